"""Running the model over key batches: the forward passes GROM needs, each done once.

Two ways to get a layer's keys:

- `collect_keys`: run the model from the start with a hook on the matrix, stopping right
  after it (used for the LM head, and as the reference path);
- `LayerStream`: run the model once up to the first layer of the band, keep the hidden
  states entering it (and the arguments the model passes its layers), then advance one
  decoder layer at a time. For matrices that write linearly into the residual stream
  (down_proj) a layer's patch moves the next layer's input by exactly ``P x``, so the
  stream advances without re-running the layer.
"""
from __future__ import annotations

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


def _capture_layer_call(model: nn.Module, layer: nn.Module, batch: Batch):
    """The (args, kwargs) the model passes `layer` for this batch; stops there."""
    calls = []

    def hook(_module, args, kwargs):
        calls.append((args, dict(kwargs)))
        raise StopForward

    try:
        with hooked(layer, hook, pre=True, with_kwargs=True):
            forward(model, batch)
    except StopForward:
        pass
    return calls[0]


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class LayerStream:
    """The residual stream of every batch, entering one decoder layer at a time."""

    def __init__(self, model: nn.Module, layers: nn.ModuleList, first: int,
                 batches: Sequence[Batch]):
        self.layers, self.batches, self.at = layers, list(batches), first
        self.hidden, self.calls = [], []
        with torch.no_grad():
            for batch in self.batches:
                args, kwargs = _capture_layer_call(model, layers[first], batch)
                self.hidden.append(args[0] if args else kwargs.pop("hidden_states"))
                self.calls.append((args[1:], kwargs))

    def _run(self, i: int, layer: nn.Module):
        rest, kwargs = self.calls[i]
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

    def advance_linear(self, P: torch.Tensor) -> None:
        """Next layer's input = unpatched output + P x (for residual-linear matrices)."""
        self.hidden = [out + nn.functional.linear(x, P.to(x.device, x.dtype))
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
