"""The server's gates, ASGI middlewares in front of gradio (limits: components/core/limits.py).

- `BodyLimit`: every request body but an upload's (gradio's /upload streams files to disk
  within GROM_MAX_UPLOAD_MB) is at most GROM_MAX_REQUEST_MB: a larger declared length is
  answered 413 before a byte is read, and a chunked body is cut off with a 413 the moment
  it passes the limit, so memory stays flat whatever a client sends.
- `QueueGuard`: refuses a session's job beyond GROM_MAX_QUEUED_PER_SESSION before gradio
  reads its inputs (a script gets a ValidationError with the message).
- `UploadGuard`: on gradio's /upload route (which needs no session), at most
  GROM_UPLOADS_PER_MINUTE uploads a minute from one client (its address), and
  GROM_SERVER_UPLOADS_PER_MINUTE from all clients together; uploaded files beyond
  GROM_UPLOAD_CACHE_MB are removed, oldest first.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time

from starlette.responses import JSONResponse, PlainTextResponse

from components.core.files import EXPORT_FOLDER, prune, upload_folder
from components.core.limits import limit

log = logging.getLogger(__name__)

ADMIT_WINDOW_S = 0.5  # a job admitted this recently may not be in gradio's pending set yet
_admitted: dict[str, collections.deque] = collections.defaultdict(collections.deque)
_admit_lock = threading.Lock()


def _live(queue, session: str) -> int:
    """The session's jobs in gradio's queue, waiting or running (a job leaves it the
    moment it ends or is cancelled)."""
    return sum(e.session_hash == session for e in list(queue.event_ids_to_events.values()))


def _registered_since(queue, session: str, since: float) -> int:
    """The session's jobs that joined the queue at or after `since` (time.time()), ended
    or not (gradio's analytics keep every recent job with its time, newest last)."""
    count = 0
    for record in reversed(list(queue.event_analytics.values())):
        if record.get("time", 0) < since:
            break
        count += record.get("session_hash") == session
    return count


def refusal(queue, session: str | None) -> str | None:
    """Why a new job of `session` may not join the queue (None: it may): its session has
    GROM_MAX_QUEUED_PER_SESSION jobs waiting or running already. Jobs asked for at once are
    checked before any of them joins, so those admitted in the last ADMIT_WINDOW_S that
    have not joined yet count too."""
    if not session or queue is None:
        return None
    most = limit("GROM_MAX_QUEUED_PER_SESSION")
    with _admit_lock:
        now = time.time()
        recent = _admitted[session]
        while recent and now - recent[0] > ADMIT_WINDOW_S:
            recent.popleft()
        not_joined = max(0, len(recent) - _registered_since(queue, session, recent[0])) if recent else 0
        if _live(queue, session) + not_joined >= most:
            return (f"This page has {most} jobs waiting or running already: wait for them to finish "
                    "(or cancel one) before asking for another. (The host sets this with "
                    "GROM_MAX_QUEUED_PER_SESSION.)")
        recent.append(now)
        if len(_admitted) > 10_000:  # sessions gone long ago: forget their windows
            for name in [k for k, v in _admitted.items() if not v or now - v[-1] > ADMIT_WINDOW_S]:
                del _admitted[name]
    return None


class QueueGuard:
    """ASGI middleware in front of gradio's queue/join and call routes: a job beyond its
    session's share is answered 422 with the message, as a validator's refusal is (a
    script gets a ValidationError that says it; the inputs are never parsed)."""
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope.get("method") != "POST" or not ("/queue/join" in path or "/call/" in path):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive, limit("GROM_MAX_REQUEST_MB") << 20)
        if body is None:
            await too_large(scope, receive, send)
            return
        try:
            session = json.loads(body or b"{}").get("session_hash")
            queue = scope["app"].get_blocks()._queue
        except Exception:  # noqa: BLE001  (not ours to judge: gradio answers it)
            session, queue = None, None
        reason = refusal(queue, session)
        if reason is not None:
            detail = [{"__type__": "validate", "is_valid": False, "message": reason, "parameter_name": "page"}]
            await JSONResponse({"detail": detail}, status_code=422)(scope, receive, send)
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# ---------------------------------------------------------------- uploads


class UploadGuard:
    """ASGI middleware: a rate per client, a rate for the server, and a disk bound on
    gradio's /upload route."""
    def __init__(self, app):
        self.app = app
        self.times: collections.deque = collections.deque()  # every client's, the newest last
        self.clients: dict[str, collections.deque] = {}
        self.lock = threading.Lock()

    def _refusal(self, client: str = "") -> str | None:
        with self.lock:
            now = time.monotonic()
            while self.times and now - self.times[0][0] > 60:
                _, gone = self.times.popleft()
                mine = self.clients.get(gone)
                if mine:
                    mine.popleft()
                    if not mine:
                        del self.clients[gone]
            if len(self.clients.get(client, ())) >= limit("GROM_UPLOADS_PER_MINUTE"):
                return ("You have uploaded as many files as this server takes from one visitor in a "
                        "minute (GROM_UPLOADS_PER_MINUTE); try again in a minute.")
            if len(self.times) >= limit("GROM_SERVER_UPLOADS_PER_MINUTE"):
                return ("This server has taken as many uploads as it accepts in a minute from all "
                        "visitors (GROM_SERVER_UPLOADS_PER_MINUTE); try again in a minute.")
            self.times.append((now, client))
            self.clients.setdefault(client, collections.deque()).append(now)
        folder = upload_folder()
        if folder.is_dir():

            kept = prune(folder, limit("GROM_UPLOAD_CACHE_MB") << 20, skip=(EXPORT_FOLDER,), min_age_s=60)
            if kept > limit("GROM_UPLOAD_CACHE_MB") << 20:
                return ("This server holds as many uploaded files as it keeps (GROM_UPLOAD_CACHE_MB); "
                        "try again in a minute.")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" and is_upload(scope):
            refusal = self._refusal(client_of(scope))
            if refusal is not None:
                log.warning("upload refused: %s", refusal)
                await PlainTextResponse(refusal, status_code=429)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------- request bodies

def is_upload(scope) -> bool:
    return scope.get("path", "").rstrip("/").endswith("/upload")


def client_of(scope) -> str:
    """Who sent a request: the first address of X-Forwarded-For where a proxy put one (a
    Space is behind one), else the peer's address."""
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            return value.decode("latin-1").split(",")[0].strip()[:64]
    client = scope.get("client")
    return client[0] if client else ""


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
