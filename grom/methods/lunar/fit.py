"""LUNAR's fit of one down_proj: upstream's training loop, and the same objective solved
in closed form on GROM's solver.

The rows (grom.methods.lunar.activations): keys k (down_proj's inputs at every forget and
retain prompt token) and targets y = g W0 k + coeff r at the forget tokens, y = g W0 k at the
retain tokens (g the residual gain, 1 for Llama; r the refusal direction; upstream's
`perturb_post_block_activations_forget` adds coeff r at every token of a forget prompt,
though its docstring says the last only). The objective is one mean squared error over all
rows, forget and retain mixed, every token weighted alike:

    L(W) = 1/(N m) sum_rows || g W k - y ||^2.

`fit_adamw` is upstream's optimisation (`run_lunar.py`, `src/estimated_net_utils.py`
`train_multiple_layers`, commit dfa56eb0291a93e967284a9ec2d28d5572d235b1): W starts at W0
(`EstimatedNet` copies the down_proj weight), AdamW at `lr` with torch's default weight
decay 0.01, batches of 64 rows drawn from the forget and retain rows shuffled together
(`ConcatDataset`, `DataLoader(batch_size=64, shuffle=True)`), `nn.MSELoss` (mean), and an
`ExponentialLR(gamma=0.9)` step after each epoch.

Upstream's dtypes, all bfloat16: the model is loaded in bfloat16 (`src/model_utils/*_model.py`
`_load_model`, `torch_dtype=torch.bfloat16`), so the hooked keys and targets are bfloat16
(the direction, a float64 mean, is added in place to the bfloat16 block outputs, which stay
bfloat16); `prepare_estimated_net_list` (`src/dataset_utils.py`) casts the EstimatedNet with
`.to(device, dtype=torch.bfloat16)`, so the trained weight, its gradients and AdamW's two
moments (created `zeros_like` the weight) are bfloat16; `nn.MSELoss` of two bfloat16 tensors
is a bfloat16 loss. `fit_adamw(dtype=torch.bfloat16)` does the same: W0, the keys and the
targets rounded to bfloat16, the weight, the loss and the optimizer in bfloat16
(`LunarConfig.dtype="bfloat16"`, the default); `dtype=torch.float32` is our variant, the same
loop without the rounding. What stays ours in bfloat16: the rows are read from the model in
its own dtype (float32 on a float32 model) and rounded once, where upstream's forget targets
are rounded at the residual stream's scale (block output + coeff r, minus the block's mid
residual, in bfloat16). Two effects of bfloat16 worth knowing (8 bits of mantissa: a step
below half an ulp, 2^-9 to 2^-8 of the weight, is lost): AdamW's weight decay, a factor
1 - lr x 0.01 = 1 - 1e-4 a step, rounds back to the weight itself (it does nothing), and the
small steps of late epochs (lr 0.01 x 0.9^19 = 1.4e-3 at most) are partly lost. On SmolLM2's
solar system (docs/notebook/2026-11-30-lunar-upstream.md) the bfloat16 update was at cosine
0.983 to float32's (relative difference 0.19; another shuffle seed alone: 0.12), the objective
after 20 epochs 0.4% higher.

`fit_closed_form` minimises the same L exactly. With P = W - W0 it is

    sum_forget || g P k - coeff r ||^2 + sum_retain || g P k ||^2,

GROM's objective (grom.closed_form.solve) with forget keys Xf, retain keys Xr, the target
column D_j = (coeff / g) r for every forget key, and the two sets weighted per key alike
(w_f / s = w_r / r = 1), solved by `solve_update` with a ridge `rho` (mu = rho x the
mean diagonal; rho -> 0 is the least-squares solution of least norm, which the system
needs when there are fewer rows than down_proj's inputs). `LunarConfig` takes GROM's 0.03:
near the least-norm solution (1e-6) SmolLM2 lost nearly every other fact it knew. What the closed form does not
have: AdamW's weight decay (it pulls W toward 0, not W0), the finite number of epochs with
a decaying rate (upstream stops before the minimum: the closer the training gets to it, the
closer the two), the minibatch noise and (at upstream's dtype) the bfloat16 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grom.closed_form.solve import solve_update
from grom.turns import Between, give


@dataclass
class Rows:
    """The rows one fit reads: keys X (N, n), targets Y (N, m), the first `n_forget` of them
    the forget rows."""

    X: torch.Tensor
    Y: torch.Tensor
    n_forget: int


def training_rows(forget_keys: torch.Tensor, forget_out: torch.Tensor, retain_keys: torch.Tensor,
                  retain_out: torch.Tensor, direction: torch.Tensor, coeff: float, gain: float = 1.0) -> Rows:
    """Upstream's `prepare_trainset`: the forget rows' targets moved by coeff r, the retain
    rows' targets where they are; keys and targets in float32 (cast to the fit's dtype there)."""
    shift = (coeff * direction.double()).float()
    Yf = gain * forget_out.float() + shift
    Yr = gain * retain_out.float()
    X = torch.cat([forget_keys.float(), retain_keys.float()])
    return Rows(X, torch.cat([Yf, Yr]), forget_keys.shape[0])


TURN_STEPS = 100
"""Optimizer steps between two step boundaries inside an epoch (about a second on a CPU)."""


def fit_adamw(W0: torch.Tensor, rows: Rows, *, lr: float = 0.01, epochs: int = 20, batch_size: int = 64,
              gamma: float = 0.9, weight_decay: float = 0.01, gain: float = 1.0, seed: int = 0,
              dtype: torch.dtype | None = None, progress=None,
              between: Between | None = None) -> tuple[torch.Tensor, list[float]]:
    """Upstream's training of the estimated down_proj from W0 (m, n): the new weight (in
    `dtype`, W0's by default; upstream's is torch.bfloat16, see the module docstring: W0, the
    rows, the weight, the loss and AdamW's moments all in `dtype`) and each epoch's mean batch
    loss (upstream's printed "Loss"). The update the training made is W - W0.to(dtype): W0's
    own rounding to `dtype` is no part of it.
    between: a step boundary (`grom.turns`) after every epoch but the last, and every
    `TURN_STEPS` optimizer steps inside one (an epoch of the demo's 59k rows is ~900 steps):
    the weight trained is a copy, the model is as found there (and nothing else draws on
    the shuffle's generator, so the result does not depend on it)."""
    dtype = dtype or W0.dtype
    W = W0.detach().to(dtype).clone().requires_grad_(True)
    X, Y = rows.X.to(W.device, dtype), rows.Y.to(W.device, dtype)
    optimizer = torch.optim.AdamW([W], lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for epoch in range(epochs):
        order, total, batches = torch.randperm(X.shape[0], generator=g), 0.0, 0
        for step, start in enumerate(range(0, X.shape[0], batch_size)):
            if step and step % TURN_STEPS == 0:
                give(between)
            idx = order[start:start + batch_size].to(W.device)
            optimizer.zero_grad()
            loss = F.mse_loss(gain * (X[idx] @ W.T), Y[idx])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        scheduler.step()
        losses.append(total / max(batches, 1))
        if progress:
            progress((epoch + 1) / epochs, f"epoch {epoch + 1}/{epochs}: loss {losses[-1]:.4g}")
        if epoch + 1 < epochs:
            give(between)
    return W.detach(), losses


def closed_form_patch(forget_keys: torch.Tensor, retain_keys: torch.Tensor, direction: torch.Tensor,
                      coeff: float, *, gain: float = 1.0, rho: float = 1e-6) -> torch.Tensor:
    """The patch P (m, n) float64 that minimises the objective above (see the module
    docstring): `solve_update` with D = (coeff / g) r at every forget key, w_f = s, w_r = r."""
    Xf = forget_keys.double().T  # (n, s)
    Xr = retain_keys.double().T if retain_keys is not None and retain_keys.numel() else None
    s, r = Xf.shape[1], 0 if Xr is None else Xr.shape[1]
    D = ((coeff / gain) * direction.double())[:, None].expand(-1, s)
    return solve_update(Xf, Xr, D, w_r=float(r), w_f=float(s), rho=rho)


def mse(W: torch.Tensor, rows: Rows, gain: float = 1.0) -> float:
    """The objective L(W) over all rows, in float64."""
    return float(F.mse_loss(gain * (rows.X.double() @ W.double().T), rows.Y.double()))
