"""The page as a whole: what a new page (or an API client's session) starts on, the
handlers whose outputs span panels (a page opened, an edit done, new data), and the
server's first-page warm-up. Above the panels, as app.py is: it may import them, and no
panel imports it.

    wire_opening(demo, page, start_key)   the page's load, its ?run= link, its first scores
    wire(page)                            new data, an edit done: what every panel shows of them
    warm_in_background(ui, start_key)     the first page computed as the server starts
"""
from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import gradio as gr

from components.compare_panel import ANSWERS_FIRST, on_card_first, on_compare
from components.diagnostics_panel import matrix_choices
from components.edit_panel import on_run_edit
from components.export_panel import link_outputs, on_page_link
from components.layers_panel import band_text_md, on_layer_scores, score_widgets, scores_figure, view_widgets
from components.server.allowed_sources import DEMO, REAL
from components.server.device import ON_ZEROGPU, UNWANTED, deferring, gave_way, wait_for_quiet, yielding
from components.server.errors import JOB_NAME, ui_errors
from components.server.model_choices import ensure_model, n_layers, status_line, summary
from components.server.pace import calibrate
from components.server.session import REGISTRY, Session, current_benchmark, in_turn
from components.server.validate import check_seed, retain_subset
from components.studio import cards, form
from components.studio.benchmarks import default_split, preset_for, read_benchmark, splits_for
from components.studio.comparison import examples_per_set, warm_base_rows
from components.studio.edits import warm_edit
from components.studio.staleness import wire as wire_staleness
from components.studio.wiring import LINKS, LOCAL, Page, device_queue
from components.views.tables import describe, empty_table, examples_html
from grom.tasks.knowledge import split_decoding

log = logging.getLogger("grom.studio")


# ------------------------------------------------------------------------------ a new page

def start_benchmark(model_name: str) -> tuple[str, str]:
    """The benchmark a new page opens on: the demo world for the demo model, else the
    real-knowledge benchmark (facts a real chat model knows), each on its default split."""
    name = "demo" if model_name == DEMO else "real-knowledge"
    return name, default_split(name)


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


def on_first_scores(matrix, use_alpha, key_positions, k, band_mode, band_text, show_parts, retain_examples, seed,
                    session: Session, progress=gr.Progress()):
    """The layer scores of a new page, on the two offline models only (seconds on a CPU;
    cached per model and data, so later pages get them at once)."""
    if session.model_key is None or session.model_key.name not in (DEMO, REAL):
        return gr.skip(), gr.skip()
    return on_layer_scores(matrix, use_alpha, key_positions, k, band_mode, band_text, show_parts, retain_examples,
                           seed, session, progress)


def on_warm_comparison(max_examples, k, retain_examples, seed, session: Session) -> None:
    """On the real model, while the visitor reads the page: the forward pass up to the
    suggested band (Run edit then runs only the band), then the unedited rows of the
    comparison, their answers first (what a first card waits for), keeping what the layers
    below that band give on its batches (then only the Edited row is left, on the band and
    above), then their scores; all cached for every later page.
    Nothing on ZeroGPU: it would spend the visitor's GPU time on opening the page, and
    the stream and prefix caches would stay in a worker."""
    if session.model_key is None or session.model_key.name != REAL or ON_ZEROGPU:
        return
    # a page's own warm-up does not give way to other visitors: what it computes is what that
    # page's Run edit and card need next (the server's warm-up, `warm_first_page`, runs it as
    # background work); it stops once its page chose another model or benchmark, so that the
    # page's own next job (a Run edit on the new split) does not wait minutes for it
    key, bench = session.model_key, session.benchmark
    unwanted = lambda: session.model_key != key or session.benchmark is not bench  # noqa: E731
    token = UNWANTED.set(unwanted)
    named = JOB_NAME.set("on_warm_comparison") if JOB_NAME.get() is None else None  # its turns, named
    try:
        with deferring():  # every visitor's click goes first, this page's too (it resumes after)
            # the stream into the band first (a first Run edit's keys: 15 s without it on SmolLM2's default
            # page on a 2-core CPU, 4 s with it), then what its card waits for: the unedited answers (and
            # the passes its Edited row reads on them), then the scores only the comparison adds
            band = warm_edit(k, retain_examples, seed, session)
            start = min(band) if band else None
            if not unwanted():
                warm_base_rows(max_examples, session, start, answers_only=True)
            if not unwanted():
                warm_base_rows(max_examples, session, start)
    finally:
        UNWANTED.reset(token)
        if named is not None:
            JOB_NAME.reset(named)


