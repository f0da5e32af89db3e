"""What the admitted jobs may hold in memory at once: a job that keeps memory between its
turns on the device reserves its estimate here first, waits its turn when the others' leave
too little, and is refused when it alone would not fit.

Jobs take the device in turns (components/server/device.py), so several long jobs are under
way at once, each holding between its turns what it needs: a baseline's training (the
trained weights' copy, their gradients and AdamW's two moments), a relearning attack (the
same for the weights it trains). GROM_DEVICE_JOBS bounds how many jobs are admitted, not
what they hold: one SimNPO run on SmolLM2 held +3.0 GB, three +4.1 GB, nine 6.1 GB
(issue 45, item 8). Here every such job reserves `bytes` of the budget (`reserved`) for as
long as it runs:

- the budget is GROM_JOBS_MEMORY_MB, else half of the device's memory (the GPU's where the
  model is on CUDA, else the machine's RAM) read when first asked;
- a job whose estimate is larger than the whole budget is refused at once, with what it
  would hold and what to ask for instead;
- otherwise it waits, in the order asked, until the jobs already holding memory leave room
  (its place shown in its progress, as a wait for the device is; its clock,
  GROM_MAX_JOB_SECONDS, does not run meanwhile; a cancelled job stops waiting).

On ZeroGPU each GPU call runs in a worker of its own that holds nothing once it returns
(a training's state between calls is a file), so nothing is reserved there.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

from components.server.device import ON_ZEROGPU, WAIT_REPORT, WAIT_SHOWN_S, check_wanted
from components.server.errors import JOB_STARTED, UserError

GiB = float(1 << 30)
WAIT_CHECK_S = 0.5


def total_bytes(device: str) -> int:
    """The memory of `device`: the GPU's total on CUDA, else the machine's RAM (Linux)."""
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def budget_bytes(device: str) -> int:
    """GROM_JOBS_MEMORY_MB, else half of `device`'s memory (`total_bytes`)."""
    raw = os.environ.get("GROM_JOBS_MEMORY_MB", "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 1:
            raise ValueError(f"GROM_JOBS_MEMORY_MB={raw!r}: set it to a whole number of MB of at least 1 "
                             "(default: half of the device's memory).")
        return int(value) << 20
    return total_bytes(device) // 2


@dataclass(eq=False)
class Hold:
    """One job's reservation: what it runs, how much, since when."""
    what: str
    bytes: int
    since: float


class MemoryBudget:
    """The reservations of the jobs running now and those waiting for room (module docstring)."""

    def __init__(self):
        self._cond = threading.Condition()
        self.held: list[Hold] = []
        self.line: deque[Hold] = deque()

    @property
    def held_bytes(self) -> int:
        return sum(h.bytes for h in self.held)

    @contextlib.contextmanager
    def reserved(self, nbytes: int, what: str, device: str = "cpu"):
        """Hold `nbytes` of the budget of `device` for the block (module docstring); yields
        the Hold. A `UserError` when `nbytes` alone is more than the budget."""
        if ON_ZEROGPU or nbytes <= 0:
            yield None
            return
        budget = budget_bytes(device)
        if nbytes > budget:
            raise UserError(f"{what} would hold about {nbytes / GiB:.1f} GB between its steps, more than the "
                            f"{budget / GiB:.1f} GB this server lets its jobs hold at once (GROM_JOBS_MEMORY_MB). "
                            "Ask for less (fewer examples per set, a smaller model, a method that trains fewer "
                            "weights) or, hosting the studio yourself, raise GROM_JOBS_MEMORY_MB.")
        hold = Hold(what, int(nbytes), time.monotonic())
        self._wait_for_room(hold, budget)
        try:
            yield hold
        finally:
            with self._cond:
                self.held.remove(hold)
                self._cond.notify_all()

    def _wait_for_room(self, hold: Hold, budget: int) -> None:
        """Join the line; take the room once first in it and the held bytes leave enough."""
        asked, reported = time.monotonic(), 0.0
        with self._cond:
            self.line.append(hold)
        try:
            while True:
                with self._cond:
                    if self.line[0] is hold and self.held_bytes + hold.bytes <= budget:
                        self.line.popleft()
                        self.held.append(hold)
                        self._cond.notify_all()
                        break
                    self._cond.wait(WAIT_CHECK_S)
                check_wanted()
                if time.monotonic() - asked >= WAIT_SHOWN_S and time.monotonic() - reported >= WAIT_SHOWN_S:
                    reported = time.monotonic()
                    report = WAIT_REPORT.get()
                    if report is not None:
                        report(self.wait_text(hold, budget))
        except BaseException:
            with self._cond:
                if hold in self.line:
                    self.line.remove(hold)
                self._cond.notify_all()
            raise
        started = JOB_STARTED.get()
        if started is not None:  # the job's clock counts its own work, not its wait for memory
            JOB_STARTED.set(started + time.monotonic() - asked)

    def wait_text(self, hold: Hold, budget: int) -> str:
        with self._cond:
            held, ahead = list(self.held), list(self.line)[:list(self.line).index(hold)] if hold in self.line else []
        jobs = ", ".join(h.what for h in held[:3]) + (", …" if len(held) > 3 else "")
        return (f"Waiting for memory: this job holds about {hold.bytes / GiB:.1f} GB between its steps, and "
                f"{sum(h.bytes for h in held) / GiB:.1f} of the {budget / GiB:.1f} GB jobs may hold are held now "
                f"({jobs})" + (f"; {len(ahead)} more wait before it" if ahead else "") + ".")


BUDGET = MemoryBudget()
