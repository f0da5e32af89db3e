"""`landscape`: every cell of a grid, each GROM's edit exactly as Run edit makes it, read
by one teacher-forced pass.

Each cell is `run_edit` at the cell's settings on the band and layer scores of the first
(the band does not depend on beta, w_r or rho): the layers edited in order, each on keys
collected from the model as the earlier ones left it, as the paper does. Beta moves the
keys of every layer after the first, so no solve is shared between two cells of a band
wider than one layer; what is shared is what does not move: the hidden states entering
the band (`run_edit`'s stream cache), the layer scores, and the evaluation's layers below
the band (kept by the reader). A cell's edit is `run_edit`'s (a test reads both
the same). (Keys collected once from the unedited model for every layer would make a whole
beta column one solve; on SmolLM2 they leave retain answers twice as likely at beta 1000
as the real edit does, so the map would not be the one Run edit walks.)
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from grom.closed_form.config import EditConfig
from grom.closed_form.pipeline import run_edit
from grom.landscape.grid import Cell, Grid, strength_name
from grom.landscape.reader import AnswerReader
from grom.turns import Between, give


def cell_edit(model, tokenizer, forget, retain, config: EditConfig, *, scores=None, stream_cache=None,
              between: Between | None = None):
    """One cell's edit: `run_edit` with no progress of its own."""
    return run_edit(model, tokenizer, forget, retain, config, progress=False, scores=scores,
                    stream_cache=stream_cache, between=between)


def read_cell(model, reader: AnswerReader, grid: Grid, strength: float, w_r: float, edit, edit_s: float,
              between: Between | None = None) -> Cell:
    """The cell of `edit` (made at these settings in `edit_s` seconds), its answers read."""
    t0 = time.perf_counter()
    readings = reader.read(model, edit, between)
    return Cell(strength, w_r, grid.rho, {name: r.counts() for name, r in readings.items()},
                {name: r.words for name, r in readings.items()}, edit_s, time.perf_counter() - t0, readings)


def _same(edit, config: EditConfig) -> bool:
    """Whether `edit` is the edit of `config` (its band the one `config` fixes, if any)."""
    if edit is None:
        return False
    mine = edit.settings.replace(keep_keys=False)
    if config.layers is not None and mine.layers is None and edit.band:
        mine = mine.replace(layers=tuple(edit.band))
    return mine == config.replace(keep_keys=False)


def landscape(model, tokenizer, forget: Sequence, retain: Sequence, config: EditConfig, grid: Grid,
              reader: AnswerReader, *, scores=None, stream_cache: dict | None = None,
              between: Between | None = None, current=None,
              skip: Sequence[tuple[float, float]] = (), progress=None) -> Iterator[Cell]:
    """The grid's cells, nearest to `config`'s own first (`Grid.order`), one at a time.

    config: the settings every cell starts from (its band: `config.layers`, else the band
    its layer scores give, `scores` or computed with the first cell). current: an `Edit`
    made with one cell's settings (the session's), reused rather than made again. skip:
    (strength, w_r) pairs already computed. The reader keeps the states entering the band from
    the first cell's reading; every later one runs the band and above. progress(fraction,
    message) before each cell; `between` between two cells and inside each one's steps."""
    progress = progress or (lambda f, m: None)
    name = strength_name(config)
    at = (getattr(config, name), config.w_r)
    todo = [c for c in grid.order(at) if c not in set(skip)]
    stream_cache = {} if stream_cache is None else stream_cache
    for i, (strength, w_r) in enumerate(todo):
        if i:
            give(between)
        progress(i / len(todo), f"cell {i + 1} of {len(todo)}: {name} {strength:g}, w_r {w_r:g}, rho {grid.rho:g}")
        cell_config = grid.config(config, strength, w_r)
        t0 = time.perf_counter()
        if _same(current, cell_config):
            edit, edit_s = current, float(current.timings.get("total", 0.0))
        else:
            edit = cell_edit(model, tokenizer, forget, retain, cell_config, scores=scores,
                             stream_cache=stream_cache, between=between)
            edit_s = time.perf_counter() - t0
        if scores is None:
            scores = edit.scores
        if config.layers is None and edit.band:
            config = config.replace(layers=tuple(edit.band))  # every later cell on this band
        yield read_cell(model, reader, grid, strength, w_r, edit, edit_s, between)
    progress(1.0, "done")
