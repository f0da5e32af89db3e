"""Run history (under Edit details): the session's run history (one row per edit: its settings, band, time and
the headline metrics of its comparison; one per baseline or editor run of Compare, its
method as "from" and its own settings), a forget-against-retain scatter of the runs (GROM's
violet, the others orange), and sweeps over beta (or c), w_r, rho or the band. A click on a
GROM history or sweep row puts its settings back into the Edit panel; a baseline's row says
why it cannot.

A session keeps at most `MAX_ROWS` rows of settings and metrics (never patches) in
`session.extra["history"]`, and the last sweep's points in `session.extra["sweep"]`.
"""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components.server.errors import UserError, ui_errors
from components.server.session import Session
from components.studio.form import RESTORED, widgets
from components.studio.history import (
    FORGET,
    KEPT,
    add_run,
    attach_report,
    beta_text,
    comparator_settings,
    history,
    is_grom,
    not_restorable,
    restore,
    row_index,
    shown_rows,
)
from components.studio.runs import band_text
from components.studio.wiring import LOCAL, Page, offer_files
from components.views import plots, text
from components.views.tables import download_box, empty_table


def _grom_settings(r: dict, corruption: bool) -> dict:
    cfg, run = r["config"], r["run"]
    row = {"β": beta_text(cfg), "w_r": cfg["w_r"], "ρ": cfg["rho"]}
    if corruption:
        row["c"] = cfg["c"] if cfg["target"] == "corruption" else ""
    return row | {"band": band_text(run.get("band") or cfg.get("layers") or []) or cfg["matrix"],
                  "edit s": round(r["seconds"], 1), "from": "" if r["source"] == "edit" else r["source"],
                  "settings": "", "retain ex.": run.get("n_retain", ""), "seed": cfg["seed"],
                  "α": "on" if cfg["use_alpha"] else "off", "matrix": cfg["matrix"], "time": r["time"]}


def _other_settings(r: dict, corruption: bool) -> dict:
    """A baseline's or editor's row: GROM's columns empty, its own settings in words."""
    row = {"β": "", "w_r": "", "ρ": ""} | ({"c": ""} if corruption else {})
    return row | {"band": band_text(r["run"].get("band") or []), "edit s": round(r["seconds"], 1),
                  "from": r["source"], "settings": comparator_settings(r), "retain ex.": "", "seed": "",
                  "α": "", "matrix": "", "time": r["time"]}


