"""Result cards kept on disk, so that a page opens with its card already there.

A card states what one edit did on one benchmark split: the same model weights, data,
settings and evaluation size always give the same card (greedy answers, a seeded retain
sample). So the card of a run is written here once it is whole, under a key made of all
of those (`card_key`), and a page whose form holds the same request shows it at once,
marked as computed ahead (`shown`), before any device work; the server's warm-up computes
the start page's card where none is kept (components/page.py). A restarted or woken
server thus gives its first visitor the card a warm one gives.

Where: GROM_CARD_DIR (default `~/.cache/grom/cards`; on a Space with persistent storage,
a folder under /data), then the cards shipped with the app (assets/cards, read only: used
where the host's weights are bit for bit the ones they were computed on). At most
GROM_MAX_CARDS files, the least recently written go first (GROM_BUNDLED_CARDS=0: the
shipped ones are not read). A card is HTML this app made
from its own evaluation, never a visitor's upload; it is read only from these folders.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from components.server.device import DEVICE_LOCK
from components.server.limits import limit
from grom.model.fingerprint import weights_fingerprint as fingerprint

log = logging.getLogger(__name__)
CARD_VERSION = 2  # bumped when the card's words or its evaluation change: older cards are not shown
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "assets" / "cards"
_FINGERPRINTS: dict[int, tuple[weakref.ref, str]] = {}
"""id(model) -> (a weak reference to the model, its fingerprint): an unloaded model is not kept
alive by it, and a new model at the same id is not taken for it."""
_DIGESTS: OrderedDict = OrderedDict()  # id(benchmark) -> (benchmark, digest)
_lock = threading.Lock()


@dataclass(frozen=True)
class StoredCard:
    """A card read back: its HTML, when and on what it was computed, and its key."""
    html: str
    made: float
    device: str
    key: str


def cards_root() -> Path:
    """GROM_CARD_DIR, else ~/.cache/grom/cards."""
    raw = os.environ.get("GROM_CARD_DIR", "").strip()
    return Path(raw) if raw else Path.home() / ".cache" / "grom" / "cards"


def weights_fingerprint(model) -> str:
    """`grom.model.fingerprint.weights_fingerprint` of the model, cached per model (call it
    with the device lock held, where an edit may be applied for a while: the app's base model
    is never left edited, so the first reading holds)."""
    hit = _FINGERPRINTS.get(id(model))
    if hit is not None and hit[0]() is model:
        return hit[1]
    fp = fingerprint(model)
    for k in [k for k, (ref, _) in list(_FINGERPRINTS.items()) if ref() is None]:
        _FINGERPRINTS.pop(k, None)  # models since unloaded
    _FINGERPRINTS[id(model)] = (weakref.ref(model), fp)
    return fp


def known_fingerprint(model) -> str | None:
    """The fingerprint already computed for `model`, else None (never computes it)."""
    hit = _FINGERPRINTS.get(id(model))
    return hit[1] if hit is not None and hit[0]() is model else None


def data_digest(bench) -> str:
    """A digest of a benchmark's examples (its forget, retain and evaluation sets)."""
    with _lock:
        hit = _DIGESTS.get(id(bench))
        if hit is not None and hit[0] is bench:
            return hit[1]
    sets = {"forget": bench.forget, "retain": bench.retain, **(bench.eval_sets or {})}
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(sets):
        h.update(f"{name}:{len(sets[name])}:".encode())
        for ex in sets[name]:
            h.update(repr(ex).encode())
    digest = h.hexdigest()
    with _lock:
        _DIGESTS[id(bench)] = (bench, digest)
        while len(_DIGESTS) > 32:
            _DIGESTS.popitem(last=False)
    return digest


def card_key(fingerprint: str, dtype: str, bench, config: dict, run: dict, n) -> str:
    """The key of a card: the weights (`weights_fingerprint`) and their dtype, the benchmark
    and its data, the EditConfig (as a dict), what of the run reproduces the edit besides it
    (retain sample, seed, band choice) and the examples per evaluation set (None: all)."""
    what = {"version": CARD_VERSION, "weights": fingerprint, "dtype": dtype, "benchmark": bench.name,
            "split": bench.split, "data": data_digest(bench), "config": config, "n": n,
            "run": {k: run.get(k) for k in ("retain_examples", "n_retain", "seed", "band_mode", "k")}}
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def config_of(config: dict, run: dict) -> dict:
    """The EditConfig's fields (as a dict) that decide a card: the band only where it was
    chosen by hand (a suggested band follows from the weights, the data and k, in the key)."""
    out = dict(config)
    if run.get("band_mode") != "manual":
        out.pop("layers", None)
    return out


def _path(root: Path, key: str) -> Path:
    if len(key) != 32 or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"not a card key: {key!r}")
    return root / f"{key}.json"


def keep(key: str, html: str, device: str) -> None:
    """Write the card `html` under `key` (atomically; the oldest beyond GROM_MAX_CARDS go).
    Silent on a folder that cannot be written: a card kept is a courtesy."""
    root = cards_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"version": CARD_VERSION, "key": key, "made": time.time(), "device": device,
                           "html": html})
        fd, tmp = tempfile.mkstemp(prefix=".card-", dir=root)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, _path(root, key))
        _prune(root)
    except OSError as err:
        log.info("card not kept in %s: %s", root, err)


