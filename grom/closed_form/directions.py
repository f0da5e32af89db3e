"""The directions `D` (m, s): what each forget key's output should move by.

- token suppression, ``d_j = -beta * alpha_j * u_j`` with `u_j` the unit LM-head row of
  the gold token (down_proj / o_proj), or the one-hot `e_{g_j}` (LM head, kept sparse:
  a vocab x s matrix is never built);
- representation corruption, ``d_j = c * u`` for one seeded random unit vector `u`;
- refusal (token promotion), ``d_j = +beta * v_j`` with `v_j` the unit vector along
  ``w_{g_j} - mean_v w_v``, `g_j` the refusal's next token (`grom.closed_form.refusal`), or the one-hot
  ``+e_{g_j}`` at the LM head (`promotion_directions`, `head_promotion_directions`).

`alpha` is the specificity weight: tokens as frequent in the retain answers as in the
forget answers get little push, so shared words ("the", "was") are left alone.

(Was `grom/targets.py`. Its `Target`, `as_target` and `*_target` builders are now `Directions`,
`as_directions` and `*_directions`: "target" names the objective (suppression, corruption,
refusal) only.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def specificity_weights(forget_tokens: torch.Tensor, retain_tokens: torch.Tensor,
                        vocab_size: int) -> torch.Tensor:
    """alpha(v) = max(0, 1 - rf(v) / ff(v)), (vocab_size,) float32.

    ff, rf: relative frequency of token v among all forget (retain) gold tokens. A token
    absent from the forget tokens gets 0 (it is never a forget target anyway); with no
    retain tokens every forget token gets 1.
    """
    ff = torch.bincount(forget_tokens.long().flatten(), minlength=vocab_size).double()
    rf = torch.bincount(retain_tokens.long().flatten(), minlength=vocab_size).double()
    ff = ff / ff.sum().clamp_min(1)
    rf = rf / rf.sum().clamp_min(1)
    ratio = torch.where(ff > 0, rf / ff.clamp_min(1e-300), torch.ones_like(ff))
    return (1 - ratio).clamp_min(0).float()


@dataclass(frozen=True)
class Directions:
    """The target D (m, s), dense or as scaled one-hot columns.

    Exactly one of `dense` (m, s) or the pair `rows` (s,) / `coef` (s,) is set; in the
    sparse form column j is ``coef[j] * e_{rows[j]}``.
    """

    m: int
    dense: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    coef: torch.Tensor | None = None

    @property
    def s(self) -> int:
        return self.dense.shape[1] if self.dense is not None else self.rows.numel()

    def right_product(self, X: torch.Tensor, chunk: int = 8192, out: torch.Tensor | None = None) -> torch.Tensor:
        """D X^T in float64, (m, n), for keys X (n, s); chunked over the s columns. With
        `out` (m, n) float64, the product is added to it in place (and returned)."""
        if out is None:
            out = torch.zeros(self.m, X.shape[0], dtype=torch.float64, device=X.device)
        for i in range(0, self.s, chunk):
            Xc = X[:, i:i + chunk].double()
            if self.dense is not None:
                out += self.dense[:, i:i + chunk].to(X.device, torch.float64) @ Xc.T
            else:
                coef = self.coef[i:i + chunk].to(X.device, torch.float64)
                out.index_add_(0, self.rows[i:i + chunk].to(X.device), (Xc * coef).T)
        return out

    def columns(self, idx: torch.Tensor) -> torch.Tensor:
        """D[:, idx] as a dense float64 matrix, (m, len(idx))."""
        if self.dense is not None:
            return self.dense[:, idx.to(self.dense.device)].double()
        out = torch.zeros(self.m, idx.numel(), dtype=torch.float64, device=self.rows.device)
        ar = torch.arange(idx.numel(), device=self.rows.device)
        out[self.rows[idx], ar] = self.coef[idx].double()
        return out

    def subset(self, idx: torch.Tensor) -> "Directions":
        if self.dense is not None:
            return Directions(self.m, dense=self.dense[:, idx])
        return Directions(self.m, rows=self.rows[idx], coef=self.coef[idx])

    def to(self, device) -> "Directions":
        f = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Directions(self.m, f(self.dense), f(self.rows), f(self.coef))


def as_directions(D) -> Directions:
    """Accept a dense (m, s) tensor or a Directions."""
    return D if isinstance(D, Directions) else Directions(D.shape[0], dense=D)


def suppression_directions(gold: torch.Tensor, alpha: torch.Tensor, unembed: torch.Tensor,
                           beta: float) -> Directions:
    """Token suppression for down_proj / o_proj: d_j = -beta alpha_j u_j, (m, s).

    gold (s,) gold token ids; alpha (s,) their weights; unembed (vocab, m) LM head.
    """
    rows = unembed[gold.to(unembed.device)].double()
    u = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    d = -beta * alpha.to(u.device, torch.float64)[:, None] * u
    return Directions(unembed.shape[1], dense=d.T.float().contiguous())


def head_suppression_directions(gold: torch.Tensor, alpha: torch.Tensor, vocab_size: int,
                                beta: float) -> Directions:
    """Token suppression for the LM head: d_j = -beta alpha_j e_{g_j}, kept sparse."""
    return Directions(vocab_size, rows=gold.long(), coef=(-beta * alpha.double()).float())


def corruption_direction(m: int, seed: int) -> torch.Tensor:
    """One fixed random unit vector (m,), from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(m, generator=g, dtype=torch.float64)
    return (u / u.norm()).float()


