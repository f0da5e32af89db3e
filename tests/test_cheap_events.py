"""Every event the page declares is queued (and counted per visitor: components/server/guard.py)
or cheap whatever it is sent (issue 45's rule): gradio serves an event outside the queue on
/gradio_api/run/predict to anyone, under any session id they make up, with no visitor
accounting. So each one is called here the way a hostile script would, through that route,
with the largest inputs the server reads (GROM_MAX_REQUEST_MB) shaped to hurt (a one-column
table with a 50,000-character header, huge strings, numbers at the float limit, a selection
far outside any table), each under a fresh session id, and must:

- answer within a few seconds, with at most twice what it was sent plus a fixed allowance;
- write to disk at most three times what it was sent plus a fixed allowance (a table as CSV
  and as JSON records; the same request again: nothing more);
- leave its session holding at most a fixed amount (`session_bytes`);
and the sessions they made must go once idle (components/server/page_sessions.py).

The list of events comes from the app's /config, so a panel that adds one outside the
queue is checked here without being named.
"""
from __future__ import annotations

import json
import pickle
import time
import uuid
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")

from components.server.files import upload_folder  # noqa: E402
from components.server.session import Session  # noqa: E402
from tests.app_fixtures import launch  # noqa: E402

MB = 1 << 20
BODY = 3 * MB  # under GROM_MAX_REQUEST_MB (4)
ANSWER_SLACK = 512 << 10  # a card, a plot or a table built from the session: never from the input's size
DISK_SLACK = 256 << 10
SECONDS = 20  # gradio alone reads a 3 MB table of 800,000 rows in 1.5 s on a busy 2-core CPU
SESSION_MOST = 2 * MB  # what one session may hold after any of these calls (the written table: 1 MB of text)


@pytest.fixture(scope="module")
def served():
    """(blocks, url) of a freshly launched app on the demo model."""
    from components.server.allowed_sources import DEMO

    blocks, url = launch(DEMO)
    yield blocks, url
    blocks.close()


def local_events(blocks) -> list[dict]:
    """Every dependency of /config that gradio serves outside the queue and that runs Python
    (a js-only one runs in the browser)."""
    config = blocks.get_config_file()
    return [d for d in config["dependencies"] if d.get("queue") is False and blocks.fns[d["id"]].fn is not None]


