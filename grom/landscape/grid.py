"""The landscape's grid: which settings it tries, in which order, and what each cell found.

A grid is beta (or c, the corruption target's strength) against w_r, at one rho, around
the current setting: each value times fixed steps (beta x 1/4 .. x 4, w_r x 1/10 .. x 10,
the decades the paper's presets span). Cells are computed from the current one outwards,
so that a map streamed cell by cell is readable early. A `Cell` holds what one edit's
answers were read to say (`grom.landscape.reader`) per evaluation set; `pareto` marks the
cells no other cell beats on both forgetting and retain cost. (Our design.)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from grom.closed_form.config import EditConfig

BETA_STEPS = (0.25, 0.5, 1.0, 2.0, 4.0)
W_R_STEPS = (0.1, 0.3, 1.0, 3.0, 10.0)
RHO_STEPS = (0.1, 0.3, 1.0, 3.0, 10.0)
FITTED, HELD_OUT = "forget", "probes"


def strength_name(config: EditConfig) -> str:
    """The setting the grid's first axis moves: "c" for the corruption target, else "beta"."""
    return "c" if config.target == "corruption" else "beta"


def around(value: float, steps=BETA_STEPS) -> tuple[float, ...]:
    """`value` times each step, to 4 significant digits, sorted and distinct; the value
    itself kept exactly (its cell is the current edit)."""
    out = {value if s == 1.0 else float(f"{value * s:.4g}") for s in steps}
    return tuple(sorted(out))


@dataclass(frozen=True)
class Grid:
    """Strengths (beta or c) against retain weights w_r at one ridge scale rho."""

    strengths: tuple[float, ...]
    w_rs: tuple[float, ...]
    rho: float

    @classmethod
    def around(cls, config: EditConfig, rho: float | None = None) -> "Grid":
        """The 5 x 5 grid around `config` (at its rho, or `rho`)."""
        return cls(around(getattr(config, strength_name(config)), BETA_STEPS), around(config.w_r, W_R_STEPS),
                   config.rho if rho is None else float(rho))

    def __post_init__(self):
        for name, values in (("strength", self.strengths), ("w_r", self.w_rs)):
            if not values or any(v <= 0 for v in values):
                raise ValueError(f"every {name} of the grid must be above 0; got {values}")
        if self.rho <= 0:
            raise ValueError(f"rho must be above 0 (the ridge keeps A invertible); got {self.rho}")

    @property
    def size(self) -> int:
        return len(self.strengths) * len(self.w_rs)

    def order(self, at: tuple[float, float] | None = None) -> list[tuple[float, float]]:
        """Every (strength, w_r), nearest to `at` first (in grid steps; the middle by
        default), ties broken along the strength axis."""
        si = {v: i for i, v in enumerate(self.strengths)}
        wi = {v: i for i, v in enumerate(self.w_rs)}
        ci = (si.get(at[0], len(si) // 2), wi.get(at[1], len(wi) // 2)) if at else (len(si) // 2, len(wi) // 2)
        cells = [(s, w) for w in self.w_rs for s in self.strengths]
        return sorted(cells, key=lambda c: (max(abs(si[c[0]] - ci[0]), abs(wi[c[1]] - ci[1])),
                                            abs(si[c[0]] - ci[0]) + abs(wi[c[1]] - ci[1]), wi[c[1]], si[c[0]]))

    def config(self, base: EditConfig, strength: float, w_r: float) -> EditConfig:
        """`base` with this cell's settings (its band, data and everything else as they are)."""
        return replace(base, **{strength_name(base): strength}, w_r=w_r, rho=self.rho)


@dataclass(frozen=True)
class Cell:
    """One edit of the grid and what its answers were read to say.

    counts: per evaluation set, (facts read, still stated along the unedited answer,
    still the top choice where the unedited answer put them): a
    `grom.landscape.reader.Reading` as a plain tuple."""

    strength: float
    w_r: float
    rho: float
    counts: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    words: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per set, (tokens of the unedited answers outside their facts still the top choice,
    tokens read): `Reading.words`."""
    edit_s: float = 0.0
    read_s: float = 0.0
    readings: dict = field(default_factory=dict, compare=False, repr=False)
    """The per-question `Reading`s behind the counts (to check against a card)."""

    def lost(self, names, reading: str = "top") -> float | None:
        """The share of the facts of the sets `names` (one name or several, pooled) the
        edited model no longer holds by `reading`: "top" (the fact's tokens no longer its
        top choice), "stated" (its greedy answer no longer states the fact along the
        unedited words: an upper bound on the card's forgot + broke); None where no set was
        read."""
        names = (names,) if isinstance(names, str) else tuple(names)
        col = {"stated": 1, "top": 2}[reading]
        read = sum(self.counts[n][0] for n in names if n in self.counts)
        held = sum(self.counts[n][col] for n in names if n in self.counts)
        return 1.0 - held / read if read else None

    def words_kept(self, names) -> float | None:
        """Of the unedited answers' tokens outside their facts in the sets `names`, the
        share still the edited model's top choice (1.0: it follows its own wording)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        kept = sum(self.words[n][0] for n in names if n in self.words)
        read = sum(self.words[n][1] for n in names if n in self.words)
        return kept / read if read else None

    def key(self) -> tuple[float, float, float]:
        return (self.strength, self.w_r, self.rho)

    def to_dict(self) -> dict:
        return {"strength": self.strength, "w_r": self.w_r, "rho": self.rho,
                "counts": {k: list(v) for k, v in self.counts.items()},
                "words": {k: list(v) for k, v in self.words.items()}, "edit_s": self.edit_s, "read_s": self.read_s}


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (forgetting, retain cost) that no other point beats: at least
    as much forgetting at no more cost, and better on one. Higher forgetting is better,
    lower cost is better."""
    front = []
    for i, (f, c) in enumerate(points):
        if not any((f2 >= f and c2 <= c) and (f2 > f or c2 < c) for j, (f2, c2) in enumerate(points) if j != i):
            front.append(i)
    return front
