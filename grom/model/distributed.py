"""Data parallelism on torch.distributed: each rank takes its share of the key batches,
and the sums GROM builds from them (the Gram matrices, D Xf^T, the layer scores) are
added over the ranks, so every rank solves the same system.

Everything here is the identity when torch.distributed is not initialised (one process),
so the library calls it unconditionally. NCCL (GPUs) and gloo (CPU) run the same code:
the tensors reduced live where the solve does (the weight's device for CUDA, else the CPU).

Launch: ``torchrun --nproc_per_node N -m grom edit ...``; `grom.cli` initialises the
process group from torchrun's environment (`init_from_env`).

(Was `grom/distributed.py`.)
"""
from __future__ import annotations

import logging
import os
from typing import Sequence, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
T = TypeVar("T")


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def share(items: Sequence[T]) -> list[int]:
    """The indices of `items` this rank handles: i with i % world == rank (round robin, so
    the ranks' shares differ by at most one item; a rank may get none)."""
    return list(range(rank(), len(items), world_size()))


def all_reduce_(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over the ranks, in place; returns it."""
    if not (active() and world_size() > 1):
        return t
    if dist.get_backend() == "nccl" and t.device.type != "cuda":  # NCCL reduces GPU tensors only
        on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
        return t.copy_(on_gpu)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_by_index(local: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's {global index: tensor}, merged and ordered by index (CPU tensors): the
    same list on every rank, and what one process holding all indices would have."""
    merged = dict(local)
    if active() and world_size() > 1:
        parts: list = [None] * world_size()
        dist.all_gather_object(parts, {i: t.cpu() for i, t in local.items()})
        merged = {i: t for part in parts for i, t in part.items()}
    return [merged[i].cpu() for i in sorted(merged)]


def init_from_env() -> bool:
    """Initialise the default process group from torchrun's environment (WORLD_SIZE > 1):
    NCCL where CUDA is available (each rank on cuda:LOCAL_RANK), else gloo. Returns whether
    this call started one (the caller then ends it with `shutdown`); a group already active
    (the caller's own) is used as it is."""
    if active():
        return False
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    log.info("rank %d of %d (%s)", rank(), world_size(), dist.get_backend())
    return True


def shutdown() -> None:
    if active():
        dist.destroy_process_group()
