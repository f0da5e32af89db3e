"""Links that reopen a run: a session's edit stored on the server under an unguessable
token, and the page address that opens it (`<page>?run=<token>`).

A session's edit lives in its browser tab (a gr.State); a link makes it reachable from
another browser, a stakeholder's or a student's. Gradio's own deep links
(`gr.DeepLinkButton`, `?deep_link=`) snapshot the components' values only: the session's
model, benchmark and patches are server-side state they do not hold (and gradio writes
each snapshot under its upload folder with no bound). So a link here stores what the
export writes (`store`): edit.json (the model by name, benchmark, split, retain sample,
seed, every setting, the band, the patches' sha256) and patch.safetensors, the patches
in full (bit for bit, the hash checked as it is read) where that file is at most
GROM_MAX_PATCH_MB, the bound of an uploaded patch (any 5-layer down_proj edit of SmolLM2:
16.9 MB); a larger GROM edit is stored by its edit.json alone and computed again when the
link is opened, checked against that hash (as Load a run does). An edit loaded from
factors keeps its factors. Beside them, link.json holds the model's dtype, which edit.json
does not record (a link made on bfloat16 opens on bfloat16). Opening a link (components/export_panel.py `on_page_link`)
loads the run's model where the host allows it, its benchmark and split, the Edit
panel's settings and the edit.

On a public host visitors are hostile:
- a token is 32 URL-safe characters from `secrets` (192 bits): links are listed nowhere
  and cannot be guessed;
- a token is a name, never a path: anything but those 32 characters is refused before
  the disk is read (`token_of`), and only folders directly under the links folder, not
  symbolic links, are opened;
- the links folder (GROM_LINK_DIR) is not gradio's upload folder: gradio serves none of
  its files by path, and the pruning of uploads leaves it alone;
- bounded: at most GROM_MAX_LINKS links and GROM_LINKS_MAX_MB on disk, each kept
  GROM_LINK_DAYS; past a bound, the oldest link of whoever holds the most goes first (link.json
  records a salted hash of the visitor who made it, never the address), so one visitor's
  links push out only its own while it holds more than the others; a new link counts among
  the exports (GROM_VISITOR_EXPORTS_PER_MINUTE, GROM_EXPORTS_PER_MINUTE: export_panel), and
  a link opens only a model the host's policy allows (GROM_MODELS;
  components/server/model_choices.py `model_key`).

GROM_LINK_DIR says where links are kept (default `<tmp>/grom-studio-links`; a Space with
persistent storage: under /data, to outlive a restart); their bounds are host limits
(components/server/limits.py).

The page's address is the one gradio gives its own files (`public_root`): the request's,
or behind a proxy its X-Forwarded-Host and X-Forwarded-Proto, under the app's root_path;
a proxy that sends no X-Forwarded-Host is named by its host with GRADIO_ROOT_PATH (a full
URL, such as https://example.org/studio).
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlencode, urlsplit

from components.server.errors import UserError, shorten
from components.server.limits import limit
from grom import Edit
from grom.edit import META_FILE, PATCH_FILE

LINK_PARAM = "run"  # the page's query parameter: <page>?run=<token>
CARD_FILE = "card.html"  # the run's result card as it was when the link was made (compare_panel.keep_card)
MAX_CARD_BYTES = 256 << 10
LINK_FILE = "link.json"  # beside the export's files: {"dtype": the model's, "by": who made it, hashed (owner_of)}
DTYPES = ("float32", "bfloat16", "float16")
TOKEN_CHARS = 32
TOKEN_PATTERN = re.compile(rf"[A-Za-z0-9_-]{{{TOKEN_CHARS}}}")
PARTIAL_PREFIX = ".new-"  # a link being written; never opened, removed when stale
PARTIAL_MAX_AGE_S = 3600

_lock = threading.Lock()  # writes, pruning and removals of links, one at a time


class LinkError(UserError):
    """A link this server cannot open: not a link, unknown, or expired; says what to do."""


def links_root() -> Path:
    """GROM_LINK_DIR, else a folder of the system's temporary folder (outside gradio's)."""
    raw = os.environ.get("GROM_LINK_DIR", "").strip()
    return Path(raw) if raw else Path(tempfile.gettempdir()) / "grom-studio-links"


def kept_for() -> str:
    """How long and how many links this server keeps, in words."""
    days = limit("GROM_LINK_DAYS")
    return (f"{days} day{'s' if days != 1 else ''}, at most {limit('GROM_MAX_LINKS'):,} links and "
            f"{limit('GROM_LINKS_MAX_MB'):,} MB in all, the oldest dropped first")


def age_text(seconds: float) -> str:
    """3 minutes, 5 hours, 2 days."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return "moments"


