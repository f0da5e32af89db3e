"""The paper's other trained comparators (grom.methods.trained): each loss against
values computed by hand with loops on tiny tensors, and each method end to end through
run_baseline on the tiny model (model unchanged, an Edit, finite losses)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from grom import Edit
from grom.data.schema import QAExample, TextExample
from grom.methods import IDK_ANSWERS, METHODS, answer_nll, get_method, idk_alternates, run_baseline
from grom.methods.trained.losses import dpo_loss, npo_loss
from grom.methods.trained.method import LossInputs
from grom.methods.trained.pdu import pdu
from grom.methods.trained.settings import resolve_settings
from grom.methods.trained.token_losses import (
    ceu_loss,
    pdu_forget_loss,
    rmu_activation_loss,
    satimp_loss,
    undial_loss,
    wga_loss,
)
from tests.conftest import FORGET, RETAIN
from tests.test_baselines import assert_same, snapshot

FAST = dict(lr=1e-3, max_steps=6, batch_size=2, grad_accum=1, warmup_epochs=0)
NEW = ("idknll", "idkdpo", "undial", "wga", "satimp", "ceu", "pdu", "rmu", "taskvector", "altpo", "rkld")
# RMU on the 4-layer tiny model: layer 1's activations, layers 0-1's down_proj trained; AltPO:
# 2 alternates of 8 new tokens per question
TINY = {"rmu": dict(method_args={"layer": 1.0}, params=[".layers.0.mlp.down_proj", ".layers.1.mlp.down_proj"]),
        "altpo": dict(method_args={"n_alternates": 2.0, "max_new_tokens": 8.0})}

# one batch of two sequences, V = 4; labels unshifted (label t predicted at position t - 1)
torch.manual_seed(0)
LOGITS = torch.randn(2, 4, 4)
REF = torch.randn(2, 4, 4)
LABELS = torch.tensor([[-100, 2, 1, 3], [-100, -100, 0, -100]])
VALID = [(0, 0, 2), (0, 1, 1), (0, 2, 3), (1, 1, 0)]  # (b, position, the token it predicts)


def softmax(row):
    e = [math.exp(v) for v in row]
    return [v / sum(e) for v in e]


def prob(b, t, y):
    return softmax(LOGITS[b, t].tolist())[y]


# ----------------------------------------------------------------------------- losses by hand

def test_idk_dpo_loss_by_hand_and_npo_without_a_winner():
    win, win_ref = torch.tensor([3.0, 2.0]), torch.tensor([4.0, 2.5])
    lose, lose_ref = torch.tensor([1.0, 6.0]), torch.tensor([1.5, 5.0])
    beta = 0.5
    want = sum(-(2 / beta) * math.log(1 / (1 + math.exp(-beta * ((wr - w) - (lr - x)))))
               for w, wr, x, lr in zip(win.tolist(), win_ref.tolist(), lose.tolist(), lose_ref.tolist())) / 2
    assert float(dpo_loss(win, win_ref, lose, lose_ref, beta)) == pytest.approx(want, rel=1e-6)
    # a winner whose ratio is 0 leaves NPO (upstream's compute_dpo_loss with win_inputs=None)
    assert float(dpo_loss(win, win, lose, lose_ref, beta)) == pytest.approx(float(npo_loss(lose, lose_ref, beta)))


def test_wga_and_satimp_by_hand():
    p = [prob(b, t, y) for b, t, y in VALID]
    beta, b1, b2 = 2.0, 5.0, 1.0
    want_wga = -sum(q ** beta * -math.log(q) for q in p) / len(p)
    want_sat = -sum(q ** b1 * (1 - q) ** b2 * -math.log(q) for q in p) / len(p)
    assert float(wga_loss(LOGITS, LABELS, beta)) == pytest.approx(want_wga, rel=1e-5)
    assert float(satimp_loss(LOGITS, LABELS, b1, b2)) == pytest.approx(want_sat, rel=1e-5)
    # the weights are detached: the gradient is the weighted gradient of the NLL
    z = LOGITS.clone().requires_grad_(True)
    wga_loss(z, LABELS, 0.0).backward()
    ga = LOGITS.clone().requires_grad_(True)
    F.cross_entropy(ga[:, :-1].reshape(-1, 4), LABELS[:, 1:].reshape(-1), ignore_index=-100).neg().backward()
    assert torch.allclose(z.grad, ga.grad, atol=1e-6)  # beta 0: plain gradient ascent


def test_undial_by_hand_every_position_counts():
    beta = 3.0
    total = 0.0
    for b in range(2):
        for t in range(3):  # every shifted position, prompt and padding included
            row = REF[b, t].tolist()
            y = LABELS[b, t + 1].item()
            if y != -100:
                row[y] -= beta
            target = softmax(row)
            logq = [math.log(q) for q in softmax(LOGITS[b, t].tolist())]
            total += -sum(p * lq for p, lq in zip(target, logq))
    assert float(undial_loss(LOGITS, REF, LABELS, beta)) == pytest.approx(total / 6, rel=1e-5)


def upstream_undial(logits, ref_logits, labels, beta):
    """My transcription of OpenUnlearning's compute_undial_loss (src/trainer/utils.py at
    d3d7cf9e): a mask built from the raw shifted labels (so -100 lowers token V - 100)."""
    y, z, t = labels[..., 1:], logits[..., :-1, :], ref_logits[..., :-1, :]
    mask = torch.zeros_like(t)
    mask[torch.arange(2).view(-1, 1, 1), torch.arange(z.shape[1]).view(1, -1, 1), y.unsqueeze(-1)] = 1.0
    soft = F.softmax(t - mask * beta, dim=-1)
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), soft.reshape(-1, z.shape[-1]), reduction="none").mean()


def test_undial_matches_upstream_where_every_position_has_a_label():
    torch.manual_seed(1)
    logits, ref = torch.randn(2, 5, 200), torch.randn(2, 5, 200)
    labels = torch.randint(0, 200, (2, 5))
    labels[:, 0] = -100  # never read: position 0's label is predicted by nothing
    assert float(undial_loss(logits, ref, labels, 10.0)) == pytest.approx(
        float(upstream_undial(logits, ref, labels, 10.0)), rel=1e-5)


def test_ceu_by_hand_skips_the_first_answer_token():
    # ignore_first 1: sequence 0 keeps positions 1 and 2 (labels 1, 3); sequence 1 keeps none
    total = 0.0
    for b, t, y in VALID[1:3]:
        row = LOGITS[b, t].tolist()
        target = softmax([v if k != y else -math.inf for k, v in enumerate(row)])
        logq = [math.log(q) for q in softmax(row)]
        total += -sum(p * lq for p, lq in zip(target, logq) if p > 0)
    assert float(ceu_loss(LOGITS, LABELS, 1)) == pytest.approx(total / 2, rel=1e-5)
    full = sum(-sum(p * math.log(q) for p, q in zip(
        softmax([v if k != y else -math.inf for k, v in enumerate(LOGITS[b, t].tolist())]),
        softmax(LOGITS[b, t].tolist())) if p > 0) for b, t, y in VALID) / 4
    assert float(ceu_loss(LOGITS, LABELS, 0)) == pytest.approx(full, rel=1e-5)
    assert float(ceu_loss(LOGITS, LABELS, 5)) == 0.0  # no token left: 0, not nan


def test_pdu_forget_term_and_dual_update_by_hand():
    want = sum((max(LOGITS[b, t].tolist()) - sum(LOGITS[b, t].tolist()) / 4) ** 2 for b, t, _ in VALID) / 4
    assert float(pdu_forget_loss(LOGITS, LABELS)) == pytest.approx(want, rel=1e-5)
    args = {"gamma": 2.0, "alpha": 1.0, "retain_loss_eps": 0.5, "dual_step_size": 0.1,
            "dual_warmup_epochs": 1.0, "primal_dual": 1.0}
    state: dict = {}
    r_nll, r_counts = torch.tensor([3.0, 1.0]), torch.tensor([2, 2])  # retain NLL 1.0

    def step(epoch):
        x = LossInputs(torch.zeros(2), torch.ones(2), r_nll, r_counts, None, args,
                       forget_logits=LOGITS, forget_labels=LABELS, state=state, epoch=epoch)
        return float(pdu(x)[0])

    assert step(0) == pytest.approx(2 * want + 1.0 * 0.5)  # in warm-up: lambda stays 1
    assert state["retain_preference"] == 1.0
    assert step(1) == pytest.approx(2 * want + 1.0 * 0.5)  # uses lambda before the update
    assert state["retain_preference"] == pytest.approx(1.05)
    assert step(1) == pytest.approx(2 * want + 1.05 * 0.5)


def test_idk_alternates_are_seeded_varied_and_our_own():
    assert len(IDK_ANSWERS) >= 30 and len(set(IDK_ANSWERS)) == len(IDK_ANSWERS)
    qs = [QAExample(f"question {i}?", "answer") for i in range(40)]
    a, b = idk_alternates(qs, 0), idk_alternates(qs, 0)
    assert a == b and a != idk_alternates(qs, 1)
    assert [x.question for x in a] == [q.question for q in qs]
    assert all(x.answer in IDK_ANSWERS for x in a) and len({x.answer for x in a}) > 10
    with pytest.raises(ValueError, match="question/answer"):
        idk_alternates([TextExample("text")], 0)


# ----------------------------------------------------------------------------- end to end

def test_every_new_method_is_registered_with_a_row():
    assert set(NEW) <= set(METHODS)
    assert get_method("IDKDPO").label == "IDK-DPO" and METHODS["idkdpo"].needs_answers
    assert METHODS["undial"].needs_reference_logits and not METHODS["undial"].uses_retain(METHODS["undial"].defaults)
    with pytest.raises(ValueError, match="beta = 0.0; it must be a finite number > 0"):
        run_baseline("idkdpo", None, None, FORGET, RETAIN, method_args={"beta": 0.0})


@pytest.mark.parametrize("method", NEW)
def test_each_new_method_runs_through_run_baseline(method, trained_llama, tokenizer):
    snap = snapshot(trained_llama)
    edit = run_baseline(method, trained_llama, tokenizer, FORGET, RETAIN, **{**FAST, **TINY.get(method, {})})
    assert_same(trained_llama, snap)
    assert isinstance(edit, Edit) and edit.method == method and edit.patches
    losses = [h["loss"] for h in edit.info["history"]]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]


def test_idk_nll_makes_the_refusal_likely_and_idk_dpo_prefers_it(trained_llama, tokenizer):
    alt = idk_alternates(FORGET, 0)
    before = answer_nll(trained_llama, tokenizer, alt)
    for method in ("idknll", "idkdpo"):
        edit = run_baseline(method, trained_llama, tokenizer, FORGET, RETAIN, **dict(FAST, max_steps=12))
        with edit.applied(trained_llama):
            assert answer_nll(trained_llama, tokenizer, alt) < before - 0.5, method
    mine = run_baseline("idknll", trained_llama, tokenizer, FORGET, RETAIN, alternates=["Pass."] * len(FORGET), **FAST)
    with mine.applied(trained_llama):
        assert answer_nll(trained_llama, tokenizer, [QAExample(q.question, "Pass.") for q in FORGET]) < \
            answer_nll(trained_llama, tokenizer, alt)
    with pytest.raises(ValueError, match="one non-empty answer per forget example"):
        run_baseline("idknll", trained_llama, tokenizer, FORGET, RETAIN, alternates=["Pass."], **FAST)


def test_task_vector_is_the_negated_scaled_fine_tuning(trained_llama, tokenizer):
    f0 = answer_nll(trained_llama, tokenizer, FORGET)
    one = run_baseline("taskvector", trained_llama, tokenizer, FORGET, [], **FAST)
    two = run_baseline("taskvector", trained_llama, tokenizer, FORGET, [], method_args={"scale": 2.0}, **FAST)
    for n, d in one.patches.items():
        assert torch.allclose(two.patches[n], 2 * d, atol=1e-6)
    assert one.info["history"][-1]["finetune"] < one.info["history"][0]["finetune"]  # it fine-tuned
    with one.applied(trained_llama):
        assert answer_nll(trained_llama, tokenizer, FORGET) > f0  # and the edit goes the other way


def test_rmu_activation_loss_by_hand():
    torch.manual_seed(2)
    h, target = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    want = 0.0
    for b in range(2):
        rows = [t for t in range(4) if LABELS[b, t] != -100]  # unshifted, as upstream
        want += sum(sum((h[b, t, k] - target[b, t, k]).item() ** 2 for k in range(3)) / 3 for t in rows) / len(rows)
    assert float(rmu_activation_loss(h, target, LABELS)) == pytest.approx(want / 2, rel=1e-5)


def test_rmu_has_its_own_recipe_and_trains_only_its_matrices(trained_llama, tokenizer):
    s = resolve_settings("rmu")
    assert (s.lr, s.schedule, s.max_steps, s.params) == (
        5e-5, "constant", 80, (".layers.5.mlp.down_proj", ".layers.6.mlp.down_proj", ".layers.7.mlp.down_proj"))
    assert resolve_settings("rmu", lr=1e-3).lr == 1e-3  # the caller's value wins
    edit = run_baseline("rmu", trained_llama, tokenizer, FORGET, RETAIN, **{**FAST, **TINY["rmu"]})
    assert set(edit.patches) == {f"model.layers.{i}.mlp.down_proj.weight" for i in (0, 1)}
    first, last = edit.info["history"][0], edit.info["history"][-1]
    assert last["forget"] < first["forget"] and first["retain"] == pytest.approx(0.0, abs=1e-8)
    with pytest.raises(ValueError, match="layer 3: use a decoder layer from 0 to 2"):
        run_baseline("rmu", trained_llama, tokenizer, FORGET, RETAIN,
                     **{**FAST, **TINY["rmu"], "method_args": {"layer": 3}})
