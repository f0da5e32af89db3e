"""Edit panel: presets, the hyperparameters (log sliders with exact number boxes), the
target and matrix, Run with staged progress, the timings and patch norms, Reset.

`edit_config` is the one function that turns the widgets into an `EditConfig`.
"""
from __future__ import annotations

import logging
import math
import random
import re
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components import plots, text
from components.errors import shorten, ui_errors
from components.limits import limit, over
from components.runs import portable_model_name, run_record
from components.session import (DEVICE_LOCK, REGISTRY, SESSIONS, ModelKey, Session, UserError,
                                current_benchmark, current_model, device_progress, on_device, resident)

CUSTOM = "(custom)"
TARGETS = ["suppression", "corruption"]
MATRICES = ["down_proj", "o_proj", "lm_head"]
BAND_MODES = ["suggested", "manual"]
# (min, max) of each value, and of its log10 slider
RANGES = {"beta": (0.0, 1e5), "w_r": (0.0, 1e6), "rho": (1e-6, 10.0), "c": (0.0, 1e4)}
LOG_SLIDERS = {"beta": (-1.0, 4.0), "w_r": (-1.0, 4.0), "rho": (-4.0, 0.0)}
DEFAULT_RETAIN_EXAMPLES = 1600
# A 135M model costs ~2 ms of CPU per key token (the toy: ~0.02 ms): its page starts with a
# smaller seeded retain sample so that Run edit answers in seconds (BENCHMARKS.md).
RETAIN_EXAMPLES_FOR = {"smollm2": 128}
MAX_SEED = 2**32 - 1  # numpy's RandomState takes seeds below 2**32
MAX_COUNT = 10**9  # the largest budget or example count a widget may hold
STREAM_CACHE_ENTRIES = 4  # hidden states entering a band kept per model (~20 MB each for SmolLM2's page)


def preset_choices() -> list[tuple[str, str]]:
    from grom import PRESETS

    return [(CUSTOM, CUSTOM)] + [(name, name) for name in PRESETS]


BAND_PART = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_BAND_CHARS = 1000


def parse_band(textual: str, n_layers: int) -> tuple[int, ...]:
    """ "3-5", "3,4,5" or "11 12" -> (3, 4, 5); every layer must be inside the model.
    Each part is checked against the model before its layers are listed, so a huge range
    costs nothing."""
    textual = textual or ""
    if len(textual) > MAX_BAND_CHARS:
        raise UserError(f"The manual band is {len(textual):,} characters long; write layers as "
                        f"3-5 or 3,4,5 (the model has layers 0..{n_layers - 1}).")
    layers: set[int] = set()
    for part in textual.replace(",", " ").split():
        match = BAND_PART.match(part)
        if match is None:
            raise UserError(f"Band {shorten(textual)!r}: write layers as 3-5 or 3,4,5.")
        a, b = int(match[1]), int(match[2] or match[1])
        if a > b:
            raise UserError(f"Band part {shorten(part)}: write the lower layer first ({b}-{a}).")
        if b >= n_layers:
            what = f"Layers {shorten(part)} are" if a < b else f"Layer {shorten(part)} is"
            raise UserError(f"{what} outside the model: it has layers 0..{n_layers - 1}. Change the band.")
        layers.update(range(a, b + 1))
    if not layers:
        raise UserError("The manual band is empty: write layers as 3-5 or 3,4,5, or choose the "
                        "suggested band.")
    return tuple(sorted(layers))


def whole_number(value, what: str, lo: int, hi: int, default: int | None = None) -> int:
    """`value` as an int in [lo, hi] (None: `default`); NaN, infinity, a fraction or a value
    out of range is refused with a message that says what to type."""
    if value is None and default is not None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or number != int(number) or not lo <= number <= hi:
        raise UserError(f"The {what} must be a whole number from {lo:,} to {hi:,} (got {shorten(value)}).")
    return int(number)


def _check_range(name: str, value) -> float:
    lo, hi = RANGES[name]
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or not lo <= number <= hi:
        raise UserError(f"{name} = {shorten(value)} is out of range: use a finite value between "
                        f"{lo:g} and {hi:g}.")
    return number


def _budget(value, what: str) -> int | None:
    """A key budget: 0 or None means no limit."""
    budget = whole_number(value, f"{what} (0: no limit)", 0, MAX_COUNT, default=0)
    return budget or None


def check_seed(seed) -> int:
    return whole_number(seed, "seed", 0, MAX_SEED, default=0)


