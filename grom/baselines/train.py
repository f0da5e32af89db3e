"""`run_baseline`: fine-tuning unlearning methods (GA, GradDiff, NPO, SimNPO, and any other
registered in grom.baselines.methods) as an `Edit`.

The trainer knows no method: it computes what the method's row asks for (a retain batch, the
reference NLL of the forget answers, the KL retain term) and minimises the row's loss. The
training settings a caller leaves out come from a recipe (grom.baselines.recipes: TOFU's by
default, MUSE's and WMDP's by name); TOFU's is OpenUnlearning's TOFU unlearning setup
(configs/trainer/finetune.yaml, configs/experiment/unlearn/tofu/default.yaml, the HF Trainer
defaults it runs under):

- data (grom.baselines.sequences): each forget sequence is visited once per epoch in a
  seeded random order; each gets a retain sequence drawn uniformly at random (seeded), as
  ``ForgetRetainDataset`` with ``anchor="forget"``; the loss is on the answer tokens.
- optimiser: ``torch.optim.AdamW`` (betas 0.9/0.999, eps 1e-8), weight decay 0.01 except on
  biases and norm weights (HF Trainer's grouping), gradients clipped to norm 1.0, linear
  warm-up over ``warmup_epochs`` (1.0) epochs' worth of steps then linear decay to 0 (HF's
  default "linear" schedule), lr 1e-5, 10 epochs, an effective batch of 32 (8 per step x 4
  accumulation steps). MUSE's and WMDP's: a constant lr, no weight decay, corpora joined
  and cut into 2048- / 512-token chunks; WMDP's runs 80 steps.
- precision (grom.baselines.optim): weights are trained in the model's own dtype, as
  OpenUnlearning does (bf16 weights, every step rounded to bf16, float32 moments);
  ``master_weights=True`` trains low-precision weights through float32 masters instead
  (the weights get the rounded masters; the patch is ``master - W0``, cast to the
  weight's dtype). float32 / float64 weights train in place either way.
- retain term: the retain answers' NLL, or (``retain_loss="kl"``) the KL from the unedited
  model's next-token distributions on the retain sequences, the unedited weights run
  through ``torch.func.functional_call`` (one copy of the trained weights, no model copy).

The model comes back exactly as it was found (weights bit for bit, train/eval mode,
requires_grad flags, .grad), also when training fails or `progress` raises. What a run
allocates (AdamW's moments, the masters, gradients, reference NLLs, batches, the autograd
graph: several times the trained weights) is dropped when it ends, fails or is cancelled,
and given back to the system (`grom.memory.releasing`): a cancel arrives as an exception
from `progress` or from a forward hook, and its traceback keeps its lines but not the run's
locals.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from grom.arch import model_device
from grom.baselines.methods import BUILT_IN, Method
from grom.baselines.micro import RunData, micro_loss, reference_nll
from grom.baselines.prepare import Encodings, prepare_run
from grom.baselines.optim import adamw, lr_factor, optimizer_step, select_parameters, updated_tensors
from grom.baselines.settings import Settings
from grom.config import EditConfig
from grom.data.prompts import PromptFormat
from grom.edit import Edit
from grom.keys import Encoded, pad_id
from grom.memory import releasing

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]

BASELINES = tuple(row.name for row in BUILT_IN)  # the built-in methods; METHODS has every registered one


# ---------------------------------------------------------------------------------------
# model state

class ModelState:
    """Train/eval mode, requires_grad flags and .grad of every parameter, to put back."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.training = {m: m.training for m in model.modules()}
        self.flags = [(p, p.requires_grad, p.grad) for p in model.parameters()]

    def restore(self) -> None:
        for m, t in self.training.items():
            m.training = t
        for p, flag, grad in self.flags:
            p.requires_grad_(flag)
            p.grad = grad


# ---------------------------------------------------------------------------------------
# training

@dataclass
class Trained:
    """What one training run produced (the weights themselves stay in the model)."""

    master_names: tuple[str, ...] = ()  # the low-precision parameters trained through fp32 masters
    history: list[dict] = field(default_factory=list)
    steps: int = 0
    total_steps: int = 0
    warmup_steps: int = 0
    n_forget: int = 0
    n_retain: int = 0
    seconds: float = 0.0


