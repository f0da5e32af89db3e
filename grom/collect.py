"""Running the model over key batches: the forward passes GROM needs, each done once.

Two ways to get a layer's keys:

- `collect_keys`: run the model from the start with a hook on the matrix, stopping right
  after it (used for the LM head, and as the reference path);
- `LayerStream`: run the model once up to the first layer of the band, keep the hidden
  states entering it (and the arguments the model passes the band's layers: one call per
  layer kind, since sliding-window and full-attention layers get different masks), then
  advance one decoder layer at a time. Where a matrix's output reaches the residual
  stream linearly (`grom.arch.residual_gain`: down_proj in most families), a layer's
  patch moves the next layer's input by exactly ``g P x``, so the stream advances without
  re-running the layer; elsewhere it re-runs the layer as patched.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from grom.arch import model_device
from grom.hooks import StopForward, capture_inputs, hooked, stop_after
from grom.keys import Batch

# Above this many bytes of cached matrix inputs, the stream re-runs layers instead.
MAX_INPUT_CACHE_BYTES = 4 << 30


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
    except StopForward:
        pass
    return calls


def _split_hidden(call: tuple) -> tuple[torch.Tensor, tuple]:
    """(args, kwargs) of a layer call -> (hidden states, (other args, other kwargs))."""
    args, kwargs = call
    hidden = args[0] if args else kwargs.pop("hidden_states")
    return hidden, (args[1:], kwargs)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class LayerStream:
    """The residual stream of every batch, entering one decoder layer at a time, from
    layer `first` up to `last`.

    kinds: per decoder layer, a label (`grom.arch.layer_kinds`; None: one for all); the
    model's call arguments are captured once per label met in first..last and reused for
    every layer with that label.
    """

    def __init__(self, model: nn.Module, layers: nn.ModuleList, first: int,
                 batches: Sequence[Batch], last: int | None = None, kinds: Sequence | None = None):
        kinds = kinds if kinds is not None else [None] * len(layers)
        self.source = _call_sources(kinds, first, first if last is None else last)
        self.layers, self.batches, self.at = layers, list(batches), first
        self.hidden, self.calls = [], []
        wanted = sorted(set(self.source.values()))
        with torch.no_grad():
            for batch in self.batches:
                parts = {j: _split_hidden(c)
                         for j, c in _capture_layer_calls(model, layers, wanted, batch).items()}
                self.hidden.append(parts[first][0])
                self.calls.append({j: rest for j, (_, rest) in parts.items()})

    def start(self) -> tuple:
        """The stream as it enters its first layer (what the forward pass up to it gave),
        to `resume` later without that pass: valid while the layers before it are unchanged."""
        return (self.at, dict(self.source), list(self.hidden), list(self.calls))

    @classmethod
    def resume(cls, layers: nn.ModuleList, batches: Sequence[Batch], start: tuple) -> "LayerStream":
        """A stream from `start()` of one over the same batches (its tensors are shared,
        never written: every step makes new ones)."""
        stream = cls.__new__(cls)
        stream.at, source, hidden, calls = start
        stream.source, stream.hidden, stream.calls = dict(source), list(hidden), list(calls)
        stream.layers, stream.batches = layers, list(batches)
        return stream

    def _run(self, i: int, layer: nn.Module):
        rest, kwargs = self.calls[i][self.source[self.at]]
        return _first(layer(self.hidden[i], *rest, **kwargs))

    def keys(self, matrix: nn.Module, device, keep_inputs: bool) -> Keys:
        """Keys of `matrix` (inside the current layer); with keep_inputs, also keep the
        layer outputs and the matrix's full inputs so `advance_linear` can be used."""
        parts, self._outs, self._inputs = [], [], []
        layer = self.layers[self.at]
        with torch.no_grad():
            for i, batch in enumerate(self.batches):
                def select(x, batch=batch):
                    if keep_inputs:
                        self._inputs.append(x)
                    return batch.select(x)

                with capture_inputs(matrix, select) as got:
                    if keep_inputs:
                        self._outs.append(self._run(i, layer))
                    else:
                        with stop_after(matrix):
                            self._run(i, layer)
                parts.extend(got)
        return Keys.concat(parts, self.batches, device)

    def advance_linear(self, P: torch.Tensor, gain: float = 1.0) -> None:
        """Next layer's input = unpatched output + gain * P x, for a matrix whose output
        reaches the residual stream scaled by `gain` and nothing else
        (`grom.arch.residual_gain`); P is (m, n) in the math layout."""
        gP = P * gain
        self.hidden = [out + nn.functional.linear(x, gP.to(x.device, x.dtype))
                       for out, x in zip(self._outs, self._inputs)]
        self._outs, self._inputs = [], []
        self.at += 1

    def advance(self) -> None:
        """Next layer's input by running the current layer as the model now is."""
        layer = self.layers[self.at]
        with torch.no_grad():
            self.hidden = [self._run(i, layer) for i in range(len(self.batches))]
        self._outs, self._inputs = [], []
        self.at += 1

    def input_cache_bytes(self, n: int) -> int:
        """Bytes that keeping every batch's full matrix inputs (width n) would take."""
        return sum(h.shape[0] * h.shape[1] * n * h.element_size() for h in self.hidden)
