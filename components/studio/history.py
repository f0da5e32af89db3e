"""The session's run history as data: one row per edit (settings, band, time, and its
comparison's headline metrics), one per baseline or editor run of Compare (its method as
the row's source, its settings, time and evaluation), and the widget values that restore a
GROM row.

A row's "method" is "grom" for GROM's edits and sweep points, else the comparator's
registry name; only a GROM row holds an EditConfig (as a dict) in its "config" and can go
back into the Edit form. A session keeps at most `MAX_ROWS` rows of settings and metrics (never patches) in
`session.extra["history"]`."""
from __future__ import annotations

import time
import weakref

import gradio as gr

from components.server.session import REGISTRY, Session
from components.studio.form import hidden_differences, restore_values
from components.studio.runs import band_text, portable_model_name
from grom.eval.report import EDITED
from grom.model.arch import num_layers

MAX_ROWS = 50


# the metrics a row shows, where its comparison has them: the headline, then what should go
# down on the forget side and stay on the retain side (each task's `Task.retain_metrics`, grom/tasks/)
HEADLINE = ("Knowledge score", "Final score")


FORGET = ("Forget fact recall", "KnowMem forget", "Forget accuracy", "Efficacy", "Forget ROUGE-L")


KEPT = ("Kept fact recall", "Retain fact recall", "KnowMem retain", "Utility accuracy", "Specificity",
        "Retain ROUGE-L")


def history(session: Session) -> list[dict]:
    return session.extra.setdefault("history", [])


def add_run(session: Session, edit, source: str = "edit") -> None:
    """A row for `edit` (just made, or imported): settings, band and time; metrics follow
    from its comparison (`attach_report`)."""
    add_row(session, edit.settings.to_dict(), dict(edit.run), float(edit.timings.get("total", 0.0)),
            source=source, edit=edit)


def add_row(session: Session, config: dict, run: dict, seconds: float, *, source: str,
            metrics: dict | None = None, edit=None, method: str = "grom") -> None:
    """A row of settings (an EditConfig as a dict and its run; for another `method`, its
    own settings), time and metrics; `edit`, when given, is held weakly so that its
    comparison's metrics can find the row."""
    rows = history(session)
    number = (rows[-1]["n"] + 1) if rows else 1
    rows.append({"n": number, "time": time.strftime("%H:%M:%S"), "source": source, "method": method,
                 "config": config, "run": run, "seconds": seconds, "metrics": dict(metrics or {}),
                 "edit": weakref.ref(edit) if edit is not None else (lambda: None)})
    del rows[:-MAX_ROWS]


def add_comparator_run(session: Session, name: str, label: str, settings: dict, seconds: float, report,
                       band=None) -> None:
    """A row for a baseline or editor run of Compare on the session's benchmark: `label` as
    its source, `settings` ({"epochs", "lr"}; for an editor the value optimisation's steps
    and lr) as its config, its time of update, and the headline metrics of `report`'s
    Edited row (its own evaluation); `band`: the layers an editor edited."""
    benchmark, _, split = (session.bench_label or "").partition("/")
    model = portable_model_name(session.model_key.name) if session.model_key is not None else None
    run = {"model": model, "benchmark": benchmark, "split": split, "band": list(band or [])}
    add_row(session, dict(settings), run, float(seconds), source=label, method=name,
            metrics=headline_metrics(report))


def is_grom(row: dict) -> bool:
    return row.get("method", "grom") == "grom"


def comparator_settings(row: dict) -> str:
    """A comparator row's settings in words: "1 epoch, lr 0.001" or "25 value steps, lr 0.1"."""
    c = row["config"]
    if "value_steps" in c:
        return f"{c['value_steps']:g} value steps, lr {c['value_lr']:g}"
    return f"{c['epochs']:g} epoch{'' if c['epochs'] == 1 else 's'}, lr {c['lr']:g}"


