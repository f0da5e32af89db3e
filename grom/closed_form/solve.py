"""The closed-form update (Theorem 1), in float64 with a Cholesky factorisation.

    A = (w_r/r) Xr Xr^T + (w_f/s) Xf Xf^T + mu I,   mu = rho * mean(diag(A_data))
    P = (w_f/s) D Xf^T A^-1

Only the ratio w_r / w_f matters: scaling both scales A, mu and D Xf^T alike.

`SystemSums` builds A_data and D Xf^T batch by batch (memory n^2 + m n float64 whatever
the number of keys) and factors A in place; `build_system` / `solve_update` take whole key
matrices (the reference, and the diagnostics that keep the keys).

(Was `grom/solve.py`.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grom.closed_form.directions import Directions, as_directions
from grom.model.distributed import all_reduce_


def gram(X: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """X X^T in float64, (n, n), for X (n, k); chunked so X is never copied whole."""
    G = torch.zeros(X.shape[0], X.shape[0], dtype=torch.float64, device=X.device)
    for i in range(0, X.shape[1], chunk):
        Xc = X[:, i:i + chunk].double()
        G += Xc @ Xc.T
    return G


@dataclass
class RidgeSystem:
    """A factored A with the weights that built it.

    chol: lower Cholesky factor of A, (n, n) float64; wf_s = w_f/s; mu the ridge.
    """

    chol: torch.Tensor
    wf_s: float
    mu: float

    def solve(self, B: torch.Tensor) -> torch.Tensor:
        """A^-1 B for B (n, k), float64: two triangular solves, L Y = B then L^T X = Y.
        (torch.cholesky_solve copies a row-major factor into column-major order first: one
        more n x n float64 matrix, measured on the CPU; solve_triangular reads it as is.)"""
        B = B.to(self.chol.device, torch.float64)
        Y = torch.linalg.solve_triangular(self.chol, B, upper=False)
        return torch.linalg.solve_triangular(self.chol.mT, Y, upper=True)

    def update(self, DXt: torch.Tensor) -> torch.Tensor:
        """P = (w_f/s) (D Xf^T) A^-1 from D Xf^T (m, n); float64."""
        return self.wf_s * self.solve(DXt.T).T


def data_matrix(Gf: torch.Tensor, s: int, Gr: torch.Tensor | None, r: int, *,
                w_r: float, w_f: float) -> torch.Tensor:
    """A_data = (w_r/r) Gr + (w_f/s) Gf from the Gram matrices."""
    if s == 0:
        raise ValueError("there are no forget keys: the forget set produced no positions")
    A = (w_f / s) * Gf
    if r > 0 and Gr is not None:
        A = A + (w_r / r) * Gr
    return A


def mu_of(A_data: torch.Tensor, rho: float) -> float:
    return float(rho * torch.diagonal(A_data).mean())


def factor(A_data: torch.Tensor, mu: float, wf_s: float, in_place: bool = False) -> RidgeSystem:
    """Cholesky-factor A = A_data + mu I; a clear error if it is not positive definite.
    in_place: A_data's memory becomes the factor (no other n x n matrix is made)."""
    A = A_data if in_place else A_data.clone()
    A.diagonal().add_(mu)
    # LAPACK factors column-major matrices and torch copies a row-major one into that
    # order first (one more n x n, measured). A is symmetric: its transpose view is A itself
    # in column-major order, factored in its own memory.
    Ac = A.mT
    info = torch.empty((), dtype=torch.int32, device=A.device)
    chol, info = torch.linalg.cholesky_ex(Ac, out=(Ac, info))
    if int(info) != 0:
        raise ValueError(
            "the key matrix A is singular (not positive definite): increase rho (the ridge), "
            "or add more forget/retain data"
        )
    return RidgeSystem(chol, wf_s, mu)


