"""Diagnostics of an `Edit` from the keys it kept: per-example influence, the per-example
outputs of the edited matrix before and after, and the directions along which they moved.

(Was `grom/diagnostics.py`.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grom.closed_form.influence import influence_norms
from grom.closed_form.solve import build_system
from grom.edit import Edit, LayerKeys


def layer_keys(edit: Edit, param_name: str | None) -> tuple[str, LayerKeys]:
    """(name, kept keys) of the edited matrix `param_name`, or of the first one when None."""
    if not edit.keys:
        raise ValueError("this edit kept no keys (keep_keys=False, or it was loaded from disk); "
                         "run the edit again with keep_keys=True for diagnostics")
    name = param_name or next(iter(edit.keys))
    if name not in edit.keys:
        raise ValueError(f"no keys for {name!r}; edited matrices: {', '.join(edit.keys)}")
    return name, edit.keys[name]


def influence(edit: Edit, param_name: str | None = None) -> torch.Tensor:
    """||P - P_{-i}||_F for each forget example i of one edited matrix, (N,) float64
    (Theorem 2, from one factorisation; examples with no kept keys get 0)."""
    _, k = layer_keys(edit, param_name)
    cfg = edit.settings
    system = build_system(k.Xf, k.Xr, w_r=cfg.w_r, rho=cfg.rho, w_f=cfg.w_f)
    P = system.update(k.directions.right_product(k.Xf))
    return influence_norms(system, P, k.Xf, k.directions, k.forget_example, k.n_forget)


def _example_means(X: torch.Tensor, example: torch.Tensor, n: int) -> torch.Tensor:
    """Mean key per example, (N, n_keys); rows of examples with no keys are NaN."""
    sums = torch.zeros(n, X.shape[0], dtype=torch.float64).index_add_(0, example.long(), X.T.double())
    counts = torch.bincount(example.long(), minlength=n).double()
    return sums / counts[:, None]


@dataclass
class ExampleOutputs:
    """Per-example mean output of the edited matrix, W x and (W + P) x, (N, m) each."""

    forget_before: torch.Tensor
    forget_after: torch.Tensor
    retain_before: torch.Tensor
    retain_after: torch.Tensor


def example_outputs(edit: Edit, model, param_name: str | None = None) -> ExampleOutputs:
    """W x and (W + P) x averaged over each example's key positions (linear, so the mean
    of the keys suffices), with W read from the unedited `model`."""
    name, k = layer_keys(edit, param_name)
    record = next(r for r in edit.layers if r.param_name == name)
    P = edit.patches[name].double().cpu()
    W = model.get_parameter(name).detach().double().cpu()
    if record.transposed:  # the parameter's layout -> (m, n)
        P, W = P.T, W.T
    mf = _example_means(k.Xf, k.forget_example, k.n_forget)
    mr = _example_means(k.Xr, k.retain_example, k.n_retain)
    return ExampleOutputs(mf @ W.T, mf @ (W + P).T, mr @ W.T, mr @ (W + P).T)


def movement_axes(displacements: torch.Tensor, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` directions along which outputs moved most, and each one's share of the
    movement.

    displacements: (N, m), one row (W + P) x - W x = P x per example. Returns axes (k, m),
    orthonormal rows: the top right singular vectors of the displacements, uncentred (the
    common movement of the forget set is movement, not an offset to remove), each signed so
    that the summed displacement projects on it non-negatively; and share (k,), the part of
    sum ||P x||^2 each axis holds (s_i^2 / sum_j s_j^2). float64. The outputs of P lie in the
    span of the target D's columns, a few directions, so three axes hold most of it (a PCA
    of the outputs themselves spends its axes on how examples differ before any edit)."""
    D = displacements.double()
    if D.ndim != 2 or D.shape[0] == 0:
        raise ValueError(f"expected (N, m) displacements with N >= 1, got {tuple(D.shape)}")
    _, S, Vh = torch.linalg.svd(D, full_matrices=False)
    total = (S ** 2).sum()
    if not torch.isfinite(total) or total == 0:
        raise ValueError("the edit moved no output of these examples (P x = 0): nothing to project")
    k = min(k, Vh.shape[0])
    axes = Vh[:k].clone()
    signs = torch.where((D @ axes.T).sum(0) < 0, -1.0, 1.0).double()
    return axes * signs[:, None], (S[:k] ** 2) / total
