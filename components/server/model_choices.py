"""Which models a visitor may load and how: the model box's choices, the registry key
for the widgets' values, and loading into the shared registry.

A load is two steps (`ensure_model`): `fetch` brings the files here without DEVICE_LOCK
(the other visitors' jobs run meanwhile), then the registry loads them into memory under
it. Before any weight is downloaded, a visitor's free choice (no GROM_MODELS, or `*`) is
sized from its config.json and refused above GROM_MAX_MODEL_PARAMS; the models the host
chose (GROM_MODELS, a Space's default list, the start model) are not. The app's start
model is pinned (`pin_start_model`): no visitor's load unloads it.

`status_line` and `summary` say what the loaded model is, in a line and in a table.

Loading is not a compute function: it runs in the process that serves the page, so that
the shared registry holds the model. On ZeroGPU that is what the platform asks (models
loaded in the main process, moved to "cuda" there, which `spaces` intercepts; every GPU
worker is forked from it and inherits them): the allow-listed models are loaded at start
(`preload_allowed`), and a model loaded by a request is loaded there too (CPU work)."""
from __future__ import annotations

import logging
import os
import threading

import torch

from components.server.allowed_sources import DEMO, REAL, allowed_source, require_hub
from components.server.device import ON_ZEROGPU
from components.server.errors import UserError, shorten
from components.server.limits import ModelPolicy, limit, over
from components.server.session import REGISTRY, ModelHandle, ModelKey
from grom.demo import load_demo_model
from grom.model.arch import num_layers
from grom.model.fetch import registry_model
from grom.model.loading import ModelLoadError, download_model, load_model, model_size, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

