"""The update rules of the four locate-then-edit editors, as pure tensor functions
(was grom/baselines/editors.py).

Every rule edits one matrix W (m, n) in the math layout (out, in) from
- K (n, u): the forget keys, one per fact (W's input at the fact's key token);
- R (m, u): the residual each fact's output should move by at this layer (from the shared
  value optimisation, grom.methods.editors.value_optimisation; spread over a band as MEMIT does);
- C0 (n, n): the retain covariance, ``Xr Xr^T / r`` of GROM's own retain keys
  (`retain_covariance`), the statistic the upstream editors take from Wikipedia.
Each returns the additive patch P (m, n) in float64; the caller casts it to W's dtype.

Upstream read for these transcriptions (their text and code are not copied):
- ROME, kmeng01/rome rome/rome_main.py, rome/compute_u.py, rome/compute_v.py: left vector
  C^-1 k, right vector (v* - W k) / (k . C^-1 k); requests applied one after another;
- MEMIT, kmeng01/memit memit/memit_main.py: ``adj_k = solve(w C + K K^T, K)``,
  ``P = R adj_k^T``, the residual divided by the layers still to edit;
- AlphaEdit, jianghoucheng/AlphaEdit AlphaEdit/AlphaEdit_main.py (commit 2ff0e4e) and
  experiments/evaluate.py ``get_project``: the projector onto the eigenvectors of the
  covariance whose eigenvalues are below ``nullspace_threshold`` (2e-2), and
  ``P^T = solve(Pn K K^T + L2 I, Pn K R^T)`` (L2 = 10);
- ZeroUnlearn, XMUDeepLIT/ZeroUnlearn ZeroUnlearn/ZeroUnlearn_main.py (commit deff011):
  ``Pf = (1 + eps) I - V V^T`` with V the orthonormal basis of the forget outputs,
  ``D = Pf (VKT + lam W) W^T [W (KKT + lam I) W^T]^-1``, ``W <- D W``.
"""
from __future__ import annotations

import torch

from grom.closed_form.solve import factor, gram


def retain_covariance(Xr: torch.Tensor) -> torch.Tensor:
    """C0 = Xr Xr^T / r (n, n) float64 from retain keys Xr (n, r)."""
    if Xr.shape[1] == 0:
        raise ValueError("the retain set produced no keys: the editors need a retain covariance")
    return gram(Xr) / Xr.shape[1]


def ridge(C: torch.Tensor, rho: float) -> torch.Tensor:
    """C + mu I with GROM's ridge mu = rho * mean(diag(C)) (grom.closed_form.solve.mu_of)."""
    mu = rho * float(torch.diagonal(C).mean())
    return C + mu * torch.eye(C.shape[0], dtype=C.dtype, device=C.device)


