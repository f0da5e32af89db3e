"""Per-session state, the shared model, and the one device lock.

- `REGISTRY` holds the one loaded base model of the process, keyed by (name, device,
  dtype); loading another model replaces it. Every session shares it.
- `Session` is what a browser tab owns (inside a `gr.State`): its benchmark, layer
  scores, Edit (patches as CPU data), last comparison and last gradient baseline (an
  Edit too, kept apart from the GROM edit).
- `DEVICE_LOCK` and the queue id `DEVICE_QUEUE` serialise everything that touches the
  model. A request that needs the edited model applies its session's patch, computes and
  reverts in a `finally` (`Edit.applied`, inside the library's `run_edit`, `evaluate`,
  `compare_generations`), all while holding the lock, so the base weights are never left
  edited between requests and no request sees another session's patch.
- `on_device` marks the compute functions: `spaces.GPU` on a ZeroGPU Space, plain
  functions elsewhere. They take plain values and return plain values; sessions are
  only changed outside them (on ZeroGPU they run in another process).
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

DEVICE_LOCK = threading.RLock()
DEVICE_QUEUE = "device"  # the concurrency_id of every event that touches the model
DEMO = "demo"  # the bundled demo model's name in the model box
REAL = "smollm2-135m-instruct"  # the real chat model the studio opens on (grom.fetch)


def _gpu_decorator() -> tuple[Callable, bool]:
    try:
        import spaces  # noqa: F401  (only on Hugging Face Spaces)
    except ImportError:
        return (lambda fn: fn), False
    return spaces.GPU, True


on_device, ON_SPACES = _gpu_decorator()


def on_device_for(seconds: int) -> Callable:
    """`on_device` for long work (training a baseline): on ZeroGPU, a GPU slot of up to
    `seconds` (`spaces.GPU(duration=...)`; the default slot is 60 s); elsewhere a no-op."""
    if not ON_SPACES:
        return lambda fn: fn
    import spaces

    return spaces.GPU(duration=seconds)


def device_progress(callback: Callable | None) -> Callable | None:
    """A progress callback to hand to an `on_device` function: on ZeroGPU those run in
    another process and take only plain, picklable values, so none is passed there."""
    return None if ON_SPACES else callback


class UserError(ValueError):
    """A bad input or a state the user can fix; its message says what to do."""


@dataclass(frozen=True)
class ModelKey:
    """Which model is loaded: a name (the demo, a Hub id or a folder), device, dtype."""

    name: str
    device: str
    dtype: str

    def label(self) -> str:
        return f"{self.name} ({self.device}, {self.dtype})"


@dataclass
class ModelHandle:
    """A loaded base model, its tokenizer, and how long it took."""

    key: ModelKey
    model: Any
    tokenizer: Any
    seconds: float
    # Layer scores of this (unedited) model, by (forget, retain, config): every new page
    # and every visitor of a Space asks for the same demo scores. Gone with the model.
    scores_cache: dict = field(default_factory=dict, repr=False)
    # The hidden states entering a band, by (band, key batches): the next edit of the same
    # data (a new beta, w_r or rho) skips the forward pass up to the band. Gone with the model.
    stream_cache: dict = field(default_factory=dict, repr=False)


class ModelRegistry:
    """One loaded model per process, shared by every session, plus the demo's retain
    model (the reference row of comparisons), loaded lazily."""

    def __init__(self):
        self._handle: ModelHandle | None = None
        self._references: dict = {}

    @property
    def current(self) -> ModelHandle | None:
        return self._handle

    def load(self, key: ModelKey, loader: Callable[[ModelKey], tuple]) -> ModelHandle:
        """The model for `key`: the loaded one if it matches, else `loader(key)` replaces it
        (on failure the old one stays)."""
        with DEVICE_LOCK:
            if self._handle is not None and self._handle.key == key:
                return self._handle
            t0 = time.perf_counter()
            try:  # the old model stays usable if the new one fails to load
                model, tokenizer = loader(key)
            except torch.cuda.OutOfMemoryError:
                self._release()  # both do not fit: free the old one and try again
                model, tokenizer = loader(key)
            self._release()
            self._handle = ModelHandle(key, model, tokenizer, time.perf_counter() - t0)
            log.info("loaded %s in %.1fs", key.label(), self._handle.seconds)
            return self._handle

    def reference(self, key: ModelKey, loader: Callable[[ModelKey], tuple]) -> tuple:
        """(model, tokenizer) of the reference model for `key`, loaded once (one kept)."""
        with DEVICE_LOCK:
            if key not in self._references:
                self._references.clear()
                self._references[key] = loader(key)
            return self._references[key]

    def _release(self) -> None:
        self._handle = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


REGISTRY = ModelRegistry()


class Session:
    """What one browser session owns. Handlers change it only after a step succeeded,
    so an error never loses what was there. (A plain class, not a dataclass: gradio would
    try to serialise a dataclass held in a gr.State.)"""

    def __init__(self):
        self.model_key: ModelKey | None = None
        self.benchmark = None  # grom.data.schema.Benchmark
        self.bench_label = ""
        self.scores = None  # grom.LayerScores
        self.scores_for: tuple | None = None  # what the scores were computed for
        self.edit = None  # grom.Edit
        self.edit_for: ModelKey | None = None
        self.report = None  # the last comparison (grom.eval Report)
        self.report_for: tuple | None = None  # (benchmark, edit, max_examples) it was made for
        self.influence = None  # (param name, shares) of the last influence audit
        self.extra: dict = {}

    def __repr__(self) -> str:
        return f"Session(model={self.model_key}, benchmark={self.bench_label!r}, edit={self.edit is not None})"


def current_model(session: Session) -> ModelHandle:
    """The shared model, checked to be the one this session is working with."""
    handle = REGISTRY.current
    if handle is None:
        raise UserError("No model is loaded: pick one in the Model panel and press Load.")
    if session.model_key is None:  # a session that never chose: it works with what is loaded
        session.model_key = handle.key
    if session.model_key != handle.key:
        raise UserError(
            f"The studio holds one model at a time, and another session has since loaded "
            f"{handle.key.label()}; this session worked with {session.model_key.label()}. "
            "Load it again in the Model panel (your benchmark is kept) to go on.")
    return handle


def current_benchmark(session: Session):
    if session.benchmark is None:
        raise UserError("No benchmark is loaded: pick one in the Benchmark panel and press Load.")
    return session.benchmark


def current_edit(session: Session):
    """The session's edit, checked to belong to the loaded model."""
    handle = current_model(session)
    if session.edit is None:
        raise UserError("There is no edit yet: press Run edit in the Edit panel first.")
    if session.edit_for != handle.key:
        raise UserError(f"This edit was made for {session.edit_for.label()}, and "
                        f"{handle.key.label()} is loaded: load that model again or run a new edit.")
    return session.edit
