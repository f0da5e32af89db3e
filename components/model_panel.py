"""Model panel: pick the demo, a paper target or any Hub id / allowed folder; device,
dtype; load with progress; a summary of what was loaded."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import torch

from components import text
from components.errors import shorten, ui_errors
from components.limits import ModelPolicy
from components.session import (DEMO, REAL, REGISTRY, ModelHandle, ModelKey, Session, UserError,
                                device_progress, on_device)
from components.sources import require_hub, resolve_source

MODEL_CHOICES = [
    ("SmolLM2-135M-Instruct: a real chat model (fetched once, ~40 s)", REAL),
    ("Demo: tiny Llama, fictitious authors (instant, offline)", DEMO),
    ("TOFU: Llama-3.2-1B-Instruct full (paper, TOFU-10%)", "open-unlearning/tofu_Llama-3.2-1B-Instruct_full"),
    ("TOFU: Llama-2-7b-chat full (paper, TOFU-5%)", "open-unlearning/tofu_Llama-2-7b-chat-hf_full"),
    ("MUSE-News target", "muse-bench/MUSE-news_target"),
    ("MUSE-Books target", "muse-bench/MUSE-books_target"),
    ("WMDP: Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
]
DEVICES = ["auto", "cpu", "cuda"]
DTYPES = ["auto", "float32", "bfloat16", "float16"]


def model_key(choice: str, device: str, dtype: str) -> ModelKey:
    """The registry key for the widgets' values (validated; auto resolved)."""
    from grom.models import resolve_device

    if device not in DEVICES or dtype not in DTYPES:
        raise UserError(f"Device must be one of {DEVICES} and dtype one of {DTYPES}.")
    policy = ModelPolicy.from_env()
    if not policy.permits((choice or "").strip()):
        raise UserError(f"This server offers only these models: {', '.join(policy.allowed)} "
                        f"(its host set GROM_MODELS). Pick one of them; {shorten(choice)!r} is not among them.")
    name = resolve_source(choice, "model")
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise UserError(str(err)) from err
    if dtype == "auto":
        dtype = "bfloat16" if dev.startswith("cuda") else "float32"
    return ModelKey(name, dev, dtype)


def _load(key: ModelKey, progress=None) -> tuple:
    from grom.fetch import registry_model
    from grom.models import ModelLoadError, load_model, resolve_dtype

    if key.name == DEMO:
        from grom.demo import load_demo_model

        return load_demo_model("full", device=key.device, dtype=resolve_dtype(key.dtype))
    if registry_model(key.name) is None and not key.name.startswith("/"):
        require_hub(key.name, "model")
    try:
        return load_model(key.name, device=key.device, dtype=key.dtype, progress=progress)
    except ModelLoadError as err:
        raise UserError(str(err)) from err


@on_device
def ensure_model(key: ModelKey, progress=None) -> ModelHandle:
    """The shared model for `key`, loaded (a registry model fetched, with `progress`) if
    another one is loaded now."""
    return REGISTRY.load(key, lambda k: _load(k, progress))


def summary(handle: ModelHandle) -> str:
    """Markdown: architecture, layers, sizes, device and memory of the loaded model."""
    from grom.arch import num_layers

    m, cfg = handle.model, handle.model.config
    n_params = sum(p.numel() for p in m.parameters())
    n_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    name = {DEMO: "bundled demo (assets/demo-full)",
            REAL: "SmolLM2-135M-Instruct (package index GGUF, float32)"}.get(handle.key.name, handle.key.shown)
    mem = f"{n_bytes / 2**20:,.1f} MiB of weights"
    if handle.key.device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        mem += f"; GPU {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"
    rows = [("model", name), ("architecture", f"{type(m).__name__} ({cfg.model_type})"),
            ("layers", num_layers(m)), ("hidden size", getattr(cfg, "hidden_size", "?")),
            ("MLP size", getattr(cfg, "intermediate_size", getattr(cfg, "n_inner", "?"))),
            ("vocabulary", getattr(cfg, "vocab_size", "?")), ("parameters", f"{n_params / 1e6:,.2f} M"),
            ("device, dtype", f"{handle.key.device}, {handle.key.dtype}"), ("memory", mem),
            ("load time", f"{handle.seconds:.1f} s")]
    return "| property | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


@ui_errors
def load_model(choice: str, device: str, dtype: str, session: Session,
               progress=gr.Progress()):
    """Load (or reuse) the shared model; returns a status line, the summary table and the
    band-width slider sized to the model's layers."""
    key = model_key(choice, device, dtype)
    progress(0.1, desc=f"loading {key.label()}")
    handle = ensure_model(key, device_progress(lambda f, m: progress(f, desc=m)))
    if session.model_key != key:
        session.model_key = key
        session.scores = session.scores_for = None
    session.extra["model_widgets"] = (choice, device, dtype)
    progress(1.0, desc="loaded")
    n = n_layers(handle)
    return status_line(handle), summary(handle), gr.Slider(maximum=n)


def restore_model(session: Session):
    """After a failed load: the model box, device and dtype show the model that is still
    loaded (not the one that failed), and the status line says so."""
    handle = REGISTRY.get(session.model_key) if session.model_key is not None else REGISTRY.current
    if handle is None:
        return gr.skip(), gr.skip(), gr.skip(), "No model is loaded: pick one and press **Load model**."
    choice, device, dtype = session.extra.get("model_widgets", (handle.key.name, "auto", "auto"))
    return (choice, device, dtype, f"⚠ That model did not load (the message says why). Still loaded: "
                                   f"{status_line(handle).removeprefix('Loaded ')}")


def status_line(handle: ModelHandle) -> str:
    name = {DEMO: "the bundled demo model", REAL: "SmolLM2-135M-Instruct"}.get(handle.key.name,
                                                                             f"`{handle.key.shown}`")
    return (f"Loaded {name}: {type(handle.model).__name__}, {n_layers(handle)} layers, on "
            f"{handle.key.device} in {handle.key.dtype}.")


def n_layers(handle: ModelHandle) -> int:
    from grom.arch import num_layers

    return num_layers(handle.model)


def model_choices(policy: ModelPolicy) -> list[tuple[str, str]]:
    """The model box's list: all of MODEL_CHOICES, or on a host with GROM_MODELS, its models."""
    if policy.allowed is None:
        return MODEL_CHOICES
    listed = [(label, name) for label, name in MODEL_CHOICES if policy.permits(name)]
    return listed + [(name, name) for name in policy.allowed if name not in dict(MODEL_CHOICES).values()]


def build_model_panel(start: str = REAL) -> SimpleNamespace:
    text.md(text.MODEL, elem_classes="panel-intro")
    policy = ModelPolicy.from_env()
    with gr.Row(equal_height=True):
        choice = gr.Dropdown(model_choices(policy), value=start, label="Model",
                             allow_custom_value=policy.allowed is None,
                             scale=4, min_width=220)
        device = gr.Dropdown(DEVICES, value="auto", label="Device", scale=1, min_width=90)
        dtype = gr.Dropdown(DTYPES, value="auto", label="dtype", scale=1, min_width=100)
    with gr.Row(equal_height=True):
        status = gr.Markdown("Loading the model…", elem_classes="status-line")
        load = gr.Button("Load model", variant="secondary", scale=0, min_width=130, size="sm")
    with gr.Accordion("Model details", open=False):
        info = gr.Markdown("", elem_classes="model-summary")
    return SimpleNamespace(choice=choice, device=device, dtype=dtype, load=load, status=status,
                           summary=info)
