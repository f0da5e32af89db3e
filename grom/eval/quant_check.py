"""The 4-bit quantization check of an edit (`quantization_check`) and its verdict
(`quantization_verdict`): the forget metrics at full precision and with the weights
quantized, for the base and the edited model; the quantization itself is `grom.eval.quant`,
what a verdict reads per task `Task.quant` (grom/tasks/)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from grom.data.schema import Benchmark
from grom.eval.quant import choose_method
from grom.eval.report import RETAIN_BROKEN, eval_sets, model_row
from grom.eval.results import BASE, EDITED, Row
from grom.eval.tasks import QUANT_METRICS, TASKS, QuantMetrics, get_task  # noqa: F401
from grom.turns import Between, give

QUANT_RETAIN_SETS = ("retain", "neighbours", "knowmem_retain", "utility_mc")


def _forget_and_retain_sets(sets: dict[str, tuple], task: str | None = None) -> dict[str, tuple]:
    """The forget sets and the first retain set of `sets` (with its few-shot examples), or
    the sets the task names (`Task.quant_sets`: for real knowledge every kept set, which
    "Kept fact recall" pools)."""
    kept = get_task(task).quant_sets if task is not None else None
    if kept is not None:
        return {k: v for k, v in sets.items() if k in kept}
    first = next((n for n in QUANT_RETAIN_SETS if n in sets), None)
    return {k: v for k, v in sets.items() if "forget" in k or (first and k in (first, f"{first}_icl"))}


def quantization_check(model, tokenizer, benchmark: Benchmark, edit=None, *,
                       max_examples: int | None = None, method: str = "auto",
                       group_size: int = 128, batch_size: int = 32,
                       with_retain: bool = False, between: Between | None = None) -> pd.DataFrame:
    """The forget metrics at full precision and with the linear weights quantized to 4
    bits (NF4 on CUDA with bitsandbytes, else round-to-nearest in groups of 128), for the
    base model and, with `edit`, the edited one. The paper's claim: gradient unlearning is
    undone by 4-bit quantization, GROM is not (the edited rows stay close).
    with_retain: also the metrics of the benchmark's main retain set (retain, neighbours,
    knowmem_retain or utility_mc; for real knowledge, neighbours and general), to tell
    whether the retain set holds at 4 bits.

    The examples are `evaluate`'s for the same `max_examples` (`eval_sets`). On the
    real-knowledge task every row is scored as `evaluate` scores it: fact recall on the
    facts the full-precision base model knew, the answer classes, "Kept fact recall" and
    the Knowledge score, so its full-precision rows equal a comparison's Base and Edited
    rows. The frame's attrs name the quantization (method; quantizer_reason: why that
    one) and the task (`quantization_verdict` picks its metrics by task). between: a step
    boundary (`grom.turns`) between the rows and inside each (`model_row`'s)."""
    resolved, reason = choose_method(model, method)
    sets = eval_sets(benchmark, max_examples)
    if with_retain:
        sets = _forget_and_retain_sets(sets, benchmark.task)
    label = f"4-bit ({resolved})"
    rows: dict[str, Row] = {}
    for name, e in [(BASE, None)] + ([(EDITED, edit)] if edit is not None else []):
        for q in (None, resolved):
            key = f"{name}, {label}" if q else f"{name}, full precision"
            if rows:
                give(between)
            rows[key] = model_row(model, tokenizer, benchmark, sets, e, batch_size=batch_size,
                             max_new_tokens=None, only_forget=not with_retain, quantize=q,
                             group_size=group_size, between=between)
    task = get_task(benchmark.task)
    if task.judge is not None:  # known facts: the full-precision base model's
        give(between)
        task.judge(model, tokenizer, rows, benchmark.prompt_format, batch_size, between=between)
        ordered = {BASE: rows[f"{BASE}, full precision"], **rows}
        if task.relative is not None:
            task.relative(ordered)
    out = {k: {m: v for m, v in row.metrics.items() if not m.startswith(("Model", "Final"))}
           for k, row in rows.items()}
    df = pd.DataFrame(out).T
    df.index.name = "model, precision"
    df.attrs.update(method=resolved, quantizer_reason=reason, group_size=group_size if resolved == "rtn" else None,
                    task=benchmark.task)
    return df


QUANT_KEPT = 0.75  # the share of the full-precision forgetting that must remain at 4 bits


@dataclass
class QuantVerdict:
    """Does an edit survive 4-bit quantization? `survives` is None when the edit forgot
    too little at full precision to tell. forget_kept: the share of the full-precision
    drop of `forget_metric` that remains at 4 bits ((B4 - E4) / (B - E), or (B - E4) /
    (B - E) where the task's `QuantMetrics.from_full_base`); retain_lost: the share of
    `retain_metric` the edited 4-bit model lost against the base 4-bit one."""

    survives: bool | None
    forget_metric: str
    forget_kept: float
    retain_metric: str | None
    retain_lost: float | None


def _first_metric(df: pd.DataFrame, names: Sequence[str]) -> str | None:
    return next((m for m in names if m in df.columns and not df[m].isna().any()), None)


def quantization_verdict(df: pd.DataFrame, min_drop: float = 0.02) -> QuantVerdict:
    """The verdict on a `quantization_check` table with the edited rows: the forget
    metric stays forgotten (at least QUANT_KEPT of its drop remains) and the retain
    metric holds (it loses at most RETAIN_BROKEN against the base model at 4 bits).
    The metrics: the task's (`Task.quant`, the task named by the frame's attrs "task"), else
    `QUANT_METRICS`."""
    base, base4, edited, edited4 = (df.iloc[i] for i in range(4))
    task = TASKS.get(df.attrs.get("task"))
    rule = task.quant if task is not None else QUANT_METRICS
    fm = _first_metric(df, rule.forget)
    if fm is None:
        raise ValueError(f"no forget metric among {list(df.columns)}")
    drop = base[fm] - edited[fm]
    start = base[fm] if rule.from_full_base else base4[fm]
    kept = float((start - edited4[fm]) / drop) if drop > min_drop else float("nan")
    rm = _first_metric(df, rule.retain)
    lost = None
    if rm is not None:
        lost = float(max(0.0, 1 - edited4[rm] / base4[rm])) if base4[rm] > 0 else 0.0
    if drop <= min_drop:
        return QuantVerdict(None, fm, kept, rm, lost)
    ok = kept >= QUANT_KEPT and (lost is None or lost <= RETAIN_BROKEN)
    return QuantVerdict(bool(ok), fm, kept, rm, lost)