ASK_AGAIN = ("Ask whoever shared it for a new link (Export tab, Copy link to this run), or for the "
             "exported edit.json (Export tab, Load a run).")


def not_a_link(text) -> LinkError:
    return LinkError(f"{shorten(text) or 'An empty address'} is not a link to a run of this server: a link "
                     f"ends in ?{LINK_PARAM}= and {TOKEN_CHARS} letters, digits, - or _. Copy the whole link again.")


def unknown_link() -> LinkError:
    return LinkError(f"This link to a run is unknown here: it expired or was dropped to make room (this server "
                     f"keeps links for {kept_for()}), or it was made on another server, or before this server's "
                     "links were cleared (a Space's restart clears them without persistent storage). " + ASK_AGAIN)


def token_of(text) -> str:
    """The token in `text`: a bare token, or a page address with ?run=<token>. Anything
    else (a path, `..`, a token of other characters or length) is a `LinkError`, before
    any file is looked at."""
    text = text.strip() if isinstance(text, str) else ""
    token = text
    if "?" in text or "/" in text:
        try:
            values = parse_qs(urlsplit(text).query).get(LINK_PARAM, [])
        except ValueError:
            values = []
        token = values[0].strip() if len(values) == 1 else ""
    if not TOKEN_PATTERN.fullmatch(token):
        raise not_a_link(text)
    return token


def _links(root: Path) -> list[tuple[float, Path]]:
    """(mtime, folder) of every link under `root`, the oldest first: folders named as a
    token, not symbolic links (anything else there is not ours: never read, never removed)."""
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        try:
            if TOKEN_PATTERN.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
                found.append((path.stat().st_mtime, path))
        except OSError:
            continue
    return sorted(found)


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and not f.is_symlink())


def _owner(folder: Path) -> str:
    """Who made the link in `folder` (link.json's "by": a hash of the visitor), "" unknown."""
    path = folder / LINK_FILE
    try:
        by = json.loads(path.read_text()).get("by", "") if path.is_file() and path.stat().st_size < 4096 else ""
    except (OSError, ValueError, AttributeError):
        return ""
    return by if isinstance(by, str) else ""


_SALT = secrets.token_hex(16)  # this process's: an address is never written to disk, nor a guessable hash of it


def owner_of(visitor: str) -> str:
    """A link's "by" for `visitor`: a salted hash (after a restart the same visitor is a new
    owner, whose earlier links still count together under their old one)."""
    return hashlib.sha256(f"{_SALT}:{visitor}".encode()).hexdigest()[:16]


