"""The host's pace: how long work takes on this machine now, for every wall-time estimate the
studio shows (each attack's and the attack tab's total, a baseline's seconds per epoch).
Not the GPU seconds asked of ZeroGPU (`components.server.durations`' `*_s`): those are upper
bounds, and stay priced at constants.

An estimate is the work counted as the job does it (`durations.Work`, `wall_seconds`) priced
at three things measured here, multiplied:

- the model's rate (`calibrate`): a timed forward of a batch and a few greedy decoding steps
  on the loaded model, solved for the seconds of a FLOP and of a pass (`fit_rate`): a
  `WallRate` of this host, and the pulse it was measured at;
- the kind's correction (`PaceBook.record`): after every finished job of a kind ("attack:
  relearn", "train:npo"), its measured seconds over the estimate at the pulse of its time,
  an exponential moving average in log space per (model, kind); a kind not seen yet takes
  its family's ("attack"), else 1;
- the load now (`pulse`): a fixed matrix product on torch's threads for a tenth of a second,
  timed now against its time when the rate was measured. Other visitors' jobs and other
  processes on a CPU show in it at once (on this 2-core Xeon one process burning a core
  made it and the demo's decoding both about 3x slower; bench/bench_estimates.py).

Measured seconds are the job's own: the waits for other visitors' turns on the device are
taken out (`errors.JOB_STARTED` moves by them), and the queue ahead of a job not started
yet is said apart (`queue_ahead`). On a GPU no pulse is taken (the CPU's load is not the
device's); on ZeroGPU nothing is calibrated (the main process has no CUDA): the constants
stand until jobs have run.
"""
from __future__ import annotations

import gc
import logging
import math
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from components.server.device import DEVICE_LOCK, ON_ZEROGPU, Yielded, check_wanted, wait_for_quiet, yielding
from components.server.durations import (
    Lengths,
    Size,
    WallRate,
    Work,
    forced_work,
    size_of,
    wall_rate,
    wall_seconds,
)
from components.server.errors import JOB_STARTED
from components.server.session import ModelKey
from grom.eval.runner import greedy_until
from grom.model.arch import model_device
from grom.turns import evaluating

log = logging.getLogger(__name__)

EMA_WEIGHT = 0.7
"""A finished job's weight in its kind's correction (the first job's is 1): what the pulse
did not see shows in the next estimate (a 2.5x slow-down is then within 1.5x), and one odd
job does not own it."""
CLAMP = 50.0  # a job's measured / estimated within [1/CLAMP, CLAMP]: a stopped job or a clock jump is no pace
PULSE_TTL_S = 2.0  # a pulse this young is taken as it is: several estimates in one event share one
PULSE_TAU_S = 3.0  # the pulse's smoothing: samples seconds apart merge, a new load shows in the next one
PULSE_WINDOW_S = 0.1  # a window's length: the products of a tenth of a second, averaged
PULSE_WINDOWS = (3, 10)  # windows a sample takes: at least 3, up to 10 while they disagree (a busy CPU)
PULSE_AGREE = 0.15  # windows within 15% of each other agree
PULSE_SHAPE = (192, 576, 1536)  # (M, K, N) of the pulse's product: SmolLM2's MLP on 192 tokens, ~0.34 GFLOP
CAL_ROWS, CAL_TOKENS, CAL_PROMPT, CAL_STEPS = 2, 32, 16, 6  # the calibration's batch: rows, tokens, decoding
CAL_TRIES = 3
CAL_MIN_S = 0.5  # each of the calibration's two runs is timed CAL_TRIES times, and on until this long,
CAL_MAX_TRIES = 12  # at most this many times (the demo model's runs take a millisecond)
CAL_BUDGET_S = 10.0  # past it no more timings (SmolLM2 on a loaded CPU: ~6 s)
MAX_MODELS = 16  # models whose pace is kept (the oldest forgotten)


@dataclass(frozen=True)
class Calibration:
    """A model's rate on this host (`fit_rate`), the pulse it was measured at (0 on a GPU:
    no pulse) and the seconds the calibration took."""
    rate: WallRate
    pulse: float
    seconds: float


