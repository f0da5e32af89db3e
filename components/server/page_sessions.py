"""Gradio's sessions, bounded: who named each one, which have a page open, and when each goes.

Gradio keeps a `SessionState` for every session id a request names, made up or not: a copy of
every component's config (0.4 MB for this page, measured) and the session's gr.State values
(components/server/session.py `Session`). It frees the state only of a session that opened a
heartbeat (a page, a gradio_client) and closed it, an hour later, and keeps even then the
config copy until `state_session_capacity` (10,000 by default) evicts the oldest. A script
naming fresh ids on /gradio_api/run/predict, outside the queue, so made sessions that
nothing ever freed (issue 45, item 2: 25 requests kept 1.5 GB). Here (`SessionBook`):

- a session belongs to the visitor whose request first named it (`guard.client_of`);
- a visitor holds at most GROM_SESSIONS_PER_VISITOR sessions: naming one more first drops
  that visitor's least recently used session that has no page open and no job, and is
  refused when there is none (every one of its sessions is an open page or busy);
- a session with no page open (no heartbeat stream now) and no job in the queue goes once
  it has not been used for GROM_SESSION_IDLE_SECONDS: a script's, and a closed page's;
- the server holds at most GROM_MAX_PAGE_SESSIONS (gradio's `state_session_capacity`).

What one session may hold is bounded where it is written (each event served outside the
queue: components/studio/wiring.py `LOCAL`), so the memory all sessions hold is bounded by
these counts times that bound, per visitor and in all.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import datetime
import os
import threading
import time

from gradio.state_holder import SessionState, StateHolder

from components.server.limits import limit

SWEEP_EVERY_S = 5.0  # how often the book looks for idle sessions (on a request, at most this often)


class SessionBook:
    """Which visitor owns each session id, which have a page (heartbeat) open, and the
    dropping of sessions beyond a visitor's share or idle too long (module docstring)."""

    def __init__(self):
        self.owner: dict[str, str] = {}  # session id -> visitor
        self.of: dict[str, collections.OrderedDict] = {}  # visitor -> its session ids, least recently used first
        self.pages: collections.Counter = collections.Counter()  # session id -> heartbeat streams open
        self.named: dict[str, float] = {}  # session id -> when a request last named it (time.monotonic)
        self.flying: collections.Counter = collections.Counter()  # session id -> its requests being answered
        self.lock = threading.Lock()
        self.swept = 0.0

    def admit(self, session: str, visitor: str, app) -> str | None:
        """Note that `visitor` names `session` now; None when it may, else why not (the
        visitor holds its share of sessions, each an open page or busy). Beyond the share,
        the visitor's least recently used idle session is dropped to make room."""
        if not session:
            return None
        with self.lock:
            self.named[session] = time.monotonic()
            mine = self.of.setdefault(self.owner.setdefault(session, visitor), collections.OrderedDict())
            if session in mine:
                mine.move_to_end(session)
                return None
            most = limit("GROM_SESSIONS_PER_VISITOR")
            busy = _busy(app) if len(mine) >= most else set()
            while len(mine) >= most:
                spare = next((s for s in mine if self._idle(s, app, 0.0, busy)), None)
                if spare is None:
                    del self.owner[session]
                    return (f"You have {most} pages or API sessions open on this server already, each open or "
                            "busy: close one (or wait for its job) before opening another. (The host sets this "
                            "with GROM_SESSIONS_PER_VISITOR.)")
                self._drop(spare, app)
            mine[session] = None
        return None

    @contextlib.contextmanager
    def answering(self, session: str | None):
        """While a request naming `session` is answered, the session is not idle (gradio may
        not have made its state yet)."""
        if not session:
            yield
            return
        with self.lock:
            self.flying[session] += 1
        try:
            yield
        finally:
            with self.lock:
                self.flying[session] -= 1
                if self.flying[session] <= 0:
                    del self.flying[session]

    def page_opened(self, session: str) -> None:
        with self.lock:
            self.pages[session] += 1

    def page_closed(self, session: str) -> None:
        with self.lock:
            self.pages[session] -= 1
            if self.pages[session] <= 0:
                del self.pages[session]

    def sweep(self, app, force: bool = False) -> int:
        """Drop every session (gradio's, whoever named it) with no page open and no job that
        has not been used for GROM_SESSION_IDLE_SECONDS; how many went. At most every
        SWEEP_EVERY_S unless `force`."""
        now = time.monotonic()
        if not force and now - self.swept < SWEEP_EVERY_S:
            return 0
        self.swept = now
        idle_s = limit("GROM_SESSION_IDLE_SECONDS")
        holder = _holder(app)
        if holder is None:
            return 0
        busy = _busy(app)
        with self.lock:
            gone = [s for s in list(holder.session_data) if self._idle(s, app, idle_s, busy)]
            for session in gone:
                self._drop(session, app)
            for session in [s for s in self.owner if s not in holder.session_data
                            and now - self.named.get(s, 0.0) >= idle_s]:
                self._forget(session)  # named but never given state (refused, or a heartbeat alone)
        return len(gone)

    def held(self, visitor: str) -> int:
        with self.lock:
            return len(self.of.get(visitor, ()))

    def _idle(self, session: str, app, idle_s: float, busy: set) -> bool:
        """No page open, no job waiting, running or unread (`busy`), not used for `idle_s`
        seconds (call with `lock`)."""
        if self.pages.get(session, 0) > 0 or self.flying.get(session, 0) > 0 or session in busy:
            return False
        if time.monotonic() - self.named.get(session, 0.0) < idle_s:
            return False
        holder = _holder(app)
        used = holder.time_last_used.get(session) if holder is not None else None
        return used is None or (datetime.datetime.now() - used).total_seconds() >= idle_s

    def _drop(self, session: str, app) -> None:
        """Free `session`'s state in gradio and forget it here (call with `lock`)."""
        holder = _holder(app)
        if holder is not None:
            with holder.lock:
                holder.session_data.pop(session, None)
                holder.time_last_used.pop(session, None)
        self._forget(session)

    def _forget(self, session: str) -> None:
        self.named.pop(session, None)
        visitor = self.owner.pop(session, None)
        mine = self.of.get(visitor)
        if mine is not None:
            mine.pop(session, None)
            if not mine:
                del self.of[visitor]