def rome_update(W: torch.Tensor, K: torch.Tensor, R: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """ROME's rank-one updates, one fact after another, (m, n).

    W (m, n) the weight, K (n, u) keys, R (m, u) the wanted output change of each fact (so
    its target value is ``W k_j + r_j``), C (n, n) the (ridged) retain covariance. Fact j
    adds ``(v_j - W_j k_j) u_j^T / (u_j^T k_j)`` with ``u_j = C^-1 k_j`` and W_j the weight
    as the facts before it left it (upstream applies requests in order), so the last fact
    lands exactly on its value and each update has rank one.
    """
    W0, Kd, Cd = W.double(), K.double(), C.double()
    V = W0 @ Kd + R.double()  # (m, u) target values
    U = torch.linalg.solve(Cd, Kd)  # (n, u): C^-1 k_j
    P = torch.zeros_like(W0)
    for j in range(Kd.shape[1]):
        k, u = Kd[:, j], U[:, j]
        lam = (V[:, j] - (W0 + P) @ k) / (u @ k)
        P = P + torch.outer(lam, u)
    return P


def memit_update(K: torch.Tensor, R: torch.Tensor, C0: torch.Tensor, w_r: float, rho: float) -> torch.Tensor:
    """MEMIT's batch update of one layer, ``R K^T (w_r C0 + K K^T + mu I)^-1`` (m, n).

    K (n, u), R (m, u) the residual this layer takes, C0 (n, n) the retain covariance,
    w_r MEMIT's ``mom2_update_weight``. It is GROM's solve (grom.closed_form.solve.factor) with
    w_f / s = 1 and the target R: the same system, only the target and weights differ.
    mu = rho * mean diag of the data part, GROM's ridge (upstream has none: its Wikipedia
    covariance is full rank, a few hundred retain keys are not).
    """
    Kd = K.double()
    A_data = w_r * C0.double() + Kd @ Kd.T
    system = factor(A_data, rho * float(torch.diagonal(A_data).mean()), 1.0)
    return system.update(R.double() @ Kd.T)


def null_space_projector(C0: torch.Tensor, threshold: float) -> torch.Tensor:
    """AlphaEdit's projector (n, n) onto the eigenvectors of C0 (n, n) whose eigenvalues are
    below `threshold` (absolute, as upstream's ``nullspace_threshold``)."""
    evals, evecs = torch.linalg.eigh(C0.double())
    U = evecs[:, evals < threshold]
    return U @ U.T


def alphaedit_update(K: torch.Tensor, R: torch.Tensor, Pn: torch.Tensor, l2: float) -> torch.Tensor:
    """AlphaEdit's update of one layer (m, n): ``Delta^T = (Pn K K^T + l2 I)^-1 Pn K R^T``.

    Delta = Delta Pn (its rows lie in the null space), so ``Delta k = Delta Pn k`` is as
    small as the retain keys' component in that space (eigenvalues below the threshold).
    Upstream's cache of earlier edits' keys is zero here (one batch of facts).
    """
    Kd, Pd = K.double(), Pn.double()
    n = Kd.shape[0]
    A = Pd @ Kd @ Kd.T + l2 * torch.eye(n, dtype=torch.float64, device=Kd.device)
    return torch.linalg.solve(A, Pd @ Kd @ R.double().T).T


def forget_output_projector(V0: torch.Tensor, eps: float) -> torch.Tensor:
    """ZeroUnlearn's ``Pf = (1 + eps) I - Q Q^T`` (m, m), Q the orthonormal basis of the span
    of the forget outputs V0 (m, u): it scales that span by eps and the rest by 1 + eps."""
    Q, S, _ = torch.linalg.svd(V0.double(), full_matrices=False)
    Q = Q[:, S > S.max() * 1e-10] if S.numel() else Q
    m = V0.shape[0]
    return (1 + eps) * torch.eye(m, dtype=torch.float64, device=V0.device) - Q @ Q.T


def zerounlearn_update(W: torch.Tensor, K: torch.Tensor, R: torch.Tensor, C0: torch.Tensor, *,
                       w_r: float, w_f: float, lam: float, eps: float) -> torch.Tensor:
    """ZeroUnlearn's multiplicative edit ``W <- D W`` of one layer, as the additive patch
    ``(D - I) W`` (m, n).

    D (m, m) minimises ``w_r E_r||D W k - Pf W k||^2 + w_f sum_j ||D W k_j - Pf (W k_j +
    r_j)||^2 + lam ||D W - Pf W||^2``: every target is taken through Pf
    (`forget_output_projector` of the forget outputs W K), so D's range is Pf's and with
    eps = 0 every output of the edited layer is orthogonal to the original forget outputs.
    Normal equations (upstream's A and B): ``D W (w_r C0 + w_f K K^T + lam I) W^T =
    Pf (w_r W C0 + w_f (W K + R) K^T + lam W) W^T``. W K R as in the module docstring.
    """
    Wd, Kd = W.double(), K.double()
    V0 = Wd @ Kd  # (m, u) the original forget outputs
    Pf = forget_output_projector(V0, eps)
    n = Wd.shape[1]
    KKT = w_r * C0.double() + w_f * Kd @ Kd.T
    VKT = Wd @ (w_r * C0.double()) + w_f * (V0 + R.double()) @ Kd.T
    B = Wd @ (KKT + lam * torch.eye(n, dtype=torch.float64, device=Wd.device)) @ Wd.T  # (m, m)
    A = Pf @ (VKT + lam * Wd) @ Wd.T  # (m, m)
    D = torch.linalg.solve(B.T, A.T).T  # D B = A
    return D @ Wd - Wd
