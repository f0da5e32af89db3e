"""Membership-inference attacks as pure score functions, their ROC AUC and MUSE's PrivLeak.

Every function mirrors OpenUnlearning (github.com/locuslab/open-unlearning at commit
d3d7cf9e6b3c125d16687d4232680d8d83548f1a, ``src/evals/metrics/mia/``: ``loss.py``,
``zlib.py``, ``min_k.py``, ``min_k_plus_plus.py``, ``reference.py``, ``utils.py``;
``src/evals/metrics/privacy.py``), sign convention included: a score is HIGHER for a text
the model finds LESS likely (more "holdout-like"), and :func:`mia_auc` labels forget 0,
holdout 1, so an AUC of 1 means every forget text is more likely than every holdout text
(memorised) and 0.5 means the attack cannot tell them apart.

Which tokens each attack reads, as upstream reads them (``grom.eval.runner`` yields both):

* LOSS, zlib and Reference read the mean NLL over EVERY labelled token, the final EOS
  included where the text is labelled with one (``utils.evaluate_probability``): pass
  ``TokenScores.logprobs`` (or ``TokenScores.avg_loss``).
* Min-K and Min-K++ read the labelled tokens WITHOUT the last one (``utils.tokenwise_logprobs``
  and ``tokenwise_vocab_logprobs`` drop it, "to ignore eos prediction"; on a raw MUSE text,
  which carries no EOS, that is the text's last token): pass the output of
  ``grom.eval.runner.tokenwise_logprobs`` (or ``TokenScores.without_last()``).

GradNorm is not here: it needs one backward pass per text, which the report does not pay.
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np

__all__ = ["loss_score", "zlib_score", "min_k_score", "min_k_plus_plus_score", "reference_score",
           "vocab_moments", "attack_scores", "mia_auc", "privacy_leakage", "MIA_ATTACKS"]

# OpenUnlearning adds this constant to PrivLeak's denominator; kept so values match.
_EPS = 1e-10
# Min-K++'s floor on the variance of the next-token log-prob (``min_k_plus_plus.py``).
_SIGMA2_FLOOR = 1e-6

MIA_ATTACKS = ("min_k", "min_k++", "loss", "zlib", "reference")
"""The attacks the report runs, by OpenUnlearning's names (``AllAttacks``); Reference needs
a second model, so `attack_scores` leaves it to the caller."""


def _vector(x: Any, name: str) -> np.ndarray:
    """1-D float64 array from a list / numpy array / torch tensor (empty allowed)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    arr = np.atleast_1d(np.asarray(x, dtype=np.float64))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def _check_k(k: float) -> None:
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be in (0, 1], got {k}")


def loss_score(token_logprobs) -> float:
    """LOSS attack score of one text: its mean token NLL, ``-mean(lp)`` over (T,) log-probs.

    Mirrors OpenUnlearning ``mia/loss.py`` ``LOSSAttack.compute_score`` (the ``avg_loss`` of
    ``evaluate_probability``: every labelled token, EOS included). No token is an error
    (upstream divides by zero and the AUC fails on the NaN).
    """
    lp = _vector(token_logprobs, "token_logprobs")
    if lp.size == 0:
        raise ValueError("no labelled token: the LOSS score of an empty text is undefined")
    return float(-lp.mean())


def zlib_score(token_logprobs, text: str) -> float:
    """zlib attack score: ``loss_score(lp) / len(zlib.compress(text.encode("utf-8")))``.

    Mirrors OpenUnlearning ``mia/zlib.py`` ``ZLIBAttack.compute_score``. ``text`` is the
    labelled tokens decoded with ``skip_special_tokens=True``
    (``utils.extract_target_texts_from_processed_data``), not the raw string. zlib at its
    default level, as upstream.
    """
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    return loss_score(token_logprobs) / len(zlib.compress(text.encode("utf-8")))


def min_k_score(token_logprobs, k: float = 0.4) -> float:
    """Min-K% Prob score of one text: ``-mean(lowest max(1, floor(k*T)) of the T log-probs)``.

    Mirrors OpenUnlearning ``mia/min_k.py`` ``MinKProbAttack.compute_score`` exactly, the
    ``num_k = max(1, int(T * k))`` and a score of 0 for an empty sequence included. The
    log-probs are those of ``tokenwise_logprobs`` (the last labelled token dropped: pass
    ``grom.eval.runner.tokenwise_logprobs``). k = 0.4 as OpenUnlearning's TOFU and MUSE
    configs set it (``mia_min_k.yaml``; the class's own default is 0.2).
    """
    _check_k(k)
    lp = _vector(token_logprobs, "token_logprobs")
    if lp.size == 0:
        return 0.0
    num_k = max(1, int(lp.size * k))
    return float(-np.mean(np.sort(lp)[:num_k]))


def vocab_moments(logprobs):
    """Mean and variance of the next-token log-prob under the model's own distribution, per
    position: ``mu = sum_v p_v log p_v``, ``sigma2 = sum_v p_v (log p_v)^2 - mu^2``.

    logprobs: (T, V) log-softmax rows, a torch tensor. Returns (mu, sigma2), each (T,), in
    the dtype given (the runner passes float32). Mirrors OpenUnlearning
    ``mia/min_k_plus_plus.py`` ``compute_score``, with the variance computed as
    ``sum_v p_v (log p_v - mu)^2``: the same number, without upstream's cancellation of two
    large sums, which in float32 on a flat distribution (log p near -log V) costs several
    digits of a small variance.
    """
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be (T, V), got shape {tuple(logprobs.shape)}")
    p = logprobs.exp()
    mu = (p * logprobs).sum(-1)
    sigma2 = (p * (logprobs - mu[:, None]).square()).sum(-1)
    return mu, sigma2


