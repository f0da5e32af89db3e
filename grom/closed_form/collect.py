"""Running the model over key batches: the forward passes GROM needs, each done once.

Two ways to get a layer's keys:

- `collect_keys`: run the model from the start with a hook on the matrix, stopping right
  after it (used for the LM head, and as the reference path);
- `LayerStream`: run the model once up to the first layer of the band, keep the hidden
  states entering it (and the arguments the model passes the band's layers: one call per
  layer kind, since sliding-window and full-attention layers get different masks), then
  advance one decoder layer at a time. Where a matrix's output reaches the residual
  stream linearly (`grom.model.arch.residual_gain`: down_proj in most families), a layer's
  patch moves the next layer's input by exactly ``g P x``, so the stream advances without
  re-running the layer; elsewhere it re-runs the layer as patched.

(Was `grom/collect.py`.)
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from grom.data.encoding import Batch
from grom.model.arch import model_device
from grom.model.hooks import StopForward, capture_inputs, drop_frames, hooked, stop_after
from grom.turns import Between, give

# Above this many bytes of cached matrix inputs, the stream re-runs layers instead.
MAX_INPUT_CACHE_BYTES = 4 << 30
# The hidden states (and call arguments) entering the band kept per batch, at most this
# many bytes by default; batches beyond are replayed from the embeddings at each layer.
HIDDEN_CACHE_BYTES = 8 << 30


@dataclass
class Keys:
    """Keys of one matrix: X (n, s) float32, with each column's gold token and example."""

    X: torch.Tensor
    gold: torch.Tensor
    example: torch.Tensor

    @classmethod
    def concat(cls, parts: list[torch.Tensor], batches: Sequence[Batch], device) -> "Keys":
        X = torch.cat([p.to(device, torch.float32) for p in parts]).T
        gold = torch.cat([b.gold for b in batches])
        example = torch.cat([b.example for b in batches])
        return cls(X, gold, example)


def forward(model: nn.Module, batch: Batch):
    dev = model_device(model)
    return model(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
                 use_cache=False)


def collect_keys(model: nn.Module, batches: Sequence[Batch], module: nn.Module, device,
                 progress: Callable[[float], None] | None = None) -> Keys:
    """Inputs of `module` at every batch's key positions, by full forward passes."""
    parts: list[torch.Tensor] = []
    with torch.no_grad():
        for i, batch in enumerate(batches):
            with capture_inputs(module, batch.select) as got, stop_after(module):
                forward(model, batch)
            parts.extend(got)
            if progress:
                progress((i + 1) / len(batches))
    return Keys.concat(parts, batches, device)


def _call_sources(kinds: Sequence, first: int, last: int) -> dict[int, int]:
    """Layer l in first..last -> the first layer from `first` on with l's kind, whose call
    arguments l reuses."""
    seen: dict = {}
    return {l: seen.setdefault(kinds[l], l) for l in range(first, last + 1)}


def _capture_layer_calls(model: nn.Module, layers: nn.ModuleList, wanted: Sequence[int],
                         batch: Batch) -> dict[int, tuple]:
    """The (args, kwargs) the model passes each layer of `wanted` for this batch; the
    forward pass stops before the last of them runs."""
    calls: dict[int, tuple] = {}
    stop = max(wanted)

    def hook_for(j: int):
        def hook(_module, args, kwargs):
            calls[j] = (args, dict(kwargs))
            if j == stop:
                raise StopForward
        return hook

    try:
        with ExitStack() as stack:
            for j in wanted:
                stack.enter_context(hooked(layers[j], hook_for(j), pre=True, with_kwargs=True))
            forward(model, batch)
    except StopForward as stopped:
        drop_frames(stopped)
    return calls


