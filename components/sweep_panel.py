"""Sweeps: the session's edit run again at several values of one setting (beta or c, w_r,
rho, or the band), each point scored by the mean probability of the gold answer on small
forget and retain evaluation subsets. A click on a point's row puts its settings into the
Edit panel (`components.history_panel.restore`).
"""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pandas as pd

from components.server.costs import EDIT_ADVICE, check_job
from components.server.device import DEVICE_LOCK, device_progress, give_turn, kept_cache, local_progress, on_device
from components.server.durations import sweep_point_s
from components.server.errors import UserError, shorten, ui_errors
from components.server.session import (
    ModelKey,
    Session,
    current_benchmark,
    current_edit,
    current_model,
    in_turn,
    resident,
)
from components.server.validate import RANGES, check_range, parse_band
from components.studio.edits import trim_stream_cache
from components.studio.form import RESTORED, widgets
from components.studio.history import add_row, restore, row_index
from components.studio.runs import band_text
from components.studio.wiring import LOCAL, Page, device_queue, offer_files
from components.views import plots, text
from components.views.tables import download_box, empty_table
from grom import run_edit
from grom.eval import answer_probabilities
from grom.model.arch import num_layers

MAX_POINTS = 8  # edits per sweep (each is a full edit of the band)
SWEEP_EXAMPLES = 40  # forget and retain examples scored per point
PARAMS = {"beta": "β (or c)", "w_r": "w_r", "rho": "ρ", "band": "band"}  # c: the corruption target
FORGET_SETS = ("forget", "knowmem_forget", "verbmem_forget")
RETAIN_SETS = ("retain", "neighbours", "general", "knowmem_retain", "real_authors", "world_facts")


def _qa_subset(examples, n: int) -> tuple:
    qa = [ex for ex in examples if hasattr(ex, "question") and hasattr(ex, "answer")]
    if not qa:
        raise UserError("The sweep scores question/answer examples, and this benchmark's "
                        "evaluation sets have none.")
    idx = np.linspace(0, len(qa) - 1, min(n, len(qa))).round().astype(int)
    return tuple(qa[i] for i in sorted(set(idx)))


def eval_subsets(bench) -> tuple[str, tuple, str, tuple]:
    """(forget set name, its examples, retain set name, its examples) the points are scored on:
    the benchmark's evaluation sets, never the retain examples the edit took keys from."""
    sets = dict(bench.eval_sets) or {"forget": bench.forget, "retain": bench.retain}
    f = next((n for n in FORGET_SETS if n in sets), None)
    r = next((n for n in RETAIN_SETS if n in sets), None)
    if f is None or r is None:
        raise UserError(f"This benchmark has no forget and retain evaluation sets to score a sweep on "
                        f"(it has: {', '.join(sets)}).")
    return f, _qa_subset(sets[f], SWEEP_EXAMPLES), r, _qa_subset(sets[r], SWEEP_EXAMPLES)


def sweep_values(param: str, values: str, config, band: list[int], n_layers: int) -> list:
    """The values to try: typed ("50, 100, 200"; bands "2-4; 3-5; 4"), or, left empty, five
    around the current one (x / 4 .. x * 4) or every window of the band's width. Sorted,
    distinct, at most MAX_POINTS."""
    values = (values or "").strip()
    if param == "band":
        if config.matrix == "lm_head":
            raise UserError("The LM head is one matrix: there is no band to sweep. Sweep β, w_r or ρ.")
        if values:
            out = [parse_band(part, n_layers) for part in re.split(r"[;|]", values) if part.strip()]
        else:
            w = len(band)
            out = [tuple(range(a, a + w)) for a in range(max(0, band[0] - 3), min(n_layers - w, band[0] + 3) + 1)]
        out = sorted(set(out))
    else:
        name = "c" if param == "c" else param
        if values:
            parts = [p for p in re.split(r"[,;\s]+", values) if p]
            out = []
            for p in parts:
                try:
                    out.append(float(p))
                except ValueError:
                    raise UserError(f"{shorten(p)!r} is not a number: type values such as 50, 100, 200.") from None
            out = [check_range(name, v) for v in out]
        else:
            current = getattr(config, name)
            lo, hi = RANGES[name]
            out = [current if j == 0 else min(hi, max(lo, float(f"{current * 2.0 ** j:.4g}")))
                   for j in (-2, -1, 0, 1, 2)]
        if name == "rho" and any(v <= 0 for v in out):
            raise UserError("ρ must be above 0 (the ridge keeps A invertible).")
        out = sorted(set(out))
    if not out:
        raise UserError("Type the values to try, e.g. 50, 100, 200 (bands: 2-4; 3-5).")
    if len(out) > MAX_POINTS:
        raise UserError(f"A sweep runs at most {MAX_POINTS} edits; {len(out)} values were given. Type fewer.")
    return out


