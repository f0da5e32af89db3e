"""`run_baseline`: a trained method's run (GA, GradDiff, NPO, SimNPO, and any other
registered in grom.methods.trained.method) as an `Edit` (was grom/baselines/train.py).

The trainer knows no method: it computes what the method's row asks for (a retain batch, the
reference NLL of the forget answers, the KL retain term) and minimises the row's loss. The
training settings a caller leaves out come from a recipe (grom.methods.trained.recipes: TOFU's by
default, MUSE's and WMDP's by name); TOFU's is OpenUnlearning's TOFU unlearning setup
(configs/trainer/finetune.yaml, configs/experiment/unlearn/tofu/default.yaml, the HF Trainer
defaults it runs under):

- data (grom.methods.trained.sequences): each forget sequence is visited once per epoch in a
  seeded random order; each gets a retain sequence drawn uniformly at random (seeded), as
  ``ForgetRetainDataset`` with ``anchor="forget"``; the loss is on the answer tokens.
- optimiser: ``torch.optim.AdamW`` (betas 0.9/0.999, eps 1e-8), weight decay 0.01 except on
  biases and norm weights (HF Trainer's grouping), gradients clipped to norm 1.0, linear
  warm-up over ``warmup_epochs`` (1.0) epochs' worth of steps then linear decay to 0 (HF's
  default "linear" schedule), lr 1e-5, 10 epochs, an effective batch of 32 (8 per step x 4
  accumulation steps). MUSE's and WMDP's: a constant lr, no weight decay, corpora joined
  and cut into 2048- / 512-token chunks; WMDP's runs 80 steps.
- precision (grom.methods.trained.optimizer): weights are trained in the model's own dtype, as
  OpenUnlearning does (bf16 weights, every step rounded to bf16, float32 moments);
  ``master_weights=True`` trains low-precision weights through float32 masters instead
  (the weights get the rounded masters; the patch is ``master - W0``, cast to the
  weight's dtype). float32 / float64 weights train in place either way.
- retain term: the retain answers' NLL, or (``retain_loss="kl"``) the KL from the unedited
  model's next-token distributions on the retain sequences, the unedited weights run
  through ``torch.func.functional_call`` (one copy of the trained weights, no model copy).

Parts: a host that grants a process minutes at a time (a ZeroGPU call) runs the training
as parts (`run_baseline(..., part=Part(path, until))`): each trains up to `until` steps,
resumes from and writes a checkpoint file (grom.methods.trained.checkpoint; the loop itself is
grom.methods.trained.training_loop), and the last returns the Edit one uninterrupted run returns, bit for
bit (tests/test_baseline_parts.py).

The model comes back exactly as it was found (weights bit for bit, train/eval mode,
requires_grad flags, .grad), also when training fails or `progress` raises. What a run
allocates (AdamW's moments, the masters, gradients, reference NLLs, batches, the autograd
graph: several times the trained weights) is dropped when it ends, fails or is cancelled,
and given back to the system (`grom.model.process_memory.releasing`): a cancel arrives as an exception
from `progress` or from a forward hook, and its traceback keeps its lines but not the run's
locals.
"""
from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Mapping, Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.edit import Edit
from grom.methods.trained.checkpoint import Part, Paused, load_state
from grom.methods.trained.method import Method
from grom.methods.trained.optimizer import select_parameters
from grom.methods.trained.prepare import Encodings, prepare_run
from grom.methods.trained.settings import RunSettings, Settings, with_settings
from grom.methods.trained.training_loop import Progress, Trained
from grom.methods.trained.training_loop import rng_devices as _rng_devices
from grom.methods.trained.training_loop import train as _train
from grom.model.arch import loaded_from
from grom.model.process_memory import releasing
from grom.turns import Between  # `between(as_found)` after each optimizer step but the last

log = logging.getLogger(__name__)

__all__ = ["ModelState", "Part", "Paused", "RunSettings", "Settings", "Trained", "run_baseline", "train_in_place"]


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
                     progress: Progress, part: Part | None = None,
                     saved: dict | None = None,
                     between: Between | None = None) -> tuple[dict[str, torch.Tensor] | None, Trained]:
    """Train, take the patches, and put the model back as it was found, also when training
    fails or is cancelled (each original copy is dropped once written back). With `part`
    (from the checkpoint `saved` where given): the patches are None when the part stops
    before the run's end (its checkpoint written). `between(as_found)` after each
    optimizer step (`run_baseline`)."""
    state = ModelState(model)
    originals = {n: p.detach().to("cpu", copy=True) for n, p in slots}
    devices = _rng_devices(model)

    @contextmanager
    def as_found():
        """The model as it was found for the block (its weights, modes, flags and the
        random state), the training's state put back after it."""
        with torch.no_grad():
            trained = {n: p.detach().to("cpu", copy=True) for n, p in slots}
            for n, p in slots:
                p.copy_(originals[n].to(p.device))
        training, rng = ModelState(model), torch.random.get_rng_state()
        cuda = [torch.cuda.get_rng_state(d) for d in devices]
        state.restore()
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, p in slots:
                    p.copy_(trained.pop(n).to(p.device))
            training.restore()
            torch.random.set_rng_state(rng)
            for d, saved_state in zip(devices, cuda):
                torch.cuda.set_rng_state(saved_state, d)

    after_step = (lambda: between(as_found)) if between is not None else None
    try:
        with torch.random.fork_rng(devices=devices):
            run, masters = _train(model, s, row, data, slots, pad, progress, part, saved, after_step)
        if run.steps < run.total_steps:
            return None, run
        return _differences(slots, masters, originals), run
    finally:
        with torch.no_grad():
            for n, p in slots:
                p.copy_(originals.pop(n).to(p.device))
        state.restore()