@dataclass(frozen=True)
class Pace:
    """A kind's correction: measured over estimated seconds (geometric EMA) and its jobs."""
    factor: float = 1.0
    jobs: int = 0

    def updated(self, ratio: float, weight: float = EMA_WEIGHT) -> "Pace":
        w = 1.0 if not self.jobs else weight
        return Pace(math.exp((1 - w) * math.log(self.factor) + w * math.log(ratio)), self.jobs + 1)


def family(kind: str) -> str:
    """"attack:relearn" -> "attack": what stands in for a kind no job of which ran yet."""
    return kind.split(":", 1)[0]


class PaceBook:
    """Per model: its `Calibration`; per (model, kind): its `Pace`. Shared by every session
    (the host's pace is the host's), bounded to MAX_MODELS models."""

    def __init__(self):
        self._lock = threading.Lock()
        self.rates: dict[ModelKey, Calibration] = {}
        self.kinds: dict[tuple[ModelKey, str], Pace] = {}

    def calibrated(self, key: ModelKey, calibration: Calibration) -> None:
        """A new rate for `key`: its kinds' corrections, relative to the old one, start again."""
        with self._lock:
            self.rates.pop(key, None)
            while len(self.rates) >= MAX_MODELS:
                self._forget(next(iter(self.rates)))
            self.rates[key] = calibration
            for k in [k for k in self.kinds if k[0] == key]:
                del self.kinds[k]

    def _forget(self, key: ModelKey) -> None:
        self.rates.pop(key, None)
        for k in [k for k in self.kinds if k[0] == key]:
            del self.kinds[k]

    def correction(self, key: ModelKey, kind: str) -> float:
        """The kind's factor, else its family's, else 1."""
        with self._lock:
            pace = self.kinds.get((key, kind)) or self.kinds.get((key, family(kind)))
        return pace.factor if pace is not None else 1.0

    def record(self, key: ModelKey, kind: str, estimated_s: float, measured_s: float) -> None:
        """A finished job of `kind` took `measured_s` where the rate and load of its time gave
        `estimated_s` (its correction left out): the kind's and its family's paces move."""
        if not (estimated_s > 0 and measured_s > 0 and math.isfinite(estimated_s) and math.isfinite(measured_s)):
            return
        ratio = min(CLAMP, max(1 / CLAMP, measured_s / estimated_s))
        with self._lock:
            for k in {kind, family(kind)}:
                self.kinds[key, k] = self.kinds.get((key, k), Pace()).updated(ratio)

    def calibration(self, key: ModelKey) -> Calibration | None:
        with self._lock:
            return self.rates.get(key)


PACE = PaceBook()
_PULSE = {"at": -math.inf, "level": 0.0, "threads": 0}
_PULSE_LOCK = threading.Lock()


def sample_pulse() -> float:
    """Seconds of a fixed float32 product (`PULSE_SHAPE`) on torch's threads now: the mean
    over back-to-back products for windows of PULSE_WINDOW_S, at least PULSE_WINDOWS[0] of
    them and more, up to PULSE_WINDOWS[1], while they disagree. A mean over windows, not
    the best of short runs: a short run often falls between two of the other processes'
    turns on a core, and would say the CPU is free when a job lasting seconds gets half of
    it; and on a busy CPU one window says little (SmolLM2's estimates from one window of
    the pulse and one timing of the calibration ranged over 8x on a 2-core EPYC with one
    process spinning: 207-1730 s for 662 s of attacks)."""
    m, k, n = PULSE_SHAPE
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    a @ b  # the first product allocates
    means: list[float] = []
    while len(means) < PULSE_WINDOWS[1]:
        done, t0 = 0, time.perf_counter()
        while not done or time.perf_counter() - t0 < PULSE_WINDOW_S:
            a @ b
            done += 1
        means.append((time.perf_counter() - t0) / done)
        if len(means) >= PULSE_WINDOWS[0] and max(means) <= (1 + PULSE_AGREE) * min(means):
            break
    return statistics.fmean(means)