def _prune(root: Path) -> None:
    cards = sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in cards[:max(0, len(cards) - limit("GROM_MAX_CARDS"))]:
        old.unlink(missing_ok=True)


def find(key: str) -> StoredCard | None:
    """The card kept under `key` (the host's folder first, then the app's own), else None."""
    bundled = (BUNDLED_DIR,) if os.environ.get("GROM_BUNDLED_CARDS", "1") != "0" else ()
    for root in (cards_root(), *bundled):
        try:
            path = _path(root, key)
            if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("version") == CARD_VERSION and data.get("key") == key and isinstance(data.get("html"), str):
            return StoredCard(data["html"], float(data.get("made", 0)), str(data.get("device", "")), key)
    return None


STALE = ('<div class="result-card rc-from-store"><div class="rc-stored">No card is kept for these settings: '
         "press <b>Run edit</b> to compute it (the card shown before was for the settings the page opened "
         "with).</div></div>")


def shown_key(html) -> str | None:
    """The key of the kept card `html` shows (`shown`), else None (a card of this visit, or none)."""
    text = html if isinstance(html, str) else ""
    start = text.find('data-card-key="')
    return text[start + 15:start + 47] if start >= 0 and "rc-from-store" in text else None


def device_words(device: str) -> str:
    """A card's device as the page names it: "a CPU", "a GPU" (cuda, cuda:1), else as it is."""
    kind = (device or "").split(":", 1)[0]
    return {"cpu": "a CPU", "cuda": "a GPU", "mps": "an Apple GPU", "": "this server"}.get(kind, device)


def shown(card: StoredCard, how: str = "computed ahead") -> str:
    """The kept card as the page shows it: marked, under its headline (which stays on the
    first screen), as not computed for this visit, with when."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(card.made)) if card.made else "earlier"
    where = device_words(card.device)
    note = (f'<div class="rc-stored" data-card-key="{card.key}">This card was {how} ({when}, on {where}) for the '
            "model, data and settings shown: the same request always gives it. Press <b>Run edit</b> to "
            "compute it again live, or change a setting first.</div>")
    html = card.html
    if not html.startswith('<div class="result-card'):
        return note + html
    html = html.replace('<div class="result-card', '<div class="result-card rc-from-store', 1)
    head = html.find('<div class="rc-head">')
    end = html.find("</div>", head) + len("</div>") if head >= 0 else -1
    if end < len("</div>"):  # no headline: the note first
        return html.replace('">', '">' + note, 1)
    return html[:end] + note + html[end:]


# ------------------------------------------------------------------ what a card rests on

OBJECT_KINDS = ("base-report", "base-answers", "base-forget", "layer-scores")  # the unedited rows of a comparison
# (every score; the answers alone; the forget side's: what a card reads), the layer scores S_l
MAX_OBJECT_BYTES = 64 << 20


def object_key(kind: str, *parts) -> str:
    """A key for `kind` from `parts` (a weights fingerprint first, then what else decides it)."""
    text = json.dumps([CARD_VERSION, kind, *parts], sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def keep_object(kind: str, key: str, obj) -> None:
    """Keep `obj` (what the unedited model gave: a Report's Base rows, layer scores) on disk
    under `key`, beside the cards, so that a restarted server's first Run edit does not
    compute it again. Written by this app from its own computation only; silent where the
    folder cannot be written or the object is larger than MAX_OBJECT_BYTES."""
    if kind not in OBJECT_KINDS:
        raise ValueError(f"not a kind kept on disk: {kind!r}")
    root = cards_root() / kind
    try:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(body) > MAX_OBJECT_BYTES:
            return
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".obj-", dir=root)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, _path(root, key).with_suffix(".pkl"))
        _prune_objects(root)
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
        log.info("%s not kept in %s: %s", kind, root, err)


def _prune_objects(root: Path) -> None:
    kept = sorted(root.glob("*.pkl"), key=lambda p: p.stat().st_mtime)
    for old in kept[:max(0, len(kept) - limit("GROM_MAX_CARDS"))]:
        old.unlink(missing_ok=True)


def find_object(kind: str, key: str):
    """What `keep_object` kept under `key` in this host's folder, else None (unreadable: None)."""
    try:
        path = _path(cards_root() / kind, key).with_suffix(".pkl")
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_OBJECT_BYTES:
            return None
        with path.open("rb") as f:
            return pickle.load(f)  # noqa: S301  (this app's own folder, written by `keep_object` only)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as err:
        log.info("%s %s not read: %s", kind, key, err)
        return None


def fingerprint_of(handle) -> str | None:
    """The weights' fingerprint of a loaded model (`weights_fingerprint`), read under the
    device lock the first time (another visitor's edit may be applied for a moment); None
    for a handle without a torch model (nothing is then kept on disk for it)."""
    if not isinstance(getattr(handle, "model", None), torch.nn.Module):
        return None
    known = known_fingerprint(handle.model)
    if known is not None:
        return known
    with DEVICE_LOCK:
        return weights_fingerprint(handle.model)
