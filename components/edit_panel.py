"""Edit panel: presets, the hyperparameters (log sliders with exact number boxes), the
target and matrix, Run with staged progress, the timings and patch norms, Reset.

The widgets are the fields `components.studio.form` declares (by the same names): the
form turns their values into an `EditConfig` and back.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import gradio as gr

from components.server.device import device_progress
from components.server.errors import ui_errors
from components.server.fit_check import check_run, device_free_bytes, plan_markdown, plan_run
from components.server.session import SESSIONS, Session, current_benchmark, current_model, in_turn
from components.server.validate import check_examples, check_seed, retain_subset
from components.studio import form
from components.studio.benchmarks import check_choice
from components.studio.edits import compute_edit, scores_key
from components.studio.form import (
    DEFAULT_RETAIN_EXAMPLES,
    LOG_SLIDERS,
    MATRICES,
    RETAIN_EXAMPLES_FOR,
    TARGETS,
    preset_choices,
)
from components.studio.runs import portable_model_name, run_record
from components.studio.wiring import LOCAL, Page, device_queue
from components.views import plots, text
from components.views.card import SCROLL_TO_CARD
from components.views.tables import edit_summary, empty_table, layer_table, norms_figure
from grom import PRESETS
from grom.data.encoding import KEY_POSITIONS
from grom.model.arch import num_layers

KEY_POSITIONS_INFO = ("answer: the answer tokens, where the fitted answers are written (the paper's); subject: the "
                      "subject's tokens where the question names it, else its last token; last_prompt: the token "
                      "before the answer; prompt: every prompt token, as LUNAR reads them. In the prompt, each key "
                      "is pushed off the fact's first token, and the retain keys are every prompt and answer "
                      "position.")

@ui_errors
@form.form_handler
def on_run_edit(v: dict, session: Session, progress):
    """Run the GROM edit for the session with the form's values `v` (by field name);
    returns the summary, the per-layer table and the patch-norm plot."""
    started = time.time()
    pressed = session.extra.pop("pressed", None)  # `on_run_pressed`, where the page wired it
    pressed = pressed if isinstance(pressed, float) and pressed <= started else None
    handle = current_model(session)
    bench = current_benchmark(session)
    check_choice(session)  # not the old data while the Benchmark boxes show new ones
    seed = check_seed(v["seed"])
    retain = retain_subset(bench.retain, v["retain_examples"], seed)
    check_examples(bench.forget, retain, handle.tokenizer)
    skey = scores_key(session, v["matrix"], v["use_alpha"], (len(retain), seed), v["key_positions"])
    scores = session.scores if session.scores_for == skey else None
    config = form.edit_config(v, n_layers=num_layers(handle.model), scores=scores,
                              prompt_format=bench.prompt_format)
    # the memory plan before any work: shown in the details, and "will not fit" refused here
    plan, free = plan_run(handle, bench.forget, retain, config), device_free_bytes(handle)
    session.extra["memory_plan"] = plan_markdown(plan, free)
    check_run(handle, plan, config, free)
    edit = compute_edit(handle.key, bench.forget, retain, config, scores,
                        device_progress(lambda f, msg: progress(f, desc=msg)))
    edit.model_name = portable_model_name(handle.key.name)  # a name, not the server's path
    edit.run = run_record(handle.key.name, session.bench_label, session.extra.get("bench_source", ""),
                          v["retain_examples"], seed, len(retain), v["preset"], v["band_mode"],
                          config.k, edit.band)
    session.edit, session.edit_for, session.dropped = edit, handle.key, ""
    session.extra["edit_inputs"] = (bench.forget, retain)
    # from the press (else this start) to the first card: what the visitor waited (the card says it)
    session.extra["clicked"] = (edit, pressed if pressed is not None else started, pressed is not None)
    session.report = session.report_for = session.influence = None
    SESSIONS.touch(session)  # counted among the sessions holding an edit
    if edit.scores is not None and scores is None:
        session.scores, session.scores_for = edit.scores, skey
    data = (f" Data: **{session.bench_label}**, {len(bench.forget)} forget and {len(retain)} retain "
            "examples giving keys.")
    return edit_summary(edit) + data, layer_table(edit), norms_figure(edit)


def on_run_pressed(session: Session) -> None:
    """Run edit pressed: the moment, kept for the card's wait (`on_run_edit` takes it). A
    queue-free event beside the edit's own, which may first wait for the device."""
    session.extra["pressed"] = time.time()


