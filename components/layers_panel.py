"""Layers panel: S_l = F_l - R_l per layer (logit lens), the suggested band of width k
highlighted, and a manual override of the band."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from components.server.errors import UserError, shorten, ui_errors
from components.server.session import Session, current_benchmark, current_model, in_turn
from components.server.validate import check_examples, check_seed, parse_band, retain_subset, whole_number
from components.studio import form
from components.studio.edits import scores_key
from components.studio.form import BAND_MODES, band_widgets, with_key_positions
from components.studio.scores import cached_scores
from components.studio.wiring import LOCAL, Page, device_queue
from components.views import plots, text
from grom import EditConfig, best_window
from grom.data.encoding import KEY_POSITIONS
from grom.model.arch import num_layers


def band_of(scores, k, band_mode: str, band_text: str) -> tuple[list[int], list[int], str]:
    """(the band that will be edited, the suggested one, what is wrong with the widgets'
    values: "" when nothing is). A band or k the model cannot take is not drawn; the
    problem is said inline, as the user types, rather than as an error after Run edit."""
    n = len(scores.S)
    try:
        k = whole_number(k, "band width k", 1, 10**6)
    except UserError as err:
        return [], [], str(err)
    suggested = best_window(scores.S, min(k, n))
    if band_mode != "manual":
        return suggested, suggested, ""
    try:
        return list(parse_band(band_text, n)), suggested, ""
    except UserError as err:
        return [], suggested, str(err)


def scores_figure(scores, k, band_mode, band_text, show_parts):
    band, suggested, _ = band_of(scores, k, band_mode, band_text)
    return plots.plot_layer_scores(scores.S, scores.F, scores.R, band, show_parts=bool(show_parts),
                                   suggested=suggested)


def band_text_md(scores, k, band_mode, band_text) -> str:
    band, suggested, problem = band_of(scores, k, band_mode, band_text)
    best = max(range(len(scores.S)), key=lambda l: scores.S[l])
    top = f"the highest single score is layer {best} (S = {scores.S[best]:.4g})."
    if problem:
        hint = f" Suggested band: {suggested[0]}–{suggested[-1]}; " if suggested else " "
        return f'<span class="band-problem">⚠ {problem}</span>{hint}{top}'
    where = "manual" if band_mode == "manual" else f"suggested for k = {len(suggested)}"
    other = ("" if band == suggested else
             f"; suggested band {suggested[0]}–{suggested[-1]} (mean S = {mean_score(scores, suggested):.3g})")
    return (f"Band ({where}): layers **{', '.join(map(str, band))}** (mean S = "
            f"{mean_score(scores, band):.3g}){other}; {top}")


def mean_score(scores, band) -> float:
    """The mean S_l over the band's layers (what the suggested band maximises)."""
    return sum(float(scores.S[l]) for l in band) / len(band)


STALE = "Press **Compute layer scores** to see S_l for the loaded model and data (or run an edit)."


def stale_figure():
    """The layer plot once the scores no longer match the data (a new benchmark or model)."""
    return plots.empty_figure("New data loaded: press Compute layer scores (or run an edit) "
                              "to see S_l per layer.")


@ui_errors
def on_layer_scores(matrix: str, use_alpha: bool, key_positions: str, k: int, band_mode: str, band_text: str,
                    show_parts: bool, retain_examples: int, seed: int, session: Session,
                    progress=gr.Progress()):
    """Compute S_l, F_l, R_l for every layer; returns the plot and a line about the band."""
    handle = current_model(session)
    bench = current_benchmark(session)
    if matrix == "lm_head":
        raise UserError("Layer scores rank down_proj / o_proj layers; the LM head is one matrix. "
                        "Choose down_proj or o_proj to see them.")
    seed = check_seed(seed)
    if band_mode == "manual":  # a bad band fails before the model works
        parse_band(band_text, num_layers(handle.model))
    retain = retain_subset(bench.retain, retain_examples, seed)
    check_examples(bench.forget, retain, handle.tokenizer, "These layer scores")
    if key_positions not in KEY_POSITIONS:
        raise UserError(f"key positions must be one of {list(KEY_POSITIONS)} (got {shorten(key_positions)}).")
    config = with_key_positions(EditConfig(matrix=matrix, use_alpha=bool(use_alpha),
                                           prompt_format=bench.prompt_format, k=1, seed=seed), key_positions)
    scores = cached_scores(handle, bench.forget, retain, config, progress)
    session.scores = scores
    session.scores_for = scores_key(session, matrix, use_alpha, (len(retain), seed), key_positions)
    return (scores_figure(scores, k, band_mode, band_text, show_parts),
            band_text_md(scores, k, band_mode, band_text))


