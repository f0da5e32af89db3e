"""A GROM edit for a session, on the device: the compute function, the warm-up of the
stream entering the band, and the cache key of the layer scores an edit may reuse.

On ZeroGPU the stream cache is not used and the warm-up is skipped: both would fill a
cache in a GPU worker that the next call may not share (`kept_cache`), spending GPU time
on every page for nothing. The edit is the same, its first forward pass just not saved."""
from __future__ import annotations

import logging

from components.server.device import DEVICE_LOCK, ON_ZEROGPU, give_turn, kept_cache, on_device
from components.server.durations import edit_s
from components.server.session import REGISTRY, ModelKey, Session, current_benchmark, current_model, resident
from components.server.validate import retain_subset
from grom import EditConfig, best_window, run_edit
from grom.closed_form.pipeline import warm_stream

STREAM_CACHE_ENTRIES = 4  # hidden states entering a band kept per model (~20 MB each for SmolLM2's page)


def scores_key(session: Session, matrix: str, use_alpha: bool, n_retain, key_positions: str = "answer") -> tuple:
    """What a session's layer scores were computed for: S_l reads the forget keys, so where
    they are is part of it."""
    return (session.model_key, id(session.benchmark), matrix, bool(use_alpha), n_retain, key_positions)


@on_device(duration=edit_s)
def compute_edit(key: ModelKey, forget, retain, config, scores, progress):
    """The Edit (CPU patches) of `config` on the resident model `key`; a visitor's job
    waiting goes between its forward batches and layers (`give_turn`)."""
    with DEVICE_LOCK:
        handle = resident(key, "edit")
        cache = kept_cache(handle.stream_cache)
        edit = run_edit(handle.model, handle.tokenizer, forget, retain, config,
                        progress=progress, scores=scores, stream_cache=cache, between=give_turn)
        trim_stream_cache(cache)
        return edit


def trim_stream_cache(cache: dict | None) -> None:
    """Keep the newest STREAM_CACHE_ENTRIES bands' streams (dicts keep their order)."""
    while cache is not None and len(cache) > STREAM_CACHE_ENTRIES:
        cache.pop(next(iter(cache)))


@on_device
def _warm(key: ModelKey, forget, retain, config, band) -> None:
    with DEVICE_LOCK:
        handle = REGISTRY.get(key)
        if handle is not None:
            warm_stream(handle.model, handle.tokenizer, forget, retain, config, band, handle.stream_cache,
                        between=give_turn)


def warm_edit(k: int, retain_examples: int, seed: int, session: Session) -> list[int] | None:
    """The forward pass up to the suggested band, ahead of the first Run edit (the page's
    defaults; any other choice just misses the cache). Returns that band (None without
    layer scores; None on ZeroGPU, where the stream would stay in a worker). Silent on
    any problem."""
    if ON_ZEROGPU:
        return None
    try:
        handle, bench = current_model(session), current_benchmark(session)
        if session.scores is None:
            return None
        band = list(best_window(session.scores.S, int(k)))
        retain = retain_subset(bench.retain, retain_examples, int(seed or 0))
        _warm(handle.key, bench.forget, retain,
              EditConfig(prompt_format=bench.prompt_format, seed=int(seed or 0)), band)
        return band
    except Exception as err:  # noqa: BLE001  (a warm-up: Run edit reports real problems)
        logging.getLogger(__name__).info("stream not precomputed: %s", err)
        return None
