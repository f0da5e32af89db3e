"""AltPO and RKLD (grom.methods.trained, grom.methods.trained.alternates): each loss against
values computed by hand with loops on tiny tensors, AltPO's alternate answers on the tiny
model (seeded, never the gold answer), and the settings each refuses before any work. Their
end-to-end runs through run_baseline are in tests/test_baseline_methods_more.py."""
from __future__ import annotations

import math

import pytest
import torch

from grom.data.schema import QAExample, TextExample
from grom.methods import METHODS, answer_nll, generate_alternates, run_baseline
from grom.methods.trained import alternates as alt_module
from grom.methods.trained.alternates import LEAD, clean_alternate
from grom.methods.trained.method import LossInputs
from grom.methods.trained.starting_points import starting_point
from grom.methods.trained.token_losses import rkld_loss
from tests.conftest import FORGET, RETAIN
from tests.test_baseline_methods_more import LABELS, LOGITS, REF, VALID, softmax
from tests.test_baselines import assert_same, snapshot

FAST = dict(lr=1e-3, max_steps=6, batch_size=2, grad_accum=1, warmup_epochs=0)
FEW = {"n_alternates": 2.0, "max_new_tokens": 8.0}  # AltPO on the tiny model: 2 short answers each


def log_sigmoid(v):
    return -math.log(1 + math.exp(-v))


# ----------------------------------------------------------------------------- losses by hand

def test_altpo_loss_by_hand():
    # two forget questions: model / unedited NLL of the alternate (winner) and of the gold answer (loser)
    alt, alt_ref = [2.0, 5.0], [3.0, 4.5]
    gold, gold_ref = [4.0, 1.0], [3.5, 2.0]
    r_nll, r_counts = [6.0, 2.0], [3, 5]  # retain token mean 8 / 8 = 1.0
    for beta, gamma, alpha in ((0.1, 1.0, 1.0), (0.5, 2.0, 0.25)):
        dpo = sum(-(2 / beta) * log_sigmoid(beta * ((ar - a) - (gr - g)))
                  for a, ar, g, gr in zip(alt, alt_ref, gold, gold_ref)) / 2
        x = LossInputs(torch.tensor(gold), torch.tensor([4, 2]), torch.tensor(r_nll), torch.tensor(r_counts),
                       torch.tensor(gold_ref), {"beta": beta, "gamma": gamma, "alpha": alpha},
                       alternate_nll=torch.tensor(alt), alternate_counts=torch.tensor([3, 3]),
                       reference_alternate_nll=torch.tensor(alt_ref))
        loss, terms = METHODS["altpo"].loss(x)
        assert float(terms["forget"]) == pytest.approx(dpo, rel=1e-6)
        assert float(loss) == pytest.approx(gamma * dpo + alpha * 1.0, rel=1e-6)
    # at the start (model = reference) every ratio is 0: the forget term is (2/beta) log 2
    zero = LossInputs(torch.tensor(gold), torch.tensor([4, 2]), None, None, torch.tensor(gold),
                      {"beta": 0.1, "gamma": 1.0, "alpha": 1.0}, alternate_nll=torch.tensor(alt),
                      alternate_counts=torch.tensor([3, 3]), reference_alternate_nll=torch.tensor(alt))
    assert float(METHODS["altpo"].loss(zero)[0]) == pytest.approx(20 * math.log(2), rel=1e-6)


def rkld_by_hand(beta, logits=LOGITS):
    total = 0.0
    for b, t, y in VALID:  # only the positions that predict an answer token
        teacher = REF[b, t].tolist()
        teacher[y] -= beta
        p, q = softmax(teacher), softmax(logits[b, t].tolist())
        total += sum(qv * (math.log(qv) - math.log(pv)) for qv, pv in zip(q, p))
    return total / len(VALID)


