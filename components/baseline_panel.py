"""Compare with a baseline: train any method of the library's registry
(`grom.methods.METHODS`: GA, GradDiff, NPO, SimNPO, IDK, ... and whatever is registered),
or run a closed-form editor (`grom.methods.EDITORS`: ROME, MEMIT, AlphaEdit, ZeroUnlearn,
on GROM's band; `components.studio.comparators`), on the session's benchmark (a trained
method with OpenUnlearning's recipe for the benchmark) and put its
time of update and its metrics beside GROM's. The panel lists, labels and checks the
methods from their registry rows: a new method needs no change here.

The baseline trains the shared model in place under DEVICE_LOCK and gives it back bit for
bit; what it learned (an `Edit`, a patch of every trained parameter) is applied only while
its row is evaluated and not kept afterwards, so a session holds no model-sized copy. The
Base and Retain model rows (and
GROM's, when the last comparison fits) are reused, so a baseline costs its training and
one evaluation row.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components.server import pace
from components.server.allowed_sources import DEMO
from components.server.costs import check_job, evaluation_sets
from components.server.device import device_progress, local_progress
from components.server.durations import baseline_memory, training_work
from components.server.errors import ui_errors
from components.server.memory_budget import BUDGET, budget_bytes
from components.server.session import REGISTRY, ModelKey, Session, current_benchmark, current_model, in_turn
from components.studio.comparators import (
    band_note,
    box_values,
    check_gpu_time,
    check_request,
    comparator_choices,
    comparator_label,
    glossary,
    key_note,
    methods_line,
    row_of,
    train_comparator,
    unavailable,
)
from components.studio.comparison import (
    comparison_report,
    compute_report,
    examples_per_set,
    reference_for,
    shared_model,
)
from components.studio.history import FORGET, add_comparator_run
from components.studio.wiring import LOCAL, Page, device_queue, offer_files
from components.views import text
from components.views.tables import download_box, empty_table, format_metric, goal_arrow
from grom.eval.report import BASE, EDITED, REFERENCE
from grom.model.arch import num_layers
from grom.model.process_memory import release_memory

log = logging.getLogger(__name__)

DEFAULT_METHOD = "simnpo"
TIME_ROW, RATIO_ROW = "Time of update", "× GROM's time"
TRAIN_SHARE = 0.8  # of the progress bar; the evaluation takes the rest
# the columns of the table for TOFU-style benchmarks (others: every metric, Final score first)
TOFU_COLUMNS = ["Final score", "Forget ROUGE-L", "Forget fact recall", "Forget prob",
                "Forget truth ratio", "Forget quality", "Retain ROUGE-L", "Retain prob",
                "Model utility"]


def _model_name(key: ModelKey | None) -> str:
    key = key if key is not None else (REGISTRY.current.key if REGISTRY.current else None)
    return DEMO if key is None else key.name


def defaults_of(method: str, key: ModelKey | None = None) -> tuple[float, float]:
    """(rate, count) a run of `method` starts from on the model: its row's two boxes'
    defaults (a trained method's learning rate and epochs, fitted to the model's family; an
    editor's value optimisation's; LUNAR's fit's)."""
    count, rate = row_of(method).boxes(_model_name(key))[:2]
    return rate.default, count.default


def whose_default(method: str, key: ModelKey | None = None) -> str:
    """"this model's" where the method's boxes start from values fitted to the model (a trained
    method on the demo or SmolLM2), else the method's own ("ROME's", "LUNAR's")."""
    row = row_of(method)
    return "this model's" if row.boxes(_model_name(key)) != row.boxes(None) else f"{row.label}'s"


def default_note(value, default: float, whose: str = "this model's") -> str:
    """The line under a box: "this model's default" while it holds the default, else what
    the default is, so that a changed value is not called the default."""
    try:
        same = math.isclose(float(value), float(default), rel_tol=1e-9)
    except (TypeError, ValueError):
        same = False
    return f"{whose} default" if same else f"{whose} default: {default:g}"


def on_method_change(method: str, session: Session):
    """A new method (or model): its two boxes as its row labels them, at their defaults for
    the session's model (a trained method's learning rate and epochs, an editor's value
    optimisation's, LUNAR's fit's); each box's line says it holds the default, and whose."""
    count, rate = row_of(method).boxes(_model_name(session.model_key))[:2]
    whose = whose_default(method, session.model_key)
    return (gr.update(value=rate.default, label=rate.label, info=default_note(rate.default, rate.default, whose)),
            gr.update(value=count.default, label=count.label, info=default_note(count.default, count.default, whose)))


