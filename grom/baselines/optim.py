"""The optimiser of the baselines, as OpenUnlearning runs it under the HF Trainer: which
parameters train, AdamW with HF's weight-decay grouping, fp32 masters for low-precision
weights, gradient clipping and the linear schedule with warm-up."""
from __future__ import annotations

import re
from typing import Callable, Sequence

import torch
from torch import nn

from grom.baselines.settings import Settings

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


def updated_tensors(slots) -> tuple[dict[str, torch.Tensor], list[tuple[nn.Parameter, torch.Tensor]]]:
    """(fp32 masters by name, [(parameter, the tensor AdamW updates)]): a float32 / float64
    parameter is updated itself, a lower-precision one through a float32 master copy."""
    masters: dict[str, torch.Tensor] = {}
    pairs = []
    for n, p in slots:
        if p.dtype in (torch.float32, torch.float64):
            pairs.append((p, p))
        else:
            masters[n] = p.detach().float().clone()
            pairs.append((p, masters[n]))
    return masters, pairs


def adamw(model: nn.Module, s: Settings, slots, pairs) -> torch.optim.AdamW:
    no_decay = _no_decay_names(model)
    groups = [{"params": [o for (n, _), (_, o) in zip(slots, pairs) if n not in no_decay],
               "weight_decay": s.weight_decay},
              {"params": [o for (n, _), (_, o) in zip(slots, pairs) if n in no_decay],
               "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=s.lr, betas=(0.9, 0.999), eps=1e-8)


def optimizer_step(opt, sched, pairs, s: Settings) -> None:
    """One optimizer step on the accumulated gradients (moved to the masters), clipped;
    the weights then get the (rounded) masters."""
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