def edit_config(preset: str, target: str, beta: float, beta_relative: bool, w_r: float, rho: float,
                c: float, matrix: str, use_alpha: bool, band_mode: str, band_text: str, k: int,
                seed: int, forget_budget: int, retain_budget: int, batch_size: int, *,
                n_layers: int, scores=None, prompt_format=None):
    """The EditConfig for the widgets' values (the preset gives the fields with no widget)."""
    from grom import PRESETS, EditConfig, best_window

    if target not in TARGETS or matrix not in MATRICES or band_mode not in BAND_MODES:
        raise UserError(f"target must be one of {TARGETS}, matrix one of {MATRICES}, band one of {BAND_MODES}.")
    k = whole_number(k, f"band width k (the model has {n_layers} layers)", 1, n_layers)
    batch_size = whole_number(batch_size, "batch size", 1, 1024)
    base = PRESETS.get(preset, EditConfig())
    layers = None
    if matrix != "lm_head":
        if band_mode == "manual":
            layers = parse_band(band_text, n_layers)
        elif scores is not None:
            layers = tuple(best_window(scores.S, k))
    return base.replace(
        target=target, beta=_check_range("beta", beta), beta_relative=bool(beta_relative),
        w_r=_check_range("w_r", w_r), rho=_check_range("rho", rho), c=_check_range("c", c),
        matrix=matrix, use_alpha=bool(use_alpha), layers=layers, k=k, seed=check_seed(seed),
        forget_budget=_budget(forget_budget, "forget key budget"),
        retain_budget=_budget(retain_budget, "retain key budget"), batch_size=batch_size,
        prompt_format=prompt_format, candidates=None,
        keep_keys=False)  # a session keeps the patches; a diagnostic makes the keys again


def retain_subset(retain, limit, seed: int) -> tuple:
    """At most `limit` retain examples (seeded sample; 0 or None: all), for speed."""
    retain = tuple(retain)
    limit = whole_number(limit, "number of retain examples (0: all)", 0, MAX_COUNT, default=0)
    if not limit or len(retain) <= limit:
        return retain
    return tuple(random.Random(check_seed(seed)).sample(retain, limit))


def check_examples(forget, retain) -> None:
    """An edit's (or the layer scores') forget and retain examples within GROM_MAX_EXAMPLES."""
    if len(forget) > limit("GROM_MAX_EXAMPLES"):
        raise over("An edit uses every forget example, and this forget set has {n}", len(forget),
                   "GROM_MAX_EXAMPLES")
    if len(retain) > limit("GROM_MAX_EXAMPLES"):
        raise over("The edit would use {n} retain examples (Advanced settings: retain examples)",
                   len(retain), "GROM_MAX_EXAMPLES")


def scores_key(session: Session, matrix: str, use_alpha: bool, n_retain) -> tuple:
    return (session.model_key, id(session.benchmark), matrix, bool(use_alpha), n_retain)


@on_device
def compute_edit(key: ModelKey, forget, retain, config, scores, progress):
    from grom import run_edit

    with DEVICE_LOCK:
        handle = resident(key, "edit")
        edit = run_edit(handle.model, handle.tokenizer, forget, retain, config,
                        progress=progress, scores=scores, stream_cache=handle.stream_cache)
        while len(handle.stream_cache) > STREAM_CACHE_ENTRIES:  # oldest first (dicts keep order)
            handle.stream_cache.pop(next(iter(handle.stream_cache)))
        return edit


@on_device
def _warm(key: ModelKey, forget, retain, config, band) -> None:
    from grom.editing import warm_stream

    with DEVICE_LOCK:
        handle = REGISTRY.get(key)
        if handle is not None:
            warm_stream(handle.model, handle.tokenizer, forget, retain, config, band, handle.stream_cache)


def warm_edit(k: int, retain_examples: int, seed: int, session: Session) -> list[int] | None:
    """The forward pass up to the suggested band, ahead of the first Run edit (the page's
    defaults; any other choice just misses the cache). Returns that band (None without
    layer scores). Silent on any problem."""
    from grom import EditConfig, best_window

    try:
        handle, bench = current_model(session), current_benchmark(session)
        if session.scores is None:
            return None
        retain = retain_subset(bench.retain, retain_examples, int(seed or 0))
        band = best_window(session.scores.S, int(k))
        _warm(handle.key, bench.forget, retain,
              EditConfig(prompt_format=bench.prompt_format, seed=int(seed or 0)), band)
        return list(band)
    except Exception as err:  # noqa: BLE001  (a warm-up: Run edit reports real problems)
        logging.getLogger(__name__).info("stream not precomputed: %s", err)
        return None


def layer_table(edit) -> pd.DataFrame:
    """One row per edited matrix: its patch norm, the beta and mu used, the key counts."""
    def name(r):
        kind = edit.config.matrix
        return f"L{r.layer} · {kind}" if r.layer is not None else kind

    rows = [{"matrix": name(r), "‖P‖": round(r.patch_norm, 4),
             "‖P‖/‖W‖": f"{r.patch_norm / max(r.weight_norm, 1e-12):.2%}",
             "β used": float(f"{r.beta:.4g}"), "μ": float(f"{r.mu:.4g}"),
             "forget keys": r.n_forget_keys, "retain keys": r.n_retain_keys,
             "solve s": round(r.solve_seconds, 2)} for r in edit.layers]
    return pd.DataFrame(rows)


