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
| GROM_MAX_UPLOAD_ROWS | 10000 | rows of an uploaded benchmark (and of a name-only table) |
| GROM_MAX_WRITTEN | 240 | texts the model writes for one name-only request: passages, question tries and answers, about the subject and its neighbours (the defaults, 8 passages and 16 questions with 2 neighbours: 108; the sliders' top: 496) |
| GROM_MAX_QUEUED_PER_SESSION | 3 | jobs one session may have waiting or running |
| GROM_MAX_QUEUE | 64 | jobs waiting in the whole server (its last eighth kept for visitors with no job in it) |
| GROM_DEVICE_JOBS | 64 | model jobs admitted at once (all that the queue holds, GROM_MAX_QUEUE): they take the device in turn, a visitor at a time, a long job between its steps (components/server/device.py); past it, they would wait in gradio's queue, where one visitor's jobs can hold every place |
| GROM_MODELS | (unset: any; on a Space, `SPACE_MODELS`) | comma-separated models a visitor may load (names as in the model box); `*`: any |
| GROM_RESIDENT_MODELS | 2 | visitors' models kept loaded at once beside the start model, which is never unloaded (least recently used goes) |
| GROM_MAX_SESSIONS | 32 | sessions whose edits are kept (the oldest is dropped) |
| GROM_EXPORT_MAX_MB | 256 | exported edits kept on disk (the oldest go) |
| GROM_EXPORTS_PER_MINUTE | 6 | new exports (and links to runs) per minute on the whole server; past it, a visitor who has had less than an equal share still gets one, up to twice this (components/server/rates.py) |
| GROM_VISITOR_EXPORTS_PER_MINUTE | 3 | new exports (and links) per minute from one visitor |
| GROM_MAX_LINKS | 500 | links to runs kept (the oldest go; GROM_LINK_DIR: where, components/studio/links.py) |
| GROM_LINKS_MAX_MB | 512 | links to runs kept on disk (the oldest go) |
| GROM_LINK_DAYS | 30 | days a link to a run opens |
| GROM_MAX_CARDS | 200 | result cards kept on disk, each a few kB, so that a page opens with its card (GROM_CARD_DIR: where, components/studio/cards.py; the oldest go) |
| GROM_UPLOADS_PER_MINUTE | 30 | uploads one client (address) may make per minute |
| GROM_SERVER_UPLOADS_PER_MINUTE | 120 | uploads the whole server accepts per minute; past it, a visitor who has had less than an equal share still gets one, up to twice this |
| GROM_MAX_REQUEST_MB | 4 | body of any request but an upload (the queue's inputs) |
| GROM_UPLOAD_CACHE_MB | 512 | uploaded files kept on disk (the oldest go) |
| GROM_GPU_SECONDS | 300 | seconds of GPU one call asks for on ZeroGPU (its limit: components/server/gpu_time.py) |
| GROM_MAX_EXAMPLE_TOKENS | 4096 | tokens of one example (a text cut into 512-token windows: 8 windows) |
| GROM_MAX_JOB_TOKENS | 500000 | tokens one job reads from the data (forget + retain + evaluation sets; the demo's largest, a baseline on forget10 with all examples: 393k) |
| GROM_MAX_JOB_SECONDS | 900 | wall time of one job, on any host (it stops at its next forward pass) |
| GROM_MAX_QUEUED_PER_VISITOR | 3 | jobs one visitor (client address, GROM_PROXY_HOPS) may have waiting or running |
| GROM_LISTEN_SECONDS | 20 | seconds a job waits for its client to listen for its result before it is dropped (stopped if it runs) |
| GROM_MAX_PATCH_RANK | 1024 | rank of one imported factored patch |
| GROM_MAX_MODEL_PARAMS | 2000000000 | parameters of a model a visitor may load by free choice (read from its config before any download; the models GROM_MODELS names are the host's choice) |
| GROM_SESSIONS_PER_VISITOR | 32 | sessions (pages, API clients, made-up session ids) one visitor may hold; one more drops its least recently used one that has no page open and no job (components/server/page_sessions.py) |
| GROM_SESSION_IDLE_SECONDS | 900 | seconds a session with no page open and no job is kept unused |
| GROM_MAX_PAGE_SESSIONS | 2000 | sessions the whole server holds (gradio's state_session_capacity: the oldest goes) |
| GROM_DIRECT_CALLS_PER_VISITOR | 8 | events served outside the queue (the page's redraws, cards, downloads) one visitor may have running at once; 8 times as many more wait, beyond that a call is refused |
| GROM_JOBS_MEMORY_MB | (unset: half the device's memory) | memory the jobs under way may hold between their turns at once (a baseline's training, a relearning attack); a job waits for room, and one that alone would not fit is refused (components/server/memory_budget.py; read there, not by `limit`) |
| GROM_PROXY_HOPS | 1 on a Space, else 0 | proxies in front of the server whose X-Forwarded-For entry is trusted (0: the header is ignored; `proxy_hops`) |
"""  # noqa: E501  a Markdown table: one row a line
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from components.server.errors import UserError

DEFAULTS = {
    "GROM_MAX_EPOCHS": 10, "GROM_MAX_EXAMPLES": 4000, "GROM_MAX_EVAL_EXAMPLES": 1000,
    "GROM_MAX_NEW_TOKENS": 64, "GROM_MAX_UPLOAD_MB": 10, "GROM_MAX_UPLOAD_ROWS": 10000, "GROM_MAX_WRITTEN": 240,
    "GROM_MAX_QUEUED_PER_SESSION": 3, "GROM_MAX_QUEUE": 64, "GROM_RESIDENT_MODELS": 2,
    "GROM_MAX_SESSIONS": 32, "GROM_EXPORT_MAX_MB": 256, "GROM_EXPORTS_PER_MINUTE": 6,
    "GROM_UPLOADS_PER_MINUTE": 30, "GROM_UPLOAD_CACHE_MB": 512, "GROM_SERVER_UPLOADS_PER_MINUTE": 120,
    "GROM_MAX_REQUEST_MB": 4, "GROM_MAX_PATCH_MB": 24, "GROM_GPU_SECONDS": 300,
    "GROM_MAX_EXAMPLE_TOKENS": 4096, "GROM_MAX_JOB_TOKENS": 500_000, "GROM_MAX_JOB_SECONDS": 900,
    "GROM_MAX_QUEUED_PER_VISITOR": 3, "GROM_LISTEN_SECONDS": 20, "GROM_MAX_PATCH_RANK": 1024,
    "GROM_MAX_MODEL_PARAMS": 2_000_000_000, "GROM_DEVICE_JOBS": 64,
    "GROM_MAX_LINKS": 500, "GROM_LINKS_MAX_MB": 512, "GROM_LINK_DAYS": 30, "GROM_MAX_CARDS": 200,
    "GROM_SESSIONS_PER_VISITOR": 32, "GROM_SESSION_IDLE_SECONDS": 900, "GROM_MAX_PAGE_SESSIONS": 2000,
    "GROM_DIRECT_CALLS_PER_VISITOR": 8, "GROM_VISITOR_EXPORTS_PER_MINUTE": 3,
}


def limit(name: str) -> int:
    """The host's value of `name` (a positive whole number), else its default. A value
    that is not one fails loudly at the first request rather than being ignored."""
    return _whole_number(name, DEFAULTS[name], least=1, default_text=f"default {DEFAULTS[name]}")


def _whole_number(name: str, default: int, least: int, default_text: str) -> int:
    """The environment's `name` as a whole number of at least `least`, else `default`; a
    value that is not one is a ValueError naming the variable and `default_text`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < least or value != int(value):
        raise ValueError(f"{name}={raw!r}: set it to a whole number of at least {least} ({default_text}).")
    return int(value)


SPACE_PROXY_HOPS = 1


def proxy_hops() -> int:
    """GROM_PROXY_HOPS: how many proxies in front of the server append to X-Forwarded-For
    and are trusted (0 or more; `limit` wants at least 1, hence this reader). A visitor is
    the address that many entries from the end of the header (`guard.client_of`): what the
    trusted proxies wrote, never what the client itself sent ahead of them.

    The default is SPACE_PROXY_HOPS on a Space (SPACE_ID set), 0 elsewhere, where the
    header is ignored and the peer address counts. Why 1 on a Space: gradio itself reads
    no forwarding header (gradio 6, `gr.Request.client.host` is the peer's address, and
    uvicorn, which gradio starts with its defaults, rewrites that peer from X-Forwarded-For
    only when the peer is 127.0.0.1, FORWARDED_ALLOW_IPS); on a Space the peer is Hugging
    Face's proxy, an internal 10.x address, and the visitor's address is the entry that
    one proxy appends to X-Forwarded-For, its last one. (Not checked here against a live
    Space: a host that sees otherwise sets GROM_PROXY_HOPS.)"""
    default = SPACE_PROXY_HOPS if os.environ.get("SPACE_ID", "").strip() else 0
    return _whole_number("GROM_PROXY_HOPS", default, least=0, default_text=(
        f"0: no proxy is trusted; the default is {SPACE_PROXY_HOPS} on a Space, 0 elsewhere"))


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


SPACE_MODELS = ("smollm2-135m-instruct", "demo", "open-unlearning/tofu_Llama-3.2-1B-Instruct_full")
"""What a visitor of a Hugging Face Space may load when its host set no GROM_MODELS (the
start model, GROM_MODEL, is added): the studio's own small set. SmolLM2-135M and the demo
are the offline pair the pages are tuned on; TOFU's Llama-3.2-1B (1.24 B parameters, 2.5 GB
in bfloat16) is the paper's TOFU-10% model, and it fits a ZeroGPU slice (~70 GB) with a
full-parameter gradient baseline (weights, gradients and AdamW's state: ~20 GB). The 7-8 B
paper models of the model box (TOFU's Llama-2-7B, MUSE, WMDP's Llama-3-8B) are left out: 13-16 GB
each in bfloat16 for every visitor to download and hold, and a full-parameter baseline on
them (~110 GB) does not fit the slice (BENCHMARKS.md). A host that wants them lists them."""


def on_space() -> bool:
    """Whether this is a Hugging Face Space (it sets SPACE_ID): a public host by default."""
    return bool(os.environ.get("SPACE_ID", "").strip())


@dataclass(frozen=True)
class ModelPolicy:
    """Which models a visitor may load: `allowed` None is a free choice.

    GROM_MODELS lists them (`*`: a free choice). Unset, a private machine leaves the choice
    free and a Space allows `SPACE_MODELS` and its start model (GROM_MODEL), so that no
    visitor of a public Space loads an 8 B model the host never meant to serve."""
    allowed: tuple[str, ...] | None

    @classmethod
    def from_env(cls) -> "ModelPolicy":
        raw = os.environ.get("GROM_MODELS", "").strip()
        if raw == "*":
            return cls(None)
        if not raw:
            if not on_space():
                return cls(None)
            start = os.environ.get("GROM_MODEL", "").strip()
            return cls(tuple(dict.fromkeys([start] * bool(start) + list(SPACE_MODELS))))
        return cls(tuple(n.strip() for n in raw.split(",") if n.strip()))

    def permits(self, name: str) -> bool:
        return self.allowed is None or name in self.allowed


def upload_bytes() -> int:
    return limit("GROM_MAX_UPLOAD_MB") << 20