def _prune(root: Path, keep: Path | None = None) -> None:
    """Drop expired links and stale partial ones, then, while more than GROM_MAX_LINKS links
    or GROM_LINKS_MAX_MB remain, the oldest link of whoever holds the most of what is over
    (links for the count, bytes for the size; a tie: the maker of `keep`, the newest): one
    visitor's many links push out its own, never another visitor's while it holds more than
    they do (issue 45, item 5: 21 large links of one visitor pushed out every other link).
    Never `keep`. Call with `_lock` held."""
    now = time.time()
    max_age = limit("GROM_LINK_DAYS") * 86400
    for path in root.glob(f"{PARTIAL_PREFIX}*"):
        if path.is_dir() and not path.is_symlink() and now - path.stat().st_mtime > PARTIAL_MAX_AGE_S:
            shutil.rmtree(path, ignore_errors=True)
    kept = []  # (folder, bytes, owner), the oldest first
    for mtime, folder in _links(root):
        if now - mtime > max_age and folder != keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            kept.append((folder, _bytes(folder), _owner(folder)))
    most_links, max_bytes = limit("GROM_MAX_LINKS"), limit("GROM_LINKS_MAX_MB") << 20
    while len(kept) > most_links or sum(size for _, size, _ in kept) > max_bytes:
        by_size = sum(size for _, size, _ in kept) > max_bytes
        held = collections.Counter()
        for _, size, owner in kept:
            held[owner] += size if by_size else 1
        asker = next((owner for folder, _, owner in kept if folder == keep), None)
        owners = sorted(held, key=lambda o: (-held[o], o != asker))  # a tie: the newest link's maker pays
        victim = next((k for owner in owners for k in kept if k[2] == owner and k[0] != keep), None)
        if victim is None:
            break
        shutil.rmtree(victim[0], ignore_errors=True)
        kept.remove(victim)


def stored_form(edit: Edit) -> str:
    """How a link stores `edit`: "patches" (patch.safetensors as held: full patches bit for
    bit, an edit loaded from factors as its factors) where that is at most
    GROM_MAX_PATCH_MB; else "settings" (edit.json alone: computed again when opened) for
    a GROM edit; another method's edit over the bound cannot be linked (a `UserError`)."""
    size = edit.held.nbytes()
    if size <= limit("GROM_MAX_PATCH_MB") << 20:
        return "patches"
    if edit.method == "grom" and not edit.stored_ranks:
        return "settings"
    raise UserError(f"This edit's patches take {size / 2**20:,.1f} MB, more than a link keeps (GROM_MAX_PATCH_MB: "
                    f"{limit('GROM_MAX_PATCH_MB')} MB), and only a GROM edit can be computed again from its "
                    "settings: press Export the edit and share its two files instead.")


