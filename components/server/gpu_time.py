"""How many seconds of GPU a compute function asks ZeroGPU for: computed from its work.

ZeroGPU grants a call the `duration` its `spaces.GPU` decorator asks for (60 s when none is
given), and a shorter ask is served sooner (huggingface/hub-docs
`docs/hub/spaces-zerogpu.md` @00b2cbfe, "Duration Management" and "Dynamic duration": the
duration may be a function of the call's arguments). The longest one call may ask is not
in those docs; the ZeroGPU team gives 5 minutes (huggingface.co/spaces/zero-gpu-explorers/
README discussion #7), and spaces 0.51.3 (`spaces/zero/client.py`, `schedule`) raises
"ZeroGPU illegal duration" when the server refuses a longer one. So a call asks for at most
`GROM_GPU_SECONDS` (default 300); a host whose account is granted more raises it.

The estimate is a small pure function of the work (`gpu_seconds`): floating-point
operations at a stated effective rate, plus the latency of the generated tokens' steps,
times a margin, plus a fixed overhead. The rate is a deliberately low estimate (no GPU
was at hand to measure it here): an H200 half-slice does ~400 TFLOP/s of dense bf16 at
peak, and forward passes of a few hundred tokens with hooks reach a small part of it.

A gradient training is priced per optimizer step (`plan_training`, a `TrainPlan`): each
call pays the overhead and its checkpoint written and read (at a stated disk rate), then
as many steps as fit `GROM_GPU_SECONDS`; a longer training is that many calls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from components.server.limits import limit, over
from grom.methods.costs import example_tokens, train_flops  # noqa: F401  (the counts every price here starts from)


@dataclass(frozen=True)
class Rate:
    """What a second of ZeroGPU buys, and the slack around it."""
    flops_per_s: float = 2e13
    """Effective dense throughput (20 TFLOP/s: ~5% of an H200 half-slice's bf16 peak)."""
    step_s: float = 2e-4
    """Seconds per decoder layer per generated-token step (small decode batches are bound
    by kernel launches, not by FLOPs)."""
    margin: float = 2.0
    """The estimate is multiplied by this (a call that runs past its duration is aborted)."""
    overhead_s: float = 10.0
    """Forking the worker, pickling arguments and results, first CUDA use."""
    disk_bytes_per_s: float = 5e8
    """A training's checkpoint written and read back between its calls (0.5 GB/s: a low
    estimate for a local SSD; the file is several times the trained weights)."""


RATE = Rate()


@dataclass(frozen=True)
class Shape:
    """What the cost of a token depends on, read from a loaded model."""
    layers: int
    layer_params: int
    """Parameters of one decoder layer (a token costs 2 x this FLOPs per layer forward)."""
    key_dim: int
    """Input size n of an edited matrix (the MLP width for down_proj): the solve is n x n."""


def cap_seconds() -> int:
    """The most one GPU call asks for (GROM_GPU_SECONDS, default 300: ZeroGPU's limit)."""
    return limit("GROM_GPU_SECONDS")


def gpu_seconds(flops: float, steps: float = 0.0, rate: Rate = RATE, cap: int | None = None) -> int:
    """ceil(overhead + margin x (flops / flops_per_s + steps x step_s)), at most `cap`
    (default `cap_seconds()`). `steps`: generated-token steps x layers."""
    cap = cap_seconds() if cap is None else cap
    need = rate.overhead_s + rate.margin * (flops / rate.flops_per_s + steps * rate.step_s)
    return int(min(cap, math.ceil(need)))


def edit_flops(shape: Shape, tokens: float, band_layers: int, with_scores: bool) -> float:
    """A GROM edit of `tokens` (forget + retain): a forward pass over all layers to collect
    keys (and one more for the layer scores when they are not given), the Grams
    (2 n^2 per token and band layer) and a float64 solve (~n^3) per band layer."""
    passes = 2 if with_scores else 1
    forward = 2.0 * tokens * shape.layers * shape.layer_params * passes
    n = float(shape.key_dim)
    return forward + band_layers * (2.0 * tokens * n * n + n ** 3)


def eval_work(shape: Shape, tokens: float, answers: int, new_tokens: int, rows: int,
              batch: int = 32) -> tuple[float, float]:
    """(FLOPs, steps) of evaluating `rows` models (Base, Edited, Retain) on sets of
    `tokens` teacher-forced tokens and `answers` generated answers of `new_tokens` each,
    in batches of `batch`."""
    flops = rows * 2.0 * (tokens + answers * new_tokens) * shape.layers * shape.layer_params
    steps = rows * math.ceil(answers / batch) * new_tokens * shape.layers
    return flops, steps


@dataclass(frozen=True)
class TrainPlan:
    """A gradient training priced per optimizer step and split into GPU calls that each fit
    `cap` seconds: every call pays `call_s` (the overhead, the checkpoint read and written),
    then `step_s` a step (both with the margin)."""
    total_steps: int
    step_s: float
    call_s: float
    cap: int

    @property
    def steps_per_call(self) -> int:
        """The steps one call holds; 0 when not even one fits."""
        return max(0, math.floor((self.cap - self.call_s) / self.step_s)) if self.step_s > 0 else self.total_steps

    @property
    def calls(self) -> int:
        """How many calls the training takes (0: it cannot be split into calls that fit)."""
        return math.ceil(self.total_steps / self.steps_per_call) if self.steps_per_call else 0

    def seconds(self, steps: int) -> int:
        """What a call of `steps` steps asks for, within [1, cap]."""
        return int(min(self.cap, max(1, math.ceil(self.call_s + steps * self.step_s))))


def plan_training(step_flops: float, total_steps: int, state_bytes: float, rate: Rate | None = None,
                  cap: int | None = None) -> TrainPlan:
    """A training of `total_steps` optimizer steps of `step_flops` each, whose state between
    calls (weights, AdamW's moments) takes `state_bytes` on disk, as calls within `cap`
    (default `cap_seconds()`) at `rate` (default: the module's RATE, read at the call)."""
    cap = cap_seconds() if cap is None else cap
    rate = RATE if rate is None else rate
    step_s = rate.margin * step_flops / rate.flops_per_s
    call_s = rate.overhead_s + rate.margin * 2.0 * state_bytes / rate.disk_bytes_per_s
    return TrainPlan(int(total_steps), step_s, call_s, cap)


def eval_sets_of(bench, n: int | None) -> Sequence[tuple]:
    """The evaluation sets of `bench` as a comparison of `n` examples per set reads them."""
    sets = bench.eval_sets or {"forget": bench.forget, "retain": bench.retain}
    return [tuple(v)[:n] if n is not None else tuple(v) for v in sets.values()]


def refuse_over(seconds: float, what: str, names: str) -> None:
    """On ZeroGPU, work that one call cannot hold and that cannot be split further (an edit,
    one optimizer step of a training): an error that says how long it would take and which
    limits bring it within GROM_GPU_SECONDS."""
    if seconds > cap_seconds():
        raise over(f"{what} needs about {{n}} s of GPU in one call (ask for less: {names})",
                   math.ceil(seconds), "GROM_GPU_SECONDS")
