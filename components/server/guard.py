"""The server's gates, ASGI middlewares in front of gradio (limits: components/server/limits.py).

- `BodyLimit`: every request body but an upload's (gradio's /upload streams files to disk
  within GROM_MAX_UPLOAD_MB) is at most GROM_MAX_REQUEST_MB: a larger declared length is
  answered 413 before a byte is read, and a chunked body is cut off with a 413 the moment
  it passes the limit, so memory stays flat whatever a client sends.
- `QueueGuard`: before gradio reads a job's inputs (queue/join and the /call/ routes),
  refuses it beyond GROM_MAX_QUEUED_PER_SESSION jobs of its session or
  GROM_MAX_QUEUED_PER_VISITOR jobs of its visitor (all the visitor's sessions together: a
  session id is whatever the client made up, its address is not), and refuses a file
  another visitor uploaded (`UPLOADS`); a script gets a ValidationError with the message.
  It also watches the result streams (queue/data, GET /call/...): a job nobody listens for
  GROM_LISTEN_SECONDS after it joined is dropped from the queue, or stopped if it already
  runs (`components.server.device` stops a job that is not alive at its next forward pass).
- `UploadGuard`: on gradio's /upload route (which needs no session), at most
  GROM_UPLOADS_PER_MINUTE uploads a minute from one visitor, and
  GROM_SERVER_UPLOADS_PER_MINUTE from all visitors together, of which a visitor who has had
  less than an equal share still gets one (`rates.FairRate`); uploaded files beyond
  GROM_UPLOAD_CACHE_MB are removed, oldest first; who uploaded which path is recorded
  from the route's answer (`UPLOADS`).

- `NoDeepLinks`: gradio's /gradio_api/deep_link route (its DeepLinkButton's) writes the
  components' values of any live session to the upload folder on every GET, with no bound
  of its own; the studio links runs its own way (components/studio/links.py), so the route
  answers 404.

A visitor is an address (`client_of`): the peer's, or with GROM_PROXY_HOPS trusted proxies
in front (a Space: `limits.proxy_hops`) the one they appended to X-Forwarded-For; the
addresses a client writes there itself never count.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import threading
from urllib.parse import parse_qs, unquote

from starlette.responses import JSONResponse, PlainTextResponse

from components.server.files import EXPORT_FOLDER, prune, upload_folder
from components.server.limits import limit, proxy_hops
from components.server.page_sessions import BOOK, make_lean
from components.server.rates import FairRate
from grom.model.process_memory import release_memory

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- who a visitor is

def client_of(scope) -> str:
    """Who sent a request: with GROM_PROXY_HOPS = N trusted proxies in front (a Space), the
    Nth address from the end of X-Forwarded-For, the one the outermost trusted proxy
    appended (what the client wrote ahead of it is never used); with N = 0 the peer's
    address, the header ignored. A header with fewer than N addresses (a chain shorter
    than the host said) gives its first one, the nearest to the client that a proxy wrote
    (the peer, a proxy, would make every visitor one), and no header gives the peer.
    (uvicorn, as gradio starts it, already puts X-Forwarded-For's last address in place of
    a 127.0.0.1 peer, a proxy on the same machine: FORWARDED_ALLOW_IPS.)"""
    client = scope.get("client")
    peer = client[0] if client else ""
    hops = proxy_hops()
    if hops == 0:
        return peer[:64]
    values = [value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"x-forwarded-for"]
    addresses = [a.strip() for a in ",".join(values).split(",") if a.strip()]
    if not addresses:
        return peer[:64]
    return (addresses[-hops] if len(addresses) >= hops else addresses[0])[:64]


def _event_client(event) -> str:
    """The visitor of a job in gradio's queue (its queue/join request, the same rule)."""
    try:
        return client_of(event.request.scope)
    except Exception:  # noqa: BLE001  (no request: a job gradio made itself)
        return ""


# ---------------------------------------------------------------- jobs per session and visitor

_joining = {"session": collections.Counter(), "visitor": collections.Counter()}
_admit_lock = threading.Lock()


_done: set[str] = set()  # jobs whose result went out to their client (gradio drops them from its queue later)