def stored_card_key(values: list, max_examples, full_set, session: Session) -> str | None:
    """The key (`cards.card_key`) of the card that Run edit would give with the form's `values`
    (in `form.NAMES` order) and the Compare panel's size, on the session's model and data;
    None where the model's weights were not read yet (the warm-up reads them) or the form
    does not make an edit."""
    handle = REGISTRY.get(session.model_key) if session.model_key is not None else None
    bench = session.benchmark
    fingerprint = cards.known_fingerprint(handle.model) if handle is not None else None
    if fingerprint is None or bench is None:
        return None
    v = form.read(values)
    config = form.edit_config(v, n_layers=n_layers(handle), prompt_format=bench.prompt_format)
    seed = check_seed(v["seed"])
    run = {"retain_examples": int(v["retain_examples"] or 0), "seed": seed, "band_mode": v["band_mode"],
           "n_retain": len(retain_subset(bench.retain, v["retain_examples"], seed)), "k": config.k}
    n = examples_per_set(max_examples, full_set, bench)
    return cards.card_key(fingerprint, handle.key.dtype, bench, cards.config_of(config.to_dict(), run), run, n)


def on_stored_card(*args, request: gr.Request = None):
    """A new page: the card its form would give, where one is kept on disk (`cards.find`),
    shown at once and marked as computed ahead; nothing for a page opened with a link to a
    run (the link shows its own) or where none is kept."""
    *values, max_examples, full_set, session = args
    params = getattr(request, "query_params", None) or {}
    if "run" in params:
        return gr.skip()
    try:
        key = stored_card_key(values, max_examples, full_set, session)
    except Exception:  # noqa: BLE001  (a courtesy: Run edit says what is wrong with the form)
        return gr.skip()
    card = cards.find(key) if key is not None else None
    return cards.shown(card) if card is not None else gr.skip()


def on_form_for_stored(*args):
    """A setting changed on a page that has run no edit yet and shows a kept card: the card
    kept for the new settings where there is one, else a line saying there is none (the
    card shown was for the settings before). Nothing once the page has an edit of its own
    (whose results the staleness lines follow) or shows no kept card."""
    *values, max_examples, full_set, shown, session = args
    before = cards.shown_key(shown)
    if session.edit is not None or (before is None and shown != cards.STALE):
        return gr.skip()
    try:
        key = stored_card_key(values, max_examples, full_set, session)
    except Exception:  # noqa: BLE001  (a setting being typed: Run edit says what is wrong)
        key = None
    if key is not None and key == before:
        return gr.skip()
    card = cards.find(key) if key is not None else None
    return cards.shown(card) if card is not None else cards.STALE


def card_widgets(ui: SimpleNamespace) -> list:
    """`on_stored_card`'s inputs, less the session: the form, the Compare panel's size."""
    return form.widgets(ui.edit, ui.layers) + [ui.compare.max_examples, ui.compare.full_set]


def warm_card(values: list, max_examples, full_set, session: Session) -> None:
    """The start page's card, computed as Run edit and the card after it would and kept on
    disk (`compare_panel.keep_card`), unless one is kept for its key already. The weights'
    fingerprint is read first (pages look cards up by it). Where a card is kept, on a CPU
    its answers are still computed once (not kept again): the prefix cache then holds the
    start edit's answers (`grom.eval.prefix.Recall`), so that Run edit on the start page
    reads them in one pass instead of decoding them."""
    handle = REGISTRY.get(session.model_key)
    if handle is None:
        return
    cards.fingerprint_of(handle)
    key = stored_card_key(values, max_examples, full_set, session)
    if key is None:
        return
    kept = cards.find(key) is not None
    if kept and (ON_ZEROGPU or not split_decoding(handle.model) or session.benchmark is None
                 or current_benchmark(session).task not in ANSWERS_FIRST):
        return  # nothing would hold the answers (no prefix cache kept, an accelerator, a task without answers)
    quiet = lambda *_, **__: None  # noqa: E731
    session.extra["keep_card"] = not kept
    on_run_edit(*values, session, quiet)
    for _ in on_card_first(max_examples, full_set, session, progress=quiet):
        pass
    if kept:
        return
    if cards.find(key) is None:  # a benchmark whose card the comparison draws
        on_compare(max_examples, full_set, session, progress=quiet)
    if cards.find(key) is None:
        log.warning("the start page's card was computed but not kept (key %s)", key)


def warm_widgets(ui: SimpleNamespace) -> list:
    """The warm-up's inputs (`on_warm_comparison`'s, in order, less the session)."""
    return [ui.compare.max_examples, ui.layers.k, ui.edit.retain_examples, ui.edit.seed]


