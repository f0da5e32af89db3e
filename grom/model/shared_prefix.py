"""The tokens every sequence of a pass begins with, run once instead of once per row.

A chat template puts the same opening before every question (SmolLM2's system prompt and
``<|im_start|>user``: 24 tokens of a key sequence's 50-60). Under causal attention those
tokens' states do not depend on what follows them, so a pass over many such sequences
can run the shared opening as one row of its own and each sequence from where it
differs, attending to the opening's keys and values:

- `common_prefix(batches)`: how many tokens every row of right-padded batches shares
  (0: none worth sharing, or left-padded rows);
- `suffix_batch(batch, n)`: the batch without its first n tokens (key positions moved);
- `PrefixKV.of(model, ids)`: the opening's keys and values at every layer (one forward
  pass of one row), and `view()`: a key/value cache object for one pass that gives every
  layer's attention the opening's keys and values before a batch's own, and stores
  nothing, so the same call arguments can run a layer again and again (a layer stream).
  A view records new keys and values for a layer while `recording()` (a stream runs the
  opening's own row through a layer as the model now is, edited or not, then its
  batches read them).

The states are those of the whole sequences up to the rounding of a differently shaped
product (the opening's rows are computed in a batch of one). Only the model's own
key/value cache API is used (`Cache.update`, transformers 5), on full-attention caches;
elsewhere (a sliding window, a cache kind we do not know) `PrefixKV.of` returns None
and the caller runs whole sequences.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import nn

from grom.data.encoding import Batch
from grom.model.arch import model_device

MIN_SHARED = 8  # fewer shared tokens than this are not worth a row of their own


def common_prefix(batches: Sequence[Batch]) -> int:
    """Tokens every row of the right-padded `batches` begins with, leaving each row at
    least one token of its own and every key position after them; 0 where that is under
    `MIN_SHARED` or a row does not start at column 0 (left padding)."""
    rows = []
    limit = None
    for b in batches:
        mask = b.attention_mask
        if mask.shape[1] == 0 or not bool((mask[:, 0] == 1).all()):
            return 0
        lengths = mask.sum(1)
        plain = torch.arange(mask.shape[1], device=mask.device) < lengths[:, None]
        if not bool((mask == plain.to(mask.dtype)).all()):
            return 0  # holes in a row: not plain right padding
        rows += [b.input_ids[r, :int(lengths[r])] for r in range(b.input_ids.shape[0])]
        if len(b.cols):
            limit = int(b.cols.min()) if limit is None else min(limit, int(b.cols.min()))
    if not rows:
        return 0
    n = min(len(r) for r in rows) - 1
    if limit is not None:
        n = min(n, limit)
    first = rows[0]
    for r in rows[1:]:
        if n <= 0:
            break
        same = (r[:n] == first[:n]).tolist()
        n = same.index(False) if False in same else n
    return n if n >= MIN_SHARED else 0


def suffix_batch(batch: Batch, n: int) -> Batch:
    """`batch` without its first n tokens, its key positions moved with them."""
    return Batch(batch.input_ids[:, n:], batch.attention_mask[:, n:], batch.rows, batch.cols - n,
                 batch.gold, batch.example)


def cache_kwarg(model: nn.Module) -> str:
    """The name the model's forward gives its key/value cache (transformers 5.2x renamed
    `past_key_values` to `cache`)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_VIEW_CLASSES: dict[type, type] = {}


def _view_class(base: type) -> type:
    """`base` (the model's cache class) whose `update` prepends the opening and stores nothing."""
    if base not in _VIEW_CLASSES:
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if self._grom_recording:
                self._grom_own[layer_idx] = (key_states, value_states)
                return key_states, value_states
            k, v = self._grom_own.get(layer_idx) or (self.layers[layer_idx].keys, self.layers[layer_idx].values)
            b = key_states.shape[0]
            return (torch.cat([k.expand(b, *k.shape[1:]).to(key_states.dtype), key_states], -2),
                    torch.cat([v.expand(b, *v.shape[1:]).to(value_states.dtype), value_states], -2))

        _VIEW_CLASSES[base] = type(f"Shared{base.__name__}", (base,), {"update": update, "_grom_shared": True})
    return _VIEW_CLASSES[base]


def is_view(x) -> bool:
    return bool(getattr(type(x), "_grom_shared", False))


class PrefixKV:
    """The opening `ids`' keys and values at every layer of `model` as it was when made
    (`of`); `view()` gives each pass its own cache object over them."""

    def __init__(self, ids: torch.Tensor, cache, kwarg: str):
        self.ids, self._cache, self.kwarg = ids, cache, kwarg

    def __len__(self) -> int:
        return int(self.ids.shape[-1])

    @classmethod
    @torch.no_grad()
    def of(cls, model: nn.Module, ids: torch.Tensor) -> "PrefixKV | None":
        """One forward pass of the opening (1, n); None where the model's cache is not
        one this sharing knows (a sliding window, layers without plain keys and values)."""
        kwarg = cache_kwarg(model)
        ids = ids.reshape(1, -1)
        base = model.base_model
        out = base(input_ids=ids.to(model_device(model)), use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        layers = getattr(cache, "layers", None)
        if cache is None or not layers or any(getattr(s, "is_sliding", False) for s in layers) \
                or any(tuple(getattr(getattr(s, "keys", None), "shape", (0,))[-2:-1]) != (ids.shape[1],)
                       for s in layers):
            return None
        return cls(ids, cache, kwarg)

    def view(self):
        """A cache object for one pass (module docstring): the opening before every batch."""
        v = copy.copy(self._cache)
        v.__class__ = _view_class(type(self._cache))
        v._grom_own, v._grom_recording = {}, False
        return v


@contextmanager
def recording(view):
    """While inside, `view` keeps the keys and values a layer writes (one layer run on the
    opening's own row) instead of prepending the opening."""
    view._grom_recording = True
    try:
        yield view
    finally:
        view._grom_recording = False
