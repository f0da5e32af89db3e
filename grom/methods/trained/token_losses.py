"""The token-level forget losses of OpenUnlearning's newer methods (UNDIAL, WGA, SatImp,
CE-U, PDU) and of RKLD: pure functions of the logits and HF-style labels.

``logits`` (B, T, V) and ``labels`` (B, T) unshifted, -100 where there is no loss, as in
grom.methods.trained.losses: the logits at position t - 1 predict ``labels[b, t]``. Each is taken
in float32. Transcribed from github.com/locuslab/open-unlearning at commit
d3d7cf9e6b3c125d16687d4232680d8d83548f1a: src/trainer/utils.py (``compute_undial_loss``,
``compute_wga_loss``, ``compute_satimp_loss``), src/trainer/unlearn/ceu.py
(``compute_batch_ceu``), src/trainer/unlearn/pdu.py (``PDU.compute_loss``). With
``l_t = -log p(y_t)`` the per-token NLL over the answer tokens (the valid positions):

- UNDIAL:  ``mean over every position of CE(softmax(z_ref - beta * onehot(y)), z)``
- WGA:     ``-mean_t[ p(y_t)^beta * l_t ]`` (weights detached)
- SatImp:  ``-mean_t[ p(y_t)^beta1 (1 - p(y_t))^beta2 * l_t ]`` (weights detached)
- CE-U:    ``mean_t CE(softmax(z_t with z_t[y_t] = -inf), z_t)`` (the soft labels detached), the first
           `ignore_first` answer tokens of each sequence left out
- PDU:     ``mean_t (max_v z_t,v - mean_v z_t,v)^2``
- RKLD:    ``mean_t KL(q_t || softmax(z_ref,t - beta * onehot(y_t)))``, q_t = softmax(z_t)
           (OpenUnlearning has no RKLD; see `rkld_loss`)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from grom.methods.trained.losses import IGNORE_INDEX


def _shift(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T-1, V) float32 logits and the (B, T-1) labels they predict."""
    return logits[:, :-1, :].float(), labels[:, 1:].to(logits.device)


