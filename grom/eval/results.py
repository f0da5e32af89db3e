"""The results of an evaluation (was grom/eval/rows.py): a model's `Row` of metrics and
per-example frames, the `Report` of every row, the rows' names (`BASE`, `EDITED`,
`REFERENCE`), and the examples an evaluation reads (`subset`, `known_mask`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from grom.eval import metrics as M
from grom.eval.verdicts import Tally, tally_frames

BASE, EDITED, REFERENCE = "Base", "Edited", "Retain model"


@dataclass
class Row:
    """The metrics of one model (base, edited or reference) and their per-example values."""

    metrics: dict[str, float] = field(default_factory=dict)
    examples: dict[str, pd.DataFrame] = field(default_factory=dict)
    raw: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. forget truth ratios
    seconds: float = 0.0
    stage: str = "full"  # the evaluation stage that made it (`grom.eval.report.evaluate`): what it holds


@dataclass
class Report:
    """Metrics of the rows "Base", "Edited" (with an edit) and "Retain model" (with a
    reference), with the per-example values behind them."""

    benchmark: str
    split: str
    task: str
    rows: dict[str, Row]
    seconds: float
    n_examples: dict[str, int] = field(default_factory=dict)
    stage: str = "full"  # or "answers": the greedy answers' metrics alone (`evaluate(stage=)`)

    def table(self) -> pd.DataFrame:
        """One row per model, one column per metric (NaN where a metric does not apply)."""
        return pd.DataFrame({name: row.metrics for name, row in self.rows.items()}).T

    def examples(self, row: str, set_name: str) -> pd.DataFrame:
        """Per-example values of one evaluation set for one row (question, answer,
        generation, rougeL_recall, prob, fact_recall ... as the task has them)."""
        if row not in self.rows:
            raise KeyError(f"no row {row!r}; rows: {', '.join(self.rows)}")
        sets = self.rows[row].examples
        if set_name not in sets:
            raise KeyError(f"no per-example values for {set_name!r}; sets: {', '.join(sets)}")
        return sets[set_name]

    def tallies(self, row: str = EDITED) -> dict[str, Tally]:
        """Per evaluation set with facts: what `row`'s answers did with the facts the unedited
        model knew (`grom.eval.verdicts.Tally`: forgot, broke into degenerate text, still
        stated), e.g. {"forget": Tally(known=15, forgot=11, broke=2, still=2), ...}. Every
        count the app and the exports show comes from here."""
        base, out = self.rows.get(BASE), {}
        if base is None or row not in self.rows:
            return out
        for name, df in self.rows[row].examples.items():
            before = base.examples.get(name)
            counted = tally_frames(before, df) if before is not None else None
            if counted is not None:
                out[name] = counted
        return out

    def known_facts(self, row: str = EDITED) -> dict[str, tuple[int, int]]:
        """Per evaluation set with facts: (facts the unedited model knew, of those the ones
        `row` still states), e.g. {"forget": (18, 2), "neighbours": (40, 39)} (`tallies`)."""
        return {name: (t.known, t.still) for name, t in self.tallies(row).items()}

    def answer_classes(self, row: str = EDITED) -> dict[str, dict[str, int]]:
        """Per evaluation set with answer classes: how many of the facts the unedited model
        knew `row` answers in each class (`grom.eval.metrics.answer_class`), e.g.
        {"forget": {"kept": 1, "refusal": 2, "fluent": 20, "degenerate": 4}, ...}."""
        base, out = self.rows.get(BASE), {}
        if base is None or row not in self.rows:
            return out
        for name, df in self.rows[row].examples.items():
            known = known_mask(base, name)
            if known is not None and "answer_class" in df:
                classes = df["answer_class"].to_numpy()[known]
                out[name] = {c: int((classes == c).sum()) for c in M.ANSWER_CLASSES}
        return out

    def to_dict(self) -> dict:
        return {"benchmark": self.benchmark, "split": self.split, "task": self.task,
                "seconds": self.seconds, "n_examples": self.n_examples, "stage": self.stage,
                "metrics": {k: v.metrics for k, v in self.rows.items()},
                "tallies": {k: {s: t.to_dict() for s, t in self.tallies(k).items()} for k in self.rows if k != BASE}}


def subset(examples: Sequence, limit: int | None) -> tuple:
    """At most `limit` examples spread evenly over the set (deterministic)."""
    examples = tuple(examples)
    if limit is None or len(examples) <= limit:
        return examples
    idx = np.linspace(0, len(examples) - 1, limit).round().astype(int)
    return tuple(examples[i] for i in idx)


def known_mask(base: Row, name: str, column: str = "fact_recall") -> np.ndarray | None:
    """Which examples of set `name` the unedited model `base` knew (its `column` is 1.0)."""
    df = base.examples.get(name)
    return None if df is None or column not in df else df[column].to_numpy() == 1.0
