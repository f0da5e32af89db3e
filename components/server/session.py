"""Per-session state and the shared models (the device lock: components/server/device.py).

- `REGISTRY` holds the loaded base models of the process, keyed by (name, device, dtype):
  the app's start model, pinned (never unloaded, whatever visitors load: every new session
  and API client opens on it), and beside it at most GROM_RESIDENT_MODELS models visitors
  loaded (components/server/limits.py), the least recently used unloaded first, so that
  sessions on different models do not break each other. Every session shares them; a
  session works with the model it loaded (`current_model`). The registry only loads into
  memory, under DEVICE_LOCK; what a load downloads comes first, without the lock
  (components/server/model_choices.py `fetch`).
- `Session` is what a browser tab owns (inside a `gr.State`): its benchmark, layer
  scores, Edit (patches as CPU data), last comparison and last gradient baseline (an
  Edit too, kept apart from the GROM edit).
- A new session is a copy of the app's template (`Session.__deepcopy__`): the start model
  and its default benchmark, shared by reference.
- `SESSIONS` keeps the heavy state (edits, comparisons) of at most GROM_MAX_SESSIONS
  sessions; the least recently active one is dropped and told so when it comes back.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import gradio as gr
import torch

from components.server.allowed_sources import shown_name
from components.server.device import DEVICE_LOCK, add_cancel_hooks, check_wanted, in_gpu_worker, reporting_waits
from components.server.errors import UserError, each_step
from components.server.limits import limit
from grom.eval.prefix import PrefixCache

log = logging.getLogger(__name__)

PREFIX_CACHE_BYTES = 1 << 30
"""Per resident model. The Base row of SmolLM2's default page on every known fact (50 a set,
the truth ratio's wrong answers included) records 258 MiB below the suggested band (its
largest entry, the decoding's prompt pass, 208 MiB): with 256 MiB the Edited row missed
every entry (each miss recorded evicts one it needed next) and ran 2x slower."""


@dataclass(frozen=True)
class ModelKey:
    """Which model is loaded: a name (the demo, a Hub id or a folder), device, dtype, and
    for a model sharded by accelerate its device map and max-memory budgets (canonical text,
    `grom.model.sharding.format_max_memory`); "" when it sits whole on `device`."""
    name: str
    device: str
    dtype: str
    device_map: str = ""
    max_memory: str = ""

    @property
    def shown(self) -> str:
        """The name as a page shows it (a folder relative to models/, never a server path)."""
        return shown_name(self.name)

    def label(self) -> str:
        where = f"device map {self.device_map}" + (f" within {self.max_memory}" if self.max_memory else "") \
            if self.device_map else self.device
        return f"{self.shown} ({where}, {self.dtype})"


def _prefix_cache():
    return PrefixCache(max_bytes=PREFIX_CACHE_BYTES)


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
    # The layers below an edit's band on the comparison's batches (grom.eval.prefix): an
    # edit's comparison then runs only the band and above on them. Gone with the model.
    prefix_cache: Any = field(default_factory=_prefix_cache, repr=False)


class ModelRegistry:
    """The loaded models of the process, shared by every session: the pinned ones (the app's
    start model) and at most GROM_RESIDENT_MODELS others, the least recently used unloaded
    first; plus the demo's retain model (the reference row of comparisons), loaded lazily.

    Loading and unloading hold the device (DEVICE_LOCK: memory is the device's); finding a
    loaded model does not (`get`: a page opening, a kept card, an estimate never wait for
    another visitor's job), its table kept consistent by a lock of its own, held for a few
    dictionary operations and never while the device is asked for."""
    def __init__(self):
        self._table = threading.RLock()  # the dictionaries below; taken after DEVICE_LOCK, never before
        self._handles: dict[ModelKey, ModelHandle] = {}  # least recently used first
        self._pinned: frozenset[ModelKey] = frozenset()
        self._references: dict = {}
        self.loader: Callable[[ModelKey], tuple] | None = None  # what `resident` loads with in a GPU worker

    @property
    def current(self) -> ModelHandle | None:
        """The most recently loaded or used model (what an API call of a session that chose no
        model works with; a new page opens on its app's start model instead)."""
        with self._table:
            return next(reversed(self._handles.values()), None)

    def resident(self) -> list[ModelKey]:
        with self._table:
            return list(self._handles)

    @property
    def pinned(self) -> frozenset[ModelKey]:
        return self._pinned

    def pin(self, *keys: ModelKey) -> None:
        """Never unload `keys` (the app's start model, which every new page and API session
        opens on): whatever visitors load, GROM_RESIDENT_MODELS bounds only their models
        beside it. The same name in another dtype, device or max memory is another key, a
        visitor's. Replaces the earlier pins: one app per process (a test that builds
        another app in the same process moves the pin to that app's start model)."""
        with DEVICE_LOCK:
            self._pinned = frozenset(keys)

    def unload_visitors(self) -> None:
        """Unload every model but the pinned ones (a server as it starts: the start model
        only; what the tests' freshly launched apps begin from)."""
        with DEVICE_LOCK:
            self._evict(0)

    def _visitors(self) -> int:
        with self._table:
            return sum(k not in self._pinned for k in self._handles)

    def peek(self, key: ModelKey | None) -> ModelHandle | None:
        """The loaded model for `key`, or None, without marking it used: for an event that
        only reads its tokenizer or name (a benchmark's load counting tokens)."""
        return self._handles.get(key) if key is not None else None

    def get(self, key: ModelKey | None) -> ModelHandle | None:
        """The loaded model for `key` (now the most recently used), or None, at once: the
        device is not asked for (a load or an unload holds it; this waits only for their
        few dictionary operations)."""
        with self._table:
            handle = self._handles.pop(key, None) if key is not None else None
            if handle is not None:
                self._handles[key] = handle
            return handle

    def load(self, key: ModelKey, loader: Callable[[ModelKey], tuple]) -> ModelHandle:
        """The model for `key`: the loaded one if there is one, else `loader(key)` (from
        files already here: the caller downloaded them first, without the lock); beyond
        GROM_RESIDENT_MODELS visitors' models the least recently used one is unloaded, never
        a pinned one (on a failed load the loaded ones stay)."""
        with DEVICE_LOCK:
            handle = self.get(key)
            if handle is not None:
                return handle
            t0 = time.perf_counter()
            room = limit("GROM_RESIDENT_MODELS")
            if self._visitors() >= room:
                try:  # the loaded ones stay usable if the new one fails to load
                    model, tokenizer = loader(key)
                except torch.cuda.OutOfMemoryError:
                    self._evict(room - 1)  # both do not fit: free room and try again
                    model, tokenizer = loader(key)
            else:
                model, tokenizer = loader(key)
            add_cancel_hooks(model)
            handle = ModelHandle(key, model, tokenizer, time.perf_counter() - t0)
            with self._table:
                self._handles[key] = handle
            self._evict(room)
            log.info("loaded %s in %.1fs (resident: %s)", key.label(), handle.seconds,
                     ", ".join(k.label() for k in self.resident()))
            return handle

    def reference(self, key: ModelKey, loader: Callable[[ModelKey], tuple]) -> tuple:
        """(model, tokenizer) of the reference model for `key`, loaded once (one kept)."""
        with DEVICE_LOCK:
            if key not in self._references:
                self._references.clear()
                model, tokenizer = loader(key)
                add_cancel_hooks(model)
                self._references[key] = (model, tokenizer)
            return self._references[key]

    def _evict(self, keep: int) -> None:
        """Unload the least recently used models until at most `keep` of the visitors' are
        loaded; the pinned ones stay."""
        while self._visitors() > keep:
            with self._table:
                old = next(k for k in self._handles if k not in self._pinned)
                del self._handles[old]
            log.info("unloaded %s to make room", old.label())
        gc.collect()
        if torch.cuda.is_initialized():  # asks no device (a ZeroGPU main process has none)
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
        self.dropped = ""  # why the edit was dropped to make room (SessionStore), if it was
        self.turn = threading.RLock()  # its device jobs run one at a time, in order (`in_turn`)

    def __deepcopy__(self, memo) -> "Session":
        """A new tab's session, from the app's template (gradio deep-copies a State's value
        for each session): the template's choices (its start model and benchmark) are shared,
        not copied, so that every session, an API client's that never opened the page
        included, starts on the start model's default split with its shared caches."""
        fresh = Session()
        fresh.model_key, fresh.benchmark, fresh.bench_label = self.model_key, self.benchmark, self.bench_label
        return fresh

    def drop(self, reason: str) -> None:
        """Let go of the heavy state (edit, comparisons), keeping the choices (model,
        benchmark, scores); `reason` is what the session is told when it asks for the edit."""
        self.edit = self.edit_for = self.report = self.report_for = self.influence = None
        for name in ("edit_inputs", "baseline_grom_report", "export", "report_files"):
            self.extra.pop(name, None)
        self.dropped = reason

    def __repr__(self) -> str:
        return f"Session(model={self.model_key}, benchmark={self.bench_label!r}, edit={self.edit is not None})"


SESSION_WAIT_S = 0.5  # how often a job behind its session's earlier one asks whether it is still wanted


def in_turn(fn: Callable) -> Callable:
    """`fn`, the handler of an event in the device queue, run after the earlier device jobs
    of its session (a visitor's own jobs keep the order they were asked in: a comparison
    asked during an edit compares that edit), and with every wait for the device shown in
    its progress (`device.reporting_waits`): its place in the line and an estimate. A
    generator handler (one that streams) takes its session's turn for each step and gives
    it back while gradio sends what the step yielded."""
    def turn(args, kwargs):
        values = (*args, *kwargs.values())
        session = next((v for v in values if isinstance(v, Session)), None)
        return session, next((v for v in values if isinstance(v, gr.Progress)), None)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            held = turn(args, kwargs)
            yield from each_step(lambda: fn(*args, **kwargs), lambda: _session_turn(*held))

        return steps

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _session_turn(*turn(args, kwargs)):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def _session_turn(session: "Session | None", progress):
    """The session's turn (none without a session), waits for the device reported."""
    with reporting_waits(progress):
        if session is None:
            yield
            return
        told = False
        while not session.turn.acquire(timeout=SESSION_WAIT_S):
            check_wanted()  # cancelled, or its page closed: it stops waiting
            if not told and progress is not None:
                told = True
                progress(None, desc="Waiting for your previous job to finish (yours run in the order asked).")
        try:
            yield
        finally:
            session.turn.release()


def current_model(session: Session) -> ModelHandle:
    """The model this session works with (a session that never chose one takes the most
    recently loaded); an error that says what to do when it was unloaded since."""
    if session.model_key is None:
        if REGISTRY.current is None:
            raise UserError("No model is loaded: pick one in the Model panel and press Load.")
        session.model_key = REGISTRY.current.key
    SESSIONS.touch(session)
    handle = REGISTRY.get(session.model_key)
    if handle is None:
        raise UserError(
            f"{session.model_key.label()} was unloaded to make room for the models other visitors "
            "loaded (this server keeps a few at a time). Press Load model in the Model panel to "
            "load it again: your benchmark and edit are kept.")
    return handle


def resident(key: ModelKey, what: str = "request") -> ModelHandle:
    """The loaded model for `key`, inside a compute function (call with DEVICE_LOCK held).

    In a ZeroGPU worker forked before the main process loaded `key` (spaces reuses an idle
    worker for the next call of the same function), the model is loaded there with
    `REGISTRY.loader` (set by components.server.model_choices): the main process checked it has it
    just before the call, and the copy lives only as long as that worker."""
    handle = REGISTRY.get(key)
    if handle is None and in_gpu_worker() and REGISTRY.loader is not None:
        log.info("%s was loaded after this GPU worker was forked: loading it here too", key.label())
        handle = REGISTRY.load(key, REGISTRY.loader)
    if handle is None:
        raise UserError(f"{key.label()} was unloaded while the {what} was queued (other visitors "
                        "loaded other models); press Load model to load it again.")
    return handle


def current_benchmark(session: Session):
    if session.benchmark is None:
        raise UserError("No benchmark is loaded: pick one in the Benchmark panel and press Load.")
    return session.benchmark


def current_edit(session: Session):
    """The session's edit, checked to belong to the session's model."""
    handle = current_model(session)
    if session.edit is None:
        if session.dropped:
            raise UserError(session.dropped)
        raise UserError("There is no edit yet: press Run edit in the Edit panel first.")
    if session.edit_for != handle.key:
        raise UserError(f"This edit was made for {session.edit_for.label()}, and "
                        f"{handle.key.label()} is loaded: load that model again or run a new edit.")
    return session.edit


class SessionStore:
    """The sessions holding an edit, least recently active first: beyond GROM_MAX_SESSIONS
    the oldest one's edit and comparisons are dropped (it is told so when it comes back),
    so that memory does not grow with every visitor of the last hour. Sessions are held
    weakly: gradio frees a closed tab's state as before."""
    def __init__(self):
        self._order: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()

    def touch(self, session: Session) -> None:
        """`session` was just active; when it holds an edit, it is counted."""
        with self._lock:
            self._order.pop(id(session), None)
            if session.edit is None and session.report is None:
                return
            self._order[id(session)] = weakref.ref(session)
            self._order = {k: r for k, r in self._order.items() if r() is not None}
            while len(self._order) > limit("GROM_MAX_SESSIONS"):
                old = self._order.pop(next(iter(self._order)))()
                if old is not None:
                    old.drop(f"This session's edit was dropped to make room for newer visitors (this "
                             f"server keeps the edits of {limit('GROM_MAX_SESSIONS')} sessions). "
                             "Press Run edit to make it again: your model, benchmark and settings are kept.")

    def __len__(self) -> int:
        return sum(r() is not None for r in self._order.values())


SESSIONS = SessionStore()
