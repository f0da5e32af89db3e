"""The server's gates: how many jobs one session may queue, and how many uploads (and
how many bytes of them) the server accepts. Limits: components/limits.py.

- `queue_guard` is the `validator` of every queued event: it runs when a job asks to
  join the queue, and refuses a session's job beyond GROM_MAX_QUEUED_PER_SESSION (the
  page shows the message at the event's first input; a script gets a ValidationError).
- `UploadGuard` is an ASGI middleware in front of gradio's /upload route (which needs no
  session): at most GROM_UPLOADS_PER_MINUTE uploads a minute for the whole server, and
  uploaded files beyond GROM_UPLOAD_CACHE_MB are removed, oldest first.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path

import gradio as gr

from components.limits import limit

log = logging.getLogger(__name__)

ADMIT_WINDOW_S = 0.5  # a job admitted this recently may not be in gradio's pending set yet
_admitted: dict[str, collections.deque] = collections.defaultdict(collections.deque)
_admit_lock = threading.Lock()


def _pending(session_hash: str) -> int:
    from gradio.context import LocalContext

    blocks = LocalContext.blocks.get(None)
    queue = getattr(blocks, "_queue", None)
    return len(queue.pending_event_ids_session.get(session_hash, ())) if queue is not None else 0


def _load(pending: int, recent) -> int:
    """Jobs of a session waiting or running: gradio's pending count, or more where jobs
    admitted in the last ADMIT_WINDOW_S are not in it yet (each admission saw `seen`
    pending; it and every later admission came on top)."""
    later = len(recent)
    estimate = pending
    for _, seen in recent:
        estimate = max(estimate, seen + later)
        later -= 1
    return estimate


def queue_guard(*inputs):
    """Validator: refuse the job when its session has GROM_MAX_QUEUED_PER_SESSION jobs
    waiting or running already (many submitted at once are counted too, although none of
    them is in gradio's queue yet when they are checked)."""
    from gradio.context import LocalContext

    ok = [gr.validate(True, "")] * len(inputs)
    request = LocalContext.request.get(None)
    session = getattr(request, "session_hash", None)
    if not session or not inputs:
        return ok
    most = limit("GROM_MAX_QUEUED_PER_SESSION")
    with _admit_lock:
        now = time.monotonic()
        recent = _admitted[session]
        while recent and now - recent[0][0] > ADMIT_WINDOW_S:
            recent.popleft()
        pending = _pending(session)
        if _load(pending, recent) >= most:
            return [gr.validate(False, f"This page has {most} jobs waiting or running already: wait for "
                                       "them to finish (or cancel one) before asking for another. "
                                       "(The host sets this with GROM_MAX_QUEUED_PER_SESSION.)")] + ok[1:]
        recent.append((now, pending))
        if len(_admitted) > 10_000:  # sessions gone long ago: forget their windows
            for name in [k for k, v in _admitted.items() if not v or now - v[-1][0] > ADMIT_WINDOW_S]:
                del _admitted[name]
    return ok


# ---------------------------------------------------------------- uploads

def upload_folder() -> Path:
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder())


def prune(folder: Path, max_bytes: int, skip: tuple[str, ...] = (), min_age_s: float = 0.0) -> int:
    """Remove the oldest files under `folder` (not under the subfolders named in `skip`,
    none younger than `min_age_s`) until at most `max_bytes` remain; the bytes left."""
    files = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not any(part in skip for part in path.relative_to(folder).parts):
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        except OSError:
            continue
    total = sum(size for _, size, _ in files)
    now = time.time()
    for mtime, size, path in sorted(files):
        if total <= max_bytes or now - mtime < min_age_s:
            break
        try:
            path.unlink()
            total -= size
        except OSError:
            pass
    return total


class UploadGuard:
    """ASGI middleware: a rate and a disk bound on gradio's /upload route."""

    def __init__(self, app):
        self.app = app
        self.times: collections.deque = collections.deque()
        self.lock = threading.Lock()

    def _refusal(self) -> str | None:
        with self.lock:
            now = time.monotonic()
            while self.times and now - self.times[0] > 60:
                self.times.popleft()
            if len(self.times) >= limit("GROM_UPLOADS_PER_MINUTE"):
                return ("This server has taken as many uploads as it accepts in a minute "
                        "(GROM_UPLOADS_PER_MINUTE); try again in a minute.")
            self.times.append(now)
        folder = upload_folder()
        if folder.is_dir():
            from components.export_panel import EXPORT_FOLDER

            kept = prune(folder, limit("GROM_UPLOAD_CACHE_MB") << 20, skip=(EXPORT_FOLDER,), min_age_s=60)
            if kept > limit("GROM_UPLOAD_CACHE_MB") << 20:
                return ("This server holds as many uploaded files as it keeps (GROM_UPLOAD_CACHE_MB); "
                        "try again in a minute.")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" and scope["path"].rstrip("/").endswith("/upload"):
            refusal = self._refusal()
            if refusal is not None:
                from starlette.responses import PlainTextResponse

                log.warning("upload refused: %s", refusal)
                await PlainTextResponse(refusal, status_code=429)(scope, receive, send)
                return
        await self.app(scope, receive, send)