class SystemSums:
    """The data of one matrix's system, summed batch by batch in float64 on `device`:

        A_data = (w_f/s) sum_b Xf_b Xf_b^T + (w_r/r) sum_b Xr_b Xr_b^T    (n, n)
        DXt    = sum_b D_b Xf_b^T                                         (m, n)

    s and r, the numbers of forget and retain key columns over every batch (and every
    rank), are known before the first batch, so each batch is added with its weight in
    place. `reduce` adds the sums of every rank (torch.distributed); `system` factors A in
    place. Equal to `build_system` on the concatenated keys up to float64 rounding.
    """

    def __init__(self, m: int, n: int, s: int, r: int, *, w_r: float, w_f: float, device=None):
        if s == 0:
            raise ValueError("there are no forget keys: the forget set produced no positions")
        self.A = torch.zeros(n, n, dtype=torch.float64, device=device)
        self.DXt = torch.zeros(m, n, dtype=torch.float64, device=device)
        self.wf_s, self.wr_r = w_f / s, (w_r / r if r > 0 else 0.0)

    def add_forget(self, X: torch.Tensor, directions: Directions) -> None:
        """Forget keys X (n, k) of one batch with their columns of D, D_b (m, k)."""
        Xd = X.to(self.A.device, torch.float64)
        self.A.addmm_(Xd, Xd.T, alpha=self.wf_s)
        directions.right_product(X.to(self.A.device), out=self.DXt)

    def add_retain(self, X: torch.Tensor) -> None:
        """Retain keys X (n, k) of one batch."""
        if self.wr_r:
            Xd = X.to(self.A.device, torch.float64)
            self.A.addmm_(Xd, Xd.T, alpha=self.wr_r)

    def reduce(self) -> None:
        all_reduce_(self.A)
        all_reduce_(self.DXt)

    def system(self, rho: float) -> RidgeSystem:
        """Factor A = A_data + mu I in A_data's memory (the sums are spent)."""
        A, self.A = self.A, None
        return factor(A, mu_of(A, rho), self.wf_s, in_place=True)


def build_system(Xf: torch.Tensor, Xr: torch.Tensor | None, *, w_r: float, rho: float,
                 w_f: float = 1.0) -> RidgeSystem:
    """Factor A for keys Xf (n, s) and Xr (n, r)."""
    s, r = Xf.shape[1], (0 if Xr is None else Xr.shape[1])
    A_data = data_matrix(gram(Xf), s, None if r == 0 else gram(Xr.to(Xf.device)), r,
                         w_r=w_r, w_f=w_f)
    return factor(A_data, mu_of(A_data, rho), w_f / s)


def ridge_mu(Xf: torch.Tensor, Xr: torch.Tensor | None, *, w_r: float, rho: float,
             w_f: float = 1.0) -> float:
    """mu = rho * mean(diag((w_r/r) Xr Xr^T + (w_f/s) Xf Xf^T))."""
    s, r = Xf.shape[1], (0 if Xr is None else Xr.shape[1])
    mean_f = (Xf.double() ** 2).sum() / (s * Xf.shape[0]) if s else 0.0
    mean_r = (Xr.double() ** 2).sum() / (r * Xr.shape[0]) if r else 0.0
    return float(rho * (w_f * mean_f + w_r * mean_r))


def solve_update(Xf: torch.Tensor, Xr: torch.Tensor | None, D, *, w_r: float, rho: float,
                 w_f: float = 1.0) -> torch.Tensor:
    """The GROM update P (m, n) in Xf's dtype.

    Xf (n, s) forget keys, Xr (n, r) retain keys (may have r = 0), D (m, s) the target
    (a tensor or a `grom.closed_form.directions.Directions`).
    """
    directions: Directions = as_directions(D)
    if directions.s != Xf.shape[1]:
        raise ValueError(f"D has {directions.s} columns but Xf has {Xf.shape[1]} keys")
    system = build_system(Xf, Xr, w_r=w_r, rho=rho, w_f=w_f)
    return system.update(directions.right_product(Xf)).to(Xf.dtype)
