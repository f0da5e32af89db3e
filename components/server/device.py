"""The one device: the lock and the queue every model job runs under, the GPU decorator of
a ZeroGPU Space, and cancellation.


- `DEVICE_LOCK` serialises everything that touches the model, fairly: jobs take the device
  in the order they asked for it, and a long job (the attack suite, a baseline's training,
  a sweep, a full comparison) takes it once per step, so the short jobs of other visitors
  that arrived meanwhile (a question, layer scores, an edit, a card) run between its steps.
  A waiting job shows its place and an estimate (`DeviceLock.wait_text`). The events that
  touch the model share the gradio queue id `DEVICE_QUEUE`, which admits GROM_DEVICE_JOBS
  at once: past it, gradio's own queue (and its position) holds them. A request that needs
  the edited model applies its session's patch, computes and reverts in a `finally`, all
  while holding the lock, so the base weights are never left edited between requests and
  no request sees another session's patch.
- A job the visitor cancelled, or whose page went away, stops at its next forward pass
  (`JobCancelled`, raised by a hook every resident model carries), so it frees the lock
  in a fraction of a second instead of running to its end.
- So does a job that has run longer than GROM_MAX_JOB_SECONDS (`JobTimedOut`), on any
  host, counted from when its handler started (`errors.JOB_STARTED`, set by `ui_errors`),
  not from when it joined the queue. The same unwinding as a cancel reverts any patch and
  gives a baseline's model back. On ZeroGPU the forward passes run in a GPU worker, whose
  every call has its own duration limit (components/server/gpu_time.py): there the main
  process checks the wall time before each GPU call and at each progress stage.
- `on_device` marks the compute functions: `spaces.GPU` on a ZeroGPU Space, plain
  functions elsewhere. They take plain values and return plain values; sessions are
  only changed outside them.

On ZeroGPU (the `spaces` package with SPACES_ZERO_GPU set, as `spaces.config` reads it;
spaces 0.51.3, `spaces/config.py`, `spaces/zero/wrappers.py`) a `spaces.GPU` call runs in
a worker process forked from the main one (`multiprocessing` "fork"), its arguments and
result pickled; whatever it changes in module state stays in that worker, which may be
reused for the next call of the same function or not. The main process has no real CUDA
(spaces patches `torch.cuda`), so the app asks it nothing there (`ON_ZEROGPU`). Models are
loaded in the main process and inherited by every fork. Without ZeroGPU (a plain machine,
a plain GPU Space, where `spaces.GPU` returns the function unchanged) nothing differs.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import deque
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

import gradio as gr
from anyio import from_thread
from gradio.context import LocalContext

from components.server.errors import JOB_NAME, JOB_STARTED, JobCancelled, JobTimedOut, message_for
from components.server.guard import client_of
from components.server.limits import limit
from grom.model.arch import decoder_layers

TRACE = logging.getLogger("grom.device")
"""Each turn on the device as it ends (its job kind, held and waited seconds), at DEBUG: on
with `GROM_TRACE_DEVICE=1` (app.py), for a trace of who held the device."""


@dataclass(eq=False)
class Turn:
    """A thread's place in the device's line: what job it runs (`job_kind`), since when
    it waits or holds the device, whose job it is (its visitor: `job_visitor`; "" for the
    server's own work and scripts), and whether it is background work (a warm-up), which
    every visitor's job goes before."""
    kind: str
    since: float
    thread: int
    background: bool = False
    visitor: str = ""
    asked: float = 0.0  # when it joined the line (its place among its visitor's turns)


class DeviceLock:
    """The device's lock: re-entrant (`threading.RLock`'s interface) and fair: among the
    threads waiting (a `Turn` each in `line`), the next turn goes to the visitor whose last
    turn ended longest ago (one never served first), each visitor's own turns in the order
    they asked, background work last (`_next`). So a long job that takes it once per step
    (an attack, a training step, a sweep value, a comparison's batch) lets every job that
    arrived meanwhile run between its steps, and a visitor with many jobs gets one turn in
    each round, as one with a single job does: three visitors' nine jobs cannot make a
    fourth visitor wait for all of them. A thread waiting for its turn reports its place and an
    estimate of the wait (`WAIT_REPORT`) from the turns' typical lengths per job kind
    (`typical`, learnt as jobs run), stops waiting when its job is cancelled, and its job's
    clock (GROM_MAX_JOB_SECONDS) does not run while it waits.

    Made anew in a forked child (`renew`): a ZeroGPU worker is forked while another
    request's thread may hold the parent's lock, and a copy held by a thread that does not
    exist in the child would never be released."""
    def __init__(self):
        self.renew()

    def renew(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self.holder: Turn | None = None
        self.line: deque[Turn] = deque()
        self.released_at = 0.0
        self.typical: dict[str, float] = {}  # job kind -> seconds of one turn (a running mean)
        self.served: dict[str, float] = {}  # visitor -> when its last turn began (time.monotonic)

    @property
    def waiting(self) -> int:
        """How many visitors' jobs wait for the device (background work not counted)."""
        return sum(not turn.background for turn in list(self.line))

    def acquire(self, blocking: bool = True, timeout: float = -1, *, checks: bool = True) -> bool:
        """Take the device when every job that asked before has had its turn. While it waits
        (`checks`): a cancelled job stops waiting (`JobCancelled`), background work gives way
        to a visitor (`Yielded`), and the wait is reported every WAIT_SHOWN_S."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            now = time.monotonic()
            turn = Turn(job_kind(), now, me, getattr(_background, "on", False) or getattr(_background, "defer", False),
                        job_visitor(), now)
            if self._owner is None and not self.line:
                self._take(turn)
                return True
            if not blocking:
                return False
            self.line.append(turn)
        asked = turn.since
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        reported, got = 0.0, False
        try:
            while not got:
                with self._cond:
                    got = self._take_if_first(turn)
                    if got:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(WAIT_CHECK_S if left is None else min(WAIT_CHECK_S, left))
                    got = self._take_if_first(turn)
                    if got:
                        break
                if not checks:
                    continue
                check_wanted()  # a visitor who left stops waiting (the wait is not the job's time)
                if time.monotonic() - asked >= WAIT_SHOWN_S and time.monotonic() - reported >= WAIT_SHOWN_S:
                    reported = time.monotonic()
                    report = WAIT_REPORT.get()
                    if report is not None:
                        report(self.wait_text(turn))
        finally:
            if not got:  # timed out, cancelled or gave way: out of the line, the next one may go
                with self._cond:
                    if turn in self.line:
                        self.line.remove(turn)
                    self._cond.notify_all()
        waited = time.monotonic() - asked
        started = JOB_STARTED.get()
        if started is not None:  # the job's clock counts its own work, not its wait for others'
            JOB_STARTED.set(started + waited)
        return True

    def _take_if_first(self, turn: Turn) -> bool:
        """Give `turn` the device if it is free and `turn` is next (`_next`; hold `_cond`)."""
        if self._owner is None and self.line and self._next(self.line, self.served) is turn:
            self.line.remove(turn)
            self._take(turn)
            return True
        return False

    @staticmethod
    def _next(line, served: dict) -> Turn:
        """The turn that goes next: visitors' before background work; among them, the
        visitor served longest ago (never: first); that visitor's turn asked first."""
        return min(line, key=lambda t: (t.background, served.get(t.visitor, float("-inf")), t.asked))

    def _order(self) -> list[Turn]:
        """The line in the order its turns will go if nobody else comes (hold `_cond`)."""
        served, line, order = dict(self.served), list(self.line), []
        while line:
            turn = self._next(line, served)
            line.remove(turn)
            order.append(turn)
            served[turn.visitor] = time.monotonic() + len(order)
        return order

    def _take(self, turn: Turn) -> None:
        turn.since = time.monotonic()
        self._owner, self._depth, self.holder = turn.thread, 1, turn
        self.served[turn.visitor] = turn.since
        if len(self.served) > 1000:  # visitors of the last hours: the oldest forgotten
            for visitor, _ in sorted(self.served.items(), key=lambda kv: kv[1])[:500]:
                del self.served[visitor]

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release the device lock: this thread does not hold it")
            self._depth -= 1
            if self._depth:
                return
            now = time.monotonic()
            turn, self._owner, self.holder = self.holder, None, None
            if turn is not None:
                seen = self.typical.get(turn.kind)
                took = now - turn.since
                self.typical[turn.kind] = took if seen is None else 0.7 * seen + 0.3 * took
                TRACE.debug("device turn: %s%s held %.1f s after waiting %.1f s", turn.kind,
                            " (background)" if turn.background else "", took, turn.since - turn.asked)
            self.released_at = now
            self._cond.notify_all()

    def pass_turn(self) -> bool:
        """Between two steps of a long job, the model as it was found (no patch applied): let
        every visitor's job waiting now go first, and go on after them (True if any did).
        Held at any depth, the lock is let go whole and taken back as deep. A job cancelled
        while it waits for its turn back still takes it before it unwinds (its `finally`
        blocks write the model), then raises."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me or not self.waiting:
                return False
            depth, self._depth = self._depth, 1
        self.release()
        try:
            self.acquire()
        except BaseException:
            self.acquire(checks=False)
            raise
        finally:
            with self._cond:
                self._depth = depth
        return True

    def held_here(self) -> bool:
        """Whether this thread holds it."""
        return self._owner == threading.get_ident()

    def is_free(self) -> bool:
        """Whether no other thread holds it now (asking does not count as a release)."""
        return self._owner in (None, threading.get_ident())

    def turn_seconds(self, kind: str) -> float:
        """The typical length of one turn of a `kind` job (a guess until one ran)."""
        return self.typical.get(kind, GUESS_S.get(kind, DEFAULT_TURN_S))

    def wait_text(self, turn: Turn) -> str:
        """Where `turn` stands: the jobs before it and about how long until its turn."""
        with self._cond:
            holder, line = self.holder, self._order()
        ahead = ([holder] if holder is not None else []) + line[:line.index(turn)] if turn in line else []
        if not ahead:
            return "Your job is next for the device."
        seconds = sum(self.turn_seconds(t.kind) for t in ahead[1:])
        if holder is not None:
            seconds += max(1.0, self.turn_seconds(holder.kind) - (time.monotonic() - holder.since))
        kinds = ", ".join(KIND_WORDS.get(t.kind, "a job") for t in ahead[:3]) + (", …" if len(ahead) > 3 else "")
        jobs = "1 job" if len(ahead) == 1 else f"{len(ahead)} jobs"
        return (f"Waiting for the device: {jobs} before yours ({kinds}); about {seconds:,.0f} s. "
                "Long jobs give the device up between their steps, so yours runs between them.")

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Superseded(Exception):
    """A job done ahead of need (a page's warm-up) stopped at a step boundary: what it was
    computing is no longer what its page will ask for (`UNWANTED`)."""


UNWANTED: ContextVar[Callable[[], bool] | None] = ContextVar("grom_unwanted", default=None)
"""Set by a job done ahead of need: whether what it computes is no longer wanted (its
page chose another benchmark or model); `give_turn` then stops it (`Superseded`)."""


def give_turn(as_found: Callable[[], AbstractContextManager] = nullcontext) -> None:
    """The `between` of every long job under the lock (`grom.turns`), called at its step
    boundaries, per forward batch or decoding step: GROM's edit and layer scores, an
    evaluation's rows, the editors', LUNAR's and a baseline's steps, the attacks, the
    name-only writer. When visitors' jobs wait, they use the device now, on the model as
    it was found (`as_found`, where the job has the model changed: a training's weights,
    the layers an edit has patched so far). A job done ahead of need whose result is no
    longer wanted (`UNWANTED`) stops here: its page's next job does not wait for it."""
    unwanted = UNWANTED.get()
    if unwanted is not None and unwanted():
        raise Superseded("what this job computed ahead is no longer wanted")
    if DEVICE_LOCK.waiting and not in_gpu_worker():
        with as_found():
            DEVICE_LOCK.pass_turn()


WAIT_CHECK_S = 0.5  # how often a waiting job asks whether it is still wanted
WAIT_SHOWN_S = 2.0  # a wait shorter than this is not reported; a longer one every this often
DEFAULT_TURN_S = 10.0  # one turn of a job kind never seen yet (a first guess; learnt after)
GUESS_S = {"on_generate": 3.0, "on_layer_scores": 10.0, "on_first_scores": 10.0, "on_run_edit": 30.0,
           "on_card_first": 30.0, "on_compare": 30.0, "on_run_attacks": 30.0, "on_run_baseline": 30.0,
           "on_sweep": 30.0}
KIND_WORDS = {
    "on_run_edit": "an edit", "on_card_first": "a result card", "on_compare": "a comparison",
    "on_generate": "a question", "on_layer_scores": "layer scores", "on_first_scores": "a new page's layer scores",
    "on_warm_comparison": "a page's warm-up", "on_run_baseline": "a baseline's training",
    "on_run_attacks": "an attack", "on_sweep": "a sweep step", "on_pca": "a PCA", "on_influence": "influence scores",
    "on_quant_check": "a quantization check", "on_import_run": "an import", "on_reset": "a reset",
    "on_load_model": "a model load", "on_page_load": "a page opening", "warm_first_page": "the server's warm-up",
}
WAIT_REPORT: ContextVar[Callable[[str], None] | None] = ContextVar("grom_wait_report", default=None)
"""Where a job waiting for the device says where it stands (`reporting_waits`); None: nowhere."""


def job_kind() -> str:
    """The kind of job this context runs: its handler's name (`errors.JOB_NAME`)."""
    return JOB_NAME.get() or threading.current_thread().name


def job_visitor() -> str:
    """Whose job this context runs: the visitor (`guard.client_of`) of the gradio request
    it answers; "" outside one (the server's own work, a script, a test)."""
    try:
        request = LocalContext.request.get(None)
        scope = getattr(getattr(request, "request", None), "scope", None)
        return client_of(scope) if scope is not None else ""
    except Exception:  # noqa: BLE001  (no request, or gradio changed: one line for all)
        return ""


@contextmanager
def reporting_waits(progress) -> None:
    """While the block runs, a wait for the device shows in `progress` (a `gr.Progress`: its
    text, no bar), or else as one notice (`gr.Info`) the first time."""
    told = []

    def report(text: str) -> None:
        if progress is not None:
            progress(None, desc=text)
        elif not told:
            told.append(True)
            gr.Info(text)

    token = WAIT_REPORT.set(report)
    try:
        yield
    finally:
        WAIT_REPORT.reset(token)


DEVICE_LOCK = DeviceLock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DEVICE_LOCK.renew)


DEVICE_QUEUE = "device"  # the concurrency_id of every event that touches the model (GROM_DEVICE_JOBS at once)


def _zerogpu() -> bool:
    """Whether this process runs on ZeroGPU: `spaces` importable and SPACES_ZERO_GPU true
    (what `spaces.config.Settings.zero_gpu` reads; elsewhere `spaces.GPU` is a no-op)."""
    if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() not in ("1", "t", "true"):
        return False
    try:
        import spaces  # noqa: F401  (only on Hugging Face Spaces)
    except ImportError:
        return False
    return True


ON_ZEROGPU = _zerogpu()
_MAIN_PID = os.getpid()  # the process that imported the app: the main one on ZeroGPU


def in_gpu_worker() -> bool:
    """Whether this is a ZeroGPU worker (a process forked from the main one for a call)."""
    return ON_ZEROGPU and os.getpid() != _MAIN_PID


def on_device(fn: Callable | None = None, *, duration: Callable | None = None) -> Callable:
    """Mark a compute function (bare, or with `duration`, a function of the same arguments
    giving the seconds of GPU it asks for: `components.server.durations`). On ZeroGPU it is
    `spaces.GPU(duration=...)` of the function with its errors made `gr.Error`s
    (`_worker_errors`); elsewhere the function itself. A compute function takes and returns
    plain picklable values, and no state it changes outlives it on ZeroGPU."""
    def mark(f: Callable) -> Callable:
        if not ON_ZEROGPU:
            return f
        import spaces

        task = _worker_errors(f)
        gpu = spaces.GPU(duration=duration)(task) if duration is not None else spaces.GPU(task)

        @functools.wraps(f)
        def call(*args, **kwargs):
            check_time()  # a job past GROM_MAX_JOB_SECONDS asks for no more GPU time
            with DEVICE_LOCK:  # the main process's line: visitors' GPU calls take turns, fairly
                return gpu(*args, **kwargs)

        return call

    return mark(fn) if fn is not None else mark


def _worker_errors(f: Callable) -> Callable:
    """`f`, its exceptions turned into a `gr.Error` with the message a user sees (as the
    handlers' `ui_errors` would): spaces passes a worker's `gr.Error` on as it is, but any
    other exception only as "ZeroGPU worker error" and its class name (spaces 0.51.3,
    `spaces/zero/wrappers.py`, `exception_result`), which would lose what to do."""
    @functools.wraps(f)
    def task(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as err:  # noqa: BLE001  (the worker's edge: the message crosses, the traceback is logged)
            logging.getLogger(__name__).warning("%s failed in the GPU worker", f.__name__, exc_info=True)
            raise gr.Error(message_for(err), print_exception=False) from None

    return task


def kept_cache(cache):
    """`cache` (a stream, prefix or similar cache a compute function fills for later ones),
    or None on ZeroGPU, where it would be filled in a worker that the next call may not
    share: the work is then simply done again, the results are the same."""
    return None if ON_ZEROGPU else cache


def local_progress(callback: Callable | None) -> Callable | None:
    """`callback` for work done in this process (loading a model, on ZeroGPU too), checking
    at each stage that the job is still wanted."""
    if callback is None:
        return None

    def report(*args, **kwargs):
        check_cancelled()
        return callback(*args, **kwargs)

    return report


def device_progress(callback: Callable | None) -> Callable | None:
    """A progress callback to hand to an `on_device` function (it also stops a cancelled
    job at each stage): on ZeroGPU those run in another process and take only plain,
    picklable values, so none is passed there."""
    return None if ON_ZEROGPU else local_progress(callback)


CANCEL_CHECK_S = 0.2  # how often a running job asks whether it was cancelled


def _event_gone() -> bool:
    """In gradio's event loop: whether this thread's job was cancelled or lost its client.
    Gradio cancels by cancelling the asyncio task that waits for the handler's thread (the
    thread itself runs on), and marks a job whose page went away as not alive."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    event = queue.event_ids_to_events.get(event_id) if queue is not None else None
    if event is None or not event.alive:
        return True
    suffix = f"<gradio-sep>{event_id}"
    tasks = [task for task in asyncio.all_tasks() if task.get_name().endswith(suffix)]
    if not hasattr(asyncio.Task, "cancelling"):  # Python 3.10 (ZeroGPU's): no cancelling(), but a
        return not tasks  # cancelled task that waited on this thread is done, out of all_tasks, at once
    return any(task.cancelling() for task in tasks)


_checked = threading.local()


def job_cancelled() -> bool:
    """Whether the gradio job this thread runs was cancelled (asked at most every
    CANCEL_CHECK_S; False outside a queued gradio job: a script, a test, the preload; and
    in a ZeroGPU worker, which has the request's context but no event loop to ask: the
    question would wait for ever. There the platform ends the call, and GROM_MAX_JOB_SECONDS
    still holds, the job's clock being in the same context)."""
    if in_gpu_worker():
        return False
    try:
        event_id = LocalContext.event_id.get(None)
        if event_id is None or LocalContext.blocks.get(None) is None:
            return False
        now = time.monotonic()
        if getattr(_checked, "event", None) == event_id and now - _checked.at < CANCEL_CHECK_S:
            return False
        _checked.event, _checked.at = event_id, now

        return bool(from_thread.run_sync(_event_gone))
    except Exception:  # not in a worker thread of gradio's loop (or gradio changed): run on
        return False


def job_seconds() -> float | None:
    """How long the job this context runs has been running (None outside a handler)."""
    started = JOB_STARTED.get()
    return None if started is None else time.monotonic() - started


def check_time() -> None:
    """Stop a job that has run longer than GROM_MAX_JOB_SECONDS (`JobTimedOut`)."""
    ran = job_seconds()
    if ran is None:
        return
    most = limit("GROM_MAX_JOB_SECONDS")
    if ran > most:
        raise JobTimedOut(
            f"This job was stopped after {ran:,.0f} s: this server lets one job run at most {most:,} s "
            "(GROM_MAX_JOB_SECONDS). Nothing was changed (the model is as it was). Ask for less work: "
            "fewer examples (Advanced settings: retain examples, key budgets), a smaller split, fewer "
            "examples per set, epochs or sweep values. Hosting the studio yourself, raise GROM_MAX_JOB_SECONDS.")


class Yielded(JobCancelled):
    """Background work (the server's first-page warm-up, a page's own warm-up) gave the
    device up to a visitor's job: nothing was changed; it may run again later."""


_background = threading.local()
_blocks: list = []  # the app's Blocks (`watch_queue`): its device queue says who is waiting


def watch_queue(blocks) -> None:
    """Let background work see the visitors' jobs waiting in `blocks`' device queue."""
    _blocks[:] = [blocks]


def visitors_waiting() -> bool:
    """Whether a visitor's job waits for the device: a thread blocked on DEVICE_LOCK, or a
    job waiting in gradio's device queue (behind the one that runs)."""
    if DEVICE_LOCK.waiting:
        return True
    for blocks in list(_blocks) + [LocalContext.blocks.get(None)]:
        if not getattr(blocks, "is_running", False):  # not launched, or closed: nobody waits on it
            continue
        queue = getattr(blocks, "_queue", None)
        waiting = queue.event_queue_per_concurrency_id.get(DEVICE_QUEUE) if queue is not None else None
        if waiting is not None and waiting.queue:
            return True
    return False


@contextmanager
def _marked(flag: str):
    """This thread's `_background.<flag>` set for the block, as it was after."""
    before = getattr(_background, flag, False)
    setattr(_background, flag, True)
    try:
        yield
    finally:
        setattr(_background, flag, before)


def yielding():
    """Run the block as background work: at its next forward pass after a visitor's job
    starts waiting for the device, it stops (`Yielded`, its patches reverted as on a
    cancel) so that the visitor goes first."""
    return _marked("on")


def deferring():
    """Run the block's device turns as background work without stopping it: each visitor's
    job waiting goes first at every step boundary (`give_turn`), and the block resumes when
    none waits (a page's warm-up: ahead-of-need work whose progress is worth keeping)."""
    return _marked("defer")


def in_background() -> bool:
    """Whether this thread runs background work (`yielding`, `deferring`)."""
    return bool(getattr(_background, "on", False) or getattr(_background, "defer", False))


def gave_way() -> bool:
    """Whether background work in this thread gave the device up since the last ask (its
    `Yielded` may have reached the caller as a handler's `gr.Error`)."""
    done = getattr(_background, "gave_way", False)
    _background.gave_way = False
    return done


def wait_for_quiet(quiet_s: float = 3.0, give_up_s: float = 3600.0) -> bool:
    """Block until no visitor's job has waited for or held the device for `quiet_s`
    seconds (False after `give_up_s`): when background work may take its turn again."""
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        if DEVICE_LOCK.is_free() and not visitors_waiting() and time.monotonic() - DEVICE_LOCK.released_at >= quiet_s:
            return True
        time.sleep(0.25)
    return False


def check_wanted() -> None:
    """Stop background work a visitor's job waits behind (`Yielded`) and a job its visitor
    cancelled or left (`JobCancelled`)."""
    if getattr(_background, "on", False) and visitors_waiting():
        _background.gave_way = True
        raise Yielded("This background work gave the device up to a visitor's job; nothing was changed.")
    if job_cancelled():
        raise JobCancelled("The job was cancelled; nothing was changed.")


def check_cancelled() -> None:
    """At each forward pass: `check_wanted`, and a job past GROM_MAX_JOB_SECONDS stops."""
    check_wanted()
    check_time()


def _cancel_hook(module, args):
    check_cancelled()


def add_cancel_hooks(model) -> None:
    """Every forward pass of `model` and of each of its decoder layers first checks that
    its job is still wanted (a batch of keys, a generated token, a training step)."""
    model.register_forward_pre_hook(_cancel_hook)
    try:
        layers = decoder_layers(model)
    except Exception:  # an unsupported family is refused elsewhere
        return
    for layer in layers:
        layer.register_forward_pre_hook(_cancel_hook)
