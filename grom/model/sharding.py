"""Sharded loading: the `device_map` strategies and the `max_memory` budgets a user types
(``--device-map auto --max-memory "0=20GiB,cpu=60GiB"``), checked before anything loads.

accelerate places the model's modules over the devices within the budgets, and what does
not fit goes to "disk" (its weights on the meta device, loaded per forward pass by a hook).
GROM edits weights in place, so a band layer placed on disk is refused before any forward
pass by `grom.model.editable.check_edit_inputs`, with a message naming the layer; the other
layers may live anywhere.

(Was `grom/sharding.py`.)
"""
from __future__ import annotations

import re

import torch

# accelerate's strategies (accelerate.utils.modeling.get_balanced_memory / infer_auto_device_map)
DEVICE_MAPS = ("auto", "balanced", "sequential")
DEVICE_MAP_HELP = ("auto, balanced or sequential (accelerate spreads the model over the GPUs, then the "
                   "CPU, then disk), or one device: cpu, cuda, cuda:N")

# Units of a memory size: decimal (GB = 10^9) and binary (GiB = 2^30), as accelerate reads them.
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DEVICE_KEYS = ("cpu", "mps", "disk")
MAX_MEMORY_HELP = ('per device, comma separated: GPU index or cpu = size, e.g. "0=20GiB,1=20GiB,cpu=60GiB" '
                   "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")


class ShardingError(ValueError):
    """A device map or a max-memory text that cannot be used; the message says the form."""


def parse_device_map(text: str | None) -> str | None:
    """'auto' | 'balanced' | 'sequential' | a device ('cpu', 'cuda', 'cuda:1') -> the
    `device_map` for `from_pretrained`; '' / 'none' / None -> None (no accelerate)."""
    value = (text or "").strip().lower()
    if value in ("", "none"):
        return None
    if value in DEVICE_MAPS or value == "cpu" or re.fullmatch(r"cuda(:\d+)?", value):
        return value
    raise ShardingError(f"device map {text!r} is unknown: use {DEVICE_MAP_HELP}")


def parse_size(text: str) -> int:
    """'20GiB' -> 21474836480, '500MB' -> 500000000, '1024' -> 1024 (bytes)."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ShardingError(f"memory size {text!r} is not a number with a unit; write e.g. 20GiB or 500MB "
                            "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_max_memory(text: str | None) -> dict[int | str, int] | None:
    """'0=20GiB,cpu=60GiB' -> {0: 21474836480, 'cpu': 64424509440} (bytes per device: GPU
    indices as ints, as accelerate wants them); '' / None -> None (accelerate's defaults)."""
    if not text or not text.strip():
        return None
    out: dict[int | str, int] = {}
    for part in text.split(","):
        device, eq, size = part.partition("=")
        device = device.strip().lower().removeprefix("cuda:")
        if not eq or not device:
            raise ShardingError(f"max memory entry {part.strip()!r} is not device=size; {MAX_MEMORY_HELP}")
        if not (device.isdigit() or device in _DEVICE_KEYS):
            raise ShardingError(f"max memory device {device!r} is not a GPU index, cpu, mps or disk; "
                                f"{MAX_MEMORY_HELP}")
        key: int | str = int(device) if device.isdigit() else device
        if key in out:
            raise ShardingError(f"max memory names device {device!r} twice")
        out[key] = parse_size(size)
    gpus = [k for k in out if isinstance(k, int)]
    if gpus and torch.cuda.is_available() and max(gpus) >= torch.cuda.device_count():
        raise ShardingError(f"max memory names GPU {max(gpus)} but this machine has "
                            f"{torch.cuda.device_count()} GPU(s) (indices from 0)")
    return out


def format_max_memory(max_memory: dict | None) -> str:
    """The canonical text of a parsed budget (sorted, in bytes): equal budgets, equal text."""
    if not max_memory:
        return ""
    order = sorted(max_memory, key=lambda k: (isinstance(k, str), str(k)))
    return ",".join(f"{k}={max_memory[k]}" for k in order)


def map_devices(device_map: str | None) -> list[str]:
    """The devices a `device_map` may put weights on ("cuda:0", ..., "cpu"), disk aside."""
    if device_map is None or device_map == "cpu":
        return ["cpu"]
    if device_map.startswith("cuda"):
        return [device_map if ":" in device_map else "cuda:0"]
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return gpus + ["cpu"]


def sharded_room(weights: int, device_map: str | None, max_memory: dict | None, free_of) -> int:
    """The memory to hold a plan (`grom.closed_form.memory_plan`, weights included) against, for a model
    sharded by `device_map` within `max_memory`: the free memory `free_of(device)` of every
    device the map may use, plus the weights that do not fit in the budgets (accelerate
    puts them on disk, which holds nothing else). So the plan fits when its working memory
    (caches, Grams, solve: peak less `weights`) and the weights kept on devices fit in
    what is free. A budget limits where weights go, not the edit's own tensors."""
    free, on_devices = 0, 0
    for dev in map_devices(device_map):
        f = free_of(dev)
        key: int | str = "cpu" if dev == "cpu" else int(dev.partition(":")[2])
        cap = (max_memory or {}).get(key, f)
        free += f
        on_devices += min(f, cap)
    return free + max(0, weights - on_devices)


def placement(model) -> dict[str, str]:
    """Where accelerate put each top module ({} when the model was not loaded with a map):
    module name -> device ('cpu', '0', 'disk', ...)."""
    return {name: str(dev) for name, dev in (getattr(model, "hf_device_map", None) or {}).items()}
