"""Model panel: pick the demo, a paper's model or any Hub id / allowed folder; device,
dtype, or a device map and max memory per device for a model sharded by accelerate; load
with progress; a summary of what was loaded."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from components.server.allowed_sources import DEMO, REAL
from components.server.device import local_progress
from components.server.errors import ui_errors
from components.server.limits import ModelPolicy
from components.server.model_choices import (
    DEVICES,
    DTYPES,
    ensure_model,
    fetch,
    free_choice,
    model_choices,
    model_key,
    n_layers,
    status_line,
    summary,
)
from components.server.session import REGISTRY, Session
from components.server.sharded import DEVICE_MAP_CHOICES, ensure_sharded_model, offload_note, sharded_key
from components.studio.wiring import LOCAL, Page
from components.views import text


@ui_errors
def on_load_model(choice: str, device: str, dtype: str, device_map: str, max_memory: str, session: Session,
                  progress=gr.Progress()):
    """Load (or reuse) the shared model, whole on `device` or sharded by `device_map`
    within `max_memory`; returns a status line, the summary table and the band-width
    slider sized to the model's layers. A visitor's free choice is sized from its config
    before any download (GROM_MAX_MODEL_PARAMS); the download holds no device lock."""
    key = sharded_key(model_key(choice, device, dtype), device_map, max_memory)
    progress(0.1, desc=f"loading {key.label()}")
    report = local_progress(lambda f, m: progress(f, desc=m))  # loads here, ZeroGPU too
    free = free_choice(key)
    if key.device_map:
        if REGISTRY.get(key) is None:
            fetch(key, report, free=free)  # downloaded here, unlocked: the sharded load reads the cache
        handle = ensure_sharded_model(key, report)
    else:
        handle = ensure_model(key, report, free=free)
    if session.model_key != key:
        session.model_key = key
        session.scores = session.scores_for = None
    session.extra["model_widgets"] = (choice, device, dtype, device_map or "none", max_memory or "")
    progress(1.0, desc="loaded")
    n = n_layers(handle)
    note = offload_note(handle)
    return status_line(handle) + (f"\n\n{note}" if note else ""), summary(handle), gr.Slider(maximum=n)


def on_restore_model(session: Session):
    """After a failed load: the model box, device, dtype, device map and max memory show the
    model that is still loaded (not the one that failed), and the status line says so."""
    handle = REGISTRY.peek(session.model_key) if session.model_key is not None else REGISTRY.current
    if handle is None:
        return (*[gr.skip()] * 5, "No model is loaded: pick one and press **Load model**.")
    choice, device, dtype, *shard = session.extra.get("model_widgets", (handle.key.name, "auto", "auto"))
    device_map, max_memory = (*shard, "none", "")[:2]
    return (choice, device, dtype, device_map, max_memory,
            f"⚠ That model did not load (the message says why). Still loaded: "
            f"{status_line(handle).removeprefix('Loaded ')}")


MODEL_WORDS = {
    REAL: "**SmolLM2-135M-Instruct**, a real chat model (135M parameters, 30 layers) that knows famous "
          "facts: the real-knowledge benchmark makes it forget one topic",
    DEMO: "**the bundled demo**, a tiny Llama trained on fictitious authors (seconds per edit on a CPU, "
          "offline): the demo benchmark makes it forget some of them",
}
"""What each model the studio knows is, for the panel's first lines."""
OTHER_WORDS = {REAL: "SmolLM2-135M-Instruct (a real chat model)", DEMO: "the demo (a tiny Llama on fictitious authors)"}


def model_intro(name: str | None, shown: str | None = None) -> str:
    """The Model panel's first lines, for the loaded model `name` (`shown`: a Hub id or
    folder as the box shows it): what it is, then what else can be loaded. Drawn for the
    start model and again after each load, so that they never describe the demo while
    SmolLM2 is loaded."""
    loaded = MODEL_WORDS.get(name) or (f"`{shown or name}`" if name else "no model yet")
    others = [words for n, words in OTHER_WORDS.items() if n != name]
    return (f"GROM edits the weights of a causal language model. Loaded: {loaded}. Or pick "
            f"{', '.join(others)}, a paper's model, or type a Hub id or a folder in `models/`.")


def on_model_intro(session: Session) -> str:
    """After a load: the panel's first lines for the session's model (`model_intro`)."""
    handle = REGISTRY.peek(session.model_key) if session.model_key is not None else REGISTRY.current
    return model_intro(handle.key.name, handle.key.shown) if handle is not None else gr.skip()


def build_model_panel(start: str = REAL) -> SimpleNamespace:
    """The model box with its device and dtype and Load model on one line, the status line
    under them, and folded: sharding for large models, and what the loaded model is."""
    policy = ModelPolicy.from_env()
    with gr.Row(equal_height=True, elem_classes="choice-row"):
        choice = gr.Dropdown(model_choices(policy), value=start, label="Model",
                             allow_custom_value=policy.allowed is None,
                             scale=4, min_width=220)
        device = gr.Dropdown(DEVICES, value="auto", label="Device", scale=1, min_width=90)
        dtype = gr.Dropdown(DTYPES, value="auto", label="dtype", scale=1, min_width=100)
        load = gr.Button("Load model", variant="secondary", scale=0, min_width=110, size="sm",
                         elem_classes="row-button")
    status = gr.Markdown("Loading the model…", elem_classes="status-line")
    with gr.Row(elem_classes="folds"):
        with gr.Accordion("What this model is", open=False):
            intro = text.md(model_intro(start), elem_classes="panel-intro", elem_id="model-intro")
            info = gr.Markdown("", elem_classes="model-summary")
        with gr.Accordion("Large models: shard over devices", open=False):
            device_map = gr.Dropdown(DEVICE_MAP_CHOICES, value="none", label="Device map", min_width=120,
                                     info="none: the whole model on Device; auto / balanced / sequential: "
                                          "over the GPUs, then the CPU, then disk (accelerate)")
            max_memory = gr.Textbox("", label="Max memory per device", min_width=200,
                                    placeholder="0=20GiB,cpu=60GiB",
                                    info="GPU index or cpu = size; what does not fit goes to disk, and "
                                         "edited layers must not")
    return SimpleNamespace(intro=intro, choice=choice, device=device, dtype=dtype, device_map=device_map,
                           max_memory=max_memory, load=load, status=status, summary=info)


def wire(m: SimpleNamespace, page: Page) -> None:
    """Load model (public `load_model`; sets `page.model_loaded`): its own queue, since the
    download holds no lock and device jobs run beside it; a failed load leaves the old model
    loaded, and the widgets say so instead of naming the failed one."""
    s = page.session
    asked = [m.choice, m.device, m.dtype, m.device_map, m.max_memory]
    loaded = m.load.click(on_load_model, asked + [s], [m.status, m.summary, page.ui.layers.k],
                          api_name="load_model", concurrency_id="load_model", concurrency_limit=1)
    loaded.success(on_model_intro, s, m.intro, **LOCAL)  # the panel's first lines: the model now loaded
    loaded.failure(on_restore_model, s, asked + [m.status], **LOCAL)
    page.model_loaded = loaded