@on_device(duration=sweep_point_s)
def sweep_point(key: ModelKey, forget, retain, config, f_eval, r_eval, fmt, progress, current=None):
    """(p forget, p retain, seconds) of one point: the unedited model where `config` is
    None, else the edit of `config` (`current`, the session's Edit, where it was made with
    that config: reused, not solved again) applied while scoring. One GPU call per point,
    so that a sweep of any length fits ZeroGPU's limit on one call."""
    progress = progress or (lambda f, m: None)
    with DEVICE_LOCK:
        handle = resident(key, "sweep")
        model, tok = handle.model, handle.tokenizer

        def probs():
            return (float(answer_probabilities(model, tok, f_eval, prompt_format=fmt).mean()),
                    float(answer_probabilities(model, tok, r_eval, prompt_format=fmt).mean()))

        if config is None:
            return (*probs(), 0.0)
        t0 = time.perf_counter()
        if current is not None:
            edit, seconds = current, float(current.timings.get("total", 0.0))
        else:
            cache = kept_cache(handle.stream_cache)
            edit = run_edit(model, tok, forget, retain, config, progress=progress, stream_cache=cache,
                            between=give_turn)
            seconds = time.perf_counter() - t0
            trim_stream_cache(cache)
        progress(0.9, "scoring")
        with edit.applied(model):
            return (*probs(), seconds)


def _sweep(key: ModelKey, forget, retain, configs, f_eval, r_eval, fmt, progress, current=None):
    """[(p forget, p retain, seconds)] for the unedited model and each config, a
    `sweep_point` call each; `current`, (the session's edit, its config as the sweep
    writes it), is reused for that config instead of being solved again."""
    progress = progress or (lambda f, m: None)
    n = len(configs)
    progress(0.0, "scoring the unedited model")
    out = [sweep_point(key, forget, retain, None, f_eval, r_eval, fmt, None)]
    for i, config in enumerate(configs):
        def step(f, msg, i=i):
            progress((i + 0.9 * f) / n, f"point {i + 1} of {n}: {msg}")

        step(0.0, "edit")
        same = current is not None and config == current[1]
        out.append(sweep_point(key, forget, retain, config, f_eval, r_eval, fmt,
                               device_progress(step), current[0] if same else None))
    progress(1.0, "done")
    return out


def _label(param: str, value) -> str:
    return band_text(value) if param == "band" else f"{value:g}"


