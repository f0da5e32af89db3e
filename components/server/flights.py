"""One computation of a shared result at a time (a single flight per key).

Every page of the real model asks for the same layer scores and the same unedited
comparison rows, and on a fresh server they ask at once: page A's and page B's warm-ups,
then A's Run edit and card. Each checked its cache, found nothing and computed the same
result, the device shared between them by turns (bench/first_click.py, 2026-11-29: the
page warm-ups held the device 386 s, two Base rows among it, while A's card waited 480 s).
`shared` lets the first caller of a key compute it and the others wait for it to finish
(off the device: they hold no lock while they wait) and then read the cache it filled; if
it failed or gave way, the next one computes it."""
from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, TypeVar

from components.server.device import DEVICE_LOCK, WAIT_REPORT, check_wanted, in_background
from components.server.errors import JOB_STARTED

T = TypeVar("T")
_LOCK = threading.Lock()
_RUNNING: dict[Hashable, threading.Event] = {}
_WAITERS: dict[Hashable, int] = {}  # key -> threads waiting for it now
WAIT_CHECK_S = 0.5
SHOWN_AFTER_S = 2.0
HANDOFF_S = 0.5
"""After background work computed a result others waited for, how long it leaves the device
to them before its next step: they were woken, but would find it taken again at once (a first
verdict waited 7.4 s behind the warm-up's next stage on SmolLM2's default page)."""


def running(key: Hashable) -> bool:
    """Whether some thread computes `key` now."""
    with _LOCK:
        return key in _RUNNING


def wait_for(key: Hashable, what: str) -> bool:
    """Block until no thread computes `key` (checking meanwhile that this job is still
    wanted, and saying what it waits for after SHOWN_AFTER_S). The wait is not the job's own
    time (`JOB_STARTED` moves by it, as for a wait for the device). Returns whether it
    waited. A thread holding the device does not wait (the one computing needs it)."""
    with _LOCK:
        event = _RUNNING.get(key)
        if event is None or DEVICE_LOCK.held_here():
            return False
        _WAITERS[key] = _WAITERS.get(key, 0) + 1
    t0, told = time.monotonic(), False
    try:
        while not event.wait(WAIT_CHECK_S):
            check_wanted()
            if not told and time.monotonic() - t0 >= SHOWN_AFTER_S:
                told = True
                report = WAIT_REPORT.get()
                if report is not None:
                    report(f"Waiting for {what}, which another job is computing now (then read, not computed again).")
    finally:
        with _LOCK:
            left = _WAITERS.get(key, 1) - 1
            if left > 0:
                _WAITERS[key] = left
            else:
                _WAITERS.pop(key, None)
    started = JOB_STARTED.get()
    if started is not None:
        JOB_STARTED.set(started + time.monotonic() - t0)
    return True


def _hand_off() -> None:
    """Leave the device, up to HANDOFF_S, to the jobs just woken, until one waits for it."""
    deadline = time.monotonic() + HANDOFF_S
    while time.monotonic() < deadline and not DEVICE_LOCK.waiting and DEVICE_LOCK.is_free():
        time.sleep(0.01)


def shared(key: Hashable, lookup: Callable[[], T | None], compute: Callable[[], T], what: str) -> T:
    """`lookup()` where it finds the result; else `compute()` (which fills what `lookup`
    reads), by one thread at a time per key: a caller that finds `key` being computed
    waits for it (`wait_for`) and looks again."""
    while True:
        found = lookup()
        if found is not None:
            return found
        with _LOCK:
            event = _RUNNING.get(key)
            mine = event is None
            if mine:
                event = _RUNNING[key] = threading.Event()
        if mine:
            try:
                return compute()
            finally:
                with _LOCK:
                    _RUNNING.pop(key, None)
                    waited = _WAITERS.get(key, 0)
                event.set()
                if waited and in_background():
                    _hand_off()
        if not wait_for(key, what):  # holding the device: compute it here rather than wait forever
            return compute()
