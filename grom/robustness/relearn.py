"""One relearning run, the one the relearning attack (`grom.robustness.weights.relearn_attack`)
and the measurement of its lr (`grom.robustness.calibration.calibrate_relearn_lr`) share:
`relearn_curve` fine-tunes a model, with an edit applied or not, a few steps (every
parameter, AdamW as the baselines run it, a constant lr) and scores it after each count of
steps. The model comes back bit for bit. The attack's defaults (`RELEARN_STEPS`,
`RELEARN_LR`, `RELEARN_BATCH`) are here, where both read them.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.data.prompts import PromptFormat
from grom.data.schema import QAExample
from grom.methods.trained.losses import mean_nll
from grom.methods.trained.optimizer import adamw, constant_schedule, optimizer_step, select_parameters, updated_tensors
from grom.methods.trained.sequences import batch_nll, collate, encode_sequences
from grom.methods.trained.settings import Settings
from grom.methods.trained.trained_edit import ModelState
from grom.robustness.result import Recall, ScoreFn, scored
from grom.turns import Between, Held, give, inside, random_kept

RELEARN_STEPS = (0, 5, 10)
RELEARN_LR = 2e-5
"""The relearning attack's lr where no calibrated one is known (`grom.robustness.calibration.relearn_lr`)."""
RELEARN_BATCH = 4

Progress = Callable[[float, str], None]


def _relearn(model: nn.Module, tokenizer, train: Sequence[QAExample], score: ScoreFn, steps: Sequence[int],
             s: Settings, tell: Progress, between: Between | None = None,
             start: Recall | None = None) -> tuple[list[Recall], list[float]]:
    """Fine-tune every parameter in place (AdamW as the baselines run it, constant lr),
    scoring after each count of `steps` (step 0: `start` where given); (recalls, mean
    answer loss per optimizer step). Sets train mode and requires_grad; the caller restores
    them and the weights. `between` (its as_found the caller's) between two optimizer steps
    and inside each scoring."""
    enc = encode_sequences(tokenizer, train, s.prompt_format, s.max_length)
    if not enc:
        raise ValueError("the relearning questions produced no answer tokens (empty answers?)")
    slots = select_parameters(model, None)
    trained = {id(p) for _, p in slots}
    for p in model.parameters():
        p.requires_grad_(id(p) in trained)
        p.grad = None
    up = updated_tensors(slots, s.master_weights)
    opt = adamw(model, s, slots, up.pairs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, constant_schedule)
    gen, pad = torch.Generator().manual_seed(s.seed), pad_id(tokenizer)
    order: list[int] = []
    recalls, losses = [], []
    for step in range(max(steps) + 1):
        if step == 0 and start is not None:
            recalls.append(start)
        elif step in steps:
            model.eval()
            with torch.no_grad():
                recalls.append(scored(score, model, between))
            tell((len(recalls)) / len(steps), f"relearn step {step}: recall {recalls[-1].value:.2f}")
        if step == max(steps):
            break
        if step:
            give(between)
        model.train()
        if not order:  # an epoch's seeded shuffle, drawn again once used up
            order = torch.randperm(len(enc), generator=gen).tolist()
        idx, order = order[:s.batch_size], order[s.batch_size:]
        nll, counts = batch_nll(model, collate([enc[i] for i in idx], pad))
        loss = mean_nll(nll, counts)
        loss.backward()
        optimizer_step(opt, sched, up, s)
        losses.append(float(loss.detach()))
    return recalls, losses


@contextmanager
def _untrained(model: nn.Module, originals: dict, state: ModelState, held: Held):
    """The model as the run found it for the block: the weights it had before training,
    its modes, flags and gradients, the edit reverted, the random state kept; then the
    run's own again (its trained weights, modes, flags and gradients), bit for bit."""
    trained = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    now = ModelState(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(originals[n].to(p.device))
    state.restore()
    try:
        with held.left(), random_kept():
            yield
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(trained.pop(n).to(p.device))
        now.restore()


def _relearned(model, tokenizer, edit, train, score, steps, s, tell, between: Between | None = None,
               start: Recall | None = None) -> tuple[list[Recall], list[float]]:
    """`_relearn` with `edit` applied (None: the base model); the weights, modes and flags
    are put back in `finally`, the edit's patched weights by the edit's own revert.
    `between`'s as_found is `_untrained`; none for an edit that unties a tied LM head
    (applied again, its head would be a new parameter, not the one the optimizer trains)."""
    if edit is not None and getattr(edit, "unties_lm_head", False):
        between = None
    with Held((lambda: edit.applied(model)) if edit is not None else nullcontext) as held:
        state = ModelState(model)
        originals = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
        turn = inside(between, lambda: _untrained(model, originals, state, held))
        try:
            with torch.random.fork_rng(devices=[]):
                return _relearn(model, tokenizer, train, score, steps, s, tell, turn, start)
        finally:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(originals.pop(n).to(p.device))
            state.restore()


def relearn_curve(model: nn.Module, tokenizer, edit, train: Sequence[QAExample], score: ScoreFn,
                  steps: Sequence[int], *, lr: float, batch_size: int = RELEARN_BATCH,
                  fmt: PromptFormat | None = None, seed: int = 0, progress: Progress | None = None,
                  between: Between | None = None, start: Recall | None = None) -> tuple[list[Recall], list[float]]:
    """(`score` at each step count of `steps`, the training loss of each optimizer step) of
    one relearning run (`relearn_attack`'s optimizer, batches and seed) of `model` with
    `edit` applied, or of the unedited model where `edit` is None. The model comes back bit
    for bit, also on failure. between: a step boundary (`grom.turns`) between two optimizer
    steps and inside each scoring (`score(model, between=...)`), the model as found there
    (`_untrained`); the curve does not depend on it. start: `score` of the model before
    any step (step 0), where the caller has it already (the suite's held-out probes
    attack): not scored again (a greedy generation of every probe, a sixth of the attack).
    It must be what `score(model)` gives there."""
    s = Settings(method="relearn", lr=lr, batch_size=batch_size, seed=seed, weight_decay=0.01,
                 max_grad_norm=1.0, prompt_format=fmt)
    return _relearned(model, tokenizer, edit, train, score, sorted({0, *steps}), s, progress or (lambda *_: None),
                      between, start)
