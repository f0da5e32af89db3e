"""Layer choice by logit-lens attribution.

    S_l = F_l - R_l,  F_l = sum_j alpha_j <w_{g_j}, o_l(j)> / sum_j alpha_j  (forget),
                      R_l = mean_j <w_{g_j}, o_l(j)>                          (retain)

with o_l the output of layer l's edited matrix (down_proj by default) at a key position
and w_g the LM-head row of its gold token: how much layer l writes the forget answers'
tokens directly into the logits, beyond what it does for the retain answers. The band is
the contiguous window of width k with the largest mean S_l.

(Was `grom/attribution.py`.)
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Callable, Sequence

import torch
from torch import nn

from grom.closed_form.collect import forward
from grom.data.encoding import Batch
from grom.edit import LayerScores
from grom.model.arch import decoder_layers, edited_matrix, unembedding
from grom.model.distributed import all_reduce_, share
from grom.model.hooks import capture_outputs, stop_after
from grom.turns import Between, give


def best_window(scores: Sequence[float], k: int, candidates: Sequence[int] | None = None) -> list[int]:
    """The contiguous window of `k` layers, all within `candidates` (default: all), with the
    largest mean score; ties go to the earliest window."""
    L = len(scores)
    allowed = set(range(L) if candidates is None else candidates)
    if not 1 <= k <= L:
        raise ValueError(f"window width k={k} must be between 1 and the number of layers ({L})")
    best, best_mean = None, -float("inf")
    for start in range(L - k + 1):
        window = list(range(start, start + k))
        if not allowed.issuperset(window):
            continue
        mean = sum(scores[i] for i in window) / k
        if mean > best_mean:
            best, best_mean = window, mean
    if best is None:
        raise ValueError(f"no contiguous window of {k} layers lies inside the candidates {sorted(allowed)}")
    return best


def _logit_dots(model, batches, modules, unembed, weights, progress, between: Between | None = None) -> torch.Tensor:
    """sum_j weight_j <w_{g_j}, o_l(j)> for every layer l, (L,) float64; `between` before
    every batch but the first (no hook held there)."""
    total = torch.zeros(len(modules), dtype=torch.float64)
    with torch.no_grad():
        for bi, batch in enumerate(batches):
            if bi:
                give(between)
            with ExitStack() as stack:
                got = [stack.enter_context(capture_outputs(m, batch.select)) for m in modules]
                stack.enter_context(stop_after(modules[-1]))  # the rest and the LM head: not needed
                forward(model, batch)
            w = weights(batch)
            for l, outs in enumerate(got):
                o = outs[0].double()
                rows = unembed[batch.gold.to(unembed.device)].to(o.device, torch.float64)
                total[l] += float(((o * rows).sum(1) * w.to(o.device)).sum())
            if progress:
                progress((bi + 1) / len(batches))
    return total


def score_layers(model: nn.Module, forget: Sequence[Batch], retain: Sequence[Batch],
                 alpha: torch.Tensor, *, matrix: str = "down_proj", k: int = 5,
                 candidates: Sequence[int] | None = None,
                 progress: Callable[[float], None] | None = None,
                 between: Between | None = None) -> LayerScores:
    """S_l for every layer from one forward pass over the forget and retain key batches.

    alpha (vocab,) the specificity weights (all ones to switch them off). Under
    torch.distributed each rank runs its share of the batches and the sums are reduced.
    between: a step boundary (`grom.turns`) between two batches; the model is as found
    there (nothing is changed), so its as_found is the caller's (`give`'s nullcontext).
    """
    if matrix == "lm_head":
        raise ValueError("layer scores apply to down_proj / o_proj edits, not the LM head")
    n = len(decoder_layers(model))
    modules = [model.get_submodule(edited_matrix(model, matrix, l).module_name) for l in range(n)]
    unembed = unembedding(model).detach()
    fw = lambda b: alpha[b.gold].double()  # noqa: E731
    mine = lambda batches: [batches[i] for i in share(batches)]  # noqa: E731
    f_sum = _logit_dots(model, mine(forget), modules, unembed, fw, progress and (lambda p: progress(p / 2)), between)
    a_sum = float(sum(fw(b).sum() for b in forget))
    if a_sum <= 0:
        raise ValueError("every forget token has specificity weight 0: the forget answers use only "
                         "tokens as common in the retain set; switch alpha off or change the data")
    r_count = sum(b.gold.numel() for b in retain)
    rw = lambda b: torch.ones(b.gold.numel(), dtype=torch.float64)  # noqa: E731
    give(between)
    r_sum = _logit_dots(model, mine(retain), modules, unembed, rw, progress and (lambda p: progress(0.5 + p / 2)),
                        between)
    F = all_reduce_(f_sum) / a_sum
    R = all_reduce_(r_sum) / max(r_count, 1)
    S = F - R
    band = best_window(S.tolist(), min(k, n), candidates)
    return LayerScores(tuple(S.tolist()), tuple(F.tolist()), tuple(R.tolist()), tuple(band), matrix, k)