def wire_opening(demo: gr.Blocks, page: Page, start_key) -> None:
    """A new page: its session on the app's start model and data, then the run of its ?run=
    link if it has one (`page.page_linked`, which the panels read as they would a pasted
    link), then its layer scores and warm-up."""
    ui, s, e, ly = page.ui, page.session, page.ui.edit, page.ui.layers

    def page_load(session: Session):
        return on_page_load(session, start_key)

    opened = demo.load(page_load, s, [ui.model.status, ui.model.summary, ui.model.choice, ly.k,
                                      ui.bench.info, ui.data.forget_df, ui.data.retain_df,
                                      ui.bench.name, ui.bench.split, e.preset],
                       api_visibility="private")  # not the device queue: a new page opens during others' jobs
    # a page opened with ?run=<token> (a link to a run): that run's model, data, settings and edit
    # come first, and what follows reads them; without one it changes nothing
    linked = opened.success(in_turn(on_page_link), s, link_outputs(ui), api_visibility="private",
                            show_progress_on=[e.status], **LINKS)
    linked.success(in_turn(on_first_scores), score_widgets(ui) + [s], [ly.plot, ly.band_info],
                   api_visibility="private", **device_queue()) \
        .success(on_warm_comparison, warm_widgets(ui) + [s], None,  # not in the page's turn: its clicks
                 api_visibility="private", **device_queue())  # do not wait for it (they go first: `deferring`)
    page.page_linked = linked
    # the card this page's form would give, where one is kept on disk: shown at once
    linked.success(on_stored_card, card_widgets(ui) + [s], e.card, **LOCAL)
    # before the page's own first run: a setting changed, the kept card of the new settings (or none)
    gr.on([w.change for w in card_widgets(ui)], on_form_for_stored, card_widgets(ui) + [e.card, s], e.card,
          trigger_mode="always_last", show_progress="hidden", **LOCAL)


# ------------------------------------------------------------------------------ across panels

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


def on_data_changed():
    """New data: the last comparison's tables and answers, and the baseline's, were of the
    old data; they go, saying what comes next."""
    return ("New data loaded: press **Run edit**; the comparison follows.", empty_table("metrics"), "", "", "",
            "Press **Train the baseline and compare** to train it on the new data.", empty_table("baseline"))


def wire(page: Page) -> None:
    """What spans panels: new data clears the comparison's and the baseline's results; an
    edit done draws its status, plot, matrices and tab (`page.edit_done`, the card's start);
    Run edit pressed or the form changed: the results on show marked (`core.staleness`)."""
    ui = page.ui
    c, a, bl, e, ly = ui.compare, ui.answers, ui.baseline, ui.edit, ui.layers
    page.data_loaded.success(on_data_changed, None, [c.summary, c.table, a.forget_html, a.retain_html, a.prompt_html,
                                                     bl.summary, bl.table], **LOCAL)
    page.edit_done = page.edit_run.success(on_edit_done, view_widgets(ly, page.session),
                                           [e.status, e.card, ly.plot, ly.band_info, ui.diag.matrix, page.tabs],
                                           **LOCAL)
    wire_staleness(page)  # results of an earlier edit, or of other settings, said to be so


# ------------------------------------------------------------------------------ the server's warm-up

WARMUP = {"running": False, "started": 0.0}  # the server's first-page warm-up (`warm_first_page`)
WARM_TRIES = 20  # times a warm-up step starts again after giving the device up to visitors


def warmup_note() -> str:
    """A line for a page opened while the server warms up, else ""."""
    if not WARMUP["running"]:
        return ""
    since = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() - (time.monotonic() - WARMUP["started"])))
    return (f" · Warming up in the background since {since}: the layer scores, the unedited answers and the "
            "card of this page, so that the first card comes sooner. Your own clicks go first: it gives the "
            "device up to them.")


def warm_first_page(start_key, score_values: list, warm_values: list, card_values: list | None = None) -> None:
    """The start model's pace (`pace.calibrate`: every estimate's rate), then what a new page
    computes as it opens (`on_page_load`, `first_scores`, `warm_comparison`: the layer
    scores, the stream entering the suggested band, the unedited comparison rows), and the
    start page's card, run once in the background as the server starts, with the
    page's default widget values. Every cache it fills is shared, so the first visitor's
    page and Run edit do not wait on them (on SmolLM2 and a 2-core CPU, ~35 s of work). A
    failure is only logged: the page computes what it needs itself."""
    t0 = time.perf_counter()
    session = Session()
    steps = [("calibration", lambda: calibrate(ensure_model(start_key))),  # the estimates' pace, while quiet
             ("page", lambda: on_page_load(session, start_key)),
             ("layer scores", lambda: on_first_scores(*score_values, session, progress=lambda *_, **__: None)),
             ("comparison", lambda: on_warm_comparison(*warm_values, session))]
    if card_values is not None:  # the start page's card, kept on disk: every first visitor sees it at once
        steps.append(("card", lambda: warm_card(card_values[:-2], *card_values[-2:], session)))
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


def warm_in_background(ui: SimpleNamespace, start_key) -> None:
    """`warm_first_page` in a daemon thread, with the page's default widget values."""
    threading.Thread(target=warm_first_page, name="warm-first-page", daemon=True,
                     args=(start_key, [c.value for c in score_widgets(ui)],
                           [c.value for c in warm_widgets(ui)], [c.value for c in card_widgets(ui)])).start()