def on_setting_change(method: str, epochs, lr, session: Session):
    """Epochs or learning rate typed: each box's line says whether it still holds the
    default, and which that is (`default_note`)."""
    d_lr, d_epochs = defaults_of(method, session.model_key)
    whose = whose_default(method, session.model_key)
    return gr.update(info=default_note(epochs, d_epochs, whose)), gr.update(info=default_note(lr, d_lr, whose))


def training_kind(method: str) -> str:
    """The kind of work a trained method's run is to the host's pace (`components.server.pace`)."""
    return f"train:{method}"


def training_seconds(handle, bench, method: str, epochs) -> float | None:
    """Estimated seconds of `method`'s training on `bench` for `epochs` on `handle`'s model,
    at this host's pace now (its work counted by `durations.training_work`, priced by
    `pace.seconds`: the model's calibration, this method's measured pace, the CPU's load);
    None for a method that trains nothing (an editor, LUNAR) or a split it cannot train on."""
    if handle is None or bench is None or not bench.forget or not row_of(method).stepwise:
        return None
    try:
        return pace.seconds(handle, training_kind(method), training_work(handle, bench, method, epochs))
    except Exception:  # noqa: BLE001  (an estimate is a courtesy: the summary goes without one)
        log.warning("no training estimate for %s", method, exc_info=True)
        return None


def placeholder(key: ModelKey | None = None, bench=None) -> str:
    """The summary before any run; with the model loaded and a benchmark, the time an epoch
    of the default method (SimNPO) takes on it on this server now, and its default run's."""
    handle = REGISTRY.get(key) if key is not None else REGISTRY.current
    epoch = training_seconds(handle, bench, DEFAULT_METHOD, 1)
    epochs = defaults_of(DEFAULT_METHOD, handle.key if handle is not None else None)[1]
    run = training_seconds(handle, bench, DEFAULT_METHOD, epochs) if epoch is not None else None
    if epoch is None or run is None:
        return "Pick a method and press **Train the baseline and compare**."
    return (f"Pick a method and press **Train the baseline and compare** ({comparator_label(DEFAULT_METHOD)} here "
            f"now: about {_about(epoch)} per epoch, {epochs:g} epochs about {_about(run)}, at the pace this server "
            f"measured).{pace.queue_words()}")


def _about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def on_baseline_model(session: Session) -> str:
    """After a model load: the summary's first words for it (`placeholder`)."""
    return placeholder(session.model_key, session.benchmark)


def method_choices(bench=None) -> list[tuple[str, str]]:
    """The method box: every registered method, labelled "GA: what it does", then the
    closed-form editors; with the session's benchmark, those that cannot run on it greyed
    out ("⊘ ROME: not on this split")."""
    return comparator_choices(bench)


def method_note(method: str, bench=None) -> str:
    """The line beside the method box: the chosen method's glossary line and, where the
    split lacks what it needs, why it cannot run here."""
    note = glossary(method)
    why = unavailable(method, bench)
    return note + (f"\n\n⊘ **Not on this split.** {why}" if why else "")


def on_method_note(method: str, session: Session) -> str:
    """A method chosen: its glossary line (and why not, on this split)."""
    return method_note(method, session.benchmark)


def on_methods_for_data(method: str, session: Session):
    """New data (a benchmark or an imported run): the method box's choices with the methods
    it cannot serve greyed out, and the chosen method's note."""
    return gr.Dropdown(choices=method_choices(session.benchmark)), method_note(method, session.benchmark)


def check_data(tokenizer, bench, n, label: str) -> None:
    """A baseline reads the whole forget and retain sets (to train, or an editor's keys and
    covariance) and the comparison's evaluation examples: within the token limits
    (`components.server.costs`), before any training."""
    check_job(tokenizer, f"This {label} run", {"forget": bench.forget, "retain": bench.retain}
              | evaluation_sets(bench, n),
              "A baseline trains on the whole split: choose a smaller split, or evaluate fewer examples per set.")


def _part(progress, start: float, share: float):
    """`progress` for a stage from `start` to `start + share` of the bar (None stays None:
    on ZeroGPU no callback crosses into a GPU worker)."""
    if progress is None:
        return None
    return lambda f, m: progress(start + share * f, m)


