"""Loading a causal LM and its tokenizer, safely: safetensors only, no remote code."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from grom.arch import arch_spec

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


def load_model(name_or_path: str | Path, *, device: str | None = "cpu", dtype="float32",
               device_map: str | dict | None = None, local_files_only: bool = False):
    """(model, tokenizer) from a local folder or a Hub id, in eval mode, gradients off.

    `device_map` ("auto" or an accelerate map) spreads a large model over devices; then
    `device` is ignored. `local_files_only` never touches the network (a Hub id must then
    be in the local cache).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = resolve_dtype(dtype)
    kw = dict(dtype=torch_dtype, use_safetensors=True, trust_remote_code=False,
              local_files_only=local_files_only)
    if device_map is not None:
        kw["device_map"] = device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False,
                                                  local_files_only=local_files_only)
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kw)
    except OSError as err:  # not found, no network, no safetensors weights
        raise ModelLoadError(
            f"could not load {name_or_path!r}: {err}. Give a local folder with config.json, "
            "tokenizer files and *.safetensors weights, or a Hub id when the network is there."
        ) from err
    arch_spec(model)  # an unsupported family fails here, with the list of supported ones
    if device_map is None:
        model.to(resolve_device(device))
    model.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s (%s, %s)", name_or_path, model.config.model_type, torch_dtype)
    return model, tokenizer
