"""The first click works for every visitor (issue 37): background work, the server's
first-page warm-up and a page's own warm-up, gives the device up to a visitor's job at its
next forward pass, and takes its turn again once the device is quiet."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from components.server import device
from components.server.device import DEVICE_LOCK, Yielded, add_cancel_hooks, gave_way, wait_for_quiet, yielding


def test_the_device_lock_counts_its_waiters_and_stays_reentrant():
    assert DEVICE_LOCK.waiting == 0
    with DEVICE_LOCK:
        with DEVICE_LOCK:  # the same thread again: no wait
            assert DEVICE_LOCK.waiting == 0
        waiter = threading.Thread(target=lambda: DEVICE_LOCK.acquire() and DEVICE_LOCK.release())
        waiter.start()
        for _ in range(200):
            if DEVICE_LOCK.waiting == 1:
                break
            time.sleep(0.01)
        assert DEVICE_LOCK.waiting == 1
    waiter.join(5)
    assert DEVICE_LOCK.waiting == 0 and not waiter.is_alive()
    assert DEVICE_LOCK.acquire(blocking=False)
    DEVICE_LOCK.release()


def test_background_work_gives_the_device_up_to_a_visitor_at_its_next_forward_pass(llama):
    """A warm-up holding the lock through endless forward passes lets a visitor in within
    a forward pass's time, says it gave way, and may run again when the device is quiet."""
    add_cancel_hooks(llama)
    ids = torch.randint(0, 50, (2, 16))
    started, outcome = threading.Event(), {}

    def warm():
        with yielding(), DEVICE_LOCK:
            started.set()
            try:
                for _ in range(100_000):  # far longer than the test: only giving way ends it
                    llama(ids)
            except Yielded:
                outcome["gave_way"] = gave_way()

    worker = threading.Thread(target=warm)
    worker.start()
    assert started.wait(30)
    t0 = time.perf_counter()
    with DEVICE_LOCK:  # a visitor's job
        waited = time.perf_counter() - t0
        assert outcome == {"gave_way": True}
    worker.join(10)
    assert waited < 5, waited
    assert wait_for_quiet(quiet_s=0.2, give_up_s=10)  # the device is free again: the warm-up may go on


def test_outside_background_work_a_waiting_visitor_stops_nothing(llama):
    add_cancel_hooks(llama)
    ids = torch.randint(0, 50, (1, 8))
    with DEVICE_LOCK:
        blocker = threading.Thread(target=lambda: DEVICE_LOCK.acquire() and DEVICE_LOCK.release())
        blocker.start()
        for _ in range(200):
            if DEVICE_LOCK.waiting:
                break
            time.sleep(0.01)
        llama(ids)  # a visitor's own job is not background work: it runs on
        assert device.visitors_waiting()
    blocker.join(5)


@pytest.mark.parametrize("quiet_s", [0.3])
def test_wait_for_quiet_waits_while_a_visitor_holds_the_device(quiet_s):
    held = threading.Event()

    def visitor():
        with DEVICE_LOCK:
            held.set()
            time.sleep(1.0)

    t = threading.Thread(target=visitor)
    t.start()
    held.wait(5)
    t0 = time.perf_counter()
    assert wait_for_quiet(quiet_s=quiet_s, give_up_s=10)
    assert time.perf_counter() - t0 >= 1.0 - 0.1 + quiet_s - 0.1
    t.join()