@releasing()
def train_in_place(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence,
                   settings: RunSettings | None = None, *, progress: Progress | None = None, **kw) -> Trained:
    """Train `model` with the method and leave it trained (mode, requires_grad flags and
    .grad are restored; the weights are not). Same arguments as `run_baseline`; for tests
    and for whoever wants the trained model itself."""
    s, row, data = prepare_run(method, tokenizer, forget, retain, with_settings(settings, kw), model, progress)
    slots = select_parameters(model, s.params)
    state = ModelState(model)
    try:
        with torch.random.fork_rng(devices=_rng_devices(model)):
            run, _ = _train(model, s, row, data, slots, pad_id(tokenizer), progress or (lambda *_: None))
        return run
    finally:
        state.restore()


@releasing()
def run_baseline(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence,
                 settings: RunSettings | None = None, *, progress: Progress | None = None,
                 part: Part | None = None, between: Between | None = None, **kw) -> Edit | Paused:
    """Unlearn by fine-tuning with `method` (a name in grom.methods.METHODS) and return
    the weight change as an `Edit`; the model is returned exactly as it was found (also on
    failure), and what the run allocated is freed.

    forget / retain: sequences of benchmark examples (grom.data.schema). settings: a
    `RunSettings` (None: its defaults); `kw` change its fields by name (a name that is no
    setting is a TypeError). Its recipe: "tofu" (None), "muse" or "wmdp"
    (grom.methods.trained.recipes; `recipe_for_task` picks one for a benchmark): every
    training setting left None takes the method's own recipe, then the benchmark's (TOFU's:
    10 epochs, lr 1e-5, batch 8 x 4 accumulation, weight decay 0.01, one epoch of linear
    warm-up, then linear decay). method_args: the method's hyperparameters by name (its
    row's `defaults`, fitted to the model (`Method.fitted`: RMU's layers), fill the rest).
    The built-in defaults are OpenUnlearning's: GradDiff gamma 1, alpha 1; NPO beta 0.1,
    gamma 1, alpha 1; SimNPO beta 4.5, delta 0, gamma 0.125, alpha 1 (GA takes none).
    `epochs` over the forget set, or `max_steps` optimizer steps (overrides epochs, as in
    HF). `params`: None trains every parameter, else those whose name contains one of the
    substrings (e.g. ["mlp"]). master_weights: train bf16 / fp16 weights through float32
    masters (default: in their own dtype, as OpenUnlearning). retain_loss: "nll" or "kl"
    (the retain term of the methods with one; upstream's ``retain_loss_type``).
    alternates: for a method that `needs_answers` (IDK-NLL, IDK-DPO, AltPO), one answer per
    forget example to train toward, or a list of answers each (the example is then trained
    once per answer, as upstream's AltPO data holds one row per alternate); None: AltPO has
    the model write them (grom.methods.trained.alternates), the others pair each question with a
    seeded "I don't know" (grom.methods.trained.idk). `info["alternates"]` holds the ones used.
    `progress(fraction, message)` is called after every optimizer step and every
    micro-batch of an accumulated one, with the time left at the pace so far; an exception
    from it cancels the run.

    part: run only a part of the training, for a host that grants a process minutes at a
    time (a ZeroGPU call): resume from the checkpoint `part.path` where it exists (written
    by an earlier part of the same run, with the same arguments), train up to `part.until`
    optimizer steps and, when that is before the end, write the checkpoint there and return
    a `Paused` record instead of the Edit; the part that reaches the end returns the Edit
    the uninterrupted run returns (same patches and history; `timings` sum the parts) and
    deletes the checkpoint. The model is given back as found after every part.

    between: called after every optimizer step but the last with `as_found`, a context
    manager that puts the model as it was found (weights, train/eval modes, grad flags,
    random state) for the length of its block and the training's state back after it: a
    server sharing one model lends it to other jobs there (GROM Studio's device line). The
    run's result is the same with it or without it.

    The Edit: `patches` = final - initial weights of every parameter that changed (each in
    its weight's dtype), `method`, `info` (settings, steps, final losses, loss history),
    `timings` {"train", "total"}; `settings` the resolved `Settings`;
    `layers` is empty.
    """
    t_start = time.perf_counter()
    progress = progress or (lambda *_: None)
    saved = load_state(part.path) if part is not None and os.path.exists(part.path) else None
    progress(0.0 if saved is None else saved["steps"] / saved["total_steps"], "tokenizing")
    given = with_settings(settings, kw)
    if saved is not None and saved["alternates"] is not None:  # written once, by the first part (AltPO's: the model)
        given = given.replace(alternates=saved["alternates"])
    s, row, data = prepare_run(method, tokenizer, forget, retain, given, model, progress)
    slots = select_parameters(model, s.params)
    patches, run = _trained_patches(model, s, row, data, slots, pad_id(tokenizer), progress, part, saved, between)
    if patches is None:
        last = run.history[-1] if run.history else {}
        return Paused(part.path, run.steps, run.total_steps, run.seconds,
                      {k: v for k, v in last.items() if k not in ("step", "lr")})
    if part is not None and os.path.exists(part.path):
        os.remove(part.path)  # the run is whole: its checkpoint is done with
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
    }
    if data.alternate_texts is not None:
        info["alternates"] = [list(g) for g in data.alternate_texts]
    earlier = run.seconds - run.part_seconds  # the earlier parts' training
    timings = {"train": run.seconds, "total": earlier + time.perf_counter() - t_start}
    progress(1.0, "done")
    return Edit(settings=s, patches=patches, layers=[], timings=timings,
                model_name=loaded_from(model),
                method=s.method, info=info)
