"""The losses of the gradient unlearning baselines, as OpenUnlearning defines them.

Pure tensor functions. `labels` are HF-style, unshifted: ``labels[b, t]`` is the token that
position ``t - 1`` should predict, and -100 marks positions without a loss (the prompt, the
padding, position 0). Reference: github.com/locuslab/open-unlearning,
``src/trainer/utils.py`` (``compute_batch_nll``, ``compute_dpo_loss``) and
``src/trainer/unlearn/{grad_ascent,grad_diff,npo,simnpo}.py``.

With ``nll_i`` the summed negative log-likelihood of sequence i's label tokens, ``n_i``
their number, and ``NLL(batch) = sum_i nll_i / sum_i n_i`` (the token mean, what
``model(**inputs).loss`` gives):

- GA:       ``-NLL(forget)``
- GradDiff: ``gamma * -NLL(forget) + alpha * NLL(retain)``
- NPO:      ``gamma * mean_i[ -(2/beta) logsigmoid(beta (nll_i - nll_ref_i)) ] + alpha * NLL(retain)``
            (``= (2/beta) log(1 + (pi/pi_ref)^beta)`` per sequence)
- SimNPO:   ``gamma * mean_i[ -(2/beta) logsigmoid(beta (nll_i / n_i - delta)) ] + alpha * NLL(retain)``

With ``retain_loss="kl"`` (upstream ``retain_loss_type: KL``) the retain term of GradDiff,
NPO and SimNPO is `kl_to_reference` instead of ``NLL(retain)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def sequence_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of each sequence's label tokens and their number, (B,) and (B,).

    logits (B, T, V), labels (B, T) unshifted with -100 where there is no loss; the
    logits are taken in float32 (as HF's loss does). As ``compute_batch_nll`` upstream.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:].to(logits.device)
    nll = F.cross_entropy(shift_logits.transpose(1, 2), shift_labels, ignore_index=IGNORE_INDEX,
                          reduction="none").sum(-1)
    return nll, (shift_labels != IGNORE_INDEX).sum(-1)


def mean_nll(nll: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The token-mean NLL of a batch (``model(**inputs).loss``), from `sequence_nll`."""
    return nll.sum() / counts.sum().clamp_min(1)


def ga_loss(nll: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Gradient ascent on the forget batch: ``-NLL``."""
    return -mean_nll(nll, counts)


def npo_loss(nll: torch.Tensor, ref_nll: torch.Tensor, beta: float) -> torch.Tensor:
    """NPO on the forget batch: ``-(2/beta) mean logsigmoid(beta (nll - nll_ref))``.

    nll, ref_nll (B,) summed sequence NLLs of the model and of the reference model. As
    ``compute_dpo_loss(win_inputs=None, lose_inputs=forget)``: the lose log-ratio is
    ``log pi - log pi_ref = nll_ref - nll`` and the loss ``-2/beta logsigmoid(-beta * ratio)``.
    """
    lose_log_ratio = -(nll - ref_nll.to(nll.device, nll.dtype))
    return -2.0 / beta * F.logsigmoid(beta * (0.0 - lose_log_ratio)).mean()


def simnpo_loss(nll: torch.Tensor, counts: torch.Tensor, beta: float, delta: float) -> torch.Tensor:
    """SimNPO on the forget batch: ``-(2/beta) mean logsigmoid(beta (nll / n - delta))``,
    the length-normalised, reference-free NPO."""
    avg = nll / counts.to(nll.dtype) - delta
    return -F.logsigmoid(beta * avg).mean() * 2.0 / beta


def kl_to_reference(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """``sum_{b,t} KL(p_ref(.|b,t) || p(.|b,t)) / (B * T)``: the KL from the unedited
    model's next-token distributions to the trained model's, averaged over every position.

    logits, ref_logits (B, T, V). As OpenUnlearning's ``compute_kl_divergence``
    (src/trainer/utils.py at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: ``kl_div(log p,
    log p_ref, reduction="batchmean", log_target=True)`` on the (B*T, V) view), so every
    position counts, the prompt's and the padding's included, as upstream. One deliberate
    difference: the log-softmax is taken in float32 (upstream: in the logits' dtype, bf16
    for its models), so the term does not round to bf16's 8 bits.
    """
    B, T, V = logits.shape
    logp = F.log_softmax(logits.float(), dim=-1).reshape(B * T, V)
    logq = F.log_softmax(ref_logits.to(logits.device).float(), dim=-1).reshape(B * T, V)
    return F.kl_div(logp, logq, reduction="batchmean", log_target=True)


def dpo_loss(win_nll: torch.Tensor, win_ref_nll: torch.Tensor, lose_nll: torch.Tensor,
             lose_ref_nll: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO with the alternate answer as the winner and the forget answer as the loser:
    ``-(2/beta) mean logsigmoid(beta (win_ratio - lose_ratio))``, each ratio
    ``log pi - log pi_ref = nll_ref - nll`` of the summed sequence NLLs, (B,) each.

    As ``compute_dpo_loss(win_inputs=alternate, lose_inputs=forget)`` (src/trainer/utils.py
    at d3d7cf9e6b3c125d16687d4232680d8d83548f1a), OpenUnlearning's IDK-DPO; its 2/beta
    scale makes it NPO when the winner is dropped.
    """
    win = win_ref_nll.to(win_nll.device, win_nll.dtype) - win_nll
    lose = lose_ref_nll.to(lose_nll.device, lose_nll.dtype) - lose_nll
    return -2.0 / beta * F.logsigmoid(beta * (win - lose)).mean()