def on_form_change(preset: str, *values):
    """A setting a preset sets changed (typed, dragged, restored or filled): the Preset
    box names the preset these values are, else says "(custom)" (`form.matching_preset`;
    `values` in `form.PRESET_FIELDS` order). So changing β, w_r or ρ by hand gives
    "(custom)", as importing those values does, and typing a preset's values back names
    it again."""
    return form.matching_preset(dict(zip(form.PRESET_FIELDS, values)), preset)


def on_show_plan(session: Session):
    """The memory plan of the last Run edit (also one refused as too large)."""
    return session.extra.get("memory_plan", gr.skip())


@ui_errors
def on_reset(session: Session):
    """Drop the session's edit: the model is the original again (its weights never changed)."""
    had = session.edit is not None
    session.edit = session.edit_for = session.report = session.report_for = session.influence = None
    session.extra.pop("edit_inputs", None)
    msg = ("Reset: the edit was dropped; every answer now comes from the original model."
           if had else "Nothing to reset: there is no edit, the model is the original.")
    return msg, empty_table("matrices"), plots.empty_figure("Run an edit to see its patch norms.", 260)


def on_preset(preset: str):
    """The widgets' values for a preset (`form.PRESET_FILLED`: beta, w_r, rho as number
    and log slider); a band text the preset leaves open stays as the user wrote it."""
    if preset not in PRESETS:
        return [gr.skip()] * len(form.PRESET_FILLED)
    return [gr.skip() if value is None else value for value in form.preset_values(preset)]


def on_preset_chosen(preset: str):
    """A preset chosen in its box: the run's settings it has a default for
    (`form.RUN_DEFAULTED`: batch size, key budgets, retain sample) take it, as those it sets
    do (`on_preset`). Choosing "(custom)" changes nothing."""
    if preset not in PRESETS:
        return [gr.skip()] * len(form.RUN_DEFAULTED)
    return form.run_defaults(preset)


def on_run_defaults(preset: str):
    """New data loaded: the run's settings take the defaults of the preset the load chose
    (the demo's presets 1600 retain examples, SmolLM2's 128): a split loaded on another
    model's numbers broke the demo's retain set (issue 49, item 6)."""
    return form.run_defaults(preset if isinstance(preset, str) else "")


def on_benchmark_loaded(session: Session) -> str:
    """The line under Run edit once a benchmark loaded: which data the next edit uses."""
    return f"Loaded **{session.bench_label}**: press **Run edit** to unlearn its forget set."


def beta_label(relative: bool) -> str:
    return "β (relative)" if relative else "β (absolute)"


def _log_pair(name: str, label: str, value: float, info: str):
    lo, hi = LOG_SLIDERS[name]
    with gr.Row(equal_height=True, elem_classes="log-pair"):
        slider = gr.Slider(lo, hi, value=form.log10(value), step=0.01, label=f"log₁₀ {label.split()[0]}", scale=3,
                           info=info, buttons=[])
        number = gr.Number(value=value, label=label, scale=1, min_width=110)
    slider.input(form.from_log10, slider, number, queue=False,
                 api_visibility="private")
    number.input(lambda v: form.log10(v) if v and v > 0 else gr.skip(), number, slider, queue=False,
                 api_visibility="private")
    return slider, number


