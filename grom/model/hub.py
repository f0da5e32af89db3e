"""Is the Hugging Face Hub there? Offline mode as asked (HF_HUB_OFFLINE and its kin) and a
quick, cached TCP probe, so that no network fails in a second instead of after retries.
Below both the model loading and the data readers.

(Was in `grom/data/readers.py`.)
"""
from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlparse

_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Whether offline mode is asked for now (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, ...)."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(n, "").upper() in _TRUE for n in names)


_probe: dict[str, tuple[float, bool]] = {}


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face Hub answers a TCP connection (cached for a minute), so that
    no network fails in a second instead of after retries."""
    if hub_offline():
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    now = time.monotonic()
    if host in _probe and now - _probe[host][0] < 60:
        return _probe[host][1]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        ok = True
    except OSError:
        ok = False
    _probe[host] = (now, ok)
    return ok
