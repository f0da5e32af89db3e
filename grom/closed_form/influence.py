"""The influence audit (Theorem 2): how much each forget example contributes to P.

Removing example i (its key block C_i, n x c_i, and block D_i of D, m x c_i) with
w = w_f/s and mu held fixed gives, by the Woodbury identity,

    dP_i = P - P_{-i} = L_i R_i^T,   R_i = A^-1 C_i,
    L_i = (D_i - P C_i) (I/w - C_i^T A^-1 C_i)^-1

so each example costs one c_i x c_i solve against the factor of A already computed.
`example_influence_bruteforce` re-solves without the example, as the reference.

(Was `grom/influence.py`.)
"""
from __future__ import annotations

import torch

from grom.closed_form.directions import Directions, as_directions
from grom.closed_form.solve import RidgeSystem, build_system, data_matrix, factor, gram, mu_of


def example_columns(example_index: torch.Tensor, N: int | None = None) -> list[torch.Tensor]:
    """Column indices of each example 0..N-1 (an example with no columns gets none)."""
    example_index = example_index.long().cpu()
    if N is None:
        N = int(example_index.max()) + 1 if example_index.numel() else 0
    order = torch.argsort(example_index, stable=True)
    counts = torch.bincount(example_index, minlength=N).tolist()
    return list(torch.split(order, counts))


def _lowrank_fro(L: torch.Tensor, R: torch.Tensor) -> float:
    """||L R^T||_F without forming it: sqrt(sum((L^T L) * (R^T R)))."""
    return float(((L.T @ L) * (R.T @ R)).sum().clamp_min(0).sqrt())


def influence_factors(system: RidgeSystem, P: torch.Tensor, Xf: torch.Tensor, directions: Directions,
                      cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_i, R_i) with dP_i = L_i R_i^T for the example whose columns are `cols`."""
    dev = system.chol.device
    C = Xf[:, cols.to(Xf.device)].to(dev, torch.float64)  # (n, c)
    R = system.solve(C)  # (n, c)
    K = C.T @ R  # (c, c)
    c = C.shape[1]
    M_inv = torch.eye(c, dtype=torch.float64, device=dev) / system.wf_s - K
    resid = directions.columns(cols).to(dev) - P.to(dev, torch.float64) @ C  # (m, c)
    L = torch.linalg.solve(M_inv, resid.T).T  # M_inv is symmetric
    return L, R


def influence_norms(system: RidgeSystem, P: torch.Tensor, Xf: torch.Tensor, directions: Directions,
                    example_index: torch.Tensor, n_examples: int | None = None) -> torch.Tensor:
    """||dP_i||_F for every example, (N,) float64, from the factored system."""
    norms = []
    for cols in example_columns(example_index, n_examples):
        if cols.numel() == 0:
            norms.append(0.0)
            continue
        norms.append(_lowrank_fro(*influence_factors(system, P, Xf, directions, cols)))
    return torch.tensor(norms, dtype=torch.float64)


def example_influence(Xf: torch.Tensor, Xr: torch.Tensor | None, D, example_index: torch.Tensor,
                      *, w_r: float, rho: float, w_f: float = 1.0) -> torch.Tensor:
    """Frobenius norm of dP_i = P - P_{-i} for each forget example i, (N,).

    Xf (n, s), Xr (n, r), D (m, s) or a Directions, example_index (s,) in 0..N-1.
    """
    directions = as_directions(D)
    system = build_system(Xf, Xr, w_r=w_r, rho=rho, w_f=w_f)
    P = system.update(directions.right_product(Xf))
    return influence_norms(system, P, Xf, directions, example_index)


def example_influence_bruteforce(Xf: torch.Tensor, Xr: torch.Tensor | None, D,
                                 example_index: torch.Tensor, *, w_r: float, rho: float,
                                 w_f: float = 1.0) -> torch.Tensor:
    """The same as `example_influence`, by re-solving without each example (the reference).

    w_f/s and mu stay those of the full problem, as Theorem 2 states.
    """
    directions = as_directions(D)
    s, r = Xf.shape[1], (0 if Xr is None else Xr.shape[1])
    Gr = None if r == 0 else gram(Xr)
    full = data_matrix(gram(Xf), s, Gr, r, w_r=w_r, w_f=w_f)
    mu, wf_s = mu_of(full, rho), w_f / s
    P = factor(full, mu, wf_s).update(directions.right_product(Xf))
    norms = []
    for cols in example_columns(example_index):
        keep = torch.ones(s, dtype=torch.bool)
        keep[cols] = False
        Xk = Xf[:, keep]
        A_data = wf_s * gram(Xk) + (0 if r == 0 else (w_r / r) * Gr)
        P_minus = factor(A_data, mu, wf_s).update(directions.subset(keep.nonzero().flatten()).right_product(Xk))
        norms.append(float(torch.linalg.matrix_norm(P - P_minus)))
    return torch.tensor(norms, dtype=torch.float64)