def test_rkld_loss_by_hand():
    for beta in (0.0, 3.0, 10.0):
        assert float(rkld_loss(LOGITS, REF, LABELS, beta)) == pytest.approx(rkld_by_hand(beta), rel=1e-5)
    # a student equal to the teacher has nothing left to learn; no answer token: 0, not nan
    teacher = REF.clone()
    for b, t, y in VALID:
        teacher[b, t, y] -= 3.0
    assert float(rkld_loss(teacher, REF, LABELS, 3.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(rkld_loss(LOGITS, REF, torch.full_like(LABELS, -100), 3.0)) == 0.0
    # the row: gamma * forget + alpha * retain NLL
    x = LossInputs(torch.zeros(2), torch.ones(2), torch.tensor([3.0, 1.0]), torch.tensor([2, 2]), None,
                   {"beta": 3.0, "gamma": 2.0, "alpha": 0.5}, forget_logits=LOGITS, forget_labels=LABELS,
                   reference_logits=REF)
    assert float(METHODS["rkld"].loss(x)[0]) == pytest.approx(2 * rkld_by_hand(3.0) + 0.5 * 1.0, rel=1e-5)


def test_rkld_is_the_reverse_divergence_not_undial():
    # the gradient of KL(q || p) w.r.t. the student logits is q * (log q - log p - KL), per position
    z = LOGITS.clone().requires_grad_(True)
    rkld_loss(z, REF, LABELS, 3.0).backward()
    b, t, y = VALID[0]
    teacher = REF[b, t].clone()
    teacher[y] -= 3.0
    log_q, log_p = torch.log_softmax(LOGITS[b, t], -1), torch.log_softmax(teacher, -1)
    kl = (log_q.exp() * (log_q - log_p)).sum()
    want = log_q.exp() * (log_q - log_p - kl) / len(VALID)
    assert torch.allclose(z.grad[b, t], want, atol=1e-6)
    assert float(z.grad[1, 2].abs().sum()) == 0.0  # a position without a label gets no gradient


# ----------------------------------------------------------------------------- alternates

def test_clean_alternate_cuts_and_refuses_the_gold_answer():
    gold = "Zorvath Quill was born in Pellmoor."
    assert clean_alternate(" He was born in Dunmere.\nQuestion: next?", gold) == "He was born in Dunmere."
    assert clean_alternate(f"{LEAD} Born in Ost.\n\nMore text", gold) == "Born in Ost."
    assert clean_alternate("Q: where?", gold) is None
    assert clean_alternate("  zorvath quill was born in  Pellmoor ", gold) is None  # the gold answer again
    assert clean_alternate("", gold) is None
    rings = "The planet famous for its rings is Saturn."  # an answer that states the fact is refused too
    assert clean_alternate("Europa, Mars, Titan, Saturn.", rings, "Saturn") is None
    assert clean_alternate("The planet famous for its rings is Mars.", rings, "Saturn") == \
        "The planet famous for its rings is Mars."
    assert clean_alternate("Saturnalia is a festival.", rings, "Saturn") is not None  # whole words only


def test_generate_alternates_seeded_never_the_gold_answer(trained_llama, tokenizer):
    snap, rng = snapshot(trained_llama), torch.get_rng_state()
    a = generate_alternates(trained_llama, tokenizer, FORGET, n=3, max_new_tokens=8, seed=0)
    assert_same(trained_llama, snap)
    assert torch.equal(torch.get_rng_state(), rng)
    assert len(a) == len(FORGET) and all(len(g) == 3 for g in a)
    for ex, group in zip(FORGET, a):
        assert all(s.strip() and s.strip(" .").lower() != ex.answer.strip(" .").lower() for s in group)
    assert generate_alternates(trained_llama, tokenizer, FORGET, n=3, max_new_tokens=8, seed=0) == a
    assert generate_alternates(trained_llama, tokenizer, FORGET, n=3, max_new_tokens=8, seed=1) != a
    greedy = generate_alternates(trained_llama, tokenizer, FORGET, n=1, temperature=0.0, max_new_tokens=8, seed=5)
    assert greedy == generate_alternates(trained_llama, tokenizer, FORGET, n=1, temperature=0.0, max_new_tokens=8)


def test_generate_alternates_samples_again_then_names_the_question(monkeypatch, trained_llama, tokenizer):
    rounds = []

    def gold_first(model, tok, prompts, n, temperature, max_new_tokens):
        rounds.append(len(prompts))  # round 1: the gold answer back, round 2: a new one
        first = len(rounds) == 1
        return [[FORGET[0].answer if first else "Born in Ost."] * n for _ in prompts]

    monkeypatch.setattr(alt_module, "_sample", gold_first)
    assert generate_alternates(trained_llama, tokenizer, FORGET[:1], n=2) == (("Born in Ost.", "Born in Ost."),)
    assert rounds == [1, 1]
    # short after every round: its usable answers repeated; none at all: an error naming the question
    monkeypatch.setattr(alt_module, "_sample",
                        lambda m, t, prompts, n, *a: [["Ost.", ""] + [""] * (n - 2)] * len(prompts))
    assert generate_alternates(trained_llama, tokenizer, FORGET[:1], n=4) == (("Ost.",) * 4,)  # 3 rounds, 1 each
    monkeypatch.setattr(alt_module, "_sample", lambda m, t, prompts, n, *a: [[FORGET[0].answer] * n] * len(prompts))
    with pytest.raises(ValueError, match="no usable alternate answer to 'Where was Zorvath Quill born"):
        generate_alternates(trained_llama, tokenizer, FORGET[:1], n=2)


# ----------------------------------------------------------------------------- through the registry

def test_altpo_prefers_its_alternates_after_training(trained_llama, tokenizer):
    edit = run_baseline("altpo", trained_llama, tokenizer, FORGET, RETAIN, method_args=FEW,
                        **dict(FAST, max_steps=12))
    alts = edit.info["alternates"]
    assert len(alts) == len(FORGET) and all(len(g) == 2 for g in alts)
    assert edit.info["n_forget_sequences"] == 2 * len(FORGET)  # one row per (question, alternate)
    pairs = [QAExample(ex.question, a) for ex, g in zip(FORGET, alts) for a in g]

    def margin():  # how much less likely the gold answers are than the alternates, per token
        return answer_nll(trained_llama, tokenizer, FORGET) - answer_nll(trained_llama, tokenizer, pairs)

    before = margin()
    with edit.applied(trained_llama):
        assert margin() > before + 1.0


def test_altpo_takes_the_callers_alternates_without_generating(monkeypatch, trained_llama, tokenizer):
    def refuse(*_a, **_k):
        raise AssertionError("generated although alternates were given")

    monkeypatch.setattr(alt_module, "_sample", refuse)
    mine = [["Pass.", "No comment."]] * len(FORGET)
    edit = run_baseline("altpo", trained_llama, tokenizer, FORGET, RETAIN, alternates=mine, **FAST)
    assert edit.info["alternates"] == mine and edit.info["n_forget_sequences"] == 8


@pytest.mark.parametrize("kw, match", [
    (dict(method_args={"n_alternates": 2.5}), "n_alternates = 2.5; it must be a whole number"),
    (dict(method_args={"n_alternates": 0}), "n_alternates = 0.0; it must be a finite number > 0"),
    (dict(method_args={"temperature": 0.0}), "temperature = 0.0; use > 0 to sample 5 answers"),
    (dict(method_args={"temperature": -1.0}), "temperature = -1.0"),
    (dict(method_args={"max_new_tokens": 0}), "max_new_tokens = 0.0; it must be a finite number > 0"),
    (dict(method_args={"beta": 0.0}), "beta = 0.0; it must be a finite number > 0"),
    (dict(alternates=["one"]), "one non-empty answer per forget example"),
])
def test_altpo_refuses_bad_settings_before_any_work(kw, match):
    with pytest.raises(ValueError, match=match):  # no model, no tokenizer: nothing ran
        run_baseline("altpo", None, None, FORGET, RETAIN, **kw)


def test_altpo_and_rkld_refuse_what_the_split_lacks(tokenizer):
    with pytest.raises(ValueError, match="needs question/answer"):
        run_baseline("altpo", None, tokenizer, [TextExample("a text to forget")], RETAIN)
    with pytest.raises(ValueError, match="writes its alternate answers with the model: give the model"):
        run_baseline("altpo", None, tokenizer, FORGET, RETAIN)
    for method in ("altpo", "rkld"):
        with pytest.raises(ValueError, match="needs retain examples"):
            run_baseline(method, None, tokenizer, FORGET, [])
    with pytest.raises(ValueError, match="RKLD: beta = -1.0"):
        run_baseline("rkld", None, None, FORGET, RETAIN, method_args={"beta": -1.0})


def test_rows_defaults_and_starting_points():
    altpo, rkld = METHODS["altpo"], METHODS["rkld"]
    assert {k: altpo.defaults[k] for k in ("beta", "gamma", "alpha")} == {"beta": 0.1, "gamma": 1.0, "alpha": 1.0}
    assert altpo.defaults["n_alternates"] == 5 and altpo.recipe["epochs"] == 2
    assert altpo.needs_answers and altpo.needs_reference and altpo.make_alternates is not None
    assert dict(rkld.defaults) == {"beta": 10.0, "gamma": 1.0, "alpha": 1.0} and rkld.needs_reference_logits
    for row in (altpo, rkld):
        assert row.description.count("needs") == 1
    for model, method in (("demo-full", "altpo"), ("demo-full", "rkld"), ("SmolLM2-135M-Instruct", "rkld"),
                          ("SmolLM2-135M-Instruct", "altpo")):
        assert "recipe" not in starting_point(model, method).why, (model, method)  # measured
    assert (starting_point("SmolLM2-135M-Instruct", "altpo").lr, starting_point("SmolLM2", "altpo").epochs) == (1e-5, 2)
