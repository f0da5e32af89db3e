"""Run history (under Edit details): the session's run history (one row per edit: its settings, band, time and
the headline metrics of its comparison), a forget-against-retain scatter of the runs, and
sweeps over beta (or c), w_r, rho or the band. A click on a history or sweep row puts its
settings back into the Edit panel.

A session keeps at most `MAX_ROWS` rows of settings and metrics (never patches) in
`session.extra["history"]`, and the last sweep's points in `session.extra["sweep"]`.
"""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components.core.errors import UserError, ui_errors
from components.core.history import FORGET, KEPT, _beta, add_run, attach_report, history, restore, row_index
from components.core.runs import band_text
from components.core.session import Session
from components.views import plots, text


def history_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per run, the newest first."""
    if not rows:
        return pd.DataFrame()
    corruption = any(r["config"]["target"] == "corruption" for r in rows)
    out = []
    for r in reversed(rows):
        cfg, run = r["config"], r["run"]
        row = {"#": r["n"], "time": r["time"],
               "benchmark": f"{run.get('benchmark', '?')}/{run.get('split', '?')}", "β": _beta(cfg),
               "w_r": cfg["w_r"], "ρ": cfg["rho"]}
        if corruption:
            row["c"] = cfg["c"] if cfg["target"] == "corruption" else ""
        row |= {"band": band_text(run.get("band") or cfg.get("layers") or []) or cfg["matrix"],
                "matrix": cfg["matrix"], "α": "on" if cfg["use_alpha"] else "off", "seed": cfg["seed"],
                "retain ex.": run.get("n_retain", ""), "edit s": round(r["seconds"], 1)}
        row |= {name: round(v, 3) for name, v in r["metrics"].items()}
        if r["source"] != "edit":
            row["from"] = r["source"]
        out.append(row)
    return pd.DataFrame(out).fillna("")


def history_figure(rows: list[dict]):
    """Forget against retain, one point per compared run."""
    pts = [(r, next((n for n in FORGET if n in r["metrics"]), None),
            next((n for n in KEPT if n in r["metrics"]), None)) for r in rows]
    pts = [(r, f, k) for r, f, k in pts if f and k]
    if not pts:
        return plots.empty_figure("Run edits: each compared run becomes a point here.", 320)
    return plots.plot_tradeoff(
        [r["metrics"][f] for r, f, _ in pts], [r["metrics"][k] for r, _, k in pts],
        [f"#{r['n']}: β {_beta(r['config'])}, w_r {r['config']['w_r']:g}, ρ {r['config']['rho']:g}, "
         f"band {band_text(r['run'].get('band', [])) or r['config']['matrix']}" for r, _, _ in pts],
        x_title=" / ".join(dict.fromkeys(f for _, f, _ in pts)) + " ↓",
        y_title=" / ".join(dict.fromkeys(k for _, _, k in pts)) + " ↑")


def on_show_history(session: Session):
    """The table and the scatter, after an edit (its row is added here, once), a comparison
    (its metrics go onto its edit's row) or an import."""
    edit = session.edit
    if edit is not None and edit.method == "grom" and not any(r["edit"]() is edit for r in history(session)):
        add_run(session, edit)
    attach_report(session)
    rows = history(session)
    return history_frame(rows), history_figure(rows)


@ui_errors
def on_history_select(evt: gr.SelectData, session: Session):
    """A click on a history row: its settings into the Edit panel."""
    rows = list(reversed(history(session)))  # as the table shows them
    i = row_index(evt)
    if not 0 <= i < len(rows):
        raise UserError("That row is gone (the history keeps the last 50 runs); click another.")
    return restore(rows[i]["config"], rows[i]["run"], session, f"run #{rows[i]['n']}")


def build_history_panel() -> SimpleNamespace:
    with gr.Accordion("Run history: every edit of this session", open=True, elem_id="history"):
        text.md(text.HISTORY, elem_classes="panel-intro")
        table = gr.Dataframe(label="Runs, the newest first (click a row to restore its settings)",
                             interactive=False, max_height=320, wrap=True, elem_id="history-table")
        note = gr.Markdown("", elem_id="restore-note")
        plot = gr.Plot(plots.empty_figure("Run edits: each compared run becomes a point here.", 320),
                       show_label=False, elem_id="history-plot")
    return SimpleNamespace(table=table, note=note, plot=plot)
