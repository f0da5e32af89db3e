"""What one request, one session and the whole server may use: the host's limits.

Every limit is an environment variable with a default that suits a free GPU Space (one
GPU, many visitors); a private machine raises them as it likes. They are read when a
request asks (so a test or a host may change them without a restart), and going over
one is a `UserError` that names the limit and the variable to raise (`over`).

| variable | default | bounds |
|---|---|---|
| GROM_MAX_EPOCHS | 10 | epochs of one gradient baseline |
| GROM_MAX_EXAMPLES | 4000 | forget or retain examples one edit or baseline uses |
| GROM_MAX_EVAL_EXAMPLES | 1000 | examples per evaluation set of a comparison ("all examples" included) |
| GROM_MAX_NEW_TOKENS | 64 | new tokens of an answer to a typed question |
| GROM_MAX_UPLOAD_MB | 10 | size of one uploaded benchmark file |
| GROM_MAX_PATCH_MB | 24 | size of an uploaded patch.safetensors (any 5-layer down_proj edit of SmolLM2, full form: 16.9 MB) |
| GROM_MAX_UPLOAD_ROWS | 10000 | rows of an uploaded benchmark |
| GROM_MAX_QUEUED_PER_SESSION | 3 | jobs one session may have waiting or running |
| GROM_MAX_QUEUE | 64 | jobs waiting in the whole server |
| GROM_MODELS | (unset: any) | comma-separated models a visitor may load (names as in the model box) |
| GROM_RESIDENT_MODELS | 2 | models kept loaded at once (least recently used goes) |
| GROM_MAX_SESSIONS | 32 | sessions whose edits are kept (the oldest is dropped) |
| GROM_EXPORT_MAX_MB | 256 | exported edits kept on disk (the oldest go) |
| GROM_EXPORTS_PER_MINUTE | 6 | new exports per minute on the whole server |
| GROM_UPLOADS_PER_MINUTE | 30 | uploads one client (address) may make per minute |
| GROM_SERVER_UPLOADS_PER_MINUTE | 120 | uploads the whole server accepts per minute |
| GROM_MAX_REQUEST_MB | 4 | body of any request but an upload (the queue's inputs) |
| GROM_UPLOAD_CACHE_MB | 512 | uploaded files kept on disk (the oldest go) |
| GROM_GPU_SECONDS | 300 | seconds of GPU one call asks for on ZeroGPU (its limit: components/core/gpu_time.py) |
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from components.core.errors import UserError

DEFAULTS = {
    "GROM_MAX_EPOCHS": 10, "GROM_MAX_EXAMPLES": 4000, "GROM_MAX_EVAL_EXAMPLES": 1000,
    "GROM_MAX_NEW_TOKENS": 64, "GROM_MAX_UPLOAD_MB": 10, "GROM_MAX_UPLOAD_ROWS": 10000,
    "GROM_MAX_QUEUED_PER_SESSION": 3, "GROM_MAX_QUEUE": 64, "GROM_RESIDENT_MODELS": 2,
    "GROM_MAX_SESSIONS": 32, "GROM_EXPORT_MAX_MB": 256, "GROM_EXPORTS_PER_MINUTE": 6,
    "GROM_UPLOADS_PER_MINUTE": 30, "GROM_UPLOAD_CACHE_MB": 512, "GROM_SERVER_UPLOADS_PER_MINUTE": 120,
    "GROM_MAX_REQUEST_MB": 4, "GROM_MAX_PATCH_MB": 24, "GROM_GPU_SECONDS": 300,
}


def limit(name: str) -> int:
    """The host's value of `name` (a positive whole number), else its default. A value
    that is not one fails loudly at the first request rather than being ignored."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"{name}={raw!r}: set it to a whole number of at least 1 "
                         f"(default {DEFAULTS[name]}).")
    return int(value)


def over(what: str, asked, name: str) -> UserError:
    """The error for `asked` beyond the limit `name`: says the limit and who may raise it.
    `what` names the quantity ("Epochs") or is a phrase with `{n}` where `asked` goes."""
    asked = int(asked) if float(asked) == int(asked) else asked
    said = what.format(n=f"{asked:,}") if "{n}" in what else f"{what}: {asked:,}"
    return UserError(f"{said}, more than this server allows (at most {limit(name):,}). "
                     f"Ask for less, or, hosting the studio yourself, raise {name}.")


def check(what: str, asked: int, name: str) -> int:
    """`asked` when it is within the limit `name`; else the error that names it."""
    if asked > limit(name):
        raise over(what, asked, name)
    return asked


@dataclass(frozen=True)
class ModelPolicy:
    """Which models a visitor may load: `allowed` None is a free choice."""
    allowed: tuple[str, ...] | None

    @classmethod
    def from_env(cls) -> "ModelPolicy":
        raw = os.environ.get("GROM_MODELS", "").strip()
        if not raw:
            return cls(None)
        return cls(tuple(n.strip() for n in raw.split(",") if n.strip()))

    def permits(self, name: str) -> bool:
        return self.allowed is None or name in self.allowed


def upload_bytes() -> int:
    return limit("GROM_MAX_UPLOAD_MB") << 20
