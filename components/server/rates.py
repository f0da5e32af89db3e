"""Rates per minute that one visitor cannot use up for everyone: a visitor's own quota first,
then the server's, of which a visitor who has had less than an equal share still gets one.

The server's rates (uploads, exports and links a minute) bound the disk and CPU all
visitors use; as plain ceilings they were one visitor's to use up (issue 45, item 6: six
links in 26 s from one page refused another visitor's export and link for a minute; four
addresses of 30 uploads each used up the server's 120). `FairRate.refusal` admits an event
of `visitor` unless
- the visitor had its own quota this minute (`per_visitor`), or
- the server had its quota (`server`) and the visitor had at least an equal share of it
  (the server's quota over the visitors seen this minute, the asker counted), or
- the server had twice its quota: the hard ceiling, whoever asks.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

WINDOW_S = 60.0


class FairRate:
    """Events per minute, per visitor and for the server (module docstring). The quotas are
    read at each ask (`per_visitor()`, `server()`), so a host or a test may change them."""

    def __init__(self, per_visitor: Callable[[], int], server: Callable[[], int]):
        self.per_visitor, self.server = per_visitor, server
        self.times: collections.deque = collections.deque()  # (when, visitor), the newest last
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self.times and now - self.times[0][0] > WINDOW_S:
            _, gone = self.times.popleft()
            self.counts[gone] -= 1
            if self.counts[gone] <= 0:
                del self.counts[gone]

    def refusal(self, visitor: str) -> str | None:
        """None, and the event counted, when `visitor` may have one more this minute; else
        "visitor" (its own quota is used up) or "server" (the server's, and it had its share)."""
        with self.lock:
            now = time.monotonic()
            self._expire(now)
            mine, total, server = self.counts[visitor], len(self.times), self.server()
            if mine >= self.per_visitor():
                return "visitor"
            share = server / (len(self.counts) + (visitor not in self.counts))
            if total >= 2 * server or (total >= server and mine >= share):
                return "server"
            self.times.append((now, visitor))
            self.counts[visitor] += 1
            return None
