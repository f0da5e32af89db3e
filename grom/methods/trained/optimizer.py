"""The optimiser of the trained methods (was grom/baselines/optim.py), as OpenUnlearning
runs it under the HF Trainer: which
parameters train, AdamW with HF's weight-decay grouping, gradient clipping, the linear
schedule with warm-up or the constant one, and the precision of the weights.

Precision. OpenUnlearning loads bf16 models in bf16 and trains them with ``bf16: True``
and ``optim: paged_adamw_32bit`` (configs/trainer/finetune.yaml at
d3d7cf9e6b3c125d16687d4232680d8d83548f1a): float32 moments, and each step read from the
bf16 weight, computed in float32 and written back rounded to bf16; no float32 copy of the
weights survives a step, so an update smaller than half a bf16 step of the weight is lost.
`updated_tensors(slots, master_weights=False)` does the same: AdamW (float32 moments)
updates a float32 work tensor that is re-read from the rounded weight after every step.
`master_weights=True` keeps the float32 values from step to step instead (mixed-precision
training with masters). float32 / float64 weights are updated in place either way.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple, Sequence

import torch
from torch import nn

from grom.methods.trained.settings import Settings

# HF Trainer.get_decay_parameter_names: no weight decay on these (and on nn.LayerNorm).
_NO_DECAY = [re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)",
                                     r"_norm(?:$|\.)")]


def select_parameters(model: nn.Module, params: Sequence[str] | None) -> list[tuple[str, nn.Parameter]]:
    """The trained parameters: all floating ones, or those whose name contains one of the
    `params` substrings. From named_parameters(), so a tied pair appears once, under the
    name model.get_parameter resolves."""
    named = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    chosen = named if params is None else [(n, p) for n, p in named if any(s in n for s in params)]
    if not chosen:
        raise ValueError(f"no parameter name contains any of {list(params or [])}; names look like "
                         f"{', '.join(n for n, _ in named[:4])}")
    meta = [n for n, p in chosen if p.device.type == "meta"]
    if meta:
        raise ValueError(f"{meta[0]} is offloaded (on the meta device); load the model on a real device")
    return chosen


def _no_decay_names(model: nn.Module) -> set[str]:
    names = set()
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(mod, nn.LayerNorm) or any(r.search(full.lower()) for r in _NO_DECAY):
                names.add(full)
    return names


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """HF's get_linear_schedule_with_warmup factor of the lr at optimizer step `step`."""
    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def constant_schedule(step: int) -> float:
    """HF's "constant" schedule (get_constant_schedule): the lr at every step, no warm-up."""
    return 1.0


def lr_factor(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The lr factor of `schedule` ("linear" or "constant") for a LambdaLR."""
    if schedule == "constant":
        return constant_schedule
    if schedule == "linear":
        return linear_schedule(warmup, total)
    raise ValueError(f"unknown lr schedule {schedule!r}; use 'linear' or 'constant'")


class Updated(NamedTuple):
    """The tensors AdamW updates: `pairs` [(parameter, the tensor AdamW steps)], `masters`
    the float32 masters kept across steps (by name), `work` the float32 work tensors
    re-read from their rounded weight after every step."""

    pairs: list
    masters: dict
    work: list


def updated_tensors(slots, master_weights: bool = False) -> Updated:
    """What AdamW updates for each (name, parameter) of `slots`: a float32 / float64
    parameter itself; a lower-precision one through a float32 tensor, kept across steps
    (a master) when `master_weights`, else re-read from the weight after each step."""
    masters: dict[str, torch.Tensor] = {}
    pairs, work = [], []
    for n, p in slots:
        if p.dtype in (torch.float32, torch.float64):
            pairs.append((p, p))
            continue
        o = p.detach().float().clone()
        pairs.append((p, o))
        if master_weights:
            masters[n] = o
        else:
            work.append((p, o))
    return Updated(pairs, masters, work)


_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # torch's fused AdamW takes these


def adamw(model: nn.Module, s: Settings, slots, pairs) -> torch.optim.AdamW:
    no_decay = _no_decay_names(model)
    groups = [{"params": [o for (n, _), (_, o) in zip(slots, pairs) if n not in no_decay],
               "weight_decay": s.weight_decay},
              {"params": [o for (n, _), (_, o) in zip(slots, pairs) if n in no_decay],
               "weight_decay": 0.0}]
    tensors = [o for _, o in pairs]
    # torch's fused kernel where every tensor's device has one: the same update up to the last bit
    # (6e-8 on SmolLM2's weights), 5x sooner on the 2-core CPU (0.07 s a step of its 135M parameters
    # against 0.35 s); the HF Trainer's own default since torch 2.8 ("adamw_torch_fused")
    fused = bool(tensors) and all(t.device.type in ("cpu", "cuda") and t.dtype in _FUSED_DTYPES for t in tensors)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=s.lr, betas=(0.9, 0.999), eps=1e-8,
                             fused=fused or None)



def optimizer_step(opt, sched, up: Updated, s: Settings) -> None:
    """One optimizer step on the accumulated gradients (moved to the float32 tensors),
    clipped; the weights then get the float32 values rounded to their dtype, and the work
    tensors (training in the model's dtype) get the rounded weights back."""
    pairs = up.pairs
    for p, o in pairs:
        if o is not p:
            o.grad = None if p.grad is None else p.grad.float()
            p.grad = None
    if s.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([o for _, o in pairs], s.max_grad_norm)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p, o in pairs:
            if o is not p:
                p.copy_(o)
        for p, o in up.work:
            o.copy_(p)