def min_k_plus_plus_score(token_logprobs, mu, sigma2, k: float = 0.4) -> float:
    """Min-K%++ score of one text: each token's log-prob standardised by the model's
    next-token distribution at that position, ``z_t = (lp_t - mu_t) / sqrt(max(sigma2_t,
    1e-6))``, then ``-mean(lowest max(1, floor(k*T)) z_t)``.

    token_logprobs, mu, sigma2: (T,), the positions of ``tokenwise_logprobs`` (last
    labelled token dropped), mu and sigma2 from :func:`vocab_moments`. Mirrors OpenUnlearning
    ``mia/min_k_plus_plus.py`` ``MinKPlusPlusAttack.compute_score`` (variance floor 1e-6,
    empty sequence 0).
    """
    _check_k(k)
    lp, m, s2 = _vector(token_logprobs, "token_logprobs"), _vector(mu, "mu"), _vector(sigma2, "sigma2")
    if not lp.shape == m.shape == s2.shape:
        raise ValueError(f"token_logprobs {lp.shape}, mu {m.shape} and sigma2 {s2.shape} differ in length")
    if lp.size == 0:
        return 0.0
    z = (lp - m) / np.sqrt(np.maximum(s2, _SIGMA2_FLOOR))
    num_k = max(1, int(z.size * k))
    return float(-np.mean(np.sort(z)[:num_k]))


def reference_score(avg_loss: float, reference_avg_loss: float) -> float:
    """Reference attack score: the attacked model's mean token NLL minus a reference model's
    on the same text (lower: the attacked model finds it likelier than a model that never saw it).
    Mirrors OpenUnlearning ``mia/reference.py`` ``ReferenceAttack.compute_score``; the report
    uses the retain model as the reference."""
    return float(avg_loss) - float(reference_avg_loss)


def attack_scores(scores, texts, *, k: float = 0.4) -> dict[str, np.ndarray]:
    """Every single-model attack's score of each text, from one teacher-forced pass.

    scores: one ``grom.eval.runner.TokenScores`` per text over ALL its labelled tokens (EOS
    included where labelled); Min-K and Min-K++ read its ``without_last()``, as upstream.
    texts: the labelled tokens decoded with ``skip_special_tokens=True`` (zlib's text).
    Returns {"loss", "zlib", "min_k"[, "min_k++" where the scores carry ``mu``/``sigma2``]}
    -> (n,) arrays.
    """
    if len(scores) != len(texts):
        raise ValueError(f"{len(scores)} scored texts but {len(texts)} decoded texts")
    cut = [s.without_last() for s in scores]
    out = {"loss": np.array([loss_score(s.logprobs) for s in scores]),
           "zlib": np.array([zlib_score(s.logprobs, t) for s, t in zip(scores, texts)]),
           "min_k": np.array([min_k_score(s.logprobs, k) for s in cut])}
    if all(s.mu is not None and s.sigma2 is not None for s in cut):
        out["min_k++"] = np.array([min_k_plus_plus_score(s.logprobs, s.mu, s.sigma2, k) for s in cut])
    return out


def mia_auc(forget_scores, holdout_scores) -> float:
    """Membership-inference ROC AUC: ``roc_auc_score(labels, scores)`` with forget -> 0,
    holdout -> 1.

    Mirrors OpenUnlearning ``mia/utils.mia_auc``. With this module's scores (higher = less
    likely) the AUC is 1 when every forget text is likelier than every holdout text, 0.5
    when indistinguishable.
    """
    from sklearn.metrics import roc_auc_score

    f, h = _vector(forget_scores, "forget_scores"), _vector(holdout_scores, "holdout_scores")
    if f.size == 0 or h.size == 0:
        raise ValueError(f"an AUC needs forget and holdout scores, got {f.size} and {h.size}")
    scores = np.concatenate([f, h])
    labels = np.concatenate([np.zeros(f.size, dtype=int), np.ones(h.size, dtype=int)])
    return float(roc_auc_score(labels, scores))


def privacy_leakage(auc, reference_auc, *, convention: str = "openunlearning") -> float:
    """MUSE PrivLeak (percent): relative MIA-AUC gap to the retain (reference) model.

        a = 1 - auc, r = 1 - reference_auc      (convention "openunlearning", default)
        a = auc,     r = reference_auc          (convention "muse")
        PrivLeak = (a - r) / (r + 1e-10) * 100

    Mirrors OpenUnlearning ``privacy.privleak``: their AUCs (:func:`mia_auc`) are
    1 - MUSE's, so privleak first maps both back to MUSE's convention and then applies
    MUSE's (AUC_unlearn - AUC_retrain) / AUC_retrain. Pass AUCs from :func:`mia_auc`
    with the default convention. 0 is ideal; OpenUnlearning's default reference when no
    retain-model logs exist is an AUC of 0.5. Degenerate reference (r = 0, i.e. a
    reference OpenUnlearning-AUC of 1): upstream's 1e-10 keeps it finite, so the result
    is 0 when a = 0 and ~1e12 * a otherwise; we keep that behaviour.
    """
    vals = []
    for v, name in ((auc, "auc"), (reference_auc, "reference_auc")):
        arr = _vector(v, name)
        if arr.size != 1 or not 0.0 <= arr[0] <= 1.0:
            raise ValueError(f"{name} must be one number in [0, 1], got {v!r}")
        vals.append(float(arr[0]))
    a0, r0 = vals
    if convention == "openunlearning":
        a, r = 1.0 - a0, 1.0 - r0
    elif convention == "muse":
        a, r = a0, r0
    else:
        raise ValueError(f"convention must be 'openunlearning' or 'muse', got {convention!r}")
    return (a - r) / (r + _EPS) * 100.0
