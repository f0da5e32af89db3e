"""Giving memory back to the operating system after a large piece of work, and reading how
much the process holds.

Freeing a tensor returns its bytes to the allocator, not to the system: glibc keeps freed
heap for reuse (and after a large free it raises its mmap threshold, so later large
buffers come from that heap too), and CUDA's caching allocator keeps freed blocks. A server
that trained a baseline once would otherwise stay at its peak for good.

(Was `grom/memory.py`. (`components/server` has the app's own memory check.))
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import sys
import traceback
from contextlib import contextmanager
from typing import Iterator

import torch

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None where there is none (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Collect unreachable cycles, empty CUDA's cache and trim the C heap, so that what was
    freed leaves the process. Cheap enough to call after every run (tens of ms)."""
    gc.collect()
    if torch.cuda.is_initialized():  # no query of a device that was never used
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@contextmanager
def releasing() -> Iterator[None]:
    """Give back the memory of the work inside when it ends, fails or is cancelled; also a
    decorator (``@releasing()``).

    On an exception the traceback's finished frames are cleared first: they hold the work's
    locals (an optimizer's state, activations, an autograd graph) for as long as the
    exception lives, and a caller may keep it a while (to log it, chain it, show it). The
    traceback keeps its lines, not those locals."""
    try:
        yield
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)
        raise
    finally:
        release_memory()


def resident_bytes() -> int:
    """The process's resident set size in bytes, from /proc (0 where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