def compute_baseline(key: ModelKey, bench, method: str, epochs: float, lr: float, grom_edit,
                     cached, n, progress):
    """Train the baseline (or run the editor on GROM's band; the model is given back as
    found), then the rows of the table: `cached` (a Report with Base, GROM's Edited and
    Retain model rows) or those rows computed now, and the baseline's row. Returns
    (baseline Edit, GROM report, baseline report). `progress`: a callback of this process.
    On ZeroGPU the training runs as GPU calls that each fit one (refused first only if one
    optimizer step cannot), its progress relayed; each report is one call."""
    check_gpu_time(key, bench, method, epochs)
    reference_for(shared_model(key, "baseline"), bench)  # loaded here: every worker forked next has it
    band = grom_edit.band if grom_edit is not None else None
    with paced_training(key, bench, method, epochs, progress):
        edit = train_comparator(key, bench, method, epochs, lr, band, _part(progress, 0.0, TRAIN_SHARE))
    rest = 1 - TRAIN_SHARE
    report = cached or comparison_report(shared_model(key, "baseline"), bench, grom_edit, n,
                                         device_progress(_part(progress, TRAIN_SHARE, rest / 2)))
    last = device_progress(_part(progress, TRAIN_SHARE + rest / 2, rest / 2))
    mine = compute_report(key, bench, edit, n, last, prior=report, prefix=False)
    return edit, report, mine


@contextmanager
def paced_training(key: ModelKey, bench, method: str, epochs: float, progress):
    """A trained method's training: its estimate said first (`progress`), its time recorded
    into the host's pace of its kind (`pace.timed`); an editor or LUNAR simply runs."""
    handle = REGISTRY.get(key)
    seconds = training_seconds(handle, bench, method, epochs)
    if seconds is None:
        yield
        return
    if progress is not None:
        progress(0.0, f"{comparator_label(method)}: about {_about(seconds)} of training here now")
    with pace.timed(handle, training_kind(method), training_work(handle, bench, method, epochs)):
        yield


def _ratio(seconds: float, grom_seconds: float | None) -> str:
    if grom_seconds is None or grom_seconds <= 0:
        return ""
    r = seconds / grom_seconds
    return f"{r:.0f}×" if r >= 10 else f"{r:.1f}×"


def table_frame(rows: list[tuple[str, dict, float | None]], grom_seconds: float | None,
                task: str) -> pd.DataFrame:
    """The models as columns (Base, GROM, the baseline, Retain model), as in the comparison
    above; the time of update, its ratio to GROM's and the metrics as rows. `rows`: (name,
    metrics, seconds of its update or None) per model."""
    present = {m for _, metrics, _ in rows for m in metrics}
    if task == "tofu" and sum(m in present for m in TOFU_COLUMNS) >= 3:
        metrics = [m for m in TOFU_COLUMNS if m in present]
    else:
        metrics = (["Final score"] if "Final score" in present else []) + sorted(
            m for m in present if m != "Final score")
    out = pd.DataFrame({"metric": [TIME_ROW, RATIO_ROW] + metrics})
    for name, values, seconds in rows:
        out[name] = (["" if seconds is None else f"{seconds:.1f} s",
                      "" if seconds is None else _ratio(seconds, grom_seconds)]
                     + [format_metric(values.get(m)) for m in metrics])
    out["goal"] = ["↓", "↓"] + [goal_arrow(m) for m in metrics]
    return out


def styled(frame: pd.DataFrame, method_label: str):
    """The time rows in bold, GROM's column in the page's violet, the baseline's in orange."""
    styler = frame.style.apply(lambda row: ["font-weight: 700" if row["metric"] in (TIME_ROW, RATIO_ROW)
                                            else "" for _ in row], axis=1)
    for name, colour in (("GROM", "#5f3dc4"), (method_label, "#d9480f")):
        if name in frame.columns:
            styler = styler.set_properties(subset=[name], **{"color": colour, "font-weight": "600"})
    return styler


NOT_FORGOTTEN = 0.10  # a forget metric that fell by less than this share of its base value: not forgotten


def forgetting(base: dict, mine: dict) -> tuple[str, float, float] | None:
    """(the forget metric, its base value, the baseline's) for the first forget metric both
    rows have (fact recall first: what the card counts), or None."""
    name = next((m for m in FORGET if m in base and m in mine), None)
    return None if name is None else (name, float(base[name]), float(mine[name]))


