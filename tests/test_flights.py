"""`components.server.flights`: pages that ask for the same shared result at once compute it once."""
from __future__ import annotations

import threading
import time

import pytest

from components.server import flights
from components.server.device import DEVICE_LOCK


def test_callers_at_once_compute_a_key_once_and_read_it():
    cache, calls, started = {}, [], threading.Event()

    def compute():
        calls.append(threading.get_ident())
        started.set()
        time.sleep(0.3)
        cache["k"] = 42
        return 42
    got = []
    first = threading.Thread(target=lambda: got.append(flights.shared("k", lambda: cache.get("k"), compute, "x")))
    first.start()
    started.wait(5)
    assert flights.running("k")
    others = [threading.Thread(target=lambda: got.append(flights.shared("k", lambda: cache.get("k"), compute, "x")))
              for _ in range(3)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(10)
    assert got == [42] * 4 and len(calls) == 1 and not flights.running("k")


def test_a_failed_computation_leaves_the_key_to_the_next_caller():
    cache, started, release = {}, threading.Event(), threading.Event()

    def failing():
        started.set()
        release.wait(5)
        raise RuntimeError("gave way")
    errors = []

    def first():
        try:
            flights.shared("f", lambda: cache.get("f"), failing, "x")
        except RuntimeError as err:
            errors.append(err)
    t = threading.Thread(target=first)
    t.start()
    started.wait(5)
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        flights.shared("f", lambda: cache.get("f"), lambda: cache.setdefault("f", 7), "x")))
    waiter.start()
    time.sleep(0.2)
    assert not got  # waiting for the first
    release.set()
    for th in (t, waiter):
        th.join(10)
    assert errors and got == [7]


def test_a_thread_holding_the_device_computes_rather_than_waits():
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(5)
        return 1
    t = threading.Thread(target=lambda: flights.shared("d", lambda: None, slow, "x"))
    t.start()
    started.wait(5)
    with DEVICE_LOCK:
        assert DEVICE_LOCK.held_here()
        assert not flights.wait_for("d", "x")  # would wait for a job that needs the device
        assert flights.shared("d", lambda: None, lambda: 2, "x") == 2
    release.set()
    t.join(10)
    assert not DEVICE_LOCK.held_here()


@pytest.mark.parametrize("key", ["absent"])
def test_nothing_running_is_no_wait(key):
    assert not flights.running(key) and not flights.wait_for(key, "x")


def test_background_work_leaves_the_device_to_the_jobs_that_waited_for_its_result():
    """A warm-up that computed what a visitor's job waited for lets that job take the device
    before its own next step (a first verdict waited 7.4 s behind the warm-up's next stage)."""
    from components.server.device import deferring

    cache, started, order = {}, threading.Event(), []

    def compute():
        started.set()
        time.sleep(0.3)
        cache["k"] = 1
        return 1

    def background():
        with deferring():
            flights.shared("handoff", lambda: cache.get("k"), compute, "x")
            with DEVICE_LOCK:  # the warm-up's next stage
                order.append("background")

    def visitor():
        started.wait(5)
        flights.shared("handoff", lambda: cache.get("k"), compute, "x")
        with DEVICE_LOCK:
            order.append("visitor")
            time.sleep(0.05)
    threads = [threading.Thread(target=background), threading.Thread(target=visitor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["visitor", "background"]