def _token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL of the valid positions, (N,), and the valid mask (B, T-1)."""
    z, y = _shift(logits, labels)
    valid = y != IGNORE_INDEX
    return F.cross_entropy(z[valid], y[valid], reduction="none"), valid


def _empty(logits: torch.Tensor) -> torch.Tensor:
    """A zero that keeps the graph, for a batch with no answer token (upstream: nan)."""
    return logits.float().sum() * 0.0


def undial_loss(logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor,
                beta: float) -> torch.Tensor:
    """UNDIAL's self-distillation: cross-entropy to the unedited model's distribution with
    the answer token's logit lowered by `beta`, averaged over every position (prompt and
    padding included, as upstream). ref_logits (B, T, V), no grad.

    One deliberate difference: upstream builds the lowering mask by indexing with the raw
    shifted labels, so at every position without a label (-100) it lowers the logit of
    token V - 100 (negative indexing); here positions without a label keep the teacher's
    distribution unchanged.
    """
    z, y = _shift(logits, labels)
    teacher = ref_logits[:, :-1, :].to(z.device).float()
    valid = y != IGNORE_INDEX
    lowered = teacher.clone()
    b, t = valid.nonzero(as_tuple=True)
    lowered[b, t, y[b, t]] -= beta
    soft = F.softmax(lowered, dim=-1)  # the soft labels
    return -(soft * F.log_softmax(z, dim=-1)).sum(-1).mean()


def wga_loss(logits: torch.Tensor, labels: torch.Tensor, beta: float) -> torch.Tensor:
    """WGA: gradient ascent with each answer token weighted by its own probability to the
    power `beta` (detached), ``-mean(p^beta * nll)``."""
    nll, _ = _token_nll(logits, labels)
    if nll.numel() == 0:
        return _empty(logits)
    w = torch.exp(-nll.detach()) ** beta
    return -(w * nll).mean()


def satimp_loss(logits: torch.Tensor, labels: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """SatImp: gradient ascent weighted by ``p^beta1 (1 - p)^beta2`` (detached)."""
    nll, _ = _token_nll(logits, labels)
    if nll.numel() == 0:
        return _empty(logits)
    p = torch.exp(-nll.detach())
    return -((p ** beta1) * ((1 - p) ** beta2) * nll).mean()


def ceu_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_first: int = 1) -> torch.Tensor:
    """CE-U: cross-entropy to the model's own (detached) distribution with the answer token
    removed, at every answer position but the first `ignore_first` of each sequence."""
    valid = labels != IGNORE_INDEX
    first = (valid.cumsum(dim=-1) <= int(ignore_first)) & valid
    kept = labels.masked_fill(first, IGNORE_INDEX)
    z, y = _shift(logits, kept)
    mask = y != IGNORE_INDEX
    if not bool(mask.any()):
        return _empty(logits)
    zv, yv = z[mask], y[mask]
    soft = zv.detach().clone()  # the soft labels' logits: the gold token's taken out
    soft.scatter_(-1, yv.unsqueeze(-1), float("-inf"))
    return -(F.softmax(soft, dim=-1) * F.log_softmax(zv, dim=-1)).sum(-1).mean()


def pdu_forget_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """PDU's forget term: the squared gap between the largest and the mean logit, averaged
    over the positions that predict answer tokens (pushes those distributions flat).

    One deliberate difference: upstream masks the unshifted logits with the unshifted
    labels (the position holding an answer token, which predicts the token after it);
    here the positions are those that predict the answer tokens, as in every other loss.
    """
    z, y = _shift(logits, labels)
    mask = y != IGNORE_INDEX
    if not bool(mask.any()):
        return _empty(logits)
    zv = z[mask]
    return ((zv.max(dim=-1).values - zv.mean(dim=-1)) ** 2).mean()


def rmu_activation_loss(h: torch.Tensor, control: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """RMU's activation distance: per sequence, the squared error averaged over the hidden
    size and summed over its labelled positions, divided by their number; then the mean
    over the batch. h (B, T, d), control (B, T, d) or broadcastable (the forget side's scaled
    random control vector, or the frozen model's activations on the retain side), labels (B, T).

    As ``RMU.compute_activation_loss`` (src/trainer/unlearn/rmu.py at d3d7cf9e): the mask
    is the unshifted ``labels != -100`` (the positions holding answer tokens), upstream's
    choice, kept. In float32.
    """
    mask = (labels != IGNORE_INDEX).to(h.device)
    sq = (h.float() - control.to(h.device).float()) ** 2
    per_seq = (sq.mean(-1) * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    return per_seq.mean()


def rkld_loss(logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor,
              beta: float) -> torch.Tensor:
    """RKLD's forget term (Wang et al. 2024, arXiv 2406.01983): the reverse KL from the
    model's next-token distribution q to a teacher's p, ``sum_v q_v (log q_v - log p_v)``,
    averaged over the positions that predict answer tokens. ref_logits (B, T, V), no grad.

    The teacher: the paper's is the original model's logits minus a multiple of the part
    by which a model further trained on the forget set ("strengthened") raises them,
    ``z_ref - a * relu(z_strong - z_ref)``, which needs a second training run. Here the
    raise is taken to fall on the answer token alone, by `beta`: ``p = softmax(z_ref -
    beta * onehot(y))``, UNDIAL's teacher. Continued training on an answer raises its
    token's logit and lowers the others (which the relu drops), so this keeps the
    teacher's direction without the run; what it loses are the raises of other tokens
    that the strengthened model would also have learned (a paraphrase's first token).
    Unlike UNDIAL (forward cross-entropy at every position), the student's own
    distribution weighs the divergence, and only the answer positions count.
    """
    z, y = _shift(logits, labels)
    valid = y != IGNORE_INDEX
    if not bool(valid.any()):
        return _empty(logits)
    teacher = ref_logits[:, :-1, :].to(z.device).float()[valid]  # (N, V)
    yv = y[valid]
    teacher[torch.arange(len(yv), device=z.device), yv] -= beta
    log_q, log_p = F.log_softmax(z[valid], dim=-1), F.log_softmax(teacher, dim=-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1).mean()
