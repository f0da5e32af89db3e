"""A GROM edit for a session, on the device: the compute function, the warm-up of the
stream entering the band, and the cache key of the layer scores an edit may reuse."""
from __future__ import annotations

import logging

from components.core.device import DEVICE_LOCK, on_device
from components.core.session import REGISTRY, ModelKey, Session, current_benchmark, current_model, resident
from components.core.validate import retain_subset
from grom import EditConfig, best_window, run_edit
from grom.pipeline import warm_stream

STREAM_CACHE_ENTRIES = 4  # hidden states entering a band kept per model (~20 MB each for SmolLM2's page)


def scores_key(session: Session, matrix: str, use_alpha: bool, n_retain) -> tuple:
    return (session.model_key, id(session.benchmark), matrix, bool(use_alpha), n_retain)


@on_device
def compute_edit(key: ModelKey, forget, retain, config, scores, progress):
    with DEVICE_LOCK:
        handle = resident(key, "edit")
        edit = run_edit(handle.model, handle.tokenizer, forget, retain, config,
                        progress=progress, scores=scores, stream_cache=handle.stream_cache)
        while len(handle.stream_cache) > STREAM_CACHE_ENTRIES:  # oldest first (dicts keep order)
            handle.stream_cache.pop(next(iter(handle.stream_cache)))
        return edit


@on_device
def _warm(key: ModelKey, forget, retain, config, band) -> None:
    with DEVICE_LOCK:
        handle = REGISTRY.get(key)
        if handle is not None:
            warm_stream(handle.model, handle.tokenizer, forget, retain, config, band, handle.stream_cache)


def warm_edit(k: int, retain_examples: int, seed: int, session: Session) -> list[int] | None:
    """The forward pass up to the suggested band, ahead of the first Run edit (the page's
    defaults; any other choice just misses the cache). Returns that band (None without
    layer scores). Silent on any problem."""
    try:
        handle, bench = current_model(session), current_benchmark(session)
        if session.scores is None:
            return None
        retain = retain_subset(bench.retain, retain_examples, int(seed or 0))
        band = best_window(session.scores.S, int(k))
        _warm(handle.key, bench.forget, retain,
              EditConfig(prompt_format=bench.prompt_format, seed=int(seed or 0)), band)
        return list(band)
    except Exception as err:  # noqa: BLE001  (a warm-up: Run edit reports real problems)
        logging.getLogger(__name__).info("stream not precomputed: %s", err)
        return None