def _live(queue) -> tuple[collections.Counter, collections.Counter]:
    """The jobs in gradio's queue, waiting or running, per session and per visitor. A job
    stops counting the moment its result is sent (`_done`): gradio keeps it in its queue a
    little longer, while it tidies up, and a client that asks again at once would have
    found its finished job counted (issue 45, item 7: 3 of 12 back-to-back calls refused)."""
    sessions, visitors = collections.Counter(), collections.Counter()
    events = dict(queue.event_ids_to_events)
    _done.intersection_update(events)
    for event_id, event in events.items():
        if event_id not in _done:
            sessions[event.session_hash] += 1
            visitors[_event_client(event)] += 1
    return sessions, visitors


_COMPLETED = re.compile(rb'^data: \{"msg":"process_completed","event_id":"([^"]+)"', re.MULTILINE)


def note_results(chunk: bytes, event_id: str | None = None) -> None:
    """Mark the jobs whose result is in `chunk` of a result stream as done: gradio's
    queue/data messages name their event ("process_completed"); a /call/ stream is one
    event's (`event_id`), done at its "complete" or "error" event."""
    if event_id is not None:
        if b"event: complete" in chunk or b"event: error" in chunk:
            _done.add(event_id)
        return
    if b"process_completed" in chunk:
        _done.update(m.decode("latin-1") for m in _COMPLETED.findall(chunk))


def refusal(queue, session: str | None, visitor: str = "") -> str | None:
    """Why a new job of `session` from `visitor` may not join the queue (None: it may, and
    it counts as joining until `joined`): its session has GROM_MAX_QUEUED_PER_SESSION jobs
    waiting or running already, or its visitor, over all its sessions,
    GROM_MAX_QUEUED_PER_VISITOR, or the queue is nearly full and the visitor has a job in it
    already (`newcomers`). Jobs asked for at once are counted while gradio takes
    them in, so a burst cannot slip in before the first of it is in the queue. (A /call/
    job without a session gets one of its own from gradio: only its visitor's share counts.)"""
    if queue is None:
        return None
    per_session, per_visitor = limit("GROM_MAX_QUEUED_PER_SESSION"), limit("GROM_MAX_QUEUED_PER_VISITOR")
    with _admit_lock:
        sessions, visitors = _live(queue)
        if session and sessions[session] + _joining["session"][session] >= per_session:
            return (f"This page has {per_session} jobs waiting or running already: wait for them to finish "
                    "(or cancel one) before asking for another. (The host sets this with "
                    "GROM_MAX_QUEUED_PER_SESSION.)")
        mine = visitors[visitor] + _joining["visitor"][visitor]
        if mine >= per_visitor:
            return (f"You have {per_visitor} jobs waiting or running already, over all your pages: wait for "
                    "them to finish (or cancel one) before asking for another. (The host sets this with "
                    "GROM_MAX_QUEUED_PER_VISITOR.)")
        if mine and sum(visitors.values()) + sum(_joining["visitor"].values()) >= limit("GROM_MAX_QUEUE") - newcomers():
            return ("This server's queue is nearly full: its last places are kept for visitors with no job "
                    "yet. Wait for your job to finish before asking for another.")
        _joining["session"][session or ""] += 1
        _joining["visitor"][visitor] += 1
    return None


