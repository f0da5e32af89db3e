"""The host's pace (components.server.pace, issue 49): the arithmetic of its three factors
(the model's calibrated rate, a kind's measured correction, the CPU's load now), a
simulated host that slows down, the calibration on a tiny model (which leaves it as found),
the device's queue ahead, and the attack and baseline estimates reading it."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from components.server import durations as D
from components.server import pace as P
from components.server.device import DEVICE_LOCK
from components.server.session import ModelKey
from tests.conftest import tiny_llama, weights_hash

KEY = ModelKey("tiny", "cpu", "float32")
SIZE = D.Size(layers=4, body=4_000_000, head=500_000, params=5_000_000, weight_bytes=20_000_000, vocab=1000)


def test_a_kinds_pace_starts_at_its_first_job_then_moves_most_of_the_way_in_log_space():
    pace = P.Pace()
    assert pace.factor == 1.0 and pace.jobs == 0
    pace = pace.updated(3.0)
    assert pace.factor == pytest.approx(3.0) and pace.jobs == 1  # the first job: all of it
    w = P.EMA_WEIGHT
    pace = pace.updated(1 / 3)
    assert pace.factor == pytest.approx(3.0 ** (1 - 2 * w)) and pace.jobs == 2  # log-linear between 3 and 1/3
    assert pace.updated(pace.factor).factor == pytest.approx(pace.factor)  # a job as estimated moves nothing
    assert 0.5 < w < 1  # one odd job does not own it; a 2.5x slow-down is within 1.5x after one job


def test_a_kind_not_seen_yet_takes_its_familys_pace_else_one():
    book = P.PaceBook()
    assert book.correction(KEY, "attack:relearn") == 1.0
    book.record(KEY, "attack:heldout", estimated_s=2.0, measured_s=6.0)
    assert book.correction(KEY, "attack:heldout") == pytest.approx(3.0)
    assert book.correction(KEY, "attack:relearn") == pytest.approx(3.0)  # the family's, until one runs
    assert book.correction(KEY, "train:npo") == 1.0  # another family
    assert book.correction(ModelKey("other", "cpu", "float32"), "attack:heldout") == 1.0  # another model
    book.record(KEY, "attack:relearn", estimated_s=10.0, measured_s=10.0)
    assert book.correction(KEY, "attack:relearn") == pytest.approx(1.0)
    assert book.correction(KEY, "attack:heldout") == pytest.approx(3.0)  # its own, unmoved
    book.record(KEY, "attack:heldout", estimated_s=0.0, measured_s=5.0)  # no estimate: nothing learnt
    book.record(KEY, "attack:heldout", estimated_s=1.0, measured_s=1e6)  # a clock jump: at most CLAMP
    assert book.correction(KEY, "attack:heldout") == pytest.approx(3.0 ** (1 - P.EMA_WEIGHT) * P.CLAMP ** P.EMA_WEIGHT)


def test_a_new_calibration_starts_the_models_kinds_again():
    book = P.PaceBook()
    book.record(KEY, "attack:heldout", 1.0, 4.0)
    book.calibrated(KEY, P.Calibration(D.CPU_WALL, 0.01, 0.1))
    assert book.correction(KEY, "attack:heldout") == 1.0 and book.calibration(KEY).pulse == 0.01


def true_seconds(work: D.Work, x: float, y: float, base: D.WallRate = D.CPU_WALL) -> float:
    """A host x times slower per FLOP and y times per pass than `base` (the model `fit_rate` assumes)."""
    flops = work.flops / base.flops_per_s
    rest = D.wall_seconds(work, SIZE, base) - base.start_s - flops - work.param_ops * base.param_op_s
    return x * flops + y * rest


@pytest.mark.parametrize("x, y", [(2.0, 5.0), (0.5, 3.0), (4.0, 1.2)])
def test_the_rate_fitted_to_two_timings_prices_both_and_other_work(x, y):
    forward, decoding = P.calibration_work(SIZE)
    rate = P.fit_rate(D.CPU_WALL, SIZE, forward, decoding, true_seconds(forward, x, y), true_seconds(decoding, x, y))
    start = rate.start_s
    for work in (forward, decoding, D.Work(flops=1e12, passes=40, tokens=300), D.Work(passes=500, tokens=4000)):
        assert D.wall_seconds(work, SIZE, rate) - start == pytest.approx(true_seconds(work, x, y), rel=1e-6)
    assert rate.flops_per_s == pytest.approx(D.CPU_WALL.flops_per_s / x)
    assert rate.layer_s == pytest.approx(D.CPU_WALL.layer_s * y)


def test_timings_that_do_not_tell_flops_from_passes_give_one_factor():
    forward, decoding = P.calibration_work(SIZE)
    t_f, t_d = true_seconds(forward, 2.0, 2.0), true_seconds(decoding, 2.0, 2.0)
    rate = P.fit_rate(D.CPU_WALL, SIZE, forward, decoding, 10 * t_f, t_d / 10)  # the solve goes negative
    assert rate.flops_per_s * rate.layer_s == pytest.approx(D.CPU_WALL.flops_per_s * D.CPU_WALL.layer_s)


class Host:
    """A simulated host: each job's seconds are its work at `rate` times the load; the pulse
    reads the load (as a fixed product on a shared CPU does)."""

    def __init__(self, monkeypatch, rate: D.WallRate):
        self.rate, self.load, self.drift = rate, 1.0, 1.0
        self.book = P.PaceBook()
        self.handle = SimpleNamespace(key=KEY, model=object())
        monkeypatch.setattr(P, "PACE", self.book)
        monkeypatch.setattr(P, "pulse", lambda *a, **k: 0.01 * self.load)
        monkeypatch.setattr(P, "on_cpu", lambda handle: True)
        monkeypatch.setattr(P, "size_of", lambda model: SIZE)
        self.book.calibrated(KEY, P.Calibration(rate, 0.01, 0.1))

    def run(self, kind: str, work: D.Work) -> tuple[float, float]:
        """(estimated, measured) seconds of one job, recorded as the app records it."""
        estimate = P.seconds(self.handle, kind, work)
        took = D.wall_seconds(work, SIZE, self.rate) * self.load * self.drift
        clock = iter([0.0, took])
        with pytest.MonkeyPatch.context() as m:
            m.setattr(P.time, "monotonic", lambda: next(clock))
            with P.timed(self.handle, kind, work):
                pass
        return estimate, took


def within(ratio: float, estimate: float, measured: float) -> bool:
    return measured / ratio <= estimate <= measured * ratio


def test_a_slow_down_shows_in_the_next_estimate(monkeypatch):
    """A calibrated host: the first job is estimated right; a load that triples the CPU's
    time shows at once through the pulse; a slow-down the pulse does not see (the kind's
    own, 2.5x) is within 1.5x after one job of the kind."""
    host = Host(monkeypatch, replace(D.CPU_WALL, layer_s=3e-3))
    work = D.Work(flops=2e11, passes=300, tokens=900)
    assert within(1.01, *host.run("attack:heldout", work))
    host.load = 3.0
    assert within(1.01, *host.run("attack:heldout", work))  # the pulse saw it
    host.drift = 2.5
    estimate, took = host.run("attack:heldout", work)
    assert not within(1.5, estimate, took)  # unseen: the first such job is off
    assert within(1.5, *host.run("attack:heldout", work))  # the next one is not
    assert within(1.2, *host.run("attack:heldout", work * 2))  # nor a larger one of the kind
    for _ in range(4):
        host.run("attack:heldout", work)
    assert within(1.01, *host.run("attack:heldout", work))  # a steady host: its pace, learnt
    host.load = 1.0
    assert within(1.5, *host.run("attack:heldout", work))  # the load gone: at once


def test_an_uncalibrated_model_on_a_busy_device_is_priced_at_the_constants(monkeypatch):
    monkeypatch.setattr(P, "PACE", P.PaceBook())
    monkeypatch.setattr(P, "calibrate", lambda handle, wait=True: None)  # the device is busy
    model = tiny_llama(64)
    handle = SimpleNamespace(key=KEY, model=model)
    work = D.Work(flops=1e10, passes=10)
    assert P.seconds(handle, "attack:heldout", work) == pytest.approx(
        D.wall_seconds(work, D.size_of(model), D.wall_rate(model)))


def test_calibrating_a_tiny_model_times_it_and_leaves_it_as_found(tokenizer, monkeypatch):
    monkeypatch.setattr(P, "PACE", P.PaceBook())
    model = tiny_llama(len(tokenizer)).train()
    before = weights_hash(model)
    handle = SimpleNamespace(key=KEY, model=model, tokenizer=tokenizer)
    calibration = P.calibrate(handle)
    assert weights_hash(model) == before and model.training  # weights and mode as found
    assert P.PACE.calibration(KEY) is calibration and calibration.pulse > 0 and 0 < calibration.seconds < 60
    forward, decoding = P.calibration_work(D.size_of(model))
    rate = calibration.rate
    assert rate.flops_per_s > 0 and rate.layer_s > 0 and rate.token_s > 0
    assert D.wall_seconds(forward, D.size_of(model), rate) > 0 and D.wall_seconds(decoding, D.size_of(model), rate) > 0


def test_the_queue_ahead_counts_the_holder_and_the_visitors_waiting():
    assert P.queue_ahead() == (0, 0.0) and P.queue_words() == ""
    held, go = threading.Event(), threading.Event()

    def holder():
        with DEVICE_LOCK:
            held.set()
            go.wait(10)

    first = threading.Thread(target=holder, name="pace-test-holder")
    first.start()
    held.wait(10)
    waiter = threading.Thread(target=lambda: DEVICE_LOCK.acquire() and DEVICE_LOCK.release(), name="pace-test-waiter")
    waiter.start()
    for _ in range(100):
        if DEVICE_LOCK.line:
            break
        time.sleep(0.01)
    try:
        jobs, seconds = P.queue_ahead()
        assert jobs == 2 and seconds >= DEVICE_LOCK.turn_seconds("pace-test-waiter") + 1.0
        assert P.queue_words().startswith(" The device is busy: 2 jobs ahead, so it starts in about ")
    finally:
        go.set()
        first.join(10)
        waiter.join(10)
    assert P.queue_ahead() == (0, 0.0)


def test_the_bench_prints_estimates_beside_measured_times(tmp_path):
    """bench/bench_estimates.py at its smallest: the demo, one round of NPO's epoch, quiet and
    with a core burnt; the table and the JSON (nothing timed here: BENCHMARKS.md's numbers)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "bench_estimates.py"
    done = subprocess.run([sys.executable, str(bench), "--models", "demo", "--jobs", "epoch", "--rounds", "1",
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| demo | NPO, one epoch | quiet | 1 |" in done.stdout
    assert "| demo | NPO, one epoch | loaded (1 core burnt) | 1 |" in done.stdout
    rows = json.loads((tmp_path / "out.json").read_text())["runs"][0]["rows"]
    assert len(rows) == 2 and all(r["estimate"] > 0 and r["measured"] > 0 for r in rows)
