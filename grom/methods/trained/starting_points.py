"""Per-model starting points for the trained methods (was grom/baselines/defaults.py): the
learning rate and epochs a run starts
from on a model, where the recipe's own (lr 1e-5, tuned by OpenUnlearning for 1-8B models)
does not unlearn. One row per model family, like grom.closed_form.config.PRESETS; a model no row
matches gets its recipe's values.

Each row was measured (BENCHMARKS.md): the demo's from bench/bench_baselines.py's lr sweep
on the fictitious authors, SmolLM2's from bench/bench_knowledge.py's grid on the
real-knowledge benchmark's default split (the solar system, known facts).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from grom.methods.trained.recipes import DEFAULT_RECIPE, get_recipe


@dataclass(frozen=True)
class StartingPoint:
    """lr and epochs for one method on one model family; `why` says where they come from."""

    lr: float
    epochs: float
    why: str


@dataclass(frozen=True)
class ModelDefaults:
    """A model family's row: `match` substrings of the model's name (lower case), one of
    which must occur; `methods` the starting point per method name."""

    family: str
    match: tuple[str, ...]
    methods: Mapping[str, StartingPoint]


_DEMO = "bench/bench_baselines.py lr sweep at 10 epochs (BENCHMARKS.md)"
_SMOL = "bench/bench_knowledge.py grid, the-solar-system known facts, 5 epochs (BENCHMARKS.md)"
_SMOL_1123 = "bench/bench_knowledge.py baselines, the-solar-system, 5 epochs, 2026-11-23 (BENCHMARKS.md)"
_SMOL_1125 = "bench/bench_knowledge.py baselines --skip-grom --known-only, one lr, 2026-11-25 (comment beside it)"
_SMOL_RMU = ("bench/bench_knowledge.py baselines --skip-grom --known-only, lr 1e-3, 2e-3 and 3e-3 on the three "
             "subjects, 2026-11-25 (comment beside it)")
_DEMO_F01 = ("bench/bench_baselines.py --split forget01 --sweep 1e-4,3e-4,1e-3,3e-3 --max-examples 40 "
             "(AltPO --epochs 2), 2026-11-25; numbers in the comment beside it")
MODEL_DEFAULTS: tuple[ModelDefaults, ...] = (
    # the recipe's lr leaves a 1.2M-parameter model as it was; GradDiff's best Final score
    # (3e-4) halves retain ROUGE-L, 1e-4 keeps 0.91
    ModelDefaults("demo", ("demo",), MappingProxyType({
        "ga": StartingPoint(1e-4, 10, _DEMO), "graddiff": StartingPoint(1e-4, 10, _DEMO),
        "npo": StartingPoint(1e-3, 10, _DEMO), "simnpo": StartingPoint(1e-3, 10, _DEMO),
        # forget01 (40 questions), Final score (Retain ROUGE-L) at lr 1e-4 / 3e-4 / 1e-3 / 3e-3;
        # Base 0.370 (1.000), GROM's demo preset 0.644 (0.982), Retain model 0.809 (1.000).
        # AltPO, 2 epochs over 5 alternates per question (upstream's run.sh), 14 steps:
        # 0.373 (1.000) / 0.517 (0.980) / 0.756 (0.894) / 0.779 (0.711). RKLD, 10 epochs, 20
        # steps: 0.552 (0.980) / 0.761 (0.980) / 0.806 (0.959) / 0.779 (0.654). Picked: the
        # best Final score whose Retain ROUGE-L stays near 0.9.
        "altpo": StartingPoint(1e-3, 2, _DEMO_F01), "rkld": StartingPoint(1e-3, 10, _DEMO_F01)})),
    # no lr tried forgets on SmolLM2 without breaking the kept facts (BENCHMARKS.md): these
    # forget, at a cost the panel shows. SimNPO 3e-4: recall 1 -> 0.56, kept 0.73 (1e-3:
    # 0.33, kept 0.51, text perplexity 98). GA / GradDiff: the recipe's lr (GA at 1e-4
    # forgets everything else too), 5 epochs rather than 10 to keep the button short.
    ModelDefaults("smollm2", ("smollm2",), MappingProxyType({
        "ga": StartingPoint(1e-5, 5, _SMOL_1123), "graddiff": StartingPoint(1e-5, 5, _SMOL_1123),
        "npo": StartingPoint(5e-5, 5, _SMOL), "simnpo": StartingPoint(3e-4, 5, _SMOL),
        # 2026-11-25 (the grid's command, --methods rkld@5e-5): on the solar system RKLD forgot
        # all 15 known forget facts and kept 0.859 of the others (retain cost 0.14) in one run,
        # but that did not hold: 2e-5 and 3e-5 there, and 5e-5 on world-war-ii and the human
        # body, forget 40-87% of the facts at retain costs 0.16-0.29 (BENCHMARKS.md). Kept as
        # the point that forgets most; no lr tried stays inside the 0.10 line
        "rkld": StartingPoint(5e-5, 5, _SMOL_1125),
        # AltPO, 2 epochs over 5 alternates each, with the generation: at 5e-5 forget recall
        # 0.133 but kept 0.234 (retain cost 0.77, Knowledge score 0.369, 1016 s); at 1e-5
        # (the bottom of upstream's grid 1e-5..5e-5) recall 0.467, paraphrases 0.8, kept
        # 0.797 (retain cost 0.20, Knowledge score 0.639, 446 s): the one that keeps more
        "altpo": StartingPoint(1e-5, 2, _SMOL_1125),
        # RMU (steering layer 7, layers 5-7's down_proj trained): its recipe's 5e-5 forgets
        # nothing on SmolLM2. Forget recall / retain cost on the solar system, world-war-ii
        # and the human body: 1e-3 0.53/0.078, 1.0/0.061, 0.73/0.104; 2e-3 0.20/0.094,
        # 0.56/0.136, 0.60/0.119; 3e-3 0.07/0.125, 0.33/0.167 (BENCHMARKS.md, 2026-11-25).
        # 2e-3: the one that forgets on every subject, near the 0.10 line
        "rmu": StartingPoint(2e-3, 5, _SMOL_RMU)})),
)


def model_defaults_for(model_name: str | None) -> ModelDefaults | None:
    """The first row whose `match` occurs in the model's name (case ignored), or None."""
    name = str(model_name or "").lower()
    return next((row for row in MODEL_DEFAULTS if any(m in name for m in row.match)), None)


def starting_point(model_name: str | None, method: str, recipe: str = DEFAULT_RECIPE) -> StartingPoint:
    """The lr and epochs a `method` run starts from on `model_name`: its family's row, else
    the recipe's values."""
    row = model_defaults_for(model_name)
    method = str(method).strip().lower()
    if row is not None and method in row.methods:
        return row.methods[method]
    r = get_recipe(recipe)
    return StartingPoint(r.lr, r.epochs, f"OpenUnlearning's {r.name} recipe ({r.source})")