def newcomers() -> int:
    """The places of gradio's queue (GROM_MAX_QUEUE) kept for visitors with no job in it: a
    visitor with one job already is refused once only these are left, so that a newcomer's
    job always finds a place (issue 45, item 4)."""
    return max(1, limit("GROM_MAX_QUEUE") // 8)


def joined(session: str | None, visitor: str) -> None:
    """A job `refusal` admitted is in gradio's queue now (or was turned away by gradio)."""
    with _admit_lock:
        for kind, key in (("session", session or ""), ("visitor", visitor)):
            _joining[kind][key] -= 1
            if _joining[kind][key] <= 0:
                del _joining[kind][key]


# ---------------------------------------------------------------- listening for results

_streams: collections.Counter = collections.Counter()  # session or event id -> result streams open
_checks: set = set()  # the pending listen checks (a task needs a reference to finish)


def _stream_keys(scope, queue) -> list[str]:
    """The sessions (and event ids) whose results a GET streams: queue/data names its
    session; GET /call/<api>/<event_id> names an event, whose session gradio streams."""
    path = scope.get("path", "").rstrip("/")
    if path.endswith("/queue/data"):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return query.get("session_hash", [])[:1]
    event_id = path.rsplit("/", 1)[-1]
    event = queue.event_ids_to_events.get(event_id) if queue is not None else None
    return [event_id] + ([event.session_hash] if event is not None else [])


async def _drop_unheard(queue, event_id: str) -> None:
    """Drop the job `event_id` if nobody streams its results: out of the queue if it
    waits; marked not alive if it runs, so that it stops at its next forward pass."""
    event = queue.event_ids_to_events.get(event_id)
    if event is None or _streams[event.session_hash] > 0 or _streams[event_id] > 0:
        return  # ended, or someone listens
    log.warning("job %s dropped: no client listened for its result within GROM_LISTEN_SECONDS", event_id)
    await queue.clean_events(event_id=event_id)
    for _ in range(600):  # a running one stops at its next forward pass, then leaves the queue
        if event_id not in queue.event_ids_to_events:
            break
        await asyncio.sleep(1)
    ids = queue.pending_event_ids_session.get(event.session_hash)  # its result, which nobody will read
    if ids is not None:
        ids.discard(event_id)
        if not ids:
            queue.pending_event_ids_session.pop(event.session_hash, None)


def _expect_listener(queue, event_id: str) -> None:
    loop = asyncio.get_running_loop()

    def check():
        task = loop.create_task(_drop_unheard(queue, event_id))
        _checks.add(task)
        task.add_done_callback(_checks.discard)

    loop.call_later(limit("GROM_LISTEN_SECONDS"), check)


# ---------------------------------------------------------------- uploaded files

class UploadRecord:
    """Which visitors uploaded which file (gradio names an upload by its content's hash and
    its name, so the same file sent twice is one path with two uploaders). A path another
    visitor uploaded is refused as a job's input; a path nobody uploaded (an export, a file
    a handler returned) is not this record's to judge. The MOST newest paths are kept."""
    MOST = 50_000

    def __init__(self):
        self.owners: collections.OrderedDict[str, set[str]] = collections.OrderedDict()
        self.folders: collections.Counter = collections.Counter()  # the hash folders of those paths
        self.lock = threading.Lock()

    def add(self, path: str, visitor: str) -> None:
        key = os.path.realpath(path)
        with self.lock:
            if key not in self.owners:
                self.owners[key] = set()
                self.folders[os.path.basename(os.path.dirname(key))] += 1
            self.owners[key].add(visitor)
            self.owners.move_to_end(key)
            while len(self.owners) > self.MOST:
                gone, _ = self.owners.popitem(last=False)
                folder = os.path.basename(os.path.dirname(gone))
                self.folders[folder] -= 1
                if self.folders[folder] <= 0:
                    del self.folders[folder]

    def foreign(self, path: str, visitor: str) -> bool:
        """Whether `path` (as a job's input names it) is a file other visitors uploaded and
        `visitor` did not. Only a name in one of the uploads' hash folders is resolved on disk."""
        if not self.folders or len(path) > 4096:
            return False
        if "/." in path or "//" in path:
            path = os.path.normpath(path)
        parts = path.rsplit("/", 2)
        if len(parts) < 2 or parts[-2] not in self.folders:
            return False
        key = os.path.realpath(path)
        with self.lock:
            owners = self.owners.get(key)
            return owners is not None and visitor not in owners


UPLOADS = UploadRecord()


def _named_paths(value) -> list[str]:
    """The file paths in a job's inputs: the "path" of every dict (gradio's FileData) and
    the path in a "url" of gradio's file route, however deep (every node is looked at: the
    walk costs what parsing the body did, which GROM_MAX_REQUEST_MB bounds)."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in ("path", "url"):
                text = item.get(key)
                if isinstance(text, str):
                    found.append(unquote(text.rsplit("file=", 1)[-1]) if key == "url" else text)
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))
    return found


def foreign_file(body: dict, visitor: str) -> str | None:
    """Why a job's inputs may not be used (None: they may): one names a file that another
    visitor uploaded (its path came back from gradio's /upload to them only)."""
    if not UPLOADS.folders:
        return None
    for path in _named_paths(body.get("data")):
        if UPLOADS.foreign(path, visitor):
            log.warning("job refused: it names a file another visitor uploaded")
            return ("This job names a file that another visitor uploaded; upload your own copy of the file "
                    "and use that.")
    return None


def _parsed(scope, body: bytes):
    """The request's JSON, its session hash and gradio's queue ({}, None, None where the body
    is not ours to judge: gradio answers it)."""
    try:
        parsed = json.loads(body or b"{}")
        return parsed, parsed.get("session_hash") or None, scope["app"].get_blocks()._queue
    except Exception:  # noqa: BLE001  (not ours to judge: gradio answers it)
        return {}, None, None


def _flooded_text() -> str:
    return (f"You have {limit('GROM_DIRECT_CALLS_PER_VISITOR') * (1 + DirectCalls.WAITING_FACTOR)} calls waiting "
            "on this server already: wait for their answers. (The host sets this with "
            "GROM_DIRECT_CALLS_PER_VISITOR.)")


def _refuse(reason: str):
    detail = [{"__type__": "validate", "is_valid": False, "message": reason, "parameter_name": "page"}]
    return JSONResponse({"detail": detail}, status_code=422)


_sweepers: dict = {}  # app -> the task that drops its idle sessions (started by its first request)
SWEEP_TASK_S = 30.0


def _watch_sessions(app) -> None:
    """Sessions made lean (`page_sessions.make_lean`), idle ones dropped now (at most every
    few seconds: `SessionBook.sweep`) and, from the app's first request on, every
    SWEEP_TASK_S even when no request comes."""
    make_lean(app)
    if BOOK.sweep(app):
        release_memory()
    task = _sweepers.get(app)
    if task is not None and not task.done():
        return

    async def sweeping():
        while True:
            await asyncio.sleep(SWEEP_TASK_S)
            try:
                if BOOK.sweep(app, force=True):
                    release_memory()
            except Exception:  # noqa: BLE001  (the next round tries again)
                log.warning("sweeping idle sessions failed", exc_info=True)

    for old in [a for a, t in _sweepers.items() if t.done()]:
        del _sweepers[old]
    _sweepers[app] = asyncio.get_running_loop().create_task(sweeping())


class DirectCalls:
    """The events served outside the queue (/run/, /api/), per visitor: at most
    GROM_DIRECT_CALLS_PER_VISITOR of a visitor's run at once, the rest wait their turn (their
    bodies not read yet), and beyond WAITING_FACTOR times that many waiting, a call is
    refused: each such event is cheap, but a script can send them by the thousand, and one
    visitor's flood should use that visitor's share of the threads, not everyone's."""
    WAITING_FACTOR = 8

    def __init__(self):
        self.slots: dict[tuple, list] = {}  # (event loop, visitor) -> [semaphore, calls running or waiting]

    @contextlib.asynccontextmanager
    async def slot(self, visitor: str):
        """Yields True once the call may run, False if it is refused (too many waiting)."""
        most = limit("GROM_DIRECT_CALLS_PER_VISITOR")
        key = (id(asyncio.get_running_loop()), visitor)
        entry = self.slots.setdefault(key, [asyncio.Semaphore(most), 0])
        if entry[1] >= most * (1 + self.WAITING_FACTOR):
            yield False
            return
        entry[1] += 1
        try:
            async with entry[0]:
                yield True
        finally:
            entry[1] -= 1
            if entry[1] <= 0:
                self.slots.pop(key, None)


DIRECT = DirectCalls()


class QueueGuard:
    """ASGI middleware in front of gradio's queue/join and call routes: a job beyond its
    session's or its visitor's share, or naming a file another visitor uploaded, is
    answered 422 with the message, as a validator's refusal is (a script gets a
    ValidationError that says it; the inputs are never parsed); an admitted job is dropped
    if nobody listens for its result within GROM_LISTEN_SECONDS. A direct call (/run/,
    /api/: gradio serves them for events outside the queue, and for every event where its
    `api_open` is true, off a Space by default) has its files checked as well."""
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        method = scope.get("method")
        if path and "app" in scope:
            _watch_sessions(scope["app"])
        if method == "GET" and "/heartbeat/" in path:
            await self._page(scope, receive, send, path.rstrip("/").rsplit("/", 1)[-1][:256], client_of(scope))
            return
        if method == "GET" and (path.rstrip("/").endswith("/queue/data") or "/call/" in path):
            await self._stream(scope, receive, send)
            return
        queued = "/queue/join" in path or "/call/" in path
        direct = "/run/" in path or "/api/" in path  # a direct call: its files are checked too
        if method != "POST" or not (queued or direct):
            await self.app(scope, receive, send)
            return
        if direct:
            async with DIRECT.slot(client_of(scope)) as allowed:
                if allowed:
                    await self._job(scope, receive, send, queued=False)
                else:
                    await PlainTextResponse(_flooded_text(), status_code=429)(scope, receive, send)
            return
        await self._job(scope, receive, send, queued=True)

    async def _job(self, scope, receive, send, queued: bool):
        """A queued job (queue/join, /call/) or a direct call (/run/, /api/): its body read
        within GROM_MAX_REQUEST_MB, its files and session checked, a queued one counted."""
        body = await read_body(receive, limit("GROM_MAX_REQUEST_MB") << 20)
        if body is None:
            await too_large(scope, receive, send)
            return
        parsed, session, queue = _parsed(scope, body)
        visitor = client_of(scope)
        reason = foreign_file(parsed, visitor) if isinstance(parsed, dict) else None
        if reason is None and session:  # a session named for the first time is one of its visitor's share
            reason = BOOK.admit(str(session)[:256], visitor, scope["app"])
        if reason is None and queued:
            reason = refusal(queue, session, visitor)
        if reason is not None:
            await _refuse(reason)(scope, receive, send)
            return
        with BOOK.answering(str(session)[:256] if session else None):
            status, answer = await self._admit(scope, body, receive, send, queued and queue is not None,
                                               session, visitor)
        if queued and status == 200 and queue is not None:
            try:
                event_id = json.loads(answer).get("event_id")
            except Exception:  # noqa: BLE001
                event_id = None
            if event_id:
                _expect_listener(queue, event_id)
                event = queue.event_ids_to_events.get(event_id)
                if not session and event is not None:  # a /call/ job: gradio named its session itself
                    BOOK.admit(event.session_hash, visitor, scope["app"])

    async def _admit(self, scope, body: bytes, receive, send, admitted: bool, session, visitor):
        """Hands the request (its body read already) to gradio; a queued job counts as joined
        once gradio has answered it (taken in or turned away), or when the call ends. Gives the
        answer's status and the first 4 KiB of its body."""
        answer = {"status": 0, "body": b""}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def watched(message):
            nonlocal admitted
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                if admitted:  # gradio has taken the job in (or turned it away): it counts as queued now
                    admitted = False
                    joined(session, visitor)
            elif message["type"] == "http.response.body" and answer["status"] == 200:
                answer["body"] += message.get("body", b"")[:4096]
            await send(message)

        try:
            await self.app(scope, replay, watched)
        finally:
            if admitted:
                joined(session, visitor)
        return answer["status"], answer["body"]

    async def _stream(self, scope, receive, send):
        """A result stream: its session (or event) counts as listened to while it is open,
        and each job whose result it sends stops counting at once (`note_results`)."""
        try:
            queue = scope["app"].get_blocks()._queue
        except Exception:  # noqa: BLE001
            queue = None
        keys = _stream_keys(scope, queue)
        one_event = keys[0] if "/call/" in scope.get("path", "") else None
        for key in keys:
            _streams[key] += 1

        async def watched(message):
            if message["type"] == "http.response.body":
                note_results(message.get("body", b""), one_event)
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            for key in keys:
                _streams[key] -= 1
                if _streams[key] <= 0:
                    del _streams[key]

    async def _page(self, scope, receive, send, session: str, visitor: str):
        """A page's heartbeat stream (gradio's /heartbeat/<session>): the session counts as a
        page open while it streams (`page_sessions.BOOK`), one of its visitor's share."""
        reason = BOOK.admit(session, visitor, scope["app"])
        if reason is not None:
            await PlainTextResponse(reason, status_code=429)(scope, receive, send)
            return
        BOOK.page_opened(session)
        try:
            await self.app(scope, receive, send)
        finally:
            BOOK.page_closed(session)


# ---------------------------------------------------------------- uploads


class UploadGuard:
    """ASGI middleware: a rate per visitor and a fair rate for the server (`rates.FairRate`),
    and a disk bound on gradio's /upload route; who uploaded which path is recorded from its
    answer."""
    def __init__(self, app):
        self.app = app
        self.rate = FairRate(lambda: limit("GROM_UPLOADS_PER_MINUTE"), lambda: limit("GROM_SERVER_UPLOADS_PER_MINUTE"))

    def _refusal(self, client: str = "") -> str | None:
        over = self.rate.refusal(client)
        if over == "visitor":
            return ("You have uploaded as many files as this server takes from one visitor in a "
                    "minute (GROM_UPLOADS_PER_MINUTE); try again in a minute.")
        if over == "server":
            return ("This server has taken as many uploads as it accepts in a minute from all "
                    "visitors, and you have had your share of them (GROM_SERVER_UPLOADS_PER_MINUTE); "
                    "try again in a minute.")
        folder = upload_folder()
        if folder.is_dir():
            kept = prune(folder, limit("GROM_UPLOAD_CACHE_MB") << 20, skip=(EXPORT_FOLDER,), min_age_s=60)
            if kept > limit("GROM_UPLOAD_CACHE_MB") << 20:
                return ("This server holds as many uploaded files as it keeps (GROM_UPLOAD_CACHE_MB); "
                        "try again in a minute.")
        return None

    async def __call__(self, scope, receive, send):
        if not (scope["type"] == "http" and scope.get("method") == "POST" and is_upload(scope)):
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        refusal = self._refusal(client)
        if refusal is not None:
            log.warning("upload refused: %s", refusal)
            await PlainTextResponse(refusal, status_code=429)(scope, receive, send)
            return
        answer = {"status": 0, "body": b""}

        async def recorded(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body" and answer["status"] == 200:
                answer["body"] += message.get("body", b"")
                if not message.get("more_body", False):  # the paths are known before the client sees them
                    _record_upload(answer["body"], client)
            await send(message)

        await self.app(scope, receive, recorded)


def _record_upload(body: bytes, client: str) -> None:
    """Note `client` as the uploader of the paths /upload answered (a JSON list)."""
    try:
        paths = json.loads(body)
    except ValueError:
        return
    for path in paths if isinstance(paths, list) else ():
        if isinstance(path, str):
            UPLOADS.add(path, client)


# ---------------------------------------------------------------- request bodies

def is_upload(scope) -> bool:
    return scope.get("path", "").rstrip("/").endswith("/upload")


def declared_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(receive, cap: int) -> bytes | None:
    """The request body, or None as soon as it passes `cap` bytes (the rest is not read)."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _too_large_text() -> str:
    return (f"The request is larger than the {limit('GROM_MAX_REQUEST_MB')} MB this server reads "
            "(GROM_MAX_REQUEST_MB); files go through the upload route.")


async def too_large(scope, receive, send) -> None:
    log.warning("request body over GROM_MAX_REQUEST_MB refused: %s", scope.get("path"))
    await PlainTextResponse(_too_large_text(), status_code=413, headers={"Connection": "close"})(
        scope, receive, send)


class _Cut(Exception):
    """A body passed its limit while the app was reading it."""


class BodyLimit:
    """ASGI middleware: no request body but an upload's beyond GROM_MAX_REQUEST_MB."""
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or is_upload(scope):
            await self.app(scope, receive, send)
            return
        cap = limit("GROM_MAX_REQUEST_MB") << 20
        length = declared_length(scope)
        if length is not None and length > cap:
            await too_large(scope, receive, send)
            return
        state = {"read": 0, "started": False, "answered": False}

        async def capped():
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > cap:
                    if not state["started"]:
                        state["answered"] = True
                        await too_large(scope, receive, send)
                    raise _Cut()
            return message

        async def tracked(message):
            if state["answered"]:
                return  # the 413 went out: whatever the app says after it is dropped
            state["started"] = state["started"] or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped, tracked)
        except _Cut:
            pass


def is_deep_link(scope) -> bool:
    return scope.get("path", "").rstrip("/").endswith("/gradio_api/deep_link")


class NoDeepLinks:
    """ASGI middleware: gradio's deep-link route is closed (module docstring)."""
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and is_deep_link(scope):
            await PlainTextResponse("Not found: links to runs are made in the Export tab.", 404)(scope, receive, send)
            return
        await self.app(scope, receive, send)
