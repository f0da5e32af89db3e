"""A baseline's training on ZeroGPU: a sequence of GPU calls that each fit one call's limit,
driven from the main process (`train_in_calls`).

Each call runs in a worker forked for it (components.server.device): it resumes the training
from a checkpoint file, trains up to its step and writes the checkpoint again
(grom.methods.trained.checkpoint); only the path and a small `Paused` record cross the process
boundary. The file lives in a folder this process makes for the run (`tempfile.mkdtemp`,
readable by this user only) and removes at the end, on an error and on a cancel.

The same folder carries the page's progress and Stop across the boundary, since no
callback can: the worker's progress callback (`FileProgress`, picklable) writes each
(fraction, message) to a small file and stops the run when a stop file appears; this
process waits for the call in a helper thread and meanwhile, every CANCEL_CHECK_S, shows the
progress and asks whether the job was cancelled; if so it writes the stop file, waits for
the worker to stop at its next micro-batch, and raises `JobCancelled`. The helper thread
runs the call in a copy of this thread's context: `spaces` reads the visitor's request
(for the quota) and gradio's job context from context variables, and its own generator
wrapper waits on a worker the same way, from a thread under `copy_context()` (spaces'
`spaces/zero/wrappers.py`, read in KingNish24/Realtime-whisper-large-v3-turbo@690bb933,
`regular_function_wrapper` and `generator_function_wrapper`; not run on a real Space here).
"""
from __future__ import annotations

import contextvars
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable

from components.server.device import CANCEL_CHECK_S, job_cancelled
from components.server.errors import JobCancelled
from components.server.gpu_time import TrainPlan
from grom.methods.trained.checkpoint import Part, Paused

log = logging.getLogger(__name__)

STOP = "stop"
PROGRESS = "progress.json"
CANCELLED = "The job was cancelled; nothing was changed."


@dataclass(frozen=True)
class FileProgress:
    """A progress callback for a GPU worker: writes (fraction, message) to `folder` for the
    main process to show, and raises `JobCancelled` once the main process asked to stop."""

    folder: str

    def __call__(self, fraction: float, message: str) -> None:
        if os.path.exists(os.path.join(self.folder, STOP)):
            raise JobCancelled(CANCELLED)
        tmp = os.path.join(self.folder, PROGRESS + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump([float(fraction), str(message)], f)
        os.replace(tmp, os.path.join(self.folder, PROGRESS))


def read_progress(folder: str) -> tuple[float, str] | None:
    try:
        with open(os.path.join(folder, PROGRESS), encoding="utf-8") as f:
            fraction, message = json.load(f)
        return float(fraction), str(message)
    except (OSError, ValueError, TypeError):
        return None


def _watched(call: Callable[[], object], folder: str, progress, cancelled: Callable[[], bool]):
    """`call()` run in a helper thread while this one relays its progress and its Stop."""
    box: dict = {}
    ctx = contextvars.copy_context()

    def work():
        try:
            box["value"] = ctx.run(call)
        except BaseException as err:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = err

    thread = threading.Thread(target=work, name="gpu-call", daemon=True)
    thread.start()
    seen, stop = None, None
    while thread.is_alive():
        thread.join(CANCEL_CHECK_S)
        if stop is not None:
            continue
        try:
            now = read_progress(folder)
            if progress is not None and now is not None and now != seen:
                seen = now
                progress(*now)
            if cancelled():
                raise JobCancelled(CANCELLED)
        except BaseException as err:  # noqa: BLE001  (a cancel, or a progress that failed: stop the worker)
            stop = err
            open(os.path.join(folder, STOP), "w").close()
    if stop is not None:
        raise stop
    if "error" in box:
        raise box["error"]
    return box["value"]


def train_in_calls(call: Callable[[Part | None, FileProgress], object], plan: TrainPlan, label: str,
                   progress=None, cancelled: Callable[[], bool] = job_cancelled):
    """The training as GPU calls: `call(part, progress)` runs one (a `train_call`); `part` is
    None when the plan fits one call (no checkpoint), else the steps it goes up to, each
    call `plan.steps_per_call` further than the last one reached. Returns the last call's
    Edit. The folder of the run (its checkpoint) is removed whatever happens."""
    folder = tempfile.mkdtemp(prefix="grom-train-")
    path = os.path.join(folder, "state.pt")
    watch = FileProgress(folder)
    try:
        done, n = 0, 0
        while True:
            if cancelled():
                raise JobCancelled(CANCELLED)
            part = None if plan.calls <= 1 else Part(path, done + plan.steps_per_call)
            out = _watched(lambda: call(part, watch), folder, progress, cancelled)
            n += 1
            if not isinstance(out, Paused):
                log.info("%s trained in %d GPU call(s)", label, n)
                return out
            if out.steps <= done:
                raise RuntimeError(f"{label}: a GPU call made no step (at {done} of {out.total_steps})")
            done = out.steps
            if progress is not None:
                calls = n + -(-(out.total_steps - done) // plan.steps_per_call)
                progress(out.fraction, f"{label}: step {done}/{out.total_steps} after GPU call {n} of {calls}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