def _split_hidden(call: tuple) -> tuple[torch.Tensor, tuple]:
    """(args, kwargs) of a layer call -> (hidden states, (other args, other kwargs))."""
    args, kwargs = call
    hidden = args[0] if args else kwargs.pop("hidden_states")
    return hidden, (args[1:], kwargs)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def iter_keys(model: nn.Module, batches: Sequence[Batch], module: nn.Module,
              only: Sequence[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """(i, inputs of `module` at batch i's key positions, (k_i, n)) for every batch (or
    those of `only`), one full forward pass each, stopping right after the module."""
    with torch.no_grad():
        for i in (range(len(batches)) if only is None else only):
            with capture_inputs(module, batches[i].select) as got, stop_after(module):
                forward(model, batches[i])
            yield i, got[0]


def _tensor_bytes(x) -> int:
    """Bytes of the tensors in a nest of tuples, lists and dicts."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_tensor_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_tensor_bytes(v) for v in x.values())
    return 0


class LayerStream:
    """The residual stream of every batch, entering one decoder layer at a time, from
    layer `first` up to `last`.

    kinds: per decoder layer, a label (`grom.model.arch.layer_kinds`; None: one for all); the
    model's call arguments are captured once per label met in first..last and reused for
    every layer with that label.

    budget: at most this many bytes of hidden states and call arguments are kept (None: no
    bound); the batches beyond it keep nothing and are replayed from the embeddings at
    each layer, by a forward pass of the model as it then is (edited up to the current
    layer), which gives the states the stream would hold: the keys are the same, up to the
    rounding of the shortcut `advance_linear` takes for the kept batches.

    between: a step boundary (`grom.turns`) between two batches' forward passes (its
    as_found the caller's; `advance` takes one too). The stream is the caller's own: another
    job using the model there changes none of it.
    """

    def __init__(self, model: nn.Module, layers: nn.ModuleList, first: int,
                 batches: Sequence[Batch], last: int | None = None, kinds: Sequence | None = None,
                 budget: int | None = None, between: Between | None = None):
        kinds = kinds if kinds is not None else [None] * len(layers)
        self.source = _call_sources(kinds, first, first if last is None else last)
        self.model, self.layers, self.batches, self.at = model, layers, list(batches), first
        self.hidden, self.calls = [], []
        wanted, held = sorted(set(self.source.values())), 0
        with torch.no_grad():
            for b, batch in enumerate(self.batches):
                if b:
                    give(between)
                parts = {j: _split_hidden(c)
                         for j, c in _capture_layer_calls(model, layers, wanted, batch).items()}
                calls = {j: rest for j, (_, rest) in parts.items()}
                held += _tensor_bytes(parts[first][0]) + _tensor_bytes(calls)
                fits = budget is None or held <= budget
                self.hidden.append(parts[first][0] if fits else None)
                self.calls.append(calls if fits else None)
        self._outs: dict = {}
        self._inputs: dict = {}

    @property
    def replayed(self) -> int:
        """How many batches are replayed rather than kept."""
        return sum(h is None for h in self.hidden)

    def start(self) -> tuple:
        """The stream as it enters its first layer (what the forward pass up to it gave),
        to `resume` later without that pass: valid while the layers before it are unchanged."""
        return (self.at, dict(self.source), list(self.hidden), list(self.calls))

    @classmethod
    def resume(cls, model: nn.Module, layers: nn.ModuleList, batches: Sequence[Batch],
               start: tuple) -> "LayerStream":
        """A stream from `start()` of one over the same batches (its tensors are shared,
        never written: every step makes new ones)."""
        stream = cls.__new__(cls)
        stream.at, source, hidden, calls = start
        stream.source, stream.hidden, stream.calls = dict(source), list(hidden), list(calls)
        stream.model, stream.layers, stream.batches = model, layers, list(batches)
        stream._outs, stream._inputs = {}, {}
        return stream

    def _run(self, i: int, layer: nn.Module):
        if self.hidden[i] is None:  # replayed: the states entering this layer, from the start
            call = _capture_layer_calls(self.model, self.layers, [self.at], self.batches[i])[self.at]
            hidden, (rest, kwargs) = _split_hidden(call)
            return _first(layer(hidden, *rest, **kwargs))
        rest, kwargs = self.calls[i][self.source[self.at]]
        return _first(layer(self.hidden[i], *rest, **kwargs))

    def key_batches(self, matrix: nn.Module, keep_inputs: bool = False,
                    only: Sequence[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(i, inputs of `matrix` (inside the current layer) at batch i's key positions,
        (k_i, n)) for every batch, or those of `only`. With keep_inputs, also keep the
        layer outputs and the matrix's full inputs of the kept batches, so that
        `advance_linear` can be used."""
        self._outs, self._inputs = {}, {}
        layer = self.layers[self.at]
        with torch.no_grad():
            for i in (range(len(self.batches)) if only is None else only):
                keep = keep_inputs and self.hidden[i] is not None

                def select(x, batch=self.batches[i], i=i, keep=keep):
                    if keep:
                        self._inputs[i] = x
                    return batch.select(x)

                with capture_inputs(matrix, select) as got:
                    if keep:
                        self._outs[i] = self._run(i, layer)
                    else:
                        with stop_after(matrix):
                            self._run(i, layer)
                yield i, got[0]

    def advance_linear(self, P: torch.Tensor, gain: float = 1.0) -> None:
        """Next layer's input = unpatched output + gain * P x, for a matrix whose output
        reaches the residual stream scaled by `gain` and nothing else
        (`grom.model.arch.residual_gain`); P is (m, n) in the math layout. Replayed batches
        need nothing: their next pass runs the patched model."""
        gP = P * gain
        for i, h in enumerate(self.hidden):  # batch by batch, each batch's old state freed as it goes
            if h is not None:
                out, x = self._outs.pop(i), self._inputs.pop(i)
                self.hidden[i] = out + nn.functional.linear(x, gP.to(h.device, h.dtype))
        self._outs, self._inputs = {}, {}
        self.at += 1

    def advance(self, between: Between | None = None) -> None:
        """Next layer's input by running the current layer as the model now is (`between`
        between two batches)."""
        layer = self.layers[self.at]
        self._outs, self._inputs = {}, {}
        with torch.no_grad():
            for i, h in enumerate(self.hidden):  # in place, batch by batch: the old states are freed
                if h is not None:               # as the new ones come (a new list held both at once)
                    if i:
                        give(between)
                    self.hidden[i] = self._run(i, layer)
        self.at += 1

    def input_cache_bytes(self, n: int) -> int:
        """Bytes that keeping every kept batch's full matrix inputs (width n) would take."""
        return sum(h.shape[0] * h.shape[1] * n * h.element_size() for h in self.hidden if h is not None)