def hostile(kind: str, budget: int, variant: int):
    """A value of component type `kind` of about `budget` bytes, shaped to hurt."""
    if kind == "dataframe":
        if variant == 0:  # the 1 GB file of issue 45: one huge header repeated per row as JSON records
            rows = max(1, (budget - 50_000) // 4)
            return {"headers": ["H" * 50_000], "data": [[0]] * rows}
        rows = budget // 100  # many rows of the written table's five columns
        return {"headers": ["text", "prompt", "kind", "side", "subject"], "data": [["x" * 60, "q", "qa", "forget",
                                                                                      "s"]] * rows}
    if kind in ("textbox", "markdown", "code", "html"):
        return "x" * budget
    if kind in ("number", "slider"):
        return 1.7e308 if variant == 0 else -1.7e308
    if kind == "checkbox":
        return True
    if kind in ("radio", "dropdown"):
        return "x" * min(budget, 100_000)
    if kind == "checkboxgroup":
        return ["x" * 100] * (budget // 110)
    return None  # state, file, plot, tabs...: the server's own or nothing


def call(url: str, dep: dict, kinds: dict, variant: int, session: str) -> tuple[int, int, float]:
    """POST the event `dep` with hostile inputs; (bytes sent, bytes answered, seconds)."""
    inputs = [i for i in dep["inputs"]]
    share = BODY // max(1, sum(kinds[i] not in ("state", "file", "plot") for i in inputs))
    body = {"fn_index": dep["id"], "session_hash": session, "trigger_id": (dep["targets"] or [[None]])[0][0],
            "data": [hostile(kinds[i], share, variant) for i in inputs],
            "event_data": {"index": [10**12, 10**12], "value": "x" * 1000, "selected": True}}
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    r = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", content=payload, timeout=120,
                   headers={"Content-Type": "application/json"})
    return len(payload), len(r.content), time.perf_counter() - t0


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def session_bytes(session: Session) -> int:
    """What a session holds of its own: its extra values as pickled (what a link, a table or a
    list a request left there weighs), the shared model and benchmark not counted."""
    own = {}
    for key, value in session.extra.items():
        try:
            own[key] = pickle.dumps(value)
        except Exception:  # noqa: BLE001  (a lock, a model: shared, not a request's)
            own[key] = b""
    return sum(len(v) for v in own.values())


def sessions_of(blocks, ids) -> list[Session]:
    holder = blocks.state_holder
    found = []
    for sid in ids:
        state = holder.session_data.get(sid)
        if state is not None:
            found += [v for v in state.state_data.values() if isinstance(v, Session)]
    return found


def test_every_event_outside_the_queue_is_cheap_whatever_it_is_sent(served):
    blocks, url = served
    kinds = {c["id"]: c["type"] for c in blocks.get_config_file()["components"]}
    events = local_events(blocks)
    assert len(events) > 50  # the page's sliders, redraws, cards, selections and downloads
    folder = upload_folder()
    problems, ids = [], []
    for dep in events:
        name = getattr(blocks.fns[dep["id"]].fn, "__qualname__", "?")
        for variant in (0, 1):
            sid = uuid.uuid4().hex
            ids.append(sid)
            before = disk_bytes(folder)
            sent, answered, seconds = call(url, dep, kinds, variant, sid)
            wrote = disk_bytes(folder) - before
            again = disk_bytes(folder)
            call(url, dep, kinds, variant, sid)  # the same request again writes nothing more
            more = disk_bytes(folder) - again
            held = max((session_bytes(s) for s in sessions_of(blocks, [sid])), default=0)
            if seconds > SECONDS or answered > 2 * sent + ANSWER_SLACK or wrote > 3 * sent + DISK_SLACK \
                    or more > DISK_SLACK or held > SESSION_MOST:
                problems.append(f"{dep['id']} {name} (variant {variant}): {seconds:.1f} s, sent {sent:,} B, "
                                f"answered {answered:,} B, wrote {wrote:,} B then {more:,} B, session {held:,} B")
    assert not problems, "\n".join(problems)


def written_table_call(url: str, blocks, session: str, rows: int) -> int:
    """The name-only table's change event (kept in the session), sent a table of `rows` rows
    of the written columns by a script under `session`; the answer's status."""
    kinds = {c["id"]: c["type"] for c in blocks.get_config_file()["components"]}
    dep = next(d for d in local_events(blocks) if [kinds[i] for i in d["inputs"]] == ["dataframe", "radio", "state"])
    table = {"headers": ["text", "prompt", "kind", "side", "subject"],
             "data": [["The Sun is a star.", "What is the Sun?", "qa", "forget", "the-solar-system"]] * rows}
    r = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", timeout=60,
                   json={"fn_index": dep["id"], "session_hash": session, "data": [table, "questions", None]})
    return r.status_code


def test_sessions_that_never_open_a_page_go_once_idle(served, monkeypatch):
    """Made-up session ids that never open a heartbeat are dropped once idle, whatever they
    hold."""
    from components.server.page_sessions import BOOK

    blocks, url = served
    made = [uuid.uuid4().hex for _ in range(5)]
    for sid in made:
        assert written_table_call(url, blocks, sid, 100) == 200
    kept = sessions_of(blocks, made)
    assert len(kept) == 5 and all(s.extra["written"][0] for s in kept)
    monkeypatch.setenv("GROM_SESSION_IDLE_SECONDS", "1")
    time.sleep(1.5)
    BOOK.sweep(blocks.server_app, force=True)  # the server's own sweeper may have taken some already
    assert not any(s in blocks.state_holder.session_data for s in made)


def test_a_visitor_holds_its_share_of_sessions_and_no_more(served, monkeypatch):
    """One visitor naming fresh session ids keeps at most GROM_SESSIONS_PER_VISITOR of them
    (its least recently used idle one goes); another visitor's are untouched."""
    blocks, url = served
    monkeypatch.setenv("GROM_SESSIONS_PER_VISITOR", "4")
    monkeypatch.setenv("GROM_PROXY_HOPS", "1")
    other = uuid.uuid4().hex
    r = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", timeout=60, headers={"X-Forwarded-For": "198.51.100.9"},
                   json={"fn_index": 0, "session_hash": other, "data": [0.5]})
    assert r.status_code == 200
    made = [uuid.uuid4().hex for _ in range(10)]
    for sid in made:
        r = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", timeout=60,
                       headers={"X-Forwarded-For": "203.0.113.66"},
                       json={"fn_index": 0, "session_hash": sid, "data": [0.5]})
        assert r.status_code == 200
    held = [s for s in made if s in blocks.state_holder.session_data]
    assert held == made[-4:]
    assert other in blocks.state_holder.session_data