MODEL_CHOICES = [
    ("SmolLM2-135M-Instruct: a real chat model (fetched once, ~40 s)", REAL),
    ("Demo: tiny Llama, fictitious authors (instant, offline)", DEMO),
    ("TOFU: Llama-3.2-1B-Instruct full (paper, TOFU-10%)", "open-unlearning/tofu_Llama-3.2-1B-Instruct_full"),
    ("TOFU: Llama-2-7b-chat full (paper, TOFU-5%)", "open-unlearning/tofu_Llama-2-7b-chat-hf_full"),
    ("MUSE-News: Llama-2-7B trained on the news corpus", "muse-bench/MUSE-news_target"),
    ("MUSE-Books: Llama-2-7B trained on the books corpus", "muse-bench/MUSE-books_target"),
    ("WMDP: Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
]


DEVICES = ["auto", "cpu", "cuda"]


DTYPES = ["auto", "float32", "bfloat16", "float16"]


def model_key(choice: str, device: str, dtype: str) -> ModelKey:
    """The registry key for the widgets' values (validated; auto resolved)."""
    if device not in DEVICES or dtype not in DTYPES:
        raise UserError(f"Device must be one of {DEVICES} and dtype one of {DTYPES}.")
    policy = ModelPolicy.from_env()
    if not policy.permits((choice or "").strip()) and (choice or "").strip() not in pinned_names():
        why = "its host set GROM_MODELS" if os.environ.get("GROM_MODELS", "").strip() else \
            "the default of a public Space; its host widens it with GROM_MODELS"
        raise UserError(f"This server offers only these models: {', '.join(policy.allowed)} "
                        f"({why}). Pick one of them; {shorten(choice)!r} is not among them.")
    name = allowed_source(choice, "model")
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


_FETCH_LOCK = threading.Lock()  # one download at a time (not DEVICE_LOCK: the jobs go on)


def pinned_names() -> set[str]:
    """The names (as typed and as shown) of the pinned models: the start model stays
    loadable whatever the allow-list (its other dtypes too)."""
    return {n for k in REGISTRY.pinned for n in (k.name, k.shown)}


def pin_start_model(key: ModelKey | None) -> None:
    """Pin the app's start model (`key`, loaded): never unloaded by a visitor's load, and
    offered in the model box whatever the allow-list. Called as the app is built."""
    REGISTRY.pin(*[key] if key is not None else [])


def free_choice(key: ModelKey) -> bool:
    """Whether `key` is a visitor's own pick (no allow-list, or `*`; not the start model):
    then its size is checked against GROM_MAX_MODEL_PARAMS before any download."""
    return ModelPolicy.from_env().allowed is None and key.name not in pinned_names()


def check_size(key: ModelKey) -> int:
    """The parameter count of `key` read from its config.json (a Hub id's downloaded alone,
    no weight), refused above GROM_MAX_MODEL_PARAMS with its size and the limit."""
    try:
        size = model_size(key.name)
    except ModelLoadError as err:
        raise UserError(f"{shorten(key.shown)}: {err}; this server reads a model's size from its config "
                        "before downloading it.") from err
    if size.params > limit("GROM_MAX_MODEL_PARAMS"):
        about = f"{size.params / 1e9:,.2f} B" if size.params >= 1e9 else f"{size.params / 1e6:,.1f} M"
        raise over(f"{shorten(key.shown)} has {about} parameters ({{n}}, read from {size.source})",
                   size.params, "GROM_MAX_MODEL_PARAMS")
    return size.params


def fetch(key: ModelKey, progress=None, *, free: bool = False) -> str | None:
    """Bring the files loading `key` reads onto this machine, without DEVICE_LOCK (the other
    visitors' jobs go on meanwhile); the folder `_load` then reads (None: the bundled demo).
    With `free` (`free_choice`), its size is checked first (`check_size`), and weights
    larger than that size in float32 are not downloaded either."""
    if key.name == DEMO:
        return None
    if registry_model(key.name) is None and not key.name.startswith("/"):
        require_hub(key.name, "model")
    params = check_size(key) if free else None
    try:
        with _FETCH_LOCK:
            return download_model(key.name, progress, max_bytes=None if params is None else 4 * params + (1 << 20))
    except ModelLoadError as err:
        raise UserError(str(err)) from err


def _load(key: ModelKey, progress=None, where: str | None = None) -> tuple:
    """(model, tokenizer) of `key`, from `where` (what `fetch` brought) or its name."""
    if key.name == DEMO:

        return load_demo_model("full", device=key.device, dtype=resolve_dtype(key.dtype))
    if where is None and registry_model(key.name) is None and not key.name.startswith("/"):
        require_hub(key.name, "model")
    try:
        return load_model(where or key.name, device=key.device, dtype=key.dtype, progress=progress)
    except ModelLoadError as err:  # named as the visitor typed it, not by the server's cache path
        raise UserError(str(err).replace(where or key.name, key.shown)) from err


REGISTRY.loader = _load  # a ZeroGPU worker forked before a model was loaded loads it itself


def ensure_model(key: ModelKey, progress=None, *, free: bool = False) -> ModelHandle:
    """The shared model for `key`, loaded (a registry model fetched, with `progress`) if
    it is not loaded now: downloaded first without DEVICE_LOCK (`fetch`, with `free` its
    size checked before), then loaded into memory under it. In the calling process (the
    main one on ZeroGPU)."""
    handle = REGISTRY.get(key)
    if handle is not None:
        return handle
    where = fetch(key, progress, free=free)
    return REGISTRY.load(key, lambda k: _load(k, progress, where))


def preload_allowed(device: str = "auto", dtype: str = "auto") -> list[ModelKey]:
    """Every model of the host's GROM_MODELS loaded now, at most GROM_RESIDENT_MODELS of
    them (the first ones named), so that every GPU worker forked later has them; the keys
    loaded. Nothing for a free choice (GROM_MODELS unset off a Space, or `*`: it cannot be
    loaded ahead); on a Space without GROM_MODELS, its default list (`limits.SPACE_MODELS`).
    A model that fails is logged and skipped: a request for it says why."""
    policy = ModelPolicy.from_env()
    if policy.allowed is None:
        return []
    room = limit("GROM_RESIDENT_MODELS")
    if len(policy.allowed) > room:
        log.warning("the allow-list (GROM_MODELS, or a Space's default) names %d models and GROM_RESIDENT_MODELS "
                    "keeps %d: loading %s at start; "
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
    """The model box's list: all of MODEL_CHOICES, or with an allow-list (GROM_MODELS, a
    Space's default), its models and the start model."""
    if policy.allowed is None:
        return MODEL_CHOICES
    listed = [(label, name) for label, name in MODEL_CHOICES if policy.permits(name)]
    known = {name for _, name in MODEL_CHOICES}
    listed += [(name, name) for name in policy.allowed if name not in known]
    shown = {name for _, name in listed}
    return listed + sorted({(k.shown, k.shown) for k in REGISTRY.pinned if not {k.name, k.shown} & shown})


def summary(handle: ModelHandle) -> str:
    """Markdown: architecture, layers, sizes, device and memory of the loaded model (no
    CUDA query on ZeroGPU, whose main process has no GPU)."""
    m, cfg = handle.model, handle.model.config
    n_params = sum(p.numel() for p in m.parameters())
    n_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    name = {DEMO: "bundled demo (assets/demo-full)",
            REAL: "SmolLM2-135M-Instruct (package index GGUF, float32)"}.get(handle.key.name, handle.key.shown)
    mem = f"{n_bytes / 2**20:,.1f} MiB of weights"
    if ON_ZEROGPU:  # this process has no GPU to ask: each compute call gets one
        mem += "; GPU attached per request (ZeroGPU)"
    elif handle.key.device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        mem += f"; GPU {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"
    rows = [("model", name), ("architecture", f"{type(m).__name__} ({cfg.model_type})"),
            ("layers", num_layers(m)), ("hidden size", getattr(cfg, "hidden_size", "?")),
            ("MLP size", getattr(cfg, "intermediate_size", getattr(cfg, "n_inner", "?"))),
            ("vocabulary", getattr(cfg, "vocab_size", "?")), ("parameters", f"{n_params / 1e6:,.2f} M"),
            ("device, dtype", f"{handle.key.device}, {handle.key.dtype}"), ("memory", mem),
            ("load time", f"{handle.seconds:.1f} s")]
    return "| property | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def status_line(handle: ModelHandle) -> str:
    """One line: which model is loaded, its class and layers, where and in which dtype."""
    name = {DEMO: "the bundled demo model", REAL: "SmolLM2-135M-Instruct"}.get(handle.key.name,
                                                                             f"`{handle.key.shown}`")
    where = f"sharded by device map {handle.key.device_map}" if handle.key.device_map else f"on {handle.key.device}"
    return (f"Loaded {name}: {type(handle.model).__name__}, {n_layers(handle)} layers, {where} "
            f"in {handle.key.dtype}.")
