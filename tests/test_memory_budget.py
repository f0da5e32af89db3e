"""Issue 45, item 8: the jobs admitted at once hold at most GROM_JOBS_MEMORY_MB between their
turns (components/server/memory_budget.py): a job that would not fit alone is refused at once
with what it would hold; one that fits waits, in the order asked, for the jobs holding
memory to leave room; a cancelled one stops waiting; the estimate of a training is checked
against the memory a real one holds."""
from __future__ import annotations

import threading
import time

import pytest

from components.server import memory_budget
from components.server.errors import JOB_STARTED, JobCancelled, UserError
from components.server.memory_budget import MemoryBudget

MB = 1 << 20


@pytest.fixture(autouse=True)
def budget_of_100_mb(monkeypatch):
    monkeypatch.setenv("GROM_JOBS_MEMORY_MB", "100")


def test_a_job_larger_than_the_whole_budget_is_refused_saying_so():
    with pytest.raises(UserError, match=r"about 0\.2 GB between its steps.*GROM_JOBS_MEMORY_MB"):
        with MemoryBudget().reserved(200 * MB, "SimNPO's training"):
            pass


def test_jobs_wait_in_order_for_room_and_take_it_when_it_is_left():
    budget, order = MemoryBudget(), []
    first = budget.reserved(60 * MB, "first")
    first.__enter__()

    def job(name, size):
        with budget.reserved(size, name):
            order.append(name)
            time.sleep(0.05)

    second = threading.Thread(target=job, args=("second", 60 * MB))
    third = threading.Thread(target=job, args=("third", 10 * MB))
    second.start()
    deadline = time.monotonic() + 5
    while len(budget.line) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    third.start()  # small enough to fit now, but it asked after the second: it waits its turn
    time.sleep(0.3)
    assert order == [] and budget.held_bytes == 60 * MB
    first.__exit__(None, None, None)
    second.join(5)
    third.join(5)
    assert order == ["second", "third"] and budget.held_bytes == 0 and not budget.line


def test_a_waiting_job_reports_its_wait_and_its_clock_stops(monkeypatch):
    budget, said = MemoryBudget(), []
    monkeypatch.setattr(memory_budget, "WAIT_SHOWN_S", 0.1)
    token = memory_budget.WAIT_REPORT.set(said.append)
    holder = budget.reserved(90 * MB, "a baseline's training")
    holder.__enter__()
    threading.Timer(0.6, holder.__exit__, (None, None, None)).start()
    clock = JOB_STARTED.set(time.monotonic())  # reset after: a clock left set leaks into later tests
    started = JOB_STARTED.get()
    try:
        with budget.reserved(50 * MB, "a relearning attack"):
            pass
        moved = JOB_STARTED.get() - started
    finally:
        memory_budget.WAIT_REPORT.reset(token)
        JOB_STARTED.reset(clock)
    assert said and "Waiting for memory" in said[0] and "a baseline's training" in said[0]
    assert moved >= 0.5  # the wait moved the job's start, not its work


def test_a_cancelled_job_stops_waiting(monkeypatch):
    budget = MemoryBudget()
    holder = budget.reserved(90 * MB, "held")
    holder.__enter__()
    calls = []

    def wanted():
        calls.append(1)
        if len(calls) > 2:
            raise JobCancelled("cancelled")

    monkeypatch.setattr(memory_budget, "check_wanted", wanted)
    with pytest.raises(JobCancelled):
        with budget.reserved(50 * MB, "waiting"):
            pass
    assert not budget.line and budget.held_bytes == 90 * MB
    holder.__exit__(None, None, None)


def test_a_trainings_estimate_counts_its_weights_gradients_and_moments():
    """Per trained float32 weight a copy, a gradient and two AdamW moments (16 bytes: SmolLM2's
    134.5 M weights, 2.2 GB; the weights themselves are resident already), plus one step's
    activations of two passes."""
    from grom.methods.costs import ACTIVATION_BYTES_PER_TOKEN_LAYER, held_while_training, shape_of
    from tests.conftest import tiny_llama

    model = tiny_llama(vocab=64, layers=4)
    weights = list(model.parameters())
    n = sum(p.numel() for p in weights)
    held = held_while_training(weights, 512, shape_of(model))
    activations = 2 * 512 * 4 * model.config.hidden_size * ACTIVATION_BYTES_PER_TOKEN_LAYER
    assert held == n * 16 + activations
