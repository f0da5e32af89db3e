"""The memory plan of a Run edit (`grom.closed_form.memory_plan`), before any work: bytes per stage for the
loaded model, the session's data and the form's EditConfig, checked against what the
device has free now ("will not fit on this device, here is what would"), and a small
table for the edit panel's details.

The loaded model's weights are resident already, so the free memory no longer counts them:
the plan's peak less those weights must fit (`grom.closed_form.memory_plan.check_fits(held=...)`). A sharded
model counts every device its map may use. On a ZeroGPU Space the main process has no
CUDA to ask, so no figure is known there and the check is skipped (the table still shows).
"""
from __future__ import annotations

import os

from components.server.errors import UserError
from components.server.session import ModelHandle
from grom.closed_form.memory_plan import GiB, MemoryPlan, WillNotFit, check_fits, free_bytes, headroom_for, plan_edit
from grom.model.sharding import map_devices


def device_free_bytes(handle: ModelHandle) -> int | None:
    """Memory free now where the edit will run: the model's device (CUDA: its free memory;
    CPU: the RAM available), or every device of its map; None where it cannot be known."""
    if os.environ.get("SPACES_ZERO_GPU"):
        return None
    if handle.key.device_map:
        return sum(free_bytes(d) for d in map_devices(handle.key.device_map))
    return free_bytes(handle.key.device)


def resident_bytes(model) -> int:
    """Bytes of the model's parameters, offloaded ones included (they need no memory here)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def plan_run(handle: ModelHandle, forget, retain, config) -> MemoryPlan:
    """The plan of `run_edit` of this model on these examples with `config`."""
    return plan_edit(handle.model.config, handle.tokenizer, forget, retain, config, handle.key.dtype)


def check_run(handle: ModelHandle, p: MemoryPlan, config, free: int | None) -> None:
    """A `UserError` saying what would fit when `p` does not fit in `free` bytes (None:
    unknown, no check)."""
    if free is None:
        return
    try:
        check_fits(p, free, handle.model.config, config, held=min(p.parts["weights"], resident_bytes(handle.model)),
                   headroom=headroom_for(handle.key.device_map or handle.key.device))
    except WillNotFit as err:
        raise UserError(str(err)[0].upper() + str(err)[1:]) from err


def plan_markdown(p: MemoryPlan, free: int | None) -> str:
    """The plan's peak bytes per stage as a small table, with the free memory it was held
    against."""
    st = p.settings
    rows = "\n".join(f"| {stage}{' (peak)' if stage == p.peak_stage else ''} | {b / GiB:.3f} |"
                     for stage, b in p.stages.items())
    head = (f"Memory plan (`grom.closed_form.memory_plan`): {st['matrix']} of {len(st['band']) or 1} layer(s), "
            f"{st['n_forget_tokens']:,} forget + {st['n_retain_tokens']:,} retain tokens, {st['dtype']}; "
            + (f"{free / GiB:.2f} GiB free now." if free is not None else "free memory unknown here."))
    return f"{head}\n\n| stage | GiB (model included) |\n|---|---|\n{rows}"