def did_not_forget(base: dict, mine: dict) -> str:
    """A plain line where the baseline did not forget (its forget metric fell by less than
    NOT_FORGOTTEN of the base value, or rose), else ""."""
    found = forgetting(base, mine)
    if found is None:
        return ""
    name, b, a = found
    if b <= 0 or a < b * (1 - NOT_FORGOTTEN):
        return ""
    moved = "rose" if a > b else "barely moved"
    return (f"⚠ It did not forget: {name} {moved}, {b:.3f} → {a:.3f}. Its time is not a comparison "
            "with an edit that did: raise the learning rate or the epochs, or read it as a failed run.")


def held_note(held: int, device: str) -> str:
    """What the training held between its turns on the device, against what jobs may hold."""
    if not held:
        return ""
    return (f"\n\nIt held about {held / 2**30:.1f} GB between its turns on the device (its estimate: trained "
            f"weights, gradients and AdamW's moments), of the {budget_bytes(device) / 2**30:.1f} GB this server "
            "lets its jobs hold at once (GROM_JOBS_MEMORY_MB).")


def summary_md(method: str, values: dict, edit, grom_seconds: float | None, finals: dict,
               n, grom_note: str, failed: str = "", moved: str = "") -> str:
    """The run's summary: what it did in its row's words (`MethodEntry.describe`, with the
    boxes' `values`), its time beside GROM's, the final scores; `moved`: why an editor ran
    off GROM's band (`band_note`) and how many facts keyed on the question's last token
    (`key_note`), else empty."""
    row = row_of(method)
    label = row.label
    t = edit.timings.get("total", edit.timings.get("train", 0.0))
    head = (row.describe(edit, values) if row.describe else f"**{label}**") + \
        f": updated the weights in **{t:.1f} s**"
    if failed:
        head += f". {failed}"
        head += (f" (GROM's edit took {grom_seconds:.1f} s.)" if grom_seconds else
                 " Press **Run edit** to put GROM's time and metrics beside it.")
    elif grom_seconds:
        r = t / grom_seconds
        times = f"{r:.0f}" if r >= 10 else f"{r:.1f}"
        head += (f"; GROM's edit took **{grom_seconds:.1f} s**, so {label} took **{times}×** as "
                 f"long{grom_note}.")
    else:
        head += ". Press **Run edit** to put GROM's time and metrics beside it."
    if finals:
        head += " Final score: " + " · ".join(f"{k} **{v:.3f}**" for k, v in finals.items()) + "."
    size = "all examples" if n is None else f"up to {n} examples per set"
    return head + f" Evaluated on {size}; the shared model's weights are unchanged." + moved


def _cached_report(session: Session, bench, grom_edit, n):
    """The session's last comparison when it was made for this benchmark, edit and size."""
    for report, made_for in ((session.report, session.report_for),
                             session.extra.get("baseline_grom_report", (None, None))):
        if report is not None and made_for is not None and made_for[0] is bench \
                and made_for[1] is grom_edit and made_for[2] == n:
            return report
    return None


@ui_errors
def on_run_baseline(method: str, epochs: float, lr: float, max_examples: int, full_set: bool,
                 session: Session, progress=gr.Progress()):
    """Train a gradient baseline on the session's benchmark and compare it with GROM:
    a summary (times and their ratio) and the table Base / GROM / method / Retain model."""
    handle = current_model(session)
    bench = current_benchmark(session)
    n = examples_per_set(max_examples, full_set, bench)
    row, epochs, lr = check_request(method, bench, epochs, lr)
    method, label = row.name, row.label
    check_data(handle.tokenizer, bench, n, label)
    grom = session.edit if session.edit is not None and session.edit_for == handle.key else None
    cached = _cached_report(session, bench, grom, n)
    held = baseline_memory(handle.key, bench, method, epochs)
    with BUDGET.reserved(held, f"{label}'s training", handle.key.device):  # held between its turns
        edit, report, mine = compute_baseline(handle.key, bench, method, epochs, lr, grom, cached, n,
                                              local_progress(lambda f, m: progress(f, desc=m)))
    values = box_values(row, epochs, lr)
    add_comparator_run(session, method, label, values, edit.timings.get("total", edit.timings.get("train", 0.0)),
                       mine, band=edit.band if row.on_grom_band else None)
    if cached is None and grom is not None:
        session.extra["baseline_grom_report"] = (report, (bench, grom, n))
    grom_seconds = grom.timings.get("total") if grom is not None else None
    seconds = edit.timings.get("total", edit.timings.get("train"))
    rows = [("Base", mine.rows[BASE].metrics, None)]
    if grom is not None:
        rows.append(("GROM", report.rows[EDITED].metrics, grom_seconds))
    rows.append((label, mine.rows[EDITED].metrics, seconds))
    if REFERENCE in mine.rows:
        rows.append(("Retain model", mine.rows[REFERENCE].metrics, None))
    finals = {name: m["Final score"] for name, m, _ in rows if "Final score" in m}
    inputs = session.extra.get("edit_inputs")
    note = ("" if grom is None or inputs is None or inputs[0] is bench.forget
            else " (GROM's edit was made for another forget set: run it again to compare on this one)")
    failed = did_not_forget(mine.rows[BASE].metrics, mine.rows[EDITED].metrics)
    depth = num_layers(handle.model)
    # the band its settings took from GROM's (an editor moves off a band that ends at the top layer)
    ran_on = row.settings_for(handle.model, bench, values, grom.band).layers if row.on_grom_band and grom else None
    moved = band_note(ran_on, grom.band, depth) if ran_on else ""
    moved += key_note(edit.info)
    out = (summary_md(method, values, edit, grom_seconds, finals, n, note, failed, moved)
           + held_note(held, handle.key.device),
           styled(table_frame(rows, grom_seconds, mine.task), label))
    del edit, mine  # the baseline's patch of every trained matrix is not kept: give its memory back
    release_memory()
    return out