def pulse(max_age: float = PULSE_TTL_S) -> float:
    """The CPU's pace now: `sample_pulse`'s seconds, smoothed over the last PULSE_TAU_S (an
    older level weighs exp(-age/tau): the samples at either end of two jobs in a row merge),
    sampled again when the last sample is older than `max_age`."""
    with _PULSE_LOCK:  # one thread measures; the others take its result
        threads, now = torch.get_num_threads(), time.monotonic()
        age = now - _PULSE["at"]
        if age <= max_age and _PULSE["threads"] == threads:
            return _PULSE["level"]
        sample = sample_pulse()
        kept = math.exp(-age / PULSE_TAU_S) if _PULSE["threads"] == threads else 0.0
        _PULSE.update(at=time.monotonic(), level=kept * _PULSE["level"] + (1 - kept) * sample, threads=threads)
        return _PULSE["level"]


def on_cpu(handle) -> bool:
    return model_device(handle.model).type == "cpu"


def load_now(handle, calibration: Calibration | None) -> float:
    """How much slower the CPU is now than when `handle`'s model was calibrated (1 on a GPU,
    or where no calibration holds a pulse)."""
    if calibration is None or not calibration.pulse or not on_cpu(handle):
        return 1.0
    return pulse() / calibration.pulse


def _timed(fn, sync, budget: float) -> float:
    """The mean seconds of `fn()` over CAL_TRIES runs and on until they add up to CAL_MIN_S
    (at most CAL_MAX_TRIES), after one untimed run (the first allocates and warms its caches); fewer where they pass
    `budget` seconds (the device is held meanwhile), at least one. On a busy CPU a run's
    time varies by 2-4x with the other processes' turns: one run, or a median of a few
    short ones, would price every later job by chance."""
    t0 = time.perf_counter()
    fn()
    took: list[float] = []
    while (len(took) < CAL_TRIES or (sum(took) < CAL_MIN_S and len(took) < CAL_MAX_TRIES)) and \
            (not took or time.perf_counter() - t0 < budget):
        check_wanted()  # as background work it stops for a visitor's job (`Yielded`), and is done again later
        sync()
        start = time.perf_counter()
        fn()
        sync()
        took.append(time.perf_counter() - start)
    return statistics.fmean(took)


def calibration_work(size: Size) -> tuple[Work, Work]:
    """(the forward's, the decoding's) `Work`: a batch of CAL_ROWS x CAL_TOKENS tokens with
    every position's logits; CAL_STEPS greedy steps of CAL_ROWS rows after a CAL_PROMPT-token
    prompt (the first step is the prompt's pass, its last position's logits only)."""
    forward = forced_work(size, Lengths(CAL_ROWS, CAL_TOKENS, CAL_TOKENS), CAL_ROWS, 2.0 * size.head)
    prompt = 2.0 * (size.body * CAL_ROWS * CAL_PROMPT + size.head * CAL_ROWS)
    steps = 2.0 * (size.body + size.head) * CAL_ROWS * (CAL_STEPS - 1)
    return forward, Work(prompt + steps, CAL_STEPS, CAL_ROWS * CAL_STEPS)


def fit_rate(base: WallRate, size: Size, forward: Work, decoding: Work, t_forward: float,
             t_decoding: float) -> WallRate:
    """`base` (a `WallRate`) scaled to two timings: x times its seconds per FLOP and y times
    its per-pass costs (a pass's weights read, its layers' calls, a generated token), where
    t = x F + y O for each of the two (F, O: the work's FLOP and pass seconds at `base`).
    Where the two do not tell x from y (a tiny model: its passes cost both), or the solve is
    not positive, one factor for both from the sum."""
    def parts(w: Work) -> tuple[float, float]:
        flops = w.flops / base.flops_per_s
        return flops, wall_seconds(w, size, base) - base.start_s - flops - w.param_ops * base.param_op_s

    (f1, o1), (f2, o2) = parts(forward), parts(decoding)
    det = f1 * o2 - f2 * o1
    x = (t_forward * o2 - t_decoding * o1) / det if det else -1.0
    y = (f1 * t_decoding - f2 * t_forward) / det if det else -1.0
    if not (x > 0 and y > 0) or abs(det) < 0.05 * (f1 + o1) * (f2 + o2):
        x = y = (t_forward + t_decoding) / (f1 + o1 + f2 + o2)
    return replace(base, flops_per_s=base.flops_per_s / x, weight_bytes_per_s=base.weight_bytes_per_s / y,
                   layer_s=base.layer_s * y, token_s=base.token_s * y, param_op_s=base.param_op_s * math.sqrt(x * y))


