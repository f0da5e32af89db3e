"""What became of the facts the unedited model knew: one rule, counted one way everywhere.

Of the facts of one set that the unedited model stated (its greedy answer held the fact),
the edited model's answer

- still states it ("still": for a kept set, the fact was kept);
- no longer states it, in words, a refusal or another fluent answer ("forgot");
- no longer states it, in degenerate text, a loop, noise, nothing ("broke").

So forgot + broke + still == known, and broken text never counts as forgetting: the
Knowledge score's rule (`grom.eval.metrics.knowledge_score`: forgotten = 1 - recall -
degenerate). The classes are `grom.eval.metrics.answer_class`'s; where a set has no
classes (a report judged before its classes, a task without them) nothing is counted as
broken. The card, the Compare summary, the attack table, the history and the exported
results read their counts from here. (Our rule.)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from grom.eval import metrics as M

KEPT_SETS = ("neighbours", "general", "retain")
"""The evaluation sets whose facts an edit should keep, pooled as "kept" (the card, the
landscape): real knowledge's neighbours and general facts, TOFU's retain set."""


@dataclass(frozen=True)
class Tally:
    """The facts of one set the unedited model knew, and what the edited answers did with
    them: forgot + broke + still == known."""

    known: int
    """Facts the unedited model stated."""
    forgot: int
    """Of those, no longer stated, in words (a refusal or another fluent answer)."""
    broke: int
    """Of those, no longer stated, in degenerate text: broken, not forgotten."""
    still: int
    """Of those, still stated (for a kept set: kept)."""

    def __post_init__(self):
        if min(self.known, self.forgot, self.broke, self.still) < 0 or \
                self.forgot + self.broke + self.still != self.known:
            raise ValueError(f"forgot ({self.forgot}) + broke ({self.broke}) + still ({self.still}) must be "
                             f"known ({self.known})")

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.known + other.known, self.forgot + other.forgot, self.broke + other.broke,
                     self.still + other.still)

    def share(self, part: str) -> float:
        """`part` ("forgot", "broke" or "still") over the known facts; 0 where none was known."""
        return getattr(self, part) / self.known if self.known else 0.0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


NONE = Tally(0, 0, 0, 0)


def tally(known: Sequence[bool], still: Sequence[bool], degenerate: Sequence[bool] | None = None) -> Tally:
    """The rule on per-example flags (one per question): whether the unedited model stated
    the fact, whether the edited one still does, whether the edited answer is degenerate
    text (None: no classes, nothing broke). A stated fact is never broken."""
    known = np.asarray(known, dtype=bool)
    still = np.asarray(still, dtype=bool) & known
    broke = known & ~still & (np.zeros_like(known) if degenerate is None else np.asarray(degenerate, dtype=bool))
    n_known, n_still, n_broke = int(known.sum()), int(still.sum()), int(broke.sum())
    return Tally(n_known, n_known - n_still - n_broke, n_broke, n_still)


def tally_frames(before: pd.DataFrame, after: pd.DataFrame) -> Tally | None:
    """The rule on one set's per-example frames of a report (`Row.examples`): `before` the
    unedited model's (its "fact_recall"), `after` the edited one's ("fact_recall" and, where
    judged, "answer_class"); None where either lacks fact recall."""
    if "fact_recall" not in before or "fact_recall" not in after or len(before) != len(after):
        return None
    degenerate = after["answer_class"].to_numpy() == M.DEGENERATE if "answer_class" in after else None
    return tally(before["fact_recall"].to_numpy() == 1.0, after["fact_recall"].to_numpy() == 1.0, degenerate)


def tally_answers(facts: Sequence[str], before: Sequence[str], after: Sequence[str]) -> Tally:
    """The rule on answers alone (the attack suite's, which scores no perplexity): fact recall
    of each answer, and degenerate text by its form (`grom.eval.metrics.answer_class`
    without a perplexity: a loop, punctuation, nothing)."""
    n = min(len(facts), len(before), len(after))
    known = [M.fact_recall(f, b) == 1.0 for f, b in zip(facts[:n], before[:n])]
    classes = [M.answer_class(f, a) for f, a in zip(facts[:n], after[:n])]
    return tally(known, [c == M.KEPT for c in classes], [c == M.DEGENERATE for c in classes])


def pooled(tallies: dict[str, Tally], names: Sequence[str]) -> Tally | None:
    """The sum of the tallies of `names` the dict has (each fact counted once), else None."""
    found = [tallies[n] for n in names if n in tallies]
    return sum(found[1:], found[0]) if found else None
