"""The training loop of the baselines (`train`; was grom/baselines/loop.py), which
`grom.methods.trained.trained_edit` runs: one run
from its first step, or a part of it resumed from a checkpoint (grom.methods.trained.checkpoint)
up to a given step. Both make the same steps: the loop's state between two optimizer
steps is all in `_Loop`, which a checkpoint saves and restores whole.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from grom.methods.trained.checkpoint import FORMAT, Part, rng_state, save_state, set_rng_state, tensors_to
from grom.methods.trained.method import Method
from grom.methods.trained.micro_batch import RunData, micro_loss, reference_nll
from grom.methods.trained.optimizer import Updated, adamw, lr_factor, optimizer_step, updated_tensors
from grom.methods.trained.prepare import Encodings
from grom.methods.trained.settings import Settings
from grom.model.arch import model_device

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]


def rng_devices(model: nn.Module) -> list[int]:
    dev = model_device(model)
    if dev.type != "cuda":
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


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
    seconds: float = 0.0  # trained, over every part of a run split into parts
    part_seconds: float = 0.0  # trained by this part


def planned_steps(s: Settings, n_forget: int) -> tuple[int, int]:
    """(optimizer steps, warm-up steps) as HF's Trainer counts them: `max_steps`, else the
    epochs' worth of ceil(micro-batches / grad_accum) steps; no warm-up under the constant
    schedule (HF's "constant" has none)."""
    steps_per_epoch = math.ceil(math.ceil(n_forget / s.batch_size) / s.grad_accum)
    total = s.max_steps if s.max_steps is not None else max(1, math.ceil(s.epochs * steps_per_epoch))
    if s.schedule == "constant":
        return total, 0
    return total, int(s.warmup_epochs * n_forget // (s.batch_size * s.grad_accum))


class _Clock:
    """The time left of a run of `total` steps, from the pace of this part (from `start`)."""

    def __init__(self, total: int, start: int = 0):
        self.total, self.start, self.t0 = total, start, time.perf_counter()

    def left(self, done: float) -> str:
        if done <= self.start:
            return ""
        rest = (time.perf_counter() - self.t0) / (done - self.start) * (self.total - done)
        return f"; about {rest:.0f} s left" if rest >= 1 else ""


def _run_data(model: nn.Module, s: Settings, row: Method, data: Encodings, slots, pad: int,
              progress: Progress, saved: dict | None = None) -> RunData:
    """What the micro-batches read, with the reference NLLs computed once, before training
    (or read from the checkpoint `saved`), and the unedited weights copied: `slots` must
    still hold them."""
    run = RunData(data.forget, data.retain, pad, alternates=data.alternates)
    if saved is not None:
        run.ref, run.ref_alternates = saved["ref"], saved["ref_alternates"]
    elif row.needs_reference:
        progress(0.0, f"{row.label}: the unedited model's log-probabilities of {len(data.forget)} forget answers")
        run.ref = reference_nll(model, data.forget, s, pad)
        if row.needs_answers:
            run.ref_alternates = reference_nll(model, data.alternates, s, pad)
    # the unedited weights for the KL retain term and reference logits (a copy of the trained ones only)
    if (row.needs_reference_logits or (row.needs_hidden and row.uses_retain(s.method_args))
            or (s.retain_loss == "kl" and row.uses_retain(s.method_args))):
        run.ref_params = {n: p.detach().clone() for n, p in slots}
    return run


@dataclass
class _Loop:
    """Everything a run carries from step to step (what a checkpoint saves): the optimiser,
    schedule and updated tensors, the run's data and state, the RNG, the summary, and the
    cursor: the current epoch's forget order (None between epochs) and its next group."""

    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    up: Updated
    run: RunData
    gen: torch.Generator
    result: Trained
    devices: list[int]
    order: torch.Tensor | None = None
    next_group: int = 0

    def capture(self, slots, s: Settings, alternates) -> dict:
        """The checkpoint of this loop after its last optimizer step. The weights, masters and
        moments are the live tensors, not copies: `torch.save` copies each to the host only
        while writing it, so a large model's state is never held twice on the host."""
        r = self.result
        return {"format": FORMAT, "settings": repr(s), "weights": {n: p.detach() for n, p in slots},
                "masters": {n: o.detach() for n, o in self.up.masters.items()},
                "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                "rng": rng_state(self.gen, self.devices), "order": self.order, "next_group": self.next_group,
                "epoch": self.run.epoch, "state": tensors_to(self.run.state, "cpu"),
                "state_devices": {k: str(v.device) for k, v in self.run.state.items() if torch.is_tensor(v)},
                "ref": self.run.ref,
                "ref_alternates": self.run.ref_alternates, "steps": r.steps, "total_steps": r.total_steps,
                "history": r.history, "seconds": r.seconds,
                "alternates": None if alternates is None else [list(g) for g in alternates]}

    def restore(self, saved: dict, slots, s: Settings) -> None:
        """Put the checkpoint `saved` back: weights, masters, optimiser, schedule, RNG, cursor."""
        if saved["settings"] != repr(s):
            raise ValueError("the training checkpoint belongs to another run (other settings); start it again")
        with torch.no_grad():
            for n, p in slots:
                p.copy_(saved["weights"][n])
            for n, o in self.up.masters.items():
                o.copy_(saved["masters"][n])
            for p, o in self.up.work:
                o.copy_(p)
        self.opt.load_state_dict(saved["optimizer"])
        self.sched.load_state_dict(saved["scheduler"])
        set_rng_state(saved["rng"], self.gen, self.devices)
        self.order, self.next_group = saved["order"], saved["next_group"]
        self.run.epoch, self.run.state = saved["epoch"], dict(saved["state"])
        for k, where in saved["state_devices"].items():  # a method's state tensor back on its device
            self.run.state[k] = self.run.state[k].to(where)
        self.result.steps, self.result.history = saved["steps"], list(saved["history"])
        self.result.seconds = saved["seconds"]


def _start(model: nn.Module, s: Settings, row: Method, data: Encodings, slots, pad: int,
           progress: Progress, saved: dict | None) -> _Loop:
    """A run's loop at its first step, or where the checkpoint `saved` left it. Sets train
    mode and requires_grad; the caller restores them."""
    trained = {n for n, _ in slots}
    torch.manual_seed(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    run = _run_data(model, s, row, data, slots, pad, progress, saved)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
        p.grad = None
    model.train()
    up = updated_tensors(slots, s.master_weights)
    opt = adamw(model, s, slots, up.pairs)
    total, warmup = planned_steps(s, len(data.forget))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(s.schedule, warmup, total))
    result = Trained(tuple(sorted(up.masters)), total_steps=total, warmup_steps=warmup,
                     n_forget=len(data.forget), n_retain=len(data.retain))
    loop = _Loop(opt, sched, up, run, gen, result, rng_devices(model))
    if saved is not None:
        loop.restore(saved, slots, s)
    return loop


def train(model: nn.Module, s: Settings, row: Method, data: Encodings,
           slots: list[tuple[str, nn.Parameter]], pad: int, progress: Progress,
           part: Part | None = None, saved: dict | None = None,
           after_step: Callable[[], None] | None = None) -> tuple[Trained, dict[str, torch.Tensor]]:
    """Train `slots` in place; returns the run's summary and the fp32 masters. Sets train
    mode and requires_grad; the caller restores them. With `part`: from the checkpoint
    `saved` (where given) up to `part.until` steps; a run stopped before its end writes
    its checkpoint to `part.path`. `after_step` is called after every optimizer step but
    the last (where the caller may lend the model out: `grom.methods.trained.trained_edit`)."""
    t0 = time.perf_counter()
    loop = _start(model, s, row, data, slots, pad, progress, saved)
    result, run, total = loop.result, loop.run, loop.result.total_steps
    stop = total if part is None else min(total, part.until)
    n_f, retain = len(data.forget), data.retain
    clock = _Clock(total, result.steps)
    while result.steps < stop:
        if loop.order is None:  # a new epoch
            if result.steps:
                run.epoch += 1
            loop.order, loop.next_group = torch.randperm(n_f, generator=loop.gen), 0
        micro = list(torch.split(loop.order, s.batch_size))
        while loop.next_group < len(micro) and result.steps < stop:
            group = micro[loop.next_group:loop.next_group + s.grad_accum]
            lr = loop.opt.param_groups[0]["lr"]
            record: dict[str, float] = {}
            for i, f_idx in enumerate(group):
                r_idx = (torch.randint(0, len(retain), (len(f_idx),), generator=loop.gen)
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
            optimizer_step(loop.opt, loop.sched, loop.up, s)
            loop.next_group += s.grad_accum
            result.steps += 1
            result.history.append({"step": result.steps, "lr": lr, **record})
            progress(result.steps / total, f"{row.label} step {result.steps}/{total}: loss "
                                           f"{record['loss']:.4f}, forget NLL {record['forget_nll']:.3f}"
                                           f"{clock.left(result.steps)}")
            if after_step is not None and result.steps < stop:
                after_step()
        if loop.next_group >= len(micro):
            loop.order = None
    result.part_seconds = time.perf_counter() - t0
    result.seconds += result.part_seconds
    if result.steps < total:
        save_state(part.path, loop.capture(slots, s, data.alternate_texts))
        log.info("%s: paused at step %d/%d, checkpoint %s", s.method, result.steps, total, part.path)
    else:
        log.info("%s: %d steps in %.1fs on %s", s.method, result.steps, result.seconds, model_device(model))
    return result, loop.up.masters