def _holder(app):
    """Gradio's StateHolder of `app` (the FastAPI app; None before it is set up)."""
    try:
        return app.state_holder
    except AttributeError:
        return None


def _busy(app) -> set[str]:
    """The sessions with a job in gradio's queue or a result not yet read."""
    try:
        queue = app.get_blocks()._queue
    except Exception:  # noqa: BLE001  (no blocks yet)
        return set()
    return {s for s, ids in list(queue.pending_event_ids_session.items()) if ids} | {
        e.session_hash for e in list(queue.event_ids_to_events.values())}


class _NoSnapshot(dict):
    """A session's deep-link snapshot that keeps nothing written into it."""

    def __setitem__(self, key, value) -> None:
        pass


class LeanSessionState(SessionState):
    """A session's state without the deep-link snapshot: gradio's SessionState copies every
    component's config when the session is made (0.4 MB for this page) and writes every
    input and output value of every event into that copy (`_update_value_in_config`; a
    3.9 MB table sent to an event stayed as 55 MB of Python objects), all of it read only by
    gradio's /deep_link route, which this app closes (guard.NoDeepLinks). Everything else
    (the gr.State values, the per-session component updates) is kept as gradio keeps it."""

    def __init__(self, blocks):  # SessionState.__init__ (gradio 6.31) without the config snapshot
        self.blocks_config = copy.copy(blocks.default_config)
        self.config_values = _NoSnapshot()
        self.state_data = {}
        self._state_ttl = {}
        self.is_closed = False
        self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600

    def _update_value_in_config(self, key: int, value) -> None:
        pass  # the snapshot's values: nothing reads them here


class LeanStateHolder(StateHolder):
    """Gradio's StateHolder making `LeanSessionState`s."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = LeanSessionState(self.blocks)
        return super().__getitem__(session_id)


def make_lean(app) -> None:
    """Have `app`'s sessions made lean from now on (its holder is gradio's own until the
    first request sees it)."""
    holder = _holder(app)
    if type(holder) is StateHolder:
        holder.__class__ = LeanStateHolder


BOOK = SessionBook()
