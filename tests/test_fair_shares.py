"""Issue 45's fair shares, without a server: a rate one visitor cannot use up for everyone
(`rates.FairRate`), and the sessions one visitor may hold (`page_sessions.SessionBook`,
with a stand-in for gradio's state holder and queue). Through the app: tests/test_hostile_round4.py."""
from __future__ import annotations

import collections
import datetime
from types import SimpleNamespace

from components.server.page_sessions import SessionBook
from components.server.rates import FairRate


def test_a_visitor_has_its_own_quota_first():
    rate = FairRate(lambda: 3, lambda: 100)
    assert [rate.refusal("a") for _ in range(4)] == [None, None, None, "visitor"]
    assert rate.refusal("b") is None


def test_past_the_servers_quota_a_light_visitor_still_gets_its_share():
    rate = FairRate(lambda: 6, lambda: 6)
    assert [rate.refusal("greedy") for _ in range(6)] == [None] * 6  # the whole server's minute
    assert rate.refusal("greedy") == "visitor"
    assert rate.refusal("other") is None  # none of an equal share (6 / 2 visitors)
    assert rate.refusal("third") is None  # none of 6 / 3
    assert rate.refusal("other") is None  # 1 of 6 / 3
    assert rate.refusal("other") == "server"  # 2 of 6 / 3: its share


def test_twice_the_servers_quota_is_a_ceiling_for_everyone():
    rate = FairRate(lambda: 1, lambda: 4)
    answers = [rate.refusal(f"v{i}") for i in range(10)]
    assert answers[:8] == [None] * 8 and answers[8:] == ["server", "server"]


class Holder:
    """gradio's StateHolder as the book reads it: session_data, time_last_used and a lock."""

    def __init__(self):
        self.session_data: dict = {}
        self.time_last_used: dict = {}
        import threading

        self.lock = threading.Lock()

    def make(self, session: str, age_s: float = 0.0) -> None:
        self.session_data[session] = object()
        self.time_last_used[session] = datetime.datetime.now() - datetime.timedelta(seconds=age_s)


def app_with(holder: Holder, busy: set = frozenset()):
    events = {i: SimpleNamespace(session_hash=s) for i, s in enumerate(busy)}
    queue = SimpleNamespace(event_ids_to_events=events, pending_event_ids_session={})
    return SimpleNamespace(state_holder=holder, get_blocks=lambda: SimpleNamespace(_queue=queue))


def test_a_visitors_sessions_beyond_its_share_drop_its_least_recently_used_idle_one(monkeypatch):
    monkeypatch.setenv("GROM_SESSIONS_PER_VISITOR", "3")
    book, holder = SessionBook(), Holder()
    app = app_with(holder, busy={"s1"})
    for s in ("s0", "s1", "s2"):
        assert book.admit(s, "v", app) is None
        holder.make(s)
    book.page_opened("s0")  # an open page is never dropped, nor a busy session (s1)
    assert book.admit("s3", "v", app) is None
    assert set(holder.session_data) == {"s0", "s1"} and book.held("v") == 3
    holder.make("s3")
    book.page_opened("s3")
    assert "GROM_SESSIONS_PER_VISITOR" in book.admit("s4", "v", app)  # every one open or busy
    assert book.admit("t0", "w", app) is None  # another visitor's share is its own


def test_idle_sessions_without_a_page_go(monkeypatch):
    monkeypatch.setenv("GROM_SESSION_IDLE_SECONDS", "60")
    book, holder = SessionBook(), Holder()
    app = app_with(holder)
    for s, age in (("old", 120), ("fresh", 1), ("page", 120)):
        book.admit(s, "v", app)
        holder.make(s, age)
    book.page_opened("page")
    book.named = collections.defaultdict(float)  # named long ago
    assert book.sweep(app, force=True) == 1
    assert set(holder.session_data) == {"fresh", "page"}
    with book.answering("fresh"):
        holder.time_last_used["fresh"] -= datetime.timedelta(seconds=600)
        assert book.sweep(app, force=True) == 0  # a request naming it is being answered
    assert book.sweep(app, force=True) == 1