@ui_errors
def on_sweep(param: str, values: str, session: Session, progress=gr.Progress()):
    """Edits at each value of `param` on the session's edit's settings (its band, data and
    seed); returns the plot, the table of points (click one to restore it) and a note."""
    handle = current_model(session)
    edit = current_edit(session)
    bench = current_benchmark(session)
    if param not in PARAMS:
        raise UserError(f"Sweep one of: {', '.join(PARAMS)}.")
    base = edit.settings.replace(layers=tuple(edit.band) or None, keep_keys=False)
    if param == "beta" and base.target == "corruption":
        param = "c"
    vals = sweep_values(param, values, base, edit.band, num_layers(handle.model))
    configs = [base.replace(layers=tuple(v)) if param == "band" else base.replace(**{param: v}) for v in vals]
    f_name, f_eval, r_name, r_eval = eval_subsets(bench)
    forget, retain = session.extra.get("edit_inputs", (bench.forget, bench.retain))
    check_job(handle.tokenizer, "This sweep", {"forget": forget, "retain": retain, f"evaluation {f_name}": f_eval,
                                               f"evaluation {r_name}": r_eval}, EDIT_ADVICE)
    res = _sweep(handle.key, forget, retain, configs, f_eval, r_eval, bench.prompt_format,
                 local_progress(lambda f, m: progress(f, desc=m)), current=(edit, base))
    run = dict(edit.run)
    points = [None] + [(c.to_dict(), run | ({"band": list(v), "band_mode": "manual", "k": len(v)}
                                            if param == "band" else {"band": list(edit.band)}))
                       for c, v in zip(configs, vals)]
    session.extra["sweep"] = points
    for point, (pf, pr, seconds), config in zip(points[1:], res[1:], configs):
        if config != base:  # the session's own edit has its row already
            add_row(session, point[0], point[1], seconds, source="sweep",
                    metrics={"Sweep p(forget)": pf, "Sweep p(retain)": pr})
    shown = {"beta": "β", "c": "c", "w_r": "w_r", "rho": "ρ", "band": "band"}[param]
    labels = ["base (no edit)"] + [f"{shown} {_label(param, v)}" for v in vals]
    frame = pd.DataFrame({"point": labels,
                          f"p(answer), {f_name}": [round(p, 4) for p, _, _ in res],
                          f"p(answer), {r_name}": [round(p, 4) for _, p, _ in res],
                          "edit s": [round(s, 1) if i else "" for i, (_, _, s) in enumerate(res)]})
    current = next((i + 1 for i, c in enumerate(configs) if c == base), None)
    fig = plots.plot_sweep(labels, [p for p, _, _ in res], [p for _, p, _ in res], f_name, r_name,
                           current=current)
    note = (f"{len(vals)} edits of {bench.name}/{bench.split}, each scored on {len(f_eval)} {f_name} and "
            f"{len(r_eval)} {r_name} examples by the mean probability of the gold answer (teacher-"
            "forced): lower on the forget side is more forgotten, higher on the retain side is more "
            "kept. Click a row to put its settings into the Edit panel.")
    return fig, frame, note


@ui_errors
def on_sweep_select(evt: gr.SelectData, session: Session):
    """A click on a sweep point: its settings into the Edit panel."""
    points = session.extra.get("sweep") or []
    i = row_index(evt)
    if not 0 <= i < len(points):
        raise UserError("Run a sweep first.")
    if points[i] is None:
        raise UserError("That point is the unedited model: there are no settings to restore. "
                        "Click an edited point.")
    config, run = points[i]
    return restore(config, run, session, f"sweep point {i}")


def on_edit_made():
    """A new edit: the sweep plot says the next step (a sweep varies this edit)."""
    return plots.empty_figure("Pick a setting and its values (or none: five around this edit's), "
                              "then press Sweep.", 320)


def build_sweep_panel() -> SimpleNamespace:
    with gr.Accordion("Sweep one setting: β, w_r, ρ or the band", open=True, elem_id="sweep"):
        text.md(text.SWEEP)
        with gr.Row(equal_height=True, elem_id="sweep-row"):
            param = gr.Dropdown([(label, name) for name, label in PARAMS.items()], value="beta",
                                label="Setting", scale=1, min_width=140)
            values = gr.Textbox(label=f"Values (at most {MAX_POINTS}; empty: five around the current one)",
                                placeholder="e.g. 50, 100, 200   ·   bands: 2-4; 3-5; 4", scale=3,
                                min_width=200)
        button = gr.Button("Sweep", elem_id="sweep-button")
        plot = gr.Plot(plots.empty_figure("Run an edit, then Sweep.", 320), show_label=False,
                       elem_id="sweep-plot")
        note = gr.Markdown("", elem_id="sweep-note")
        table = gr.Dataframe(empty_table("sweep"), label="Points (click a row to restore its settings)",
                             interactive=False, max_height=280, elem_id="sweep-table")
        files = download_box("the sweep's points")
    return SimpleNamespace(param=param, values=values, button=button, plot=plot, note=note, table=table,
                           files=files)


def wire(w: SimpleNamespace, page: Page) -> None:
    """Sweep (public `sweep`; sets `page.swept`), a row restoring the Edit panel, the sweep's
    next step after each edit, its files."""
    s, ui = page.session, page.ui
    page.edit_run.success(on_edit_made, None, w.plot, **LOCAL)  # the sweep's next step
    w.table.select(on_sweep_select, s, widgets(ui.edit, ui.layers, RESTORED) + [w.note], **LOCAL)
    page.swept = w.button.click(in_turn(on_sweep), [w.param, w.values, s], [w.plot, w.table, w.note],
                                api_name="sweep", **device_queue())
    offer_files(w.table, w.files, "sweep")
