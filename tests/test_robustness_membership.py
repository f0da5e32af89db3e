"""The membership attacks of the suite ("mia"): each AUC equals one computed here from
first principles (every token's log-probability from the logits, the AUC as the share of
forget/holdout pairs the score orders right), the edited side differs from the base, the
model is left unedited, and the suite refuses or skips mia without a holdout."""
from __future__ import annotations

import math

import pytest
import torch

from grom.closed_form.config import EditConfig
from grom.closed_form.pipeline import run_edit
from grom.data import QAExample
from grom.eval.runner import encode_pair
from grom.robustness.membership import holdout_of, membership_attack
from grom.robustness.result import Probe
from grom.robustness.suite import run_attacks
from tests.conftest import FORGET, RETAIN

HOLDOUT = RETAIN + [QAExample("Where did Odo Brask live?", "Odo Brask lived in Quenford.")]
PROBES = tuple(Probe(ex.question, ex.answer, ex.answer.split()[-1].rstrip("."), id=f"p/{i}")
               for i, ex in enumerate(FORGET))


@pytest.fixture(scope="module")
def edited(trained_llama, tokenizer):
    edit = run_edit(trained_llama, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0, w_r=10.0))
    return trained_llama, tokenizer, edit


@torch.no_grad()
def _mean_nll(model, tok, rows) -> list[float]:
    """Mean negative log-likelihood of each answer's tokens (EOS included) after its
    chat-formatted question, one unpadded forward pass per row."""
    out = []
    for r in rows:
        ids, start = encode_pair(tok, r.question, r.answer, None)
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        lp = [logp[t - 1, ids[t]].item() for t in range(start, len(ids))]
        out.append(-sum(lp) / len(lp))
    return out


def _pairwise_auc(forget: list[float], holdout: list[float]) -> float:
    """P(holdout score > forget score) + half the ties: the ROC AUC with forget 0, holdout 1."""
    wins = sum((h > f) + 0.5 * (h == f) for f in forget for h in holdout)
    return wins / (len(forget) * len(holdout))


def test_the_loss_attack_auc_is_the_pairwise_share_from_the_logits(edited):
    model, tok, edit = edited
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = membership_attack(model, tok, edit, FORGET, PROBES, HOLDOUT)
    base = _pairwise_auc(_mean_nll(model, tok, FORGET), _mean_nll(model, tok, HOLDOUT))
    with edit.applied(model):
        after = _pairwise_auc(_mean_nll(model, tok, FORGET), _mean_nll(model, tok, HOLDOUT))
    auc = r.details["auc"]
    assert (auc["fitted"]["loss"]["base"] == pytest.approx(base)
            and auc["fitted"]["loss"]["edited"] == pytest.approx(after))
    assert set(auc) == {"fitted", "probes"} and set(auc["fitted"]) == {"loss", "zlib", "min_k", "min_k++"}
    assert (r.base, r.edited) == (auc["fitted"]["min_k"]["base"], auc["fitted"]["min_k"]["edited"])
    assert r.details["leak"]["fitted"]["edited"] == pytest.approx(abs(r.edited - 0.5))
    assert (r.details["n_fitted"], r.details["n_holdout"], r.n) == (len(FORGET), len(HOLDOUT), len(FORGET))
    # the edit pushed the forget answers away: they became less likely than the holdout's
    assert auc["fitted"]["loss"]["edited"] < auc["fitted"]["loss"]["base"]
    assert not edit.is_applied and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_without_a_holdout_mia_is_skipped_in_all_and_refused_by_name(edited, monkeypatch):
    model, tok, edit = edited
    r = membership_attack(model, tok, edit, FORGET, PROBES, HOLDOUT[:1])
    assert math.isnan(r.edited) and "no held-out answers" in r.details["skipped"]
    with pytest.raises(ValueError, match="mia compares the fitted forget answers with held-out answers"):
        run_attacks(model, tok, edit, PROBES, fitted=FORGET, attacks="heldout,mia")
    out = run_attacks(model, tok, edit, PROBES, fitted=FORGET, holdout=HOLDOUT, attacks=["mia"])
    assert list(out) == ["mia"] and out["mia"].seconds > 0 and out["mia"].to_dict()["measure"] == "auc"


def test_the_holdout_is_the_benchmarks_neighbours_else_its_general_else_retain():
    n, g = (QAExample("a?", "A."),), (QAExample("b?", "B."),)
    assert holdout_of({"neighbours": n, "general": g}, RETAIN) == n
    assert holdout_of({"general": g}, RETAIN) == g
    assert holdout_of({}, RETAIN) == tuple(RETAIN)