def history_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per run as given (the newest first): its number, its metrics (the comparison's
    headline, forget, kept and retain cost; a sweep point's probabilities), then its
    settings, the ones runs differ in first."""
    if not rows:
        return empty_table("history")
    corruption = any(is_grom(r) and r["config"]["target"] == "corruption" for r in rows)
    metric_names = list(dict.fromkeys(name for r in rows for name in r["metrics"]))
    out = []
    for r in rows:
        row = {"#": r["n"]} | {name: round(r["metrics"][name], 3) if name in r["metrics"] else ""
                               for name in metric_names}
        out.append(row | (_grom_settings if is_grom(r) else _other_settings)(r, corruption))
    frame = pd.DataFrame(out).fillna("")
    for column in ("from", "settings"):
        if not (frame[column] != "").any():
            frame = frame.drop(columns=column)
    return frame


def _point_label(r: dict) -> str:
    if not is_grom(r):
        return f"#{r['n']}: {r['source']}, {comparator_settings(r)}"
    return (f"#{r['n']}: β {beta_text(r['config'])}, w_r {r['config']['w_r']:g}, ρ {r['config']['rho']:g}, "
            f"band {band_text(r['run'].get('band', [])) or r['config']['matrix']}")


def history_figure(rows: list[dict]):
    """Forget against retain, one point per compared run (oldest to newest in `rows`). The
    latest run is ringed only where it is a point; a latest run without a comparison yet
    (an edit whose comparison runs, a sweep point) is named in a note instead, so that the
    ring never marks an older run as the latest."""
    pts = [(r, next((n for n in FORGET if n in r["metrics"]), None),
            next((n for n in KEPT if n in r["metrics"]), None)) for r in rows]
    pts = [(r, f, k) for r, f, k in pts if f and k]
    if not pts:
        return plots.empty_figure("Run edits: each compared run becomes a point here.", 320)
    newest = rows[-1]
    latest = len(pts) - 1 if pts[-1][0] is newest else None
    note = "" if latest is not None else f"The latest run, #{newest['n']}, has no comparison yet: not a point here."
    return plots.plot_tradeoff(
        [r["metrics"][f] for r, f, _ in pts], [r["metrics"][k] for r, _, k in pts],
        [_point_label(r) for r, _, _ in pts],
        x_title=" / ".join(dict.fromkeys(f for _, f, _ in pts)) + " ↓",
        y_title=" / ".join(dict.fromkeys(k for _, _, k in pts)) + " ↑",
        others=[not is_grom(r) for r, _, _ in pts], latest=latest, note=note)


def on_show_history(session: Session):
    """The table and the scatter of the loaded benchmark's runs, after an edit (its row is
    added here, once), a comparison (its metrics go onto its edit's row), a sweep or an
    import; the table's label says how many runs of other benchmarks are kept."""
    edit = session.edit
    if edit is not None and edit.method == "grom" and not any(r["edit"]() is edit for r in history(session)):
        add_run(session, edit)
    attach_report(session)
    rows, others = shown_rows(session)
    label = (f"Runs on {session.bench_label or 'this benchmark'}, the newest first (click a GROM row to restore its "
             "settings)")
    if others:
        label += f"; {others} run{'s' * (others != 1)} on other benchmarks kept (load one to see them)"
    return gr.Dataframe(history_frame(rows), label=label), history_figure(list(reversed(rows)))


@ui_errors
def on_history_select(evt: gr.SelectData, session: Session):
    """A click on a history row: its settings into the Edit panel (a GROM row), or a note on
    why a baseline's row has none to give (the form is left as it is)."""
    rows, _ = shown_rows(session)  # as the table shows them
    i = row_index(evt)
    if not 0 <= i < len(rows):
        raise UserError("That row is gone (the history keeps the last 50 runs); click another.")
    if not is_grom(rows[i]):
        return [gr.skip()] * len(RESTORED) + [not_restorable(rows[i])]
    return restore(rows[i]["config"], rows[i]["run"], session, f"run #{rows[i]['n']}")


def build_history_panel() -> SimpleNamespace:
    with gr.Accordion("Run history: every edit and baseline of this session", open=True, elem_id="history"):
        text.md(text.HISTORY, elem_classes="panel-intro")
        table = gr.Dataframe(empty_table("history"),
                             label="Runs, the newest first (click a GROM row to restore its settings)",
                             interactive=False, max_height=320, wrap=True, elem_id="history-table")
        files = download_box("the run history")
        note = gr.Markdown("", elem_id="restore-note")
        plot = gr.Plot(plots.empty_figure("Run edits: each compared run becomes a point here.", 320),
                       show_label=False, elem_id="history-plot")
    return SimpleNamespace(table=table, note=note, plot=plot, files=files)


def wire(h: SimpleNamespace, page: Page) -> None:
    """A row restoring the Edit panel; the history again after every run that adds or fills a
    row: an edit (its metrics after the comparison), a comparison, a baseline, a sweep, an
    opened or imported run."""
    s, ui = page.session, page.ui
    shown = [h.table, h.plot]
    h.table.select(on_history_select, s, widgets(ui.edit, ui.layers, RESTORED) + [h.note], **LOCAL)
    for done in (page.edit_run, page.edit_compared, page.compared, page.baseline_trained, page.swept,
                 *page.run_opened, page.run_imported):
        done.success(on_show_history, s, shown, **LOCAL)
    offer_files(h.table, h.files, "history")