def edit_summary(edit) -> str:
    t = edit.timings
    band = ", ".join(map(str, edit.band)) if edit.band else "LM head"
    parts = " · ".join(f"{name} {t[name]:.2f} s" for name in ("scores", "keys", "solve", "apply") if name in t)
    return (f"**Edited** layers {band} of `{edit.config.matrix}` in **{t.get('total', 0):.1f} s** "
            f"({parts}). Total ‖P‖ = {edit.patch_norm():.4g}.")


def norms_figure(edit):
    return plots.plot_patch_norms([f"L{r.layer}" if r.layer is not None else "head" for r in edit.layers],
                                  [r.patch_norm for r in edit.layers],
                                  [r.patch_norm / max(r.weight_norm, 1e-12) for r in edit.layers])


@ui_errors
def run_edit(preset: str, target: str, beta: float, beta_relative: bool, w_r: float, rho: float,
             c: float, matrix: str, use_alpha: bool, band_mode: str, band_text: str, k: int,
             seed: int, forget_budget: int, retain_budget: int, batch_size: int,
             retain_examples: int, session: Session, progress=gr.Progress()):
    """Run the GROM edit for the session; returns the summary, the per-layer table and
    the patch-norm plot."""
    from grom.arch import num_layers

    handle = current_model(session)
    bench = current_benchmark(session)
    seed = check_seed(seed)
    retain = retain_subset(bench.retain, retain_examples, seed)
    check_examples(bench.forget, retain)
    skey = scores_key(session, matrix, use_alpha, (len(retain), seed))
    scores = session.scores if session.scores_for == skey else None
    config = edit_config(preset, target, beta, beta_relative, w_r, rho, c, matrix, use_alpha,
                         band_mode, band_text, k, seed, forget_budget, retain_budget, batch_size,
                         n_layers=num_layers(handle.model), scores=scores,
                         prompt_format=bench.prompt_format)
    edit = compute_edit(handle.key, bench.forget, retain, config, scores,
                        device_progress(lambda f, msg: progress(f, desc=msg)))
    edit.model_name = portable_model_name(handle.key.name)  # a name, not the server's path
    edit.run = run_record(handle.key.name, session.bench_label, session.extra.get("bench_source", ""),
                          retain_examples, seed, len(retain), preset, band_mode, k, edit.band)
    session.edit, session.edit_for, session.dropped = edit, handle.key, ""
    session.extra["edit_inputs"] = (bench.forget, retain)
    session.report = session.report_for = session.influence = None
    SESSIONS.touch(session)  # counted among the sessions holding an edit
    if edit.scores is not None and scores is None:
        session.scores, session.scores_for = edit.scores, skey
    data = (f" Data: **{session.bench_label}**, {len(bench.forget)} forget and {len(retain)} retain "
            "examples giving keys.")
    return edit_summary(edit) + data, layer_table(edit), norms_figure(edit)


@ui_errors
def reset(session: Session):
    """Drop the session's edit: the model is the original again (its weights never changed)."""
    had = session.edit is not None
    session.edit = session.edit_for = session.report = session.report_for = session.influence = None
    session.extra.pop("edit_inputs", None)
    msg = ("Reset: the edit was dropped; every answer now comes from the original model."
           if had else "Nothing to reset: there is no edit, the model is the original.")
    return msg, pd.DataFrame(), plots.empty_figure("Run an edit to see its patch norms.", 260)


def fill_preset(preset: str):
    """The widgets' values for a preset (beta, w_r, rho as number and log slider)."""
    from grom import PRESETS

    if preset not in PRESETS:
        return [gr.skip()] * 14
    p = PRESETS[preset]
    mode, band, k = band_widgets(preset)
    return [p.target, p.beta, _log(p.beta), p.beta_relative, p.w_r, _log(p.w_r), p.rho, _log(p.rho),
            p.c, p.matrix, p.use_alpha, mode, band if band else gr.skip(), k]


def beta_label(relative: bool) -> str:
    return "β (relative)" if relative else "β (absolute)"


def _log(v: float) -> float:
    return round(math.log10(v), 3) if v and v > 0 else -1.0


def _log_pair(name: str, label: str, value: float, info: str):
    lo, hi = LOG_SLIDERS[name]
    with gr.Row(equal_height=True, elem_classes="log-pair"):
        slider = gr.Slider(lo, hi, value=_log(value), step=0.01, label=f"log₁₀ {label.split()[0]}", scale=3,
                           info=info, buttons=[])
        number = gr.Number(value=value, label=label, scale=1, min_width=90)
    slider.input(lambda v: round(10 ** v, 6 if v < 0 else 3), slider, number, queue=False,
                 api_visibility="private")
    number.input(lambda v: _log(v) if v and v > 0 else gr.skip(), number, slider, queue=False,
                 api_visibility="private")
    return slider, number