def _schedule(s: Settings, n_forget: int) -> tuple[int, int]:
    """(optimizer steps, warm-up steps) as HF's Trainer counts them: `max_steps`, else the
    epochs' worth of ceil(micro-batches / grad_accum) steps; no warm-up under the constant
    schedule (HF's "constant" has none)."""
    steps_per_epoch = math.ceil(math.ceil(n_forget / s.batch_size) / s.grad_accum)
    total = s.max_steps if s.max_steps is not None else max(1, math.ceil(s.epochs * steps_per_epoch))
    if s.schedule == "constant":
        return total, 0
    return total, int(s.warmup_epochs * n_forget // (s.batch_size * s.grad_accum))


class _Clock:
    """The time left of a run of `total` steps, from the pace so far."""

    def __init__(self, total: int):
        self.total, self.t0 = total, time.perf_counter()

    def left(self, done: float) -> str:
        if done <= 0:
            return ""
        rest = (time.perf_counter() - self.t0) / done * (self.total - done)
        return f"; about {rest:.0f} s left" if rest >= 1 else ""


def _run_data(model: nn.Module, s: Settings, row: Method, data: Encodings, slots, pad: int,
              progress: Progress) -> RunData:
    """What the micro-batches read, with the reference NLLs computed once, before training."""
    run = RunData(data.forget, data.retain, pad, alternates=data.alternates)
    if row.needs_reference:
        progress(0.0, f"{row.label}: the unedited model's log-probabilities of {len(data.forget)} forget answers")
        run.ref = reference_nll(model, data.forget, s, pad)
        if row.needs_answers:
            run.ref_alternates = reference_nll(model, data.alternates, s, pad)
    # the unedited weights for the KL retain term and reference logits (a copy of the trained ones only)
    if (row.needs_reference_logits or (row.needs_hidden and row.uses_retain(s.method_args))
            or (s.retain_loss == "kl" and row.uses_retain(s.method_args))):
        run.ref_params = {n: p.detach().clone() for n, p in slots}
    return run


def _train(model: nn.Module, s: Settings, row: Method, data: Encodings,
           slots: list[tuple[str, nn.Parameter]], pad: int,
           progress: Progress) -> tuple[Trained, dict[str, torch.Tensor]]:
    """Train `slots` in place; returns the run's summary and the fp32 masters. Sets train
    mode and requires_grad; the caller restores them."""
    t0 = time.perf_counter()
    trained = {n for n, _ in slots}
    torch.manual_seed(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    forget, retain = data.forget, data.retain
    run = _run_data(model, s, row, data, slots, pad, progress)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
        p.grad = None
    model.train()

    up = updated_tensors(slots, s.master_weights)
    masters = up.masters
    opt = adamw(model, s, slots, up.pairs)
    n_f = len(forget)
    total, warmup = _schedule(s, n_f)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(s.schedule, warmup, total))
    result = Trained(tuple(sorted(masters)), total_steps=total, warmup_steps=warmup, n_forget=n_f,
                     n_retain=len(retain))
    clock = _Clock(total)
    while result.steps < total:
        if result.steps:
            run.epoch += 1
        order = torch.randperm(n_f, generator=gen)
        micro = list(torch.split(order, s.batch_size))
        for k in range(0, len(micro), s.grad_accum):
            if result.steps >= total:
                break
            group = micro[k:k + s.grad_accum]
            lr = opt.param_groups[0]["lr"]
            record: dict[str, float] = {}
            for i, f_idx in enumerate(group):
                r_idx = (torch.randint(0, len(retain), (len(f_idx),), generator=gen)
                         if retain and row.needs_retain else None)
                loss, parts = micro_loss(model, s, row, run, f_idx, r_idx)
                (loss / len(group)).backward()
                parts["loss"] = float(loss.detach())
                for key, v in parts.items():
                    record[key] = record.get(key, 0.0) + v / len(group)
                if i + 1 < len(group):  # within an accumulated step too: a step of SmolLM2 takes seconds
                    done = result.steps + (i + 1) / len(group)
                    progress(done / total, f"{row.label} step {result.steps + 1}/{total} "
                                           f"({i + 1}/{len(group)} micro-batches){clock.left(done)}")
            optimizer_step(opt, sched, up, s)
            result.steps += 1
            result.history.append({"step": result.steps, "lr": lr, **record})
            progress(result.steps / total, f"{row.label} step {result.steps}/{total}: loss "
                                           f"{record['loss']:.4f}, forget NLL {record['forget_nll']:.3f}"
                                           f"{clock.left(result.steps)}")
    result.seconds = time.perf_counter() - t0
    log.info("%s: %d steps in %.1fs on %s", s.method, result.steps, result.seconds, model_device(model))
    return result, masters


def _rng_devices(model: nn.Module) -> list[int]:
    dev = model_device(model)
    if dev.type != "cuda":
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


def _differences(slots, masters: Mapping[str, torch.Tensor],
                 originals: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """final - initial of every parameter that changed, on the CPU in the weight's dtype;
    computed in float32 (or wider), from the fp32 master where there is one."""
    patches: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for n, p in slots:
            final = masters.get(n, p.detach())
            work = torch.promote_types(p.dtype, torch.float32)
            d = final.to(work) - originals[n].to(final.device, work)
            if bool((d != 0).any()):
                patches[n] = d.to(p.dtype).cpu()
    return patches


def _trained_patches(model: nn.Module, s: Settings, row: Method, data: Encodings, slots, pad: int,
                     progress: Progress) -> tuple[dict[str, torch.Tensor], Trained]:
    """Train, take the patches, and put the model back as it was found, also when training
    fails or is cancelled (each original copy is dropped once written back)."""
    state = ModelState(model)
    originals = {n: p.detach().to("cpu", copy=True) for n, p in slots}
    try:
        with torch.random.fork_rng(devices=_rng_devices(model)):
            run, masters = _train(model, s, row, data, slots, pad, progress)
        return _differences(slots, masters, originals), run
    finally:
        with torch.no_grad():
            for n, p in slots:
                p.copy_(originals.pop(n).to(p.device))
        state.restore()


@releasing()
def train_in_place(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, *,
                   progress: Progress | None = None, **kw) -> Trained:
    """Train `model` with the method and leave it trained (mode, requires_grad flags and
    .grad are restored; the weights are not). Same arguments as `run_baseline`; for tests
    and for whoever wants the trained model itself."""
    s, row, data = prepare_run(method, tokenizer, forget, retain, kw, model, progress)
    slots = select_parameters(model, s.params)
    state = ModelState(model)
    try:
        with torch.random.fork_rng(devices=_rng_devices(model)):
            run, _ = _train(model, s, row, data, slots, pad_id(tokenizer), progress or (lambda *_: None))
        return run
    finally:
        state.restore()


@releasing()
def run_baseline(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, *,
                 recipe: str | None = None, epochs: float | None = None, seed: int = 0,
                 progress: Progress | None = None, lr: float | None = None, batch_size: int | None = None,
                 prompt_format: PromptFormat | None = None,
                 beta: float | None = None, alpha: float | None = None, gamma: float | None = None,
                 delta: float | None = None, method_args: Mapping[str, float] | None = None,
                 params: Sequence[str] | None = None, max_steps: int | None = None,
                 grad_accum: int | None = None, warmup_epochs: float | None = None,
                 weight_decay: float | None = None, max_grad_norm: float | None = None,
                 max_length: int | None = None, schedule: str | None = None,
                 chunk_corpus: bool | None = None, master_weights: bool = False,
                 retain_loss: str = "nll", alternates: Sequence[str | Sequence[str]] | None = None) -> Edit:
    """Unlearn by fine-tuning with `method` (a name in grom.baselines.METHODS) and return
    the weight change as an `Edit`; the model is returned exactly as it was found (also on
    failure), and what the run allocated is freed.

    forget / retain: sequences of benchmark examples (grom.data.schema). recipe: "tofu"
    (None), "muse" or "wmdp" (grom.baselines.recipes; `recipe_for_task` picks one for a
    benchmark): every training setting left None takes the recipe's (TOFU's: 10 epochs,
    lr 1e-5, batch 8 x 4 accumulation, weight decay 0.01, one epoch of linear warm-up,
    then linear decay). method_args: the method's hyperparameters by name (its row's
    `defaults` fill the rest); beta / alpha / gamma / delta are shorthands for them. The
    built-in defaults are OpenUnlearning's: GradDiff gamma 1, alpha 1; NPO beta 0.1,
    gamma 1, alpha 1; SimNPO beta 4.5, delta 0, gamma 0.125, alpha 1 (GA takes none).
    `epochs` over the forget set, or `max_steps` optimizer steps (overrides epochs, as in
    HF). `params`: None trains every parameter, else those whose name contains one of the
    substrings (e.g. ["mlp"]). master_weights: train bf16 / fp16 weights through float32
    masters (default: in their own dtype, as OpenUnlearning). retain_loss: "nll" or "kl"
    (the retain term of the methods with one; upstream's ``retain_loss_type``).
    alternates: for a method that `needs_answers` (IDK-NLL, IDK-DPO, AltPO), one answer per
    forget example to train toward, or a list of answers each (the example is then trained
    once per answer, as upstream's AltPO data holds one row per alternate); None: AltPO has
    the model write them (grom.baselines.alternates), the others pair each question with a
    seeded "I don't know" (grom.baselines.idk). `info["alternates"]` holds the ones used.
    `progress(fraction, message)` is called after every optimizer step and every
    micro-batch of an accumulated one, with the time left at the pace so far; an exception
    from it cancels the run.

    The Edit: `patches` = final - initial weights of every parameter that changed (each in
    its weight's dtype), `method`, `info` (settings, steps, final losses, loss history),
    `timings` {"train", "total"}; `config` is a default EditConfig, unused by baselines;
    `layers` is empty.
    """
    t_start = time.perf_counter()
    progress = progress or (lambda *_: None)
    progress(0.0, "tokenizing")
    kw = dict(recipe=recipe, epochs=epochs, seed=seed, lr=lr, batch_size=batch_size,
              prompt_format=prompt_format, beta=beta, alpha=alpha, gamma=gamma, delta=delta,
              method_args=method_args, params=params, max_steps=max_steps, grad_accum=grad_accum,
              warmup_epochs=warmup_epochs, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
              max_length=max_length, schedule=schedule, chunk_corpus=chunk_corpus,
              master_weights=master_weights, retain_loss=retain_loss, alternates=alternates)
    s, row, data = prepare_run(method, tokenizer, forget, retain, kw, model, progress)
    slots = select_parameters(model, s.params)
    patches, run = _trained_patches(model, s, row, data, slots, pad_id(tokenizer), progress)
    if row.finish is not None:
        patches = row.finish(patches, s.method_args)
    last = run.history[-1] if run.history else {}
    info = {
        **s.to_dict(),
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "n_forget_sequences": run.n_forget,
        "n_retain_sequences": run.n_retain,
        "trained_parameters": len(slots),
        "trained_numel": sum(p.numel() for _, p in slots),
        "fp32_master_weights": list(run.master_names),
        "trained_dtypes": sorted({str(p.dtype).removeprefix("torch.") for _, p in slots}),
        "final": {k: v for k, v in last.items() if k not in ("step", "lr")},
        "history": run.history,
        "note": "config is a default EditConfig and is not used by baselines",
    }
    if data.alternate_texts is not None:
        info["alternates"] = [list(g) for g in data.alternate_texts]
    timings = {"train": run.seconds, "total": time.perf_counter() - t_start}
    progress(1.0, "done")
    return Edit(config=EditConfig(), patches=patches, layers=[], timings=timings,
                model_name=getattr(getattr(model, "config", None), "_name_or_path", None),
                method=s.method, info=info)