def _measure(handle) -> Calibration:
    """Time the calibration's forward and decoding on `handle`'s model (eval mode, no grad,
    the model unchanged) and fit its rate; and a garbage collection of the process."""
    model, size = handle.model, size_of(handle.model)
    device = model_device(model)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(min(100, size.vocab - 1), size.vocab, (CAL_ROWS, CAL_TOKENS), generator=g).to(device)
    prompt, mask = ids[:, :CAL_PROMPT], torch.ones_like(ids[:, :CAL_PROMPT])
    t0 = time.perf_counter()
    cpu = device.type == "cpu"
    before = sample_pulse() if cpu else 0.0  # the moment's own pace: the timings are of this moment
    with evaluating(model), torch.no_grad():
        t_forward = _timed(lambda: model(input_ids=ids), sync, CAL_BUDGET_S / 2)
        t_decoding = _timed(lambda: greedy_until(model, handle.tokenizer, prompt, mask, CAL_STEPS, (),
                                                 [None] * CAL_ROWS), sync, CAL_BUDGET_S / 2)
    after = sample_pulse() if cpu else 0.0
    forward, decoding = calibration_work(size)
    t1 = time.perf_counter()
    gc.collect()  # what every training and relearning run pays after (`release_memory`)
    collect_s = time.perf_counter() - t1
    rate = replace(fit_rate(wall_rate(model), size, forward, decoding, t_forward, t_decoding), collect_s=collect_s)
    return Calibration(rate, math.sqrt(before * after), time.perf_counter() - t0)


def calibrate(handle, wait: bool = True) -> Calibration | None:
    """Measure `handle`'s model on this host (a second or two on SmolLM2 on a CPU, a few
    milliseconds on the demo) under DEVICE_LOCK, and keep its rate: the estimates of every
    kind of work on it start from it. `wait` False: only if the device is free now (None
    else). None on ZeroGPU (no CUDA in this process). Call it once a model is loaded (the
    server's warm-up, a visitor's load); an estimate asked before calibrates where it can."""
    if ON_ZEROGPU:
        return None
    if not DEVICE_LOCK.acquire(blocking=wait):
        return None
    try:
        calibration = _measure(handle)
    finally:
        DEVICE_LOCK.release()
    PACE.calibrated(handle.key, calibration)
    log.info("%s calibrated in %.2f s: %.3g FLOP/s, %.1f ms a one-token pass, pulse %.1f ms", handle.key.shown,
             calibration.seconds, calibration.rate.flops_per_s,
             1e3 * wall_seconds(Work(passes=1), size_of(handle.model), calibration.rate),
             1e3 * calibration.pulse)
    return calibration


SYNC_CAL_S = 1.0
"""A calibration priced at the constants within this many seconds runs when an estimate asks
for it (the demo model's: 0.6 s at the constants, 1.2 s measured, most of it the pulse); a
longer one (SmolLM2's: 4 s on a 2-core CPU, 10 s on a busy one, the device held) runs in the
background once the device has been quiet (`calibrate_later`): asked for by the estimates an
edit's page shows, it took the device the moment the edit ended, and the card waited 6.3 s."""
CAL_LATER_TRIES = 20  # a background calibration stopped by visitors' jobs starts again, at most this often
_LATER: set = set()
_LATER_LOCK = threading.Lock()


def calibration_cost(handle) -> float:
    """Seconds a calibration of `handle`'s model would hold the device, at the constants."""
    size = size_of(handle.model)
    rate = wall_rate(handle.model)
    forward, decoding = calibration_work(size)
    return (1 + CAL_TRIES) * (wall_seconds(forward, size, rate) + wall_seconds(decoding, size, rate))