def band_widgets(preset: str) -> tuple[str, str, int]:
    """(band mode, band text, k) for a preset: its fixed layers, or the suggested band of k."""
    from grom import PRESETS

    p = PRESETS[preset]
    if not p.layers:
        return "suggested", "", p.k
    contiguous = list(p.layers) == list(range(p.layers[0], p.layers[-1] + 1))
    text_ = f"{p.layers[0]}-{p.layers[-1]}" if contiguous else ",".join(map(str, p.layers))
    return "manual", text_, len(p.layers)


def build_edit_panel(start_preset: str = "demo") -> SimpleNamespace:
    from grom import PRESETS

    demo = PRESETS[start_preset]
    text.md(text.EDIT, elem_classes="panel-intro")
    preset = gr.Dropdown(preset_choices(), value=start_preset, label="Preset (the paper's settings)",
                         info="tofu10, tofu5, muse-*, wmdp-bio, zsre as in the paper; smollm2 for the real "
                              "chat model; demo, demo-forget05, demo-forget01 for the bundled toy's splits")
    with gr.Row():
        run = gr.Button("Run edit", variant="primary", scale=3, elem_id="run-edit")
        reset_btn = gr.Button("Reset", variant="secondary", scale=1, min_width=90, elem_id="reset-edit")
    status = gr.Markdown("No edit yet: press **Run edit**.", elem_id="edit-status")
    with gr.Row(equal_height=True):
        target = gr.Radio(TARGETS, value=demo.target, label="Target D", scale=2, min_width=150)
        matrix = gr.Radio(MATRICES, value=demo.matrix, label="Edited matrix W", scale=3, min_width=200)
    beta_log, beta = _log_pair("beta", beta_label(demo.beta_relative), demo.beta,
                               "raise it to forget harder (too high and answers turn to noise); "
                               "paper, absolute: 20 to 1000")
    beta_relative = gr.Checkbox(value=demo.beta_relative, label="β relative: in units of the mean ‖W x‖ "
                                "on the forget keys (off: absolute, as in the paper)")
    w_r_log, w_r = _log_pair("w_r", "w_r", demo.w_r, "raise it to protect the retain set more (w_f = 1); paper: 10 to 1000")
    rho_log, rho = _log_pair("rho", "ρ", demo.rho, "raise it for a smoother, smaller edit (ridge μ = ρ · mean diag A); paper: 0.03")
    c = gr.Slider(0, 200, value=demo.c, step=0.5, label="c (corruption strength; paper 45)",
                  visible=demo.target == "corruption")
    use_alpha = gr.Checkbox(value=demo.use_alpha, label="Specificity weights α (off: the paper's ablation)",
                            info="α = max(0, 1 − rf/ff): ff and rf are how often the answer token occurs "
                                 "among forget and among retain answers; tokens common in both are not pushed")
    # No `precision=0` on these boxes: gradio would round NaN before the handler sees it and
    # answer with an empty error; `whole_number` refuses fractions, NaN and infinity instead.
    with gr.Accordion("Advanced: keys, budgets, speed", open=False):
        with gr.Row():
            seed = gr.Number(value=0, label="seed", min_width=80)
            batch_size = gr.Number(value=demo.batch_size, label="batch size", min_width=80)
        with gr.Row():
            forget_budget = gr.Number(value=demo.forget_budget, label="forget key budget (0: all)",
                                      min_width=120)
            retain_budget = gr.Number(value=demo.retain_budget, label="retain key budget (0: all)",
                                      min_width=120)
        retain_examples = gr.Number(value=RETAIN_EXAMPLES_FOR.get(start_preset, DEFAULT_RETAIN_EXAMPLES),
                                    label="retain examples "
                                    "giving keys (a seeded sample, for speed; 0: all)")
    target.change(lambda t: gr.Slider(visible=t == "corruption"), target, c, queue=False,
                  api_visibility="private")
    beta_relative.change(lambda rel: gr.Number(label=beta_label(rel)), beta_relative, beta, queue=False,
                         api_visibility="private")
    return SimpleNamespace(preset=preset, target=target, beta=beta, beta_log=beta_log,
                           beta_relative=beta_relative, w_r=w_r, w_r_log=w_r_log, rho=rho,
                           rho_log=rho_log, c=c, matrix=matrix, use_alpha=use_alpha, seed=seed,
                           batch_size=batch_size, forget_budget=forget_budget,
                           retain_budget=retain_budget, retain_examples=retain_examples, run=run,
                           reset=reset_btn, status=status)
