"""The layer scores S_l of the unedited model, computed on the device and cached per model."""
from __future__ import annotations

from components.server.device import DEVICE_LOCK, device_progress, give_turn, on_device
from components.server.durations import scores_s
from components.server.flights import shared
from components.server.session import ModelKey, resident
from components.studio import cards
from grom.closed_form.pipeline import prepare
from grom.closed_form.pipeline import score_prepared as score
from grom.model.arch import unembedding


@on_device(duration=scores_s)
def compute_scores(key: ModelKey, forget, retain, config, progress):
    with DEVICE_LOCK:
        handle = resident(key, "scores")
        vocab = unembedding(handle.model).shape[0]
        prep = prepare(handle.tokenizer, forget, retain, config, vocab)
        return score(handle.model, prep, config, progress, between=give_turn)  # a visitor goes between batches


SCORES_CACHE_SIZE = 16


def cached_scores(handle, forget, retain, config, progress):
    """The layer scores of the unedited model, once per (forget, retain, config) and model:
    every new page of the demo, and every visitor of a Space, asks for the same ones. The
    cache lives in this process (on ZeroGPU, `compute_scores` runs in another one), and on
    disk (`cards.keep_object`), keyed by the weights, so that a restart does not lose it.
    Pages that ask at once compute them once (`flights.shared`): the others wait and read."""
    key = (tuple(forget), tuple(retain), config)  # examples and configs are frozen dataclasses

    def compute():
        if len(handle.scores_cache) >= SCORES_CACHE_SIZE:
            handle.scores_cache.pop(next(iter(handle.scores_cache)))  # the oldest
        # kept on disk too, by the weights and the data: a restarted server's first page has them at once
        weights = cards.fingerprint_of(handle)
        disk = cards.object_key("layer-scores", weights, handle.key.dtype, *map(repr, key)) if weights else None
        scores = cards.find_object("layer-scores", disk) if disk else None
        if scores is None:
            scores = compute_scores(handle.key, forget, retain, config,
                                    device_progress(lambda f: progress(f, desc="logit lens over the keys")))
            if disk:
                cards.keep_object("layer-scores", disk, scores)
        handle.scores_cache[key] = scores
        return scores
    return shared(("layer scores", id(handle), key), lambda: handle.scores_cache.get(key), compute,
                  "the layer scores")
