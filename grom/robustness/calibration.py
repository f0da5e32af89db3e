"""The relearning attack's learning rate: measured per model family, and the measurement.

A relearning attack (fine-tune the edited model a few steps on some forget questions, then
score questions it was not trained on) shows knowledge coming back only when the fine-tune
by itself leaves answering intact. Too low an lr moves nothing, and "the forgetting held"
says nothing (2e-5 leaves the 1.8M-parameter demo model as it was). Too high an lr damages
the model, and recall falls for every model, edited or not (on the demo at 1e-3 the
UNEDITED model's recall of held-apart questions falls from 0.98 to 0.45 in 30 steps,
BENCHMARKS.md).

`calibrate_relearn_lr` picks, from a grid, the strongest lr that does no such damage: the
largest at which relearning the unedited model keeps its score within `tolerance` of where
it started, at every step count scored. `RELEARN_LRS` holds that pick per model family
(each measured, BENCHMARKS.md), and `relearn_lr(model)` reads it; a model of no measured
family gets `RELEARN_LR` with a reason that says it was not calibrated. The relearning run
itself and the attack's defaults are `grom.robustness.relearn`'s.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from torch import nn

from grom.data.prompts import PromptFormat
from grom.data.schema import QAExample
from grom.methods.trained.starting_points import model_defaults_for
from grom.model.arch import loaded_from
from grom.robustness.relearn import RELEARN_BATCH, RELEARN_LR, RELEARN_STEPS, relearn_curve
from grom.robustness.result import ScoreFn

DAMAGE_TOLERANCE = 0.10
"""How far (in recall, absolute) the unedited model's score may fall under the attack."""


@dataclass(frozen=True)
class RelearnLR:
    """The lr a relearning attack runs at on a model, and where it comes from."""

    lr: float
    why: str
    calibrated: bool


_CALIBRATED = "bench/bench_compare.py / bench_attack_targets.py --calibrate-relearn, BENCHMARKS.md"
RELEARN_LRS: Mapping[str, RelearnLR] = {
    # demo forget10, 40 fitted pairs, 60 held-apart questions, batch 4: the unedited model's
    # recall 0.98 -> at steps 5/10/30: 1e-4 0.97/0.97/0.97, 3e-4 0.95/0.93/0.90, 1e-3
    # 0.80/0.68/0.45 (2026-11-25); 3e-4 stays inside the tolerance to 30 steps, not to 60 (0.82)
    "demo": RelearnLR(3e-4, f"the largest lr that leaves the unedited demo model's answers intact ({_CALIBRATED})",
                      True),
    # the-solar-system (the studio's default subject), 15 fitted questions, 15 held-out probes,
    # batch 4, steps 5/10: the unedited model's recall 1.00 -> at 3e-6 1.00/1.00, 1e-5
    # 0.93/1.00, 2e-5 0.80/0.87, 1e-4 0.87/0.40 (2026-11-25; the attack's earlier 2e-5
    # damaged it). On world-war-ii and the human body every lr tried damages: 3e-6
    # 0.86/0.79 and 0.90/0.80, 1e-5 0.79/0.71 and 0.70/0.70, where the control curve
    # beside the edit's is what makes the result readable
    "smollm2": RelearnLR(1e-5, "the largest lr that leaves the unedited SmolLM2's answers on the solar system "
                               f"intact; on other subjects it may not: read the unedited curve ({_CALIBRATED})", True),
}


def relearn_lr(model: nn.Module | str | None) -> RelearnLR:
    """The relearning lr for `model` (a model, or the name or folder it was loaded from):
    its family's calibrated lr, else RELEARN_LR, saying it was not calibrated."""
    name = model if isinstance(model, str) or model is None else loaded_from(model)
    row = model_defaults_for(name)
    if row is not None and row.family in RELEARN_LRS:
        return RELEARN_LRS[row.family]
    return RelearnLR(RELEARN_LR, "the default lr, not calibrated for this model: read the unedited model's curve "
                                 "beside the edited one", False)


@dataclass(frozen=True)
class Calibration:
    """What `calibrate_relearn_lr` measured: the unedited model's score at each step count
    (steps[0] is 0, before any relearning) per lr tried, and the lr picked."""

    lr: float | None  # None: every lr tried damaged the model
    start: float
    steps: tuple[int, ...]
    curves: Mapping[float, tuple[float, ...]]
    tolerance: float
    seconds: float

    def damage(self, lr: float) -> float:
        """How far the unedited model's score fell below its start at its worst step."""
        return self.start - min(self.curves[lr])

    def rows(self) -> list[list[str]]:
        """A table: lr, the score per step count, the damage, whether it was kept."""
        return [[f"{lr:g}", *(f"{v:.2f}" for v in curve), f"{self.damage(lr):.2f}",
                 "picked" if lr == self.lr else ("damages" if self.damage(lr) > self.tolerance else "")]
                for lr, curve in self.curves.items()]


def calibrate_relearn_lr(model: nn.Module, tokenizer, train: Sequence[QAExample], score: ScoreFn,
                         lrs: Sequence[float], *, steps: Sequence[int] = RELEARN_STEPS,
                         tolerance: float = DAMAGE_TOLERANCE, batch_size: int = RELEARN_BATCH,
                         fmt: PromptFormat | None = None, seed: int = 0,
                         progress: Callable[[float, str], None] | None = None) -> Calibration:
    """Relearn the UNEDITED model on `train` at each lr of `lrs` (as `relearn_attack` does,
    steps, batch and seed alike) and keep the largest lr whose `score` stays at or above its
    start minus `tolerance` at every step count of `steps`. The model comes back bit for bit.
    Each lr costs one relearning run (the steps' training and a `score` per step count)."""
    lrs = sorted({float(lr) for lr in lrs})
    if not lrs or lrs[0] <= 0:
        raise ValueError(f"give one or more learning rates > 0, got {list(lrs)}")
    if tolerance < 0:
        raise ValueError(f"the tolerance must be >= 0, got {tolerance}")
    tell, t0 = progress or (lambda *_: None), time.perf_counter()
    steps = tuple(sorted({0, *(int(k) for k in steps)}))
    curves: dict[float, tuple[float, ...]] = {}
    for i, lr in enumerate(lrs):
        def at(f, m, i=i):
            return tell((i + f) / len(lrs), f"lr {lr:g}: {m}")
        curve, _ = relearn_curve(model, tokenizer, None, train, score, steps, lr=lr, batch_size=batch_size,
                                 fmt=fmt, seed=seed, progress=at)
        curves[lr] = tuple(r.value for r in curve)
    start = curves[lrs[0]][0]  # step 0 is the unedited model before any training, the same for every lr
    kept = [lr for lr in lrs if start - min(curves[lr]) <= tolerance]
    return Calibration(max(kept) if kept else None, start, steps, curves, tolerance, time.perf_counter() - t0)