def not_restorable(row: dict) -> str:
    """Why a comparator row does not go back into the Edit form, and how to run it again."""
    return (f"Run #{row['n']} is a **{row['source']}** run ({comparator_settings(row)}), not a GROM edit: the Edit "
            f"form holds GROM's settings (β, w_r, ρ, band), which {row['source']} does not have, so nothing was "
            f"restored. To run it again, choose {row['source']} under **Compare with a baseline**.")


def bench_of(row: dict) -> str:
    return f"{row['run'].get('benchmark', '?')}/{row['run'].get('split', '?')}"


def shown_rows(session: Session) -> tuple[list[dict], int]:
    """The rows the history shows, the newest first: those of the loaded benchmark (their
    metrics share columns; another benchmark's do not), and how many others it keeps."""
    rows = history(session)
    label = session.bench_label
    mine = [r for r in rows if not label or bench_of(r) == label]
    return list(reversed(mine)), len(rows) - len(mine)


# the counts a row shows where its comparison has facts, by the card's rule (`grom.eval.verdicts`):
# per set, the columns of the facts the unedited model knew, of those forgotten, and broken
COUNTED = {"forget": ("Known", "Forgot", "Broke"), "probes": ("Probes known", "Probes forgot", "Probes broke")}


def headline_metrics(report) -> dict[str, float]:
    """The row's metrics of the Edited model: the headline, one forget and one retain
    metric, the retain cost, and the facts the unedited model knew of the forget set and
    the held-out probes, with how many of them it forgot and how many broke
    (`Report.tallies`, the card's counts), as the report has them."""
    m = report.rows[EDITED].metrics
    out = {}
    for names in (HEADLINE, FORGET, KEPT):
        name = next((n for n in names if n in m), None)
        if name is not None:
            out[name] = float(m[name])
    if "Retain cost" in m:
        out["Retain cost"] = float(m["Retain cost"])
    found = report.tallies() if hasattr(report, "tallies") else {}
    for name, (known, forgot, broke) in COUNTED.items():
        if name in found:
            out |= {known: found[name].known, forgot: found[name].forgot, broke: found[name].broke}
    return out


def attach_report(session: Session) -> None:
    """The session's last comparison's metrics, onto the row of the edit it compared."""
    if session.report is None or session.report_for is None:
        return
    compared = session.report_for[1]
    for row in history(session):  # a baseline's or sweep point's row holds no edit: never matched
        if compared is not None and row["edit"]() is compared:
            row["metrics"] = headline_metrics(session.report)


def beta_text(config: dict) -> str:
    return f"{config['beta']:g}" + (" rel." if config["beta_relative"] else "")


def restore_note(config: dict, run: dict, session: Session, what: str, with_edit: bool = False) -> str:
    """Where the restored settings came from, and what they cannot bring back; with
    `with_edit` the edit itself came back too (an import, a link), so nothing asks to run it."""
    note = (f"Restored {what}: β {beta_text(config)}, w_r {config['w_r']:g}, ρ {config['rho']:g}, "
            f"band {band_text(run.get('band') or []) or config['matrix']} ({run.get('band_mode', 'manual')}).")
    if not with_edit:
        note += " Press **Run edit** to run it again."
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


def restore(config: dict, run: dict, session: Session, what: str, with_edit: bool = False) -> list:
    """The widget values (`form.RESTORED` order) and the note for a restored run, every value
    checked against the session's model as a typed one is (a band it does not have, a seed
    or a budget the widgets cannot hold is refused with a message)."""
    handle = REGISTRY.get(session.model_key) if session.model_key is not None else None
    n_layers = num_layers(handle.model) if handle is not None else None
    return restore_values(config, run, n_layers) + [restore_note(config, run, session, what, with_edit)]


def row_index(evt: gr.SelectData) -> int:
    return evt.index[0] if isinstance(evt.index, (list, tuple)) else int(evt.index)