def calibrate_later(handle, quiet_s: float = 3.0) -> None:
    """Calibrate `handle`'s model in a background thread once no visitor's job has used the
    device for `quiet_s` seconds, as background work: a visitor's job waiting stops it
    between two timed runs, and it starts again once the device is quiet (a calibration holds
    the device 4-10 s on SmolLM2 on a 2-core CPU); once at a time per model, never on ZeroGPU."""
    if ON_ZEROGPU:
        return
    with _LATER_LOCK:
        if handle.key in _LATER:
            return
        _LATER.add(handle.key)

    def run() -> None:
        try:
            for _ in range(CAL_LATER_TRIES):
                if not wait_for_quiet(quiet_s) or PACE.calibration(handle.key) is not None:
                    return
                try:
                    with yielding():  # a visitor's job waiting stops it between two timed runs
                        calibrate(handle)
                    return
                except Yielded:
                    continue
        except Exception:  # noqa: BLE001  (an estimate is a courtesy: the constants stand in)
            log.warning("could not calibrate %s", handle.key.shown, exc_info=True)
        finally:
            with _LATER_LOCK:
                _LATER.discard(handle.key)
    threading.Thread(target=run, name="calibrate", daemon=True).start()


def rate_of(handle) -> tuple[WallRate, Calibration | None]:
    """(the rate work on `handle`'s model is priced at, its calibration): where it never was
    calibrated, calibrated now if that is quick (`SYNC_CAL_S`) and the device is free, else
    in the background (`calibrate_later`), the constants (`durations.wall_rate`) standing in
    meanwhile."""
    calibration = PACE.calibration(handle.key)
    if calibration is None:
        try:
            if calibration_cost(handle) <= SYNC_CAL_S:
                calibration = calibrate(handle, wait=False)
            else:
                calibrate_later(handle)
        except Exception:  # noqa: BLE001  (an estimate is a courtesy: the constants stand in)
            log.warning("could not calibrate %s", handle.key.shown, exc_info=True)
    return (calibration.rate if calibration is not None else wall_rate(handle.model)), calibration


def seconds(handle, kind: str, work: Work, size: Size | None = None) -> float:
    """Estimated wall seconds of `work` of `kind` on `handle`'s model, on this host now."""
    rate, calibration = rate_of(handle)
    size = size or size_of(handle.model)
    return wall_seconds(work, size, rate) * PACE.correction(handle.key, kind) * load_now(handle, calibration)


def own_clock():
    """A clock of this job's own seconds from now: the wall time less its waits for other
    visitors' turns on the device (by which `JOB_STARTED` moves; outside a handler, the wall time)."""
    t0, started = time.monotonic(), JOB_STARTED.get()

    def read() -> float:
        now, later = time.monotonic(), JOB_STARTED.get()
        waited = later - started if started is not None and later is not None else 0.0
        return max(0.0, now - t0 - waited)

    return read


@contextmanager
def timed(handle, kind: str, work: Work, size: Size | None = None):
    """Time the block as a job of `kind` doing `work` on `handle`'s model and, if it ends
    without an exception, record it (`PaceBook.record`), at the load of its start and end."""
    rate, calibration = rate_of(handle)
    size = size or size_of(handle.model)
    start = load_now(handle, calibration)
    clock = own_clock()
    yield
    took = clock()
    load = math.sqrt(start * load_now(handle, calibration))
    PACE.record(handle.key, kind, wall_seconds(work, size, rate) * load, took)


def queue_ahead() -> tuple[int, float]:
    """(jobs, seconds) before a job asked for now would take the device: what holds it (its
    turn's typical length less what it ran) and every visitor's job in the line, each a
    typical turn of its kind (`DeviceLock.turn_seconds`). Read-only."""
    me, now = threading.get_ident(), time.monotonic()
    holder, line = DEVICE_LOCK.holder, list(DEVICE_LOCK.line)
    ahead = [t for t in line if not t.background and t.thread != me]
    waited = sum(DEVICE_LOCK.turn_seconds(t.kind) for t in ahead)
    if holder is not None and holder.thread != me:
        ahead.append(holder)
        waited += max(1.0, DEVICE_LOCK.turn_seconds(holder.kind) - (now - holder.since))
    return len(ahead), waited


def queue_words() -> str:
    """" The device is busy: 2 jobs ahead, so it starts in about 14 s." or ""."""
    jobs, waited = queue_ahead()
    if not jobs:
        return ""
    return (f" The device is busy: {jobs} job{'s' * (jobs != 1)} ahead, so it starts in about "
            f"{waited:,.0f} s.")
