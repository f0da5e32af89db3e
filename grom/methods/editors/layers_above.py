"""The model from one decoder layer up: what the value optimisation runs at each step
(was grom/baselines/upper.py).

The editors' value optimisation (grom.methods.editors.value_optimisation) adds a vector to the output of
decoder layer L at one position per sequence. Nothing below it changes between steps, so
the residual stream leaving L, and the arguments the model passes each layer above it
(attention mask, position embeddings), are captured once (`capture_upper`); each step then
runs layers L+1.. and the final norm on that stream, and the LM head only at the positions
whose logits the loss reads (`upper_logits`). The logits are the full model's at those
positions, computed without the layers below L+1 and without a vocabulary row for every
other position (on SmolLM2 the head alone is ~4 decoder layers' work per position).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grom.closed_form.collect import LayerStream
from grom.data.encoding import Batch
from grom.model.arch import decoder_layers, final_norm, finish_logits, layer_kinds, num_layers
from grom.model.hooks import capture_outputs, stop_after


@dataclass(frozen=True)
class Upper:
    """One batch's stream leaving layer `layer`: hidden (B, T, d), detached, and per layer
    above it the (args, kwargs) the model passes it besides the hidden states."""

    layer: int
    hidden: torch.Tensor
    calls: dict  # layer j > `layer` -> (args, kwargs)


def _batch(ids: torch.Tensor, mask: torch.Tensor) -> Batch:
    empty = torch.zeros(0, dtype=torch.long)
    return Batch(ids, mask, empty, empty, empty, empty)


def capture_upper(model: nn.Module, layer: int, ids: torch.Tensor, mask: torch.Tensor) -> Upper:
    """One forward pass of ids (B, T) / mask (B, T), stopped before layer+1 runs: the
    `Upper` of the batch (the model's own call arguments, so any family grom.model.arch knows)."""
    layers, n = decoder_layers(model), num_layers(model)
    batch = _batch(ids, mask)
    if layer + 1 < n:
        stream = LayerStream(model, layers, layer + 1, [batch], last=n - 1, kinds=layer_kinds(model))
        calls = {j: stream.calls[0][stream.source[j]] for j in range(layer + 1, n)}
        return Upper(layer, stream.hidden[0], calls)
    with torch.no_grad(), capture_outputs(layers[layer], lambda x: x) as got, stop_after(layers[layer]):
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    return Upper(layer, got[0], {})


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def head_logits(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The model's logits (k, V) from final-layer hidden states h (k, d): final norm, LM
    head, and the logit transforms the family applies after it (`grom.model.arch.finish_logits`)."""
    return finish_logits(model, model.get_output_embeddings()(final_norm(model)(h)))


def upper_logits(model: nn.Module, upper: Upper, added: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                 at_rows: torch.Tensor, at_cols: torch.Tensor) -> torch.Tensor:
    """Logits (k, V) at positions (at_rows, at_cols) (k,) of the batch, with `added` (a, d)
    added to layer L's output at (rows, cols) (a,) (accumulated where a position repeats);
    differentiable in `added`."""
    h = upper.hidden.index_put((rows, cols), added.to(upper.hidden.dtype), accumulate=True)
    layers = decoder_layers(model)
    for j in sorted(upper.calls):
        args, kwargs = upper.calls[j]
        h = _first(layers[j](h, *args, **kwargs))
    return head_logits(model, h[at_rows, at_cols])
