"""The landscape: GROM's whole beta x w_r trade-off at one rho around the session's edit,
as a map and a Pareto front, computed cell by cell (`grom.landscape`), with the current
settings marked and a click on any cell putting its settings into the Edit form.

Every cell is the edit Run edit makes at its settings (its band, data and seed the
session edit's), read by one teacher-forced pass of the unedited model's answers
(`grom.landscape.reader`): no decoding, so a cell costs an edit and one pass. What a cell
reads is not the card's decoding: the panel says how often the two disagree on each card
the session has computed at a cell's settings. Cells are kept for the session's data and
band, so a rho switched back, or an edit run at a clicked cell, redraws at once.

Where a cell costs under `PREVIEW_WITHIN_S` (a GPU; the demo model), moving beta, w_r or
rho previews the cell of the settings before Run edit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components.server.device import DEVICE_LOCK, give_turn, kept_cache, on_device
from components.server.durations import landscape_cell_s
from components.server.errors import UserError, ui_errors
from components.server.session import (
    ModelKey,
    Session,
    current_benchmark,
    current_edit,
    current_model,
    in_turn,
    resident,
)
from components.server.validate import RANGES, check_range
from components.studio.comparison import base_report, comparison_report, examples_per_set
from components.studio.edits import trim_stream_cache
from components.studio.form import RESTORED, from_log10, widgets
from components.studio.history import restore, row_index
from components.studio.wiring import LOCAL, Page, device_queue, offer_files
from components.views import plots, text
from components.views.tables import download_box, empty_table
from grom import PRESETS, EditConfig
from grom.eval.tasks import get_task
from grom.eval.verdicts import KEPT_SETS
from grom.landscape import AnswerReader, Cell, Grid, pareto, strength_name
from grom.landscape.grid import FITTED, HELD_OUT, RHO_STEPS, around
from grom.landscape.run import cell_edit, read_cell

SAME_DATA = ("model", "benchmark", "split", "source", "retain_examples", "n_retain", "seed", "band")
"""What, besides the settings a grid does not vary, two edits share for their cells to be kept
(`components.studio.runs.run_record`'s keys; not its preset's name, which a moved slider changes)."""
MAX_CELLS = 400  # cells a session keeps (16 maps of 25); the oldest go first
PREVIEW_WITHIN_S = 1.0  # a cell costs at most this (measured) for the sliders to preview as they move
FORGET_AXES = {"held-out probes": HELD_OUT, "fitted questions": FITTED}
READINGS = {"top choice (the fact still the model's first pick)": "top",
            "stated (exact: the greedy answer still says it)": "stated"}


@dataclass
class Landscape:
    """A session's landscape: the edit settings its cells vary (`base`), the data, the
    reader, and every cell computed, by (strength, w_r, rho)."""

    base: object  # EditConfig with the band fixed
    bench: object
    n: int | None
    reader: AnswerReader
    run: dict
    cells: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)  # cell key -> (facts read differently, facts, broke) on a card
    shown: list = field(default_factory=list)  # the table's rows as last drawn: (strength, w_r) each
    shown_rho: float | None = None  # the rho of the map as last drawn


@on_device(duration=landscape_cell_s)
def landscape_cell(key: ModelKey, forget, retain, config, reader: AnswerReader, grid: Grid, strength: float,
                   w_r: float, current=None) -> Cell:
    """One cell: the edit of `config` (or `current`, the session's, where it is that edit)
    and its reading. One device call per cell, so that a grid of any size fits ZeroGPU's
    limit on one call and visitors get the device between cells."""
    with DEVICE_LOCK:
        handle = resident(key, "landscape")
        model, tok = handle.model, handle.tokenizer
        if current is not None:
            edit, edit_s = current, float(current.timings.get("total", 0.0))
        else:
            cache = kept_cache(handle.stream_cache)
            t0 = time.perf_counter()
            edit = cell_edit(model, tok, forget, retain, config, stream_cache=cache, between=give_turn)
            edit_s = time.perf_counter() - t0
            trim_stream_cache(cache)
        return read_cell(model, reader, grid, strength, w_r, edit, edit_s, give_turn)


def _keep(held: Landscape, cell: Cell) -> None:
    """`cell` into the session's landscape, the oldest cells dropped past `MAX_CELLS`."""
    held.cells[cell.key()] = cell
    while len(held.cells) > MAX_CELLS:
        held.cells.pop(next(iter(held.cells)))


def _clip(name: str, values) -> tuple[float, ...]:
    lo, hi = RANGES[name]
    return tuple(sorted({min(hi, max(lo, v)) for v in values}))


def grid_for(base, rho: float | None) -> Grid:
    """The 5 x 5 grid around `base`'s strength and w_r at `rho`, within the form's ranges."""
    name = strength_name(base)
    g = Grid.around(base, rho)
    return Grid(_clip("c" if name == "c" else "beta", g.strengths), _clip("w_r", g.w_rs), g.rho)


def rho_choices(rho: float) -> list[float]:
    return list(_clip("rho", around(rho, RHO_STEPS)))


def _state(session: Session, max_examples, full_set, progress) -> tuple[Landscape, object]:
    """The session's landscape for its edit's data and band (kept where they are the same;
    else a new one, its reader built from the unedited answers), and the edit."""
    handle, edit, bench = current_model(session), current_edit(session), current_benchmark(session)
    if not isinstance(edit.settings, EditConfig):
        raise UserError("The landscape varies GROM's β, w_r and ρ, and the session's edit was made by another "
                        "method: run a GROM edit first.")
    base = edit.settings.replace(layers=tuple(edit.band) or None, keep_keys=False)
    n = examples_per_set(max_examples, full_set, bench)
    held: Landscape | None = session.extra.get("landscape")
    run = dict(edit.run) | {"band": list(edit.band)}
    if held is not None and held.n == n and _applies(held, session):
        held.base, held.run = base, run  # the grid now centred on this edit; its cells kept
        return held, edit
    stage = "answers" if "answers" in get_task(bench.task).stages else "full"  # the unedited answers alone
    answers = base_report(handle.key, bench, n, stage)
    if answers is None:
        progress(0.0, desc="the unedited answers the cells are read against")
        answers = comparison_report(handle, bench, None, n, None, stage=stage)
    try:
        reader = AnswerReader.from_report(handle.tokenizer, bench, answers, max_examples=n)
    except ValueError:
        raise UserError("The landscape reads the unedited model's answers to questions, and this benchmark's "
                        "evaluation sets have none it answered: pick a split with questions.") from None
    if not any(name in reader.sets for name in (FITTED, HELD_OUT)):
        raise UserError("The landscape needs forget questions the unedited model answered; this split has none.")
    held = Landscape(base, bench, n, reader, run)
    session.extra["landscape"] = held
    return held, edit


def _kept_names(reader: AnswerReader) -> tuple[str, ...]:
    return tuple(n for n in KEPT_SETS if n in reader.sets)


def _check(held: Landscape, session: Session) -> None:
    """Where the session's card (its edit's answers) is at a cell's settings, count the
    facts the cell reads differently from it: held or not, against the card's still
    stated; and those the card calls broke (the cell counts them gone, as forgotten)."""
    kept = session.extra.get("answers")
    if kept is None:
        return
    edit, bench, n, report = kept
    if bench is not held.bench or n != held.n or edit is not session.edit:
        return
    s = edit.settings
    key = (getattr(s, strength_name(s)), s.w_r, s.rho)
    cell = held.cells.get(key)
    if cell is None or not cell.readings:
        return
    base = report.rows.get("Base")
    differ = total = broke = 0
    for name, reading in cell.readings.items():
        if base is None or name not in base.examples or name not in report.rows.get("Edited").examples:
            continue
        known = base.examples[name]["fact_recall"].to_numpy() == 1.0 if "fact_recall" in base.examples[name] \
            else None
        df = report.rows["Edited"].examples[name]
        if known is None or "fact_recall" not in df or int(known.sum()) != reading.read:
            continue
        still = df["fact_recall"].to_numpy()[known] == 1.0
        cls = df["answer_class"].to_numpy()[known] if "answer_class" in df else [None] * len(still)
        for held_top, card_still, c in zip(reading.top, still, cls):
            total += 1
            differ += int(bool(held_top) != bool(card_still))
            broke += int(c == "degenerate")
    if total:
        held.checks[key] = (differ, total, broke)


def _views(held: Landscape, grid: Grid, forget: str, reading: str, session: Session, preview=None):
    """(map, front, table, note) of the cells of `grid` computed so far."""
    base, reader = held.base, held.reader
    name = strength_name(base)
    label = "β" if name == "beta" else "c"
    kept = _kept_names(reader)
    forget = forget if forget in reader.sets else next(n for n in (FITTED, HELD_OUT) if n in reader.sets)
    forget_label = {FITTED: "fitted", HELD_OUT: "held-out"}[forget]
    cells = {(s, w): held.cells[(s, w, grid.rho)] for s in grid.strengths for w in grid.w_rs
             if (s, w, grid.rho) in held.cells}
    order = list(cells)
    if preview is None:
        held.shown, held.shown_rho = order, grid.rho
    points = [(cells[k].lost(kept, reading) or 0.0, cells[k].lost(forget, reading) or 0.0) for k in order]
    front = pareto([(g, c) for c, g in points])
    edit = session.edit
    s = edit.settings if edit is not None else base
    here = (getattr(s, name), s.w_r) if s.rho == grid.rho else None
    current = order.index(here) if here in cells else None
    fig_map = plots.plot_landscape_map(grid.strengths, grid.w_rs, cells, strength=label, forget=forget,
                                       forget_label=forget_label, kept=kept, reading=reading, current=here,
                                       front=[order[i] for i in front],
                                       title=f"The trade-off at ρ {grid.rho:g}: {len(cells)} of {grid.size} cells")
    labels = [f"{label} {k[0]:g} · w_r {k[1]:g}" for k in order]
    fig_front = plots.plot_landscape_front(points, labels, [f"{k[0]:g},{k[1]:g}" for k in order],
                                           front=front, forget_label=forget_label, current=current, preview=preview)
    rows = []
    for i, k in enumerate(order):
        c = cells[k]
        check = held.checks.get((*k, grid.rho))
        rows.append({label: k[0], "w_r": k[1], "ρ": grid.rho,
                     "fitted gone": c.lost(FITTED, reading), "held-out gone": c.lost(HELD_OUT, reading),
                     "kept lost": c.lost(kept, reading), "words kept": c.words_kept((FITTED, HELD_OUT)),
                     "front": "★" if i in front else "", "edit s": round(c.edit_s, 2), "read s": round(c.read_s, 2),
                     "card check": "" if check is None else f"{check[0]} of {check[1]} differ"})
    frame = pd.DataFrame(rows)
    for col in ("fitted gone", "held-out gone", "kept lost", "words kept"):
        if col in frame:
            frame[col] = frame[col].map(lambda v: "" if v is None or v != v else f"{v:.0%}")
    return fig_map, fig_front, frame if rows else empty_table("landscape"), _note(held, grid, cells, reading)


def _note(held: Landscape, grid: Grid, cells: dict, reading: str) -> str:
    reader = held.reader
    sizes = ", ".join(f"{n} {k}" for n, k in reader.sizes.items())
    spent = [c.edit_s + c.read_s for c in cells.values() if c.edit_s]
    per = f" A cell took {sum(spent) / len(spent):.1f} s here (edit and reading)." if spent else ""
    what = ("held: the fact's tokens are still the model's first pick where the unedited answer put them "
            "(it also counts a fact stated in other words; it cannot tell forgetting from breaking)"
            if reading == "top" else
            "held: the greedy answer still states the fact along the unedited words (exact for those; an "
            "answer that departs and states it later counts as gone)")
    checks = list(held.checks.values())
    if checks:
        differ, total, broke = (sum(c[i] for c in checks) for i in range(3))
        check = (f" **Against the card:** at {len(checks)} cell(s) with a card, {differ} of {total} facts read "
                 f"differently ({differ / total:.0%}, by the top-choice reading); the card called {broke} of them "
                 "broke, which every cell counts as gone.")
    else:
        check = (" **Not yet checked against a card:** Run edit at any cell (click it first) and the card's "
                 "answers are compared with the cell's reading, fact by fact.")
    return (f"Each cell is the edit Run edit makes at its settings (band {held.run.get('band')}, the same data "
            f"and seed), read in one teacher-forced pass of the unedited model's answers ({sizes} facts it "
            f"stated), not decoded: {what}. Gone = no longer held; kept lost = the kept facts no longer "
            f"held; words kept = the unedited answers' other words still the model's first pick (low: broken "
            f"text).{per}{check}")


@ui_errors
def on_landscape(rho: float, forget_axis: str, reading_label: str, max_examples, full_set, session: Session,
                 progress=gr.Progress()):
    """The grid around the session's edit at `rho`, cell by cell (a generator: the map and
    the front redrawn as each cell comes), the cells already computed kept."""
    handle = current_model(session)
    held, edit = _state(session, max_examples, full_set, progress)
    forget, reading = FORGET_AXES.get(forget_axis, HELD_OUT), READINGS.get(reading_label, "top")
    rho = held.base.rho if rho in (None, "") else check_range("rho", rho)
    if rho <= 0:
        raise UserError("ρ must be above 0 (the ridge keeps A invertible).")
    grid = grid_for(held.base, rho)
    name = strength_name(held.base)
    at = (getattr(edit.settings, name), edit.settings.w_r)
    todo = [k for k in grid.order(at) if (*k, grid.rho) not in held.cells]
    _check(held, session)
    yield _views(held, grid, forget, reading, session)
    forget_set, retain_set = session.extra.get("edit_inputs", (held.bench.forget, held.bench.retain))
    for i, (s, w) in enumerate(todo):
        spent = [c.edit_s + c.read_s for c in held.cells.values() if c.edit_s]  # measured here, this session
        per = sum(spent) / len(spent) if spent else 0.0
        left = f" (about {per * (len(todo) - i):.0f} s left at the {per:.1f} s a cell measured here)" if spent else ""
        progress(i / len(todo), desc=f"cell {i + 1} of {len(todo)}: {name} {s:g}, w_r {w:g}, ρ {grid.rho:g}{left}")
        config = grid.config(held.base, s, w)
        same = config == edit.settings.replace(layers=held.base.layers, keep_keys=False)
        cell = landscape_cell(handle.key, forget_set, retain_set, config, held.reader, grid, s, w,
                              edit if same else None)
        _keep(held, cell)
        _check(held, session)
        yield _views(held, grid, forget, reading, session)


def _pick(value: str, session: Session) -> list:
    """The Edit form's values (and the note) for the cell "strength,w_r" of the landscape."""
    held: Landscape | None = session.extra.get("landscape")
    try:
        s, w = (float(v) for v in str(value).split(",")[:2])
    except ValueError:
        raise UserError("Click a cell of the map.") from None
    if held is None:
        raise UserError("Map the trade-off first.")
    rhos = [k[2] for k in held.cells if k[:2] == (s, w)]
    if not rhos:
        raise UserError("That cell is not computed yet: wait for it, or click another.")
    rho = next((r for r in (held.shown_rho, held.base.rho) if r in rhos), rhos[-1])  # the map's own rho first
    config = Grid((s,), (w,), rho).config(held.base, s, w)
    return restore(config.to_dict(), held.run, session, f"landscape cell {value}")


@ui_errors
def on_pick(value: str, session: Session):
    """A click on a cell of the map or the front ("strength,w_r"): its settings into the Edit form."""
    return _pick(value, session)


@ui_errors
def on_row(evt: gr.SelectData, session: Session):
    """A click on a row of the cells' table (the rows as last drawn for this session): its
    settings into the Edit form."""
    held: Landscape | None = session.extra.get("landscape")
    i = row_index(evt)
    if held is None or not 0 <= i < len(held.shown):
        raise UserError("Map the trade-off first.")
    s, w = held.shown[i]
    return _pick(f"{s:g},{w:g}", session)


def _previewable(held: Landscape | None, handle) -> bool:
    """Whether a cell is cheap enough here to preview as the sliders move: on a GPU, or
    where the cells measured cost under `PREVIEW_WITHIN_S` on average."""
    if next(handle.model.parameters()).device.type == "cuda":
        return True
    spent = [c.edit_s + c.read_s for c in (held.cells.values() if held else ()) if c.edit_s]
    return bool(spent) and sum(spent) / len(spent) <= PREVIEW_WITHIN_S


@ui_errors
def on_preview(beta_log: float, w_r_log: float, rho_log: float, forget_axis: str, reading_label: str, max_examples,
               full_set, session: Session):
    """The cell of the sliders' settings before Run edit (where `_previewable`; else nothing):
    a line under the sliders and a diamond on the front. The last value wins (gradio keeps
    only the latest of a burst: trigger_mode "always_last")."""
    if session.edit is None or session.benchmark is None:
        return gr.skip(), gr.skip()
    handle = current_model(session)
    held = session.extra.get("landscape")
    if not isinstance(session.edit.settings, EditConfig) or not _previewable(held, handle) or \
            strength_name(session.edit.settings) != "beta":
        return gr.skip(), gr.skip()
    held, edit = _state(session, max_examples, full_set, lambda *a, **k: None)
    beta, w_r, rho = (check_range(name, from_log10(v)) for name, v in (("beta", beta_log), ("w_r", w_r_log),
                                                                        ("rho", rho_log)))
    if min(beta, w_r) <= 0:
        raise UserError("β and w_r must be above 0 for a preview.")
    grid = Grid((beta,), (w_r,), rho)
    cell = held.cells.get((beta, w_r, rho))
    if cell is None:
        forget_set, retain_set = session.extra.get("edit_inputs", (held.bench.forget, held.bench.retain))
        config = grid.config(held.base, beta, w_r)
        same = config == edit.settings.replace(layers=held.base.layers, keep_keys=False)
        cell = landscape_cell(handle.key, forget_set, retain_set, config, held.reader, grid, beta, w_r,
                              edit if same else None)
        _keep(held, cell)
    forget, reading = FORGET_AXES.get(forget_axis, HELD_OUT), READINGS.get(reading_label, "top")
    kept = _kept_names(held.reader)
    parts = [f"{label} gone {cell.lost(name, reading):.0%}" for label, name in (("fitted", FITTED),
             ("held-out", HELD_OUT)) if cell.lost(name, reading) is not None]
    if cell.lost(kept, reading) is not None:
        parts.append(f"kept lost {cell.lost(kept, reading):.0%}")
    line = (f"**Preview** at β {beta:g}, w_r {w_r:g}, ρ {rho:g} (not run yet; the landscape's reading, "
            f"{cell.edit_s + cell.read_s:.1f} s): {' · '.join(parts)}. Run edit for the card.")
    big = Grid.around(held.base, rho)
    front = _views(held, Grid(tuple(sorted({*big.strengths, beta})), tuple(sorted({*big.w_rs, w_r})), rho), forget,
                   reading, session, preview=((cell.lost(kept, reading) or 0.0), cell.lost(forget, reading) or 0.0,
                                              "preview"))[1]
    return line, front


def _applies(held: Landscape | None, session: Session) -> bool:
    """Whether `held`'s cells are cells of the session's edit: the same data, band and every
    setting but beta (or c), w_r and rho."""
    edit = session.edit
    if held is None or edit is None or session.benchmark is not held.bench or \
            not isinstance(edit.settings, EditConfig):
        return False
    mine = edit.settings.replace(layers=tuple(edit.band) or None, keep_keys=False)
    plain = lambda c: c.replace(beta=1.0, c=1.0, w_r=1.0, rho=1.0)  # noqa: E731
    run = dict(getattr(edit, "run", {}) or {}) | {"band": list(edit.band)}
    return plain(mine) == plain(held.base) and all(held.run.get(k) == run.get(k) for k in SAME_DATA)


def _redrawn(forget_axis: str, reading_label: str, session: Session, check: bool) -> tuple:
    """(map, front, table, note) for the session's edit now: its landscape redrawn with "you
    are here" where the edit is (and, with `check`, its card compared), or cleared, saying
    why, where the cells were computed for other data or another band."""
    held: Landscape | None = session.extra.get("landscape")
    if held is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    if not _applies(held, session):
        return (plots.empty_figure("The map was computed for another edit's data, band or settings: press "
                                   "Map the trade-off for this one.", 430),
                plots.empty_figure("", 400), empty_table("landscape"), "")
    if check:
        _check(held, session)
    rho = session.edit.settings.rho
    grid = grid_for(held.base, rho if any(k[2] == rho for k in held.cells) else held.base.rho)
    return _views(held, grid, FORGET_AXES.get(forget_axis, HELD_OUT), READINGS.get(reading_label, "top"), session)


@ui_errors
def on_edit_made(forget_axis: str, reading_label: str, session: Session):
    """A new edit: the rho choices around it, and the map redrawn with you are here on it (or
    cleared: cells of other data)."""
    edit = session.edit
    if edit is None or not isinstance(edit.settings, EditConfig):
        return (gr.skip(),) * 5
    rho = gr.Dropdown(choices=rho_choices(edit.settings.rho), value=edit.settings.rho)
    return (rho, *_redrawn(forget_axis, reading_label, session, check=False))


@ui_errors
def on_card_done(forget_axis: str, reading_label: str, session: Session):
    """The edit's card computed: compared with its cell, where the landscape has it."""
    return _redrawn(forget_axis, reading_label, session, check=True)


PICK_JS = """
() => {
  const attach = (tries) => {
    const plots = document.querySelectorAll('#landscape-map .js-plotly-plot, #landscape-front .js-plotly-plot');
    if (!plots.length || ![...plots].every(p => p.on)) {
      if (tries > 0) setTimeout(() => attach(tries - 1), 300);
      return;
    }
    plots.forEach(p => {
      if (p.__gromPick) return;
      p.__gromPick = true;
      p.on('plotly_click', (d) => {
        const pt = d && d.points && d.points[0];
        if (!pt || pt.customdata == null) return;
        const box = document.querySelector('#landscape-pick textarea, #landscape-pick input');
        if (!box) return;
        box.value = String(pt.customdata);
        box.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
  };
  attach(20);
}
"""


def build_landscape_panel(start_preset: str = "demo") -> SimpleNamespace:
    """The landscape's choices (rho, the forget set its forgetting is read on, what counts
    as held), Map the trade-off, the map and the front side by side, the note, the cells'
    table and its files."""
    rho = PRESETS[start_preset].rho
    text.md(text.LANDSCAPE)
    with gr.Row(equal_height=True, elem_id="landscape-row"):
        rho_box = gr.Dropdown(rho_choices(rho), value=rho, label="ρ (the grid's third setting)", scale=1,
                              min_width=140, allow_custom_value=True)
        forget_axis = gr.Radio(list(FORGET_AXES), value="held-out probes", label="Forgetting measured on",
                               scale=2, min_width=220)
        reading = gr.Radio(list(READINGS), value=next(iter(READINGS)), label="A fact counts as held when",
                           scale=3, min_width=260)
    button = gr.Button("Map the trade-off", variant="primary", elem_id="landscape-button")
    fig_map = gr.Plot(plots.empty_figure("Run an edit, then press Map the trade-off.", 430), show_label=False,
                      elem_id="landscape-map")
    fig_front = gr.Plot(plots.empty_figure("The cells' forgetting against their retain cost.", 400),
                        show_label=False, elem_id="landscape-front")
    note = gr.Markdown("", elem_id="landscape-note")
    table = gr.Dataframe(empty_table("landscape"), label="Cells (click a row to put its settings in the Edit form)",
                         interactive=False, max_height=300, elem_id="landscape-table")
    pick = gr.Textbox(visible="hidden", elem_id="landscape-pick", label="picked cell")
    files = download_box("the landscape's cells")
    return SimpleNamespace(rho=rho_box, forget_axis=forget_axis, reading=reading, button=button, map=fig_map,
                           front=fig_front, note=note, table=table, pick=pick, files=files)


def wire(w: SimpleNamespace, page: Page) -> None:
    """Map the trade-off (public `landscape`), a click on a cell or a row restoring the Edit
    form, the rho choices after each edit, its files."""
    s, ui = page.session, page.ui
    restored = widgets(ui.edit, ui.layers, RESTORED) + [ui.edit.status]  # the note by Run edit
    views = [w.map, w.front, w.table, w.note]
    page.edit_run.success(on_edit_made, [w.forget_axis, w.reading, s], [w.rho, *views], **LOCAL)
    page.edit_compared.success(on_card_done, [w.forget_axis, w.reading, s], views, **LOCAL)
    w.pick.change(on_pick, [w.pick, s], restored, **LOCAL)  # set only by a click (PICK_JS)
    w.table.select(on_row, s, restored, **LOCAL)
    for plot in (w.map, w.front):
        plot.change(None, js=PICK_JS, **LOCAL)
    w.button.click(in_turn(on_landscape), [w.rho, w.forget_axis, w.reading, ui.compare.max_examples,
                                          ui.compare.full_set, s], [w.map, w.front, w.table, w.note],
                   api_name="landscape", show_progress_on=[w.note], **device_queue())  # the map stays in view
    offer_files(w.table, w.files, "landscape")
    e = ui.edit
    for slider in (e.beta_log, e.w_r_log, e.rho_log):
        slider.release(in_turn(on_preview), [e.beta_log, e.w_r_log, e.rho_log, w.forget_axis, w.reading,
                                    ui.compare.max_examples, ui.compare.full_set, s], [e.preview, w.front],
                       trigger_mode="always_last", api_visibility="private", show_progress="hidden",
                       **device_queue())
