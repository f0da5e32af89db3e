"""A model sharded by accelerate (the model panel's device map and max-memory box): the
widgets' values checked into a `ModelKey`, the load into the shared registry, and which
layers landed where the edit cannot patch them.

A sharded model is loaded in this process, never inside a ZeroGPU call (a ZeroGPU Space
has one GPU slice and loads its models at start; there the device map is refused).
"""
from __future__ import annotations

import dataclasses
import os

from components.server.allowed_sources import DEMO, require_hub
from components.server.errors import UserError
from components.server.session import REGISTRY, ModelHandle, ModelKey
from grom.model.arch import edited_matrix, num_layers
from grom.model.editable import weight_problem
from grom.model.fetch import registry_model
from grom.model.loading import ModelLoadError, load_model
from grom.model.sharding import (
    DEVICE_MAPS,
    ShardingError,
    format_max_memory,
    parse_device_map,
    parse_max_memory,
    placement,
)

DEVICE_MAP_CHOICES = ["none", *DEVICE_MAPS]


def sharded_key(key: ModelKey, device_map: str | None, max_memory: str | None) -> ModelKey:
    """`key` with the device map and budgets of the widgets (checked: a clear message
    saying the form otherwise); `key` itself when the map is "none"."""
    if (device_map or "none") not in DEVICE_MAP_CHOICES:
        raise UserError(f"Device map must be one of {DEVICE_MAP_CHOICES}.")
    try:
        dmap, budgets = parse_device_map(device_map), parse_max_memory(max_memory)
    except ShardingError as err:
        raise UserError(f"Max memory: {err}.") from err
    if dmap is None:
        if budgets:
            raise UserError("Max memory applies to a sharded model: pick a device map (auto, balanced or "
                            "sequential), or clear the max memory box.")
        return key
    if key.name == DEMO:
        raise UserError("The bundled demo model is tiny: load it with device map 'none'.")
    if os.environ.get("SPACES_ZERO_GPU"):
        raise UserError("A ZeroGPU Space lends one GPU slice per call: load the model with device map 'none'.")
    return dataclasses.replace(key, device_map=dmap, max_memory=format_max_memory(budgets))


def _load_sharded(key: ModelKey, progress=None) -> tuple:
    if registry_model(key.name) is None and not key.name.startswith("/"):
        require_hub(key.name, "model")
    try:
        return load_model(key.name, dtype=key.dtype, device_map=key.device_map,
                          max_memory=parse_max_memory(key.max_memory), progress=progress)
    except (ModelLoadError, ShardingError) as err:
        raise UserError(str(err)) from err


def ensure_sharded_model(key: ModelKey, progress=None) -> ModelHandle:
    """The shared model for a sharded `key` (`sharded_key`), loaded if it is not."""
    return REGISTRY.load(key, lambda k: _load_sharded(k, progress))


def _spans(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, l in enumerate(layers):
        start = l if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != l + 1:
            out.append(f"{start}-{l}" if l > start else f"{l}")
            start = None
    return ", ".join(out)


def offload_note(handle: ModelHandle) -> str:
    """Markdown: where accelerate placed the layers, and a warning naming the layers whose
    down_proj GROM cannot patch (grom.model.editable's message for the first); "" for a model
    loaded whole on one device."""
    where = placement(handle.model)
    if not where:
        return ""
    devices: dict[str, list[int]] = {}
    blocked = []
    for l in range(num_layers(handle.model)):
        name = edited_matrix(handle.model, "down_proj", l).module_name
        dev = next((d for mod, d in where.items() if name == mod or name.startswith(mod + ".") or not mod), "?")
        devices.setdefault(dev, []).append(l)
        problem = weight_problem(handle.model.get_submodule(name), name)
        if problem:
            blocked.append((l, problem))
    text = "Layers by device: " + "; ".join(f"{_spans(ls)} on {d}" for d, ls in devices.items()) + "."
    if blocked:
        text += (f"\n\n⚠ Layers {_spans([l for l, _ in blocked])} cannot be edited (Run edit refuses a band "
                 f"with them): {blocked[0][1]}.")
    return text