def build_baseline_panel() -> SimpleNamespace:
    """The accordion's widgets: method, epochs, learning rate, the method's note, Run; the
    summary and table."""
    with gr.Accordion(f"Compare with a baseline: {methods_line()}", open=False,
                      elem_id="baseline-panel"):
        text.md(text.BASELINE, elem_classes="panel-intro")
        with gr.Row(equal_height=True):
            method = gr.Dropdown(method_choices(), value=DEFAULT_METHOD, label="Method", scale=3, min_width=220,
                                 info="OpenUnlearning's losses")
            start_lr, start_epochs = defaults_of(DEFAULT_METHOD)
            epochs = gr.Number(value=start_epochs, label="Epochs", scale=1, min_width=110, info=default_note(0, 0))
            lr = gr.Number(value=start_lr, label="Learning rate", scale=1, min_width=140, info=default_note(0, 0))
        note = gr.Markdown(method_note(DEFAULT_METHOD), elem_id="baseline-method-note")
        gr.Markdown(text.BASELINE_RECIPE, elem_classes="panel-intro baseline-recipe")
        run = gr.Button("Train the baseline and compare", variant="primary", elem_id="baseline-run")
        summary = gr.Markdown(placeholder(), elem_id="baseline-summary")
        table = gr.Dataframe(empty_table("baseline"), label="Time of update and metrics: Base, GROM, the baseline",
                             interactive=False, wrap=True, max_height=540, elem_id="baseline-table")
        files = download_box("the baseline table")
    return SimpleNamespace(method=method, epochs=epochs, lr=lr, note=note, run=run, summary=summary, table=table,
                           files=files)


def wire(bl: SimpleNamespace, page: Page) -> None:
    """The method (its defaults and glossary line), the epochs and lr boxes, Train the baseline
    and compare (public `run_baseline`; sets `page.baseline_trained`); a new model or run: its
    defaults; new data: the methods its split allows."""
    s, c = page.session, page.ui.compare
    bl.method.change(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)
    bl.method.change(on_method_note, [bl.method, s], bl.note, **LOCAL)  # its glossary line
    for box in (bl.epochs, bl.lr):  # typed: each box's line says whether it holds the model's default
        box.input(on_setting_change, [bl.method, bl.epochs, bl.lr, s], [bl.epochs, bl.lr], show_progress="hidden",
                  **LOCAL)
    page.baseline_trained = bl.run.click(in_turn(on_run_baseline), [bl.method, bl.epochs, bl.lr, c.max_examples,
                                                                    c.full_set, s],
                                         [bl.summary, bl.table], api_name="run_baseline", show_progress_on=bl.table,
                                         **device_queue())
    offer_files(bl.table, bl.files, "baseline")
    page.model_loaded.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)  # the new model's defaults
    page.model_loaded.success(on_baseline_model, s, bl.summary, **LOCAL)  # its time per epoch, not the last model's
    for done in page.run_opened:  # the run's model's defaults (SmolLM2's, not the generic ones built with)
        done.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)
    page.link_pasted.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)  # (as before: twice)
    # new data: editors greyed out or not (an opened or imported run's split may lack what they need)
    for done in (page.data_loaded, *page.run_opened, page.run_imported):
        done.success(on_methods_for_data, [bl.method, s], [bl.method, bl.note], **LOCAL)