def corruption_directions(s: int, m: int, c: float, seed: int) -> Directions:
    """Representation corruption: every column is c * u, (m, s)."""
    u = corruption_direction(m, seed)
    return Directions(m, dense=(c * u)[:, None].expand(m, s).contiguous())


def promotion_directions(gold: torch.Tensor, unembed: torch.Tensor, beta: float,
                         w_bar: torch.Tensor | None = None) -> Directions:
    """Token promotion (the refusal target) for down_proj / o_proj: d_j = beta v_j, (m, s),
    with v_j the unit vector along ``w_{g_j} - w_bar``, w_bar the mean LM-head row.

    gold (s,) the token each key should predict next; unembed (vocab, m) LM head; w_bar
    (m,) its mean row if already known (`mean_row`; computed here otherwise).

    Why centred: read through the logit lens (the final norm taken as a fixed scale), a
    change d of the residual moves log p(g) by ``<w_g - sum_v p_v w_v, d>`` to first order,
    so the steepest direction toward g is ``w_g - E_p[w]``. The model's own p at each key
    would need its logits at every forget position (one more pass, an (s, m) store, which
    the batch-summed system avoids); ``w_bar`` is that expectation under a uniform p, one
    m-vector for the whole edit. The plain row ``w_g`` (suppression's direction, sign
    flipped) also carries the component every row shares, which lifts a whole family of
    tokens along with g; the centred direction lifts g against the average token.
    """
    w_bar = mean_row(unembed) if w_bar is None else w_bar
    v = unembed[gold.to(unembed.device)].double() - w_bar.to(unembed.device, torch.float64)
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return Directions(unembed.shape[1], dense=(beta * v).T.float().contiguous())


def mean_row(unembed: torch.Tensor) -> torch.Tensor:
    """The mean LM-head row w_bar (m,), float64, without a float64 copy of the head."""
    return unembed.sum(0, dtype=torch.float64) / unembed.shape[0]


def head_promotion_directions(gold: torch.Tensor, vocab_size: int, beta: float) -> Directions:
    """Token promotion for the LM head: d_j = +beta e_{g_j}, kept sparse. (The centred
    ``e_g - 1/V`` differs by a shift of every logit, which no softmax sees.)"""
    return Directions(vocab_size, rows=gold.long(), coef=torch.full((gold.numel(),), float(beta)))
