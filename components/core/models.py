"""Which models a visitor may load and how: the model box's choices, the registry key
for the widgets' values, and loading into the shared registry.

Loading is not a compute function: it runs in the process that serves the page, so that
the shared registry holds the model. On ZeroGPU that is what the platform asks (models
loaded in the main process, moved to "cuda" there, which `spaces` intercepts; every GPU
worker is forked from it and inherits them): the allow-listed models are loaded at start
(`preload_allowed`), and a model loaded by a request is loaded there too (CPU work)."""
from __future__ import annotations

import logging

from components.core.device import ON_ZEROGPU
from components.core.errors import UserError, shorten
from components.core.limits import ModelPolicy, limit
from components.core.session import REGISTRY, ModelHandle, ModelKey
from components.core.sources import DEMO, REAL, require_hub, resolve_source
from grom.arch import num_layers
from grom.demo import load_demo_model
from grom.fetch import registry_model
from grom.models import ModelLoadError, load_model, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

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
    if device not in DEVICES or dtype not in DTYPES:
        raise UserError(f"Device must be one of {DEVICES} and dtype one of {DTYPES}.")
    policy = ModelPolicy.from_env()
    if not policy.permits((choice or "").strip()):
        raise UserError(f"This server offers only these models: {', '.join(policy.allowed)} "
                        f"(its host set GROM_MODELS). Pick one of them; {shorten(choice)!r} is not among them.")
    name = resolve_source(choice, "model")
    if ON_ZEROGPU:  # no CUDA to ask in this process: the GPU comes with each request
        dev = "cuda" if device in ("auto", "cuda") else device
    else:
        try:
            dev = resolve_device(device)
        except ValueError as err:
            raise UserError(str(err)) from err
    if dtype == "auto":
        dtype = "bfloat16" if dev.startswith("cuda") else "float32"
    return ModelKey(name, dev, dtype)


def _load(key: ModelKey, progress=None) -> tuple:
    if key.name == DEMO:

        return load_demo_model("full", device=key.device, dtype=resolve_dtype(key.dtype))
    if registry_model(key.name) is None and not key.name.startswith("/"):
        require_hub(key.name, "model")
    try:
        return load_model(key.name, device=key.device, dtype=key.dtype, progress=progress)
    except ModelLoadError as err:
        raise UserError(str(err)) from err


REGISTRY.loader = _load  # a ZeroGPU worker forked before a model was loaded loads it itself


def ensure_model(key: ModelKey, progress=None) -> ModelHandle:
    """The shared model for `key`, loaded (a registry model fetched, with `progress`) if
    another one is loaded now. In the calling process (the main one on ZeroGPU)."""
    return REGISTRY.load(key, lambda k: _load(k, progress))


def preload_allowed(device: str = "auto", dtype: str = "auto") -> list[ModelKey]:
    """Every model of the host's GROM_MODELS loaded now, at most GROM_RESIDENT_MODELS of
    them (the first ones named), so that every GPU worker forked later has them; the keys
    loaded. Nothing without GROM_MODELS (a free choice cannot be loaded ahead). A model
    that fails is logged and skipped: a request for it says why."""
    policy = ModelPolicy.from_env()
    if policy.allowed is None:
        return []
    room = limit("GROM_RESIDENT_MODELS")
    if len(policy.allowed) > room:
        log.warning("GROM_MODELS names %d models and GROM_RESIDENT_MODELS keeps %d: loading %s at start; "
                    "the others load when asked", len(policy.allowed), room, ", ".join(policy.allowed[:room]))
    loaded = []
    for name in policy.allowed[:room]:
        try:
            loaded.append(ensure_model(model_key(name, device, dtype)).key)
        except Exception as err:  # noqa: BLE001  (one bad name does not keep the others out)
            log.warning("could not preload %s: %s", name, err)
    return loaded


def n_layers(handle: ModelHandle) -> int:
    return num_layers(handle.model)


def model_choices(policy: ModelPolicy) -> list[tuple[str, str]]:
    """The model box's list: all of MODEL_CHOICES, or on a host with GROM_MODELS, its models."""
    if policy.allowed is None:
        return MODEL_CHOICES
    listed = [(label, name) for label, name in MODEL_CHOICES if policy.permits(name)]
    return listed + [(name, name) for name in policy.allowed if name not in dict(MODEL_CHOICES).values()]
