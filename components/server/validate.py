"""Input validators every panel shares: whole numbers, value ranges, seeds, the manual band,
the retain sample and the example limits. Each refusal is a `UserError` that says what to type.
The ranges are the library's (`grom.closed_form.config.BOUNDS`): one source of truth."""
from __future__ import annotations

import math
import random
import re

from components.server.costs import check_edit_data
from components.server.errors import UserError, shorten
from components.server.limits import limit, over
from grom.closed_form.config import BOUNDS

RANGES = {name: BOUNDS[name] for name in ("beta", "w_r", "rho", "c")}  # (min, max) of each value
MAX_SEED = int(BOUNDS["seed"][1])  # numpy's RandomState takes seeds below 2**32
MAX_COUNT = int(BOUNDS["forget_budget"][1])  # the largest budget or example count a widget may hold
MAX_BATCH = int(BOUNDS["batch_size"][1])
BAND_PART = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_BAND_CHARS = 1000


def parse_band(textual: str, n_layers: int) -> tuple[int, ...]:
    """ "3-5", "3,4,5" or "11 12" -> (3, 4, 5); every layer must be inside the model.
    Each part is checked against the model before its layers are listed, so a huge range
    costs nothing."""
    textual = textual or ""
    if len(textual) > MAX_BAND_CHARS:
        raise UserError(f"The manual band is {len(textual):,} characters long; write layers as "
                        f"3-5 or 3,4,5 (the model has layers 0..{n_layers - 1}).")
    layers: set[int] = set()
    for part in textual.replace(",", " ").split():
        match = BAND_PART.match(part)
        if match is None:
            raise UserError(f"Band {shorten(textual)!r}: write layers as 3-5 or 3,4,5.")
        a, b = int(match[1]), int(match[2] or match[1])
        if a > b:
            raise UserError(f"Band part {shorten(part)}: write the lower layer first ({b}-{a}).")
        if b >= n_layers:
            what = f"Layers {shorten(part)} are" if a < b else f"Layer {shorten(part)} is"
            raise UserError(f"{what} outside the model: it has layers 0..{n_layers - 1}. Change the band.")
        layers.update(range(a, b + 1))
    if not layers:
        raise UserError("The manual band is empty: write layers as 3-5 or 3,4,5, or choose the "
                        "suggested band.")
    return tuple(sorted(layers))


def whole_number(value, what: str, lo: int, hi: int, default: int | None = None) -> int:
    """`value` as an int in [lo, hi] (None: `default`); NaN, infinity, a fraction or a value
    out of range is refused with a message that says what to type."""
    if value is None and default is not None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or number != int(number) or not lo <= number <= hi:
        raise UserError(f"The {what} must be a whole number from {lo:,} to {hi:,} (got {shorten(value)}).")
    return int(number)


def check_range(name: str, value) -> float:
    lo, hi = RANGES[name]
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or not lo <= number <= hi:
        raise UserError(f"{name} = {shorten(value)} is out of range: use a finite value between "
                        f"{lo:g} and {hi:g}.")
    return number


def check_budget(value, what: str) -> int | None:
    """A key budget: 0 or None means no limit."""
    budget = whole_number(value, f"{what} (0: no limit)", 0, MAX_COUNT, default=0)
    return budget or None


def check_seed(seed) -> int:
    return whole_number(seed, "seed", 0, MAX_SEED, default=0)


def retain_subset(retain, limit, seed: int) -> tuple:
    """At most `limit` retain examples (seeded sample; 0 or None: all), for speed."""
    retain = tuple(retain)
    limit = whole_number(limit, "number of retain examples (0: all)", 0, MAX_COUNT, default=0)
    if not limit or len(retain) <= limit:
        return retain
    return tuple(random.Random(check_seed(seed)).sample(retain, limit))


def check_examples(forget, retain, tokenizer=None, what: str = "This edit") -> None:
    """An edit's (or the layer scores') forget and retain examples within GROM_MAX_EXAMPLES
    and, with the model's `tokenizer`, within GROM_MAX_EXAMPLE_TOKENS each and
    GROM_MAX_JOB_TOKENS together (`components.server.costs`)."""
    if len(forget) > limit("GROM_MAX_EXAMPLES"):
        raise over("An edit uses every forget example, and this forget set has {n}", len(forget),
                   "GROM_MAX_EXAMPLES")
    if len(retain) > limit("GROM_MAX_EXAMPLES"):
        raise over("The edit would use {n} retain examples (Advanced settings: retain examples)",
                   len(retain), "GROM_MAX_EXAMPLES")
    if tokenizer is not None:
        check_edit_data(tokenizer, forget, retain, what)
