"""What a method's run costs, counted from the model's shape and the data without running
anything: the FLOPs of a run (a device's time is priced from them) and the bytes a training
keeps between two turns on the device. Each method's registry row answers with these
(`MethodEntry.flops`, `MethodEntry.holds`); a host prices them at its own rate.

Token counts are upper estimates from the examples' characters (`example_tokens`), so that
no tokenizer runs to price a request."""
from __future__ import annotations

from dataclasses import fields
from typing import Iterable, NamedTuple

from grom.model.arch import decoder_layers

CHARS_PER_TOKEN = 3.0  # English BPE averages ~4 characters a token: 3 over-counts, on purpose
ACTIVATION_BYTES_PER_TOKEN_LAYER = 16
"""Bytes a trained token keeps per layer and hidden unit for the backward pass (its hidden
states, attention and MLP activations in float32): a rough count, held against what real
trainings hold in BENCHMARKS.md ("Hostile visitors")."""


class Shape(NamedTuple):
    """What the cost of a token depends on, read from a model."""

    layers: int
    layer_params: int  # parameters of one decoder layer (a token costs 2 x this FLOPs per layer forward)
    key_dim: int  # input size n of an MLP output matrix (the MLP width): its solve is n x n
    hidden: int


def shape_of(model) -> Shape:
    """The `Shape` of a loaded model (its decoder layers, the MLP width, the hidden size)."""
    layers = decoder_layers(model)
    cfg = model.config
    width = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size
    return Shape(len(layers), sum(p.numel() for p in layers[0].parameters()), int(width), int(cfg.hidden_size))


def example_tokens(examples: Iterable) -> float:
    """An upper estimate of the tokens in `examples` (every text field of each, at
    CHARS_PER_TOKEN): what a forward pass over them costs, without tokenizing."""
    chars = 0
    for ex in examples:
        for f in fields(ex):
            value = getattr(ex, f.name)
            if isinstance(value, str):
                chars += len(value)
            elif isinstance(value, tuple):
                chars += sum(len(v) for v in value if isinstance(v, str))
    return chars / CHARS_PER_TOKEN


def data_tokens(data) -> float:
    """`example_tokens` of the forget and the retain examples of `data`."""
    return example_tokens(getattr(data, "forget", ()) or ()) + example_tokens(getattr(data, "retain", ()) or ())


def train_flops(shape: Shape, tokens: float, epochs: float) -> float:
    """Training on `tokens` for `epochs`: forward and backward (~3 forwards) of every token
    each epoch, and as much again for a retain or reference pass."""
    return 2.0 * 6.0 * epochs * tokens * shape.layers * shape.layer_params


def held_while_training(trained, tokens_per_step: float, shape: Shape) -> int:
    """What a training keeps between its turns on the device: per trained weight the copy it
    is restored from, its gradient and AdamW's two float32 moments; and one step's
    activations (a batch of two passes, forget and retain or reference)."""
    state = sum(p.numel() * (2 * p.element_size() + 8) for p in trained)
    return int(state + 2 * tokens_per_step * shape.layers * shape.hidden * ACTIVATION_BYTES_PER_TOKEN_LAYER)
