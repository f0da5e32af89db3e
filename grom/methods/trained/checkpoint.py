"""A baseline's training split into parts that each run on their own (a ZeroGPU Space gives
a GPU call a few minutes, in a process forked for that call): between parts, everything
the trainer carries is written to a checkpoint FILE, and only its path and a small record
(`Paused`) cross to the next part.

What the file holds (`capture`, `restore`): the trained weights as they are after the
last optimizer step (the model's dtype), the float32 masters (``master_weights``),
AdamW's state and the LambdaLR position, the cursor (the epoch's forget order and the
next micro-batch group of it), the torch RNG states (the global one, dropout's and RMU's
control vector draw from it; the run's data generator; CUDA's on a GPU), the method's
run-long state (PDU's dual variable, RMU's control vector), the passes done, the
reference NLLs (computed once, by the first part, on the unedited weights), the loss
history, the seconds trained, and the alternate answers a method trains toward (AltPO's
are written by the model once: the later parts reuse them). A part resumed from it makes
exactly the steps the uninterrupted run makes (tests/test_baseline_parts.py).

Format: `torch.save`, read back with `torch.load(weights_only=True)` (tensors, numbers,
strings, lists and dicts only: nothing is executed) and ``mmap=True`` (the host does not
hold a second copy of a large model's state while it is copied onto the device). The
file is the trainer's own, written by a worker into a folder its caller made for the run,
never one a user uploads (those load from safetensors only). A write goes to a temporary
name first and is renamed into place, so a part that dies mid-write leaves the previous
checkpoint whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

FORMAT = 1  # bumped when what the file holds changes


@dataclass(frozen=True)
class Part:
    """One part of a split training. path: the checkpoint file (resumed from where it
    exists, written where this part stops before the end). until: the optimizer steps done
    when this part stops (the run's total or fewer)."""

    path: str
    until: int


@dataclass(frozen=True)
class Paused:
    """What a part that stopped before the end returns (small and picklable): the checkpoint
    `path`, the optimizer `steps` done of `total_steps`, the seconds trained so far, and the
    last step's losses (for a progress line)."""

    path: str
    steps: int
    total_steps: int
    seconds: float
    last: dict

    @property
    def fraction(self) -> float:
        return self.steps / max(1, self.total_steps)


def save_state(path: str | os.PathLike, state: dict) -> None:
    """Write `state` (tensors, numbers, strings, lists, dicts, None) to `path`, atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: str | os.PathLike) -> dict:
    """The state `save_state` wrote (on the CPU, memory-mapped), checked for its format."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # a truncated or foreign file: say which
        raise ValueError(f"the training checkpoint {path} cannot be read ({err}); start the training again") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a training checkpoint of this version; start the training again")
    return state


def rng_state(gen: torch.Generator, cuda_devices: list[int]) -> dict:
    """The RNG states a run draws from: torch's global one, the run's generator, CUDA's."""
    return {"global": torch.get_rng_state(), "gen": gen.get_state(),
            "cuda": [torch.cuda.get_rng_state(d) for d in cuda_devices]}


def set_rng_state(saved: dict, gen: torch.Generator, cuda_devices: list[int]) -> None:
    torch.set_rng_state(saved["global"])
    gen.set_state(saved["gen"])
    if len(saved["cuda"]) != len(cuda_devices):
        raise ValueError("the training checkpoint was written on another kind of device; start the training again")
    for d, s in zip(cuda_devices, saved["cuda"]):
        torch.cuda.set_rng_state(s, d)


def tensors_to(value, device):
    """`value` (a run's state: dicts, lists, tensors, numbers) with every tensor on `device`."""
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: tensors_to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tensors_to(v, device) for v in value)
    return value
