"""Run history (under Edit details): the session's run history (one row per edit: its settings, band, time and
the headline metrics of its comparison), a forget-against-retain scatter of the runs, and
sweeps over beta (or c), w_r, rho or the band. A click on a history or sweep row puts its
settings back into the Edit panel.

A session keeps at most `MAX_ROWS` rows of settings and metrics (never patches) in
`session.extra["history"]`, and the last sweep's points in `session.extra["sweep"]`.
"""
from __future__ import annotations

import time
import weakref
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components import plots, text
from components.errors import ui_errors
from components.runs import band_text, hidden_differences, portable_model_name, widget_values
from components.session import Session, UserError

MAX_ROWS = 50
# the metrics a row shows, where its comparison has them: the headline, then what should go
# down on the forget side and stay on the retain side (grom/eval/report.py RETAIN_METRICS)
HEADLINE = ("Knowledge score", "Final score")
FORGET = ("Forget fact recall", "KnowMem forget", "Forget accuracy", "Efficacy", "Forget ROUGE-L")
KEPT = ("Kept fact recall", "Retain fact recall", "KnowMem retain", "Utility accuracy", "Specificity",
        "Retain ROUGE-L")


def history(session: Session) -> list[dict]:
    return session.extra.setdefault("history", [])


def add_run(session: Session, edit, source: str = "edit") -> None:
    """A row for `edit` (just made, or imported): settings, band and time; metrics follow
    from its comparison (`attach_report`)."""
    rows = history(session)
    number = (rows[-1]["n"] + 1) if rows else 1
    rows.append({"n": number, "time": time.strftime("%H:%M:%S"), "source": source,
                 "config": edit.config.to_dict(), "run": dict(edit.run),
                 "seconds": float(edit.timings.get("total", 0.0)), "metrics": {},
                 "edit": weakref.ref(edit)})
    del rows[:-MAX_ROWS]


def headline_metrics(report) -> dict[str, float]:
    """The row's metrics of the Edited model: the headline, one forget and one retain
    metric, and the retain cost, as the report has them."""
    from grom.eval.report import EDITED

    m = report.rows[EDITED].metrics
    out = {}
    for names in (HEADLINE, FORGET, KEPT):
        name = next((n for n in names if n in m), None)
        if name is not None:
            out[name] = float(m[name])
    if "Retain cost" in m:
        out["Retain cost"] = float(m["Retain cost"])
    return out


def attach_report(session: Session) -> None:
    """The session's last comparison's metrics, onto the row of the edit it compared."""
    if session.report is None or session.report_for is None:
        return
    compared = session.report_for[1]
    for row in history(session):
        if row["edit"]() is compared:
            row["metrics"] = headline_metrics(session.report)


def _beta(config: dict) -> str:
    return f"{config['beta']:g}" + (" rel." if config["beta_relative"] else "")


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


def show_history(session: Session):
    """The table and the scatter, after an edit (its row is added here, once), a comparison
    (its metrics go onto its edit's row) or an import."""
    edit = session.edit
    if edit is not None and edit.method == "grom" and not any(r["edit"]() is edit for r in history(session)):
        add_run(session, edit)
    attach_report(session)
    rows = history(session)
    return history_frame(rows), history_figure(rows)


def restore_note(config: dict, run: dict, session: Session, what: str) -> str:
    """Where the restored settings came from, and what they cannot bring back."""
    note = (f"Restored {what}: β {_beta(config)}, w_r {config['w_r']:g}, ρ {config['rho']:g}, "
            f"band {band_text(run.get('band') or []) or config['matrix']} ({run.get('band_mode', 'manual')})."
            " Press **Run edit** to run it again.")
    label = f"{run.get('benchmark')}/{run.get('split')}"
    if run.get("benchmark") and label != session.bench_label:
        note += f" It ran on **{label}**; **{session.bench_label or 'no benchmark'}** is loaded."
    if session.model_key is not None and run.get("model") not in (None, portable_model_name(session.model_key.name)):
        note += f" It ran on the model **{run['model']}**, not the one loaded."
    hidden = hidden_differences(config)
    if hidden:
        note += (f" Its preset ({run.get('preset')}) also set {', '.join(hidden)}, which no widget "
                 "holds: choose that preset to get it back.")
    return note


def restore(config: dict, run: dict, session: Session, what: str) -> list:
    return widget_values(config, run) + [restore_note(config, run, session, what)]


def row_index(evt: gr.SelectData) -> int:
    return evt.index[0] if isinstance(evt.index, (list, tuple)) else int(evt.index)


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
    from components.sweep_panel import build_sweep_panel

    sweep = build_sweep_panel()
    return SimpleNamespace(table=table, note=note, plot=plot, sweep=sweep)