@ui_errors
def on_redraw(k: int, band_mode: str, band_text: str, show_parts: bool, session: Session):
    """Redraw from the session's scores (no model needed) after k or the band changed."""
    if session.scores is None:
        return stale_figure(), STALE
    return (scores_figure(session.scores, k, band_mode, band_text, show_parts),
            band_text_md(session.scores, k, band_mode, band_text))


def on_k(k, band_mode, band_text, show_parts, session: Session):
    """Moving k means: the suggested band of that width."""
    return ("suggested",) + tuple(on_redraw(k, "suggested", band_text, show_parts, session))


def build_layers_panel(start_preset: str = "demo") -> SimpleNamespace:
    mode, band, k_value = band_widgets(start_preset)
    text.md(text.LAYERS, elem_classes="panel-intro")
    plot = gr.Plot(plots.empty_figure("Press Compute layer scores (or run an edit) to see S_l per layer."),
                   show_label=False, elem_id="layer-plot")
    band_info = gr.Markdown("")
    with gr.Row(equal_height=True):
        k = gr.Slider(1, 32, value=k_value, step=1, label="Band width k", scale=2)
        band_mode = gr.Radio(BAND_MODES, value=mode, label="Band", scale=1, min_width=150)
        band_text = gr.Textbox(value=band, label="Manual band (layers)", placeholder="3-5 or 3,4,5",
                               scale=1, min_width=120)
    with gr.Row(equal_height=True):
        show_parts = gr.Checkbox(value=False, label="Show F_l and R_l as lines")
        compute = gr.Button("Compute layer scores", scale=0, min_width=200)
    text.md(text.LAYERS_SIGN, elem_classes="panel-intro")
    text.md(text.LAYERS_MATH, elem_classes="math")
    return SimpleNamespace(plot=plot, band_info=band_info, k=k, band_mode=band_mode,
                           band_text=band_text, show_parts=show_parts, compute=compute)


def score_widgets(ui: SimpleNamespace) -> list:
    """The layer scores' inputs (the `layer_scores` endpoint's parameters, in order, less the
    session): the Edit panel's matrix and alpha, this panel's band widgets, the retain sample."""
    e, ly = ui.edit, ui.layers
    return form.widgets(e, ly, form.SCORE_NAMES) + [ly.show_parts] + form.widgets(e, ly, ("retain_examples", "seed"))


def view_widgets(ly: SimpleNamespace, session) -> list:
    """What a redraw of the plot reads (`on_redraw`'s inputs): k, the band, the lines, the session."""
    return [ly.k, ly.band_mode, ly.band_text, ly.show_parts, session]


def wire(ly: SimpleNamespace, page: Page) -> None:
    """Compute layer scores (public `layer_scores`); k, the band or the lines changed: the plot
    again (a burst of changes redraws once, for its last value); a new model, new data or a
    pasted run: the scores drawn were of the old ones."""
    view = view_widgets(ly, page.session)
    ly.compute.click(in_turn(on_layer_scores), score_widgets(page.ui) + [page.session], [ly.plot, ly.band_info],
                     api_name="layer_scores", **device_queue())
    # k: typed (each keystroke, Enter included) or dragged; a burst redraws once, for its last value
    for trigger in (ly.k.input, ly.k.release):
        trigger(on_k, view, [ly.band_mode, ly.plot, ly.band_info], trigger_mode="always_last", **LOCAL)
    for trigger in (ly.band_mode.change, ly.show_parts.change, ly.band_text.change):
        trigger(on_redraw, view, [ly.plot, ly.band_info], trigger_mode="always_last", **LOCAL)
    for done in (page.model_loaded, page.data_loaded, page.link_pasted):
        done.success(on_redraw, view, [ly.plot, ly.band_info], **LOCAL)