def build_edit_panel(start_preset: str = "demo") -> SimpleNamespace:
    """The Edit form, in the order a laptop's first screen (1366 x 768) needs it: the preset
    and the three settings the studio is for (β, w_r, ρ), Run edit, its status and the result
    card; then the rest of the form. Every box a preset has a value for starts on
    `start_preset`'s (those it sets, and `form.run_defaults`)."""
    demo, d = PRESETS[start_preset], dict(zip(form.RUN_DEFAULTED, form.run_defaults(start_preset)))
    preset = gr.Dropdown(preset_choices(), value=start_preset, label="Preset (the paper's settings)",
                         info="fills the boxes below; a model or split loaded picks the one that fits")
    beta_log, beta = _log_pair("beta", beta_label(demo.beta_relative), demo.beta,
                               "higher: forgets harder (too high: noise)")
    w_r_log, w_r = _log_pair("w_r", "w_r", demo.w_r, "higher: keeps the retain set (w_f = 1)")
    rho_log, rho = _log_pair("rho", "ρ", demo.rho, "higher: a smaller, smoother edit (ridge)")
    # where a landscape cell costs under a second (a GPU), the settings' cell as the sliders move
    preview = gr.Markdown("", elem_id="slider-preview")
    with gr.Row(elem_id="run-row"):
        run = gr.Button("Run edit", variant="primary", scale=3, elem_id="run-edit")
        reset_btn = gr.Button("Reset", variant="secondary", scale=1, min_width=90, elem_id="reset-edit")
    status = gr.Markdown("No edit yet: press **Run edit**.", elem_id="edit-status")
    # the result card: its own box, which no event shows progress on, so that it stays in view while
    # later jobs run (the status above it shows their progress and hides what it said before)
    card = gr.HTML("", elem_id="result-card")
    text.md(text.EDIT_SHORT, elem_classes="panel-intro")
    text.md(text.EDIT, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        target = gr.Radio(TARGETS, value=demo.target, label="Target D", scale=2, min_width=150)
        matrix = gr.Radio(MATRICES, value=demo.matrix, label="Edited matrix W", scale=3, min_width=200)
    beta_relative = gr.Checkbox(value=demo.beta_relative, label="β relative: in units of the mean ‖W x‖ "
                                "on the forget keys (off: absolute, as in the paper, 20 to 1000)")
    c = gr.Slider(0, 200, value=demo.c, step=0.5, label="c (corruption strength; paper 45)",
                  visible=demo.target == "corruption")
    use_alpha = gr.Checkbox(value=demo.use_alpha, label="Specificity weights α (off: the paper's ablation)",
                            info="α = max(0, 1 − rf/ff): ff and rf are how often the answer token occurs "
                                 "among forget and among retain answers; tokens common in both are not pushed")
    # No `precision=0` on these boxes: gradio would round NaN before the handler sees it and
    # answer with an empty error; `whole_number` refuses fractions, NaN and infinity instead.
    with gr.Accordion("Advanced: keys, budgets, speed", open=False):
        key_positions = gr.Dropdown(list(KEY_POSITIONS), value="answer", label="Key positions: where the forget "
                                    "keys are", info=KEY_POSITIONS_INFO)
        with gr.Row():
            seed = gr.Number(value=0, label="seed", min_width=80)
            batch_size = gr.Number(value=d["batch_size"], label="batch size", min_width=80,
                                   info=form.FOLLOWS_PRESET)
        with gr.Row():
            forget_budget = gr.Number(value=d["forget_budget"], label="forget key budget (0: all)",
                                      min_width=120, info=form.FOLLOWS_PRESET)
            retain_budget = gr.Number(value=d["retain_budget"], label="retain key budget (0: all)",
                                      min_width=120, info=form.FOLLOWS_PRESET)
        retain_examples = gr.Number(value=d["retain_examples"],
                                    label="retain examples giving keys (a seeded sample, for speed; 0: all)",
                                    info=f"{form.FOLLOWS_PRESET}: {RETAIN_EXAMPLES_FOR['smollm2']} for smollm2 "
                                         f"(a real model's keys cost ~100x the demo's), else {DEFAULT_RETAIN_EXAMPLES}")
        memory_plan = gr.Markdown("Memory plan: computed when you press **Run edit** (bytes per stage, "
                                  "checked against the device's free memory before any work).",
                                  elem_id="memory-plan")
    target.change(lambda t: gr.Slider(visible=t == "corruption"), target, c, queue=False,
                  api_visibility="private")
    beta_relative.change(lambda rel: gr.Number(label=beta_label(rel)), beta_relative, beta, queue=False,
                         api_visibility="private")
    return SimpleNamespace(preset=preset, target=target, beta=beta, beta_log=beta_log,
                           beta_relative=beta_relative, w_r=w_r, w_r_log=w_r_log, rho=rho,
                           rho_log=rho_log, c=c, matrix=matrix, use_alpha=use_alpha,
                           key_positions=key_positions, seed=seed,
                           batch_size=batch_size, forget_budget=forget_budget,
                           retain_budget=retain_budget, retain_examples=retain_examples, run=run,
                           reset=reset_btn, status=status, card=card, memory_plan=memory_plan, preview=preview)


def build_result_view() -> SimpleNamespace:
    """The last edit's details (under Edit details): its summary, the per-matrix table and the
    patch norms, which Run edit fills."""
    text.md(text.EDIT_MATH, elem_classes="math")
    summary = gr.Markdown("No edit yet.", elem_id="result-summary")
    table = gr.Dataframe(empty_table("matrices"), label="Per edited matrix", interactive=False, wrap=True)
    text.md(text.PATCH_RATIO, elem_classes="panel-intro")
    norms = gr.Plot(plots.empty_figure("Run an edit to see its patch norms.", 260), show_label=False)
    return SimpleNamespace(summary=summary, table=table, norms=norms)


def wire(e: SimpleNamespace, page: Page) -> None:
    """The form (a preset fills it; any value changed names the preset it is, else "(custom)"),
    Run edit (public `run_edit`; sets `page.edit_run`) and Reset (public `reset`), the card
    scrolled into view; new data: the line under Run edit says which."""
    s, ui = page.session, page.ui
    ly, r, c, a = ui.layers, ui.result, ui.compare, ui.answers
    e.preset.change(on_preset, e.preset, form.widgets(e, ly, form.PRESET_FILLED), **LOCAL)
    # a preset, or data (with the preset chosen for them), puts every box it has a value for back to it
    run_boxes = form.widgets(e, ly, form.RUN_DEFAULTED)
    e.preset.input(on_preset_chosen, e.preset, run_boxes, **LOCAL)
    page.data_loaded.success(on_run_defaults, e.preset, run_boxes, **LOCAL)
    # any setting a preset sets, changed (typed, filled or restored): the Preset box names the preset the
    # values are, else "(custom)"
    preset_fields = form.widgets(e, ly, form.PRESET_FIELDS)
    gr.on([w.change for w in preset_fields], on_form_change, [e.preset] + preset_fields, e.preset,
          trigger_mode="always_last", show_progress="hidden", **LOCAL)
    e.run.click(on_run_pressed, s, None, show_progress="hidden", **LOCAL)  # the moment: the card says the wait
    run = e.run.click(in_turn(on_run_edit), form.widgets(e, ly) + [s], [r.summary, r.table, r.norms],
                      api_name="run_edit", show_progress_on=[e.status, r.summary],  # progress where the user looks
                      **device_queue())
    run.then(on_show_plan, s, e.memory_plan, **LOCAL)  # the plan, also of an edit refused as too large
    # an edit's first card into view, whole, as soon as it is drawn (the first verdict, or
    # the comparison's card where no verdict comes first), not only its headline
    e.card.change(None, js=SCROLL_TO_CARD, **LOCAL)
    e.reset.click(in_turn(on_reset), s, [e.status, r.table, r.norms], api_name="reset", **device_queue()) \
       .then(lambda msg: (msg, "", None, "", "", "", ""), e.status, [r.summary, c.summary, c.table, a.forget_html,
                                                                   a.retain_html, a.prompt_html, e.card], **LOCAL)
    page.data_loaded.success(on_benchmark_loaded, s, e.status, **LOCAL)
    page.edit_run = run