def store(edit: Edit, dtype: str = "", visitor: str = "", card: str = "") -> str:
    """A new link to `edit` (made on a model in `dtype`; "": not known) by `visitor`: its
    files (`stored_form`) written into a fresh folder, which becomes the link, named by a
    new token, only once complete; then the links are bounded (`_prune`: the largest
    holder's go first). Returns the token. A link larger than GROM_LINKS_MAX_MB alone is
    refused. `card`: the run's result card (HTML this app made), kept beside it where it
    is at most MAX_CARD_BYTES, so that the link opens with it."""
    root = links_root()
    root.mkdir(parents=True, exist_ok=True)
    form = stored_form(edit)
    partial = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=root))
    try:
        if form == "patches":
            edit.save(partial, factored=bool(edit.stored_ranks))  # full: bit for bit; factors stay factors
        else:
            (partial / META_FILE).write_text(json.dumps(edit.metadata(), indent=2))
        if card and len(card.encode()) <= MAX_CARD_BYTES:
            (partial / CARD_FILE).write_text(card)
        (partial / LINK_FILE).write_text(json.dumps({"dtype": dtype if dtype in DTYPES else "",
                                                     "by": owner_of(visitor)}))
        size = _bytes(partial)
        if size > limit("GROM_LINKS_MAX_MB") << 20:
            raise UserError(f"This link would take {size / 2**20:,.1f} MB, more than this server keeps for all its "
                            f"links (at most {limit('GROM_LINKS_MAX_MB'):,} MB). Press Export the edit and "
                            "share its files instead, or, hosting the studio yourself, raise GROM_LINKS_MAX_MB.")
        with _lock:
            token = secrets.token_urlsafe(TOKEN_CHARS * 3 // 4)
            folder = root / token
            partial.rename(folder)
            now = time.time()
            os.utime(folder, (now, now))  # its age counts from now
            _prune(root, keep=folder)
        return token
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


@dataclass(frozen=True)
class Link:
    """An opened link: its files (copied out of the store, so that pruning cannot take
    them away mid-read) and its age."""
    token: str
    meta_file: Path
    patch_file: Path | None  # None: stored by its settings, computed again
    age_s: float
    dtype: str = ""  # the model's, where the link records it
    card: str = ""  # the run's result card when the link was made, where it was kept
    made: float = 0.0  # when the link was made (time.time())


def _find(token: str) -> tuple[Path, float]:
    """(folder, age in seconds) of the link `token`; an expired one is removed and said so.
    Call with `_lock` held."""
    folder = links_root() / token
    if folder.is_symlink() or not folder.is_dir() or not (folder / META_FILE).is_file():
        raise unknown_link()
    age = time.time() - folder.stat().st_mtime
    days = limit("GROM_LINK_DAYS")
    if age > days * 86400:
        shutil.rmtree(folder, ignore_errors=True)
        raise LinkError(f"This link to a run has expired: it was made {age_text(age)} ago, and this server "
                        f"keeps links for {days} day{'s' if days != 1 else ''}. " + ASK_AGAIN)
    return folder, age


def exists(token: str) -> bool:
    """Whether the link `token` opens now."""
    try:
        with _lock:
            _find(token_of(token))
        return True
    except LinkError:
        return False


@contextmanager
def opened(text) -> Iterator[Link]:
    """The link in `text` (a token or a page address with one), its files copied into a
    private temporary folder for the block; a `LinkError` that says why it does not open
    (not a link, unknown, expired)."""
    token = token_of(text)
    with tempfile.TemporaryDirectory(prefix="grom-link-") as tmp:
        with _lock:
            folder, age = _find(token)
            for name in (META_FILE, PATCH_FILE, LINK_FILE, CARD_FILE):
                source = folder / name
                if source.is_file() and not source.is_symlink():
                    shutil.copyfile(source, Path(tmp) / name)
        patch = Path(tmp) / PATCH_FILE
        yield Link(token, Path(tmp) / META_FILE, patch if patch.is_file() else None, age, _dtype(Path(tmp) / LINK_FILE),
                   _card(Path(tmp) / CARD_FILE), time.time() - age)


def _card(path: Path) -> str:
    """The card a link keeps, else "" (none, or larger than any the app writes)."""
    try:
        return path.read_text() if path.stat().st_size <= MAX_CARD_BYTES else ""
    except (OSError, UnicodeDecodeError):
        return ""


def _dtype(path: Path) -> str:
    """The dtype link.json records, else ""."""
    try:
        dtype = json.loads(path.read_text()).get("dtype", "") if path.stat().st_size < 4096 else ""
    except (OSError, ValueError, AttributeError):
        return ""
    return dtype if dtype in DTYPES else ""


def public_root(request) -> str:
    """The page's public address without a trailing slash, as gradio computes the address
    of its own files (`gradio.route_utils.get_root_url`): the request's (an event's is the
    queue's join request, under the page), or behind a proxy its X-Forwarded-Host and
    X-Forwarded-Proto; under the app's root_path, or GRADIO_ROOT_PATH where that is a full
    URL. "" without a request."""
    from gradio import route_utils

    req = getattr(request, "request", None) if request is not None else None
    if req is None:
        return ""
    app = req.scope.get("app")
    root_path = getattr(app, "root_path", "") or req.scope.get("root_path", "") or ""
    try:
        route = route_utils.get_api_call_path(req)
    except ValueError:  # not an event's request: its own path is the page's
        route = req.url.path
    return route_utils.get_root_url(req, route, root_path)


def page_url(request, token: str) -> str:
    """The address that opens the link `token`: the page's (`public_root`) with ?run=<token>."""
    root = public_root(request)
    return f"{root}/?{urlencode({LINK_PARAM: token})}" if root else f"?{urlencode({LINK_PARAM: token})}"
