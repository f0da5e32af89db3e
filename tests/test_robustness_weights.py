"""grom.robustness.weights on tiny models: relearning trains the edited model and puts it
back bit for bit; quantization's errors and the attack's bookkeeping; the logit lens
against the model's own output and HF's hidden states, and untouched below the band."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

from grom import EditConfig, run_edit
from grom.eval.quant import quantized, rtn_quantize
from grom.methods import answer_nll
from grom.robustness import Probe, Recall, probe_recall
from grom.robustness.calibration import RELEARN_LR, RELEARN_LRS, calibrate_relearn_lr, relearn_lr
from grom.robustness.weights import (
    fact_position,
    lens,
    logit_lens_attack,
    quantization_attack,
    relearn_attack,
    relearn_curve,
)
from tests.conftest import FORGET, RETAIN, assert_bit_exact, snapshot

FACTS = ("Pellmoor", "Glass Orchard", "Tessaly Medal", "1874")
PROBES = [Probe(ex.question, ex.answer, fact) for ex, fact in zip(FORGET, FACTS)]




@pytest.fixture(scope="module")
def edit(trained_llama, tokenizer):
    """A GROM edit of the two upper layers (of 4) of the tiny trained model."""
    return run_edit(trained_llama, tokenizer, FORGET, RETAIN,
                    EditConfig(layers=(2, 3), beta=30.0, w_r=30.0, rho=0.05))


def likelihood(tokenizer):
    """A ScoreFn whose value is exp(-mean answer NLL) of the forget answers (no generation:
    it moves with every step, where recall would jump)."""
    def score(model):
        return Recall(math.exp(-answer_nll(model, tokenizer, FORGET, add_eos=False)), ("",) * len(FORGET),
                      (0.0,) * len(FORGET))
    return score


# ---------------------------------------------------------------- relearning

def test_relearning_raises_the_trained_answers_and_restores_the_model(trained_llama, tokenizer, edit):
    snap = snapshot(trained_llama)
    grads = [p.grad for p in trained_llama.parameters()]  # memorise() leaves its last ones
    score = likelihood(tokenizer)
    with edit.applied(trained_llama):
        edited0 = score(trained_llama).value
    base0 = score(trained_llama).value
    assert edited0 < base0  # the edit lowered the answers' likelihood
    res = relearn_attack(trained_llama, tokenizer, edit, FORGET, score, steps=(3, 6), lr=3e-3, batch_size=2,
                         relearn_base=True)
    assert_bit_exact(trained_llama, snap)
    assert not trained_llama.training and not any(p.requires_grad for p in trained_llama.parameters())
    assert all(p.grad is g for p, g in zip(trained_llama.parameters(), grads))
    assert res.name == "relearn" and res.details["steps"] == [0, 3, 6]
    curve = res.details["recall"]
    assert curve[0] == pytest.approx(edited0, rel=1e-6)  # step 0: the edit is on
    assert curve[2] > curve[1] > curve[0]
    assert res.edited == curve[-1]
    base_curve = res.details["base_recall"]  # the control: the unedited model relearned the same way
    assert base_curve[0] == res.details["base_start"] == pytest.approx(base0, rel=1e-6)
    assert res.base == base_curve[-1] != base_curve[0]  # as every attack's base: the unedited model under it
    alone = relearn_curve(trained_llama, tokenizer, None, FORGET, score, (3, 6), lr=3e-3, batch_size=2)[0]
    assert [r.value for r in alone] == base_curve  # one seeded run: the same curve again
    assert_bit_exact(trained_llama, snap)
    no_control = relearn_attack(trained_llama, tokenizer, edit, FORGET, score, steps=(3,), lr=3e-3, batch_size=2,
                                relearn_base=False)
    assert no_control.base == pytest.approx(base0, rel=1e-6) and "base_recall" not in no_control.details
    assert len(res.details["loss"]) == 6 and res.details["loss"][-1] < res.details["loss"][0]


def test_relearning_from_known_starts_gives_the_same_run_without_scoring_step_zero(trained_llama, tokenizer, edit):
    """start=(base, edited): the scores before any step, given by a caller that measured them
    (the suite's held-out probes); the attack's numbers are those it measures itself, and
    step 0 is not scored again."""
    score = likelihood(tokenizer)
    calls = []

    def counted(model):
        calls.append(1)
        return score(model)
    run = dict(steps=(2, 4), lr=3e-3, batch_size=2)
    measured = relearn_attack(trained_llama, tokenizer, edit, FORGET, counted, **run)
    assert len(calls) == 6
    base0 = score(trained_llama)
    with edit.applied(trained_llama):
        edited0 = score(trained_llama)
    calls.clear()
    given = relearn_attack(trained_llama, tokenizer, edit, FORGET, counted, start=(base0, edited0), **run)
    assert len(calls) == 4  # steps 2 and 4 of each run
    assert (given.base, given.edited, given.details) == (measured.base, measured.edited, measured.details)
    calls.clear()
    no_control = relearn_attack(trained_llama, tokenizer, edit, FORGET, counted, relearn_base=False,
                                start=(base0, None), **run)
    assert no_control.base == base0.value and len(calls) == 3  # the edited run's steps 0, 2, 4


def test_relearning_restores_the_model_when_cancelled(trained_llama, tokenizer, edit):
    snap = snapshot(trained_llama)

    def cancel(fraction, _message):
        if fraction > 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        relearn_attack(trained_llama, tokenizer, edit, FORGET, likelihood(tokenizer), steps=(2, 4), lr=1e-2,
                       progress=cancel)
    assert_bit_exact(trained_llama, snap)
    assert not edit.is_applied
    with pytest.raises(ValueError, match="at least one"):
        relearn_attack(trained_llama, tokenizer, edit, [], likelihood(tokenizer))


def test_calibration_keeps_the_largest_lr_that_leaves_the_unedited_model_intact(trained_llama, tokenizer):
    """Relearning on the forget answers at lr 0.3 wrecks the tiny model's retain answers
    (their likelihood, the score here, collapses); at 1e-6 it moves them by less than the
    tolerance. The pick is 1e-6, each curve is the one relearn_curve gives, and the model
    comes back bit for bit."""
    snap = snapshot(trained_llama)

    def retain_likelihood(model):
        return Recall(math.exp(-answer_nll(model, tokenizer, RETAIN, add_eos=False)), ("",) * len(RETAIN),
                      (0.0,) * len(RETAIN))

    cal = calibrate_relearn_lr(trained_llama, tokenizer, FORGET, retain_likelihood, [0.3, 1e-6], steps=(2, 4),
                               batch_size=2, tolerance=0.01)
    assert_bit_exact(trained_llama, snap)
    assert cal.lr == 1e-6 and list(cal.curves) == [1e-6, 0.3] and cal.steps == (0, 2, 4)
    assert cal.damage(1e-6) <= 0.01 < cal.damage(0.3)
    assert cal.curves[0.3][0] == cal.curves[1e-6][0] == cal.start  # step 0: the unedited model, untouched
    assert [r[-1] for r in cal.rows()] == ["picked", "damages"]
    alone = relearn_curve(trained_llama, tokenizer, None, FORGET, retain_likelihood, (2, 4), lr=0.3, batch_size=2)[0]
    assert tuple(r.value for r in alone) == cal.curves[0.3]
    nothing = calibrate_relearn_lr(trained_llama, tokenizer, FORGET, retain_likelihood, [0.3], steps=(2,),
                                   batch_size=2, tolerance=0.01)
    assert nothing.lr is None  # every lr damaged: none is offered
    with pytest.raises(ValueError, match="learning rates > 0"):
        calibrate_relearn_lr(trained_llama, tokenizer, FORGET, retain_likelihood, [0.0])


def test_relearn_lr_by_family():
    assert relearn_lr("HuggingFaceTB/SmolLM2-135M-Instruct") is RELEARN_LRS["smollm2"]
    assert relearn_lr("/somewhere/assets/demo-full") is RELEARN_LRS["demo"]
    other = relearn_lr("meta-llama/Llama-3.2-1B-Instruct")
    assert other.lr == RELEARN_LR and not other.calibrated and "not calibrated" in other.why
    assert relearn_lr(None).lr == RELEARN_LR


# ---------------------------------------------------------------- quantization

def test_rtn_eight_bit_hand_example_and_errors():
    # one group of 4, qmax 255; lo = -1, hi = 1.55 -> scale = 2.55/255 = 0.01, zero = 100
    # w/scale = [-100, 12.34, 50.06, 155] -> q - zero = [-100, 12, 50, 155] -> [-1, .12, .5, 1.55]
    W = torch.tensor([[-1.0, 0.1234, 0.5006, 1.55]])
    assert torch.allclose(rtn_quantize(W, bits=8, group_size=4), torch.tensor([[-1.0, 0.12, 0.5, 1.55]]), atol=1e-6)
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    e4, e8 = ((rtn_quantize(W, bits=b) - W).abs() for b in (4, 8))
    assert e8.max() < e4.max() / 10 and e8.norm() < e4.norm() / 10  # a step 17x finer


def test_quantization_attack_scores_both_models_quantized(trained_llama, tokenizer, edit):
    snap = snapshot(trained_llama)
    score = likelihood(tokenizer)
    with quantized(trained_llama, "rtn", bits=4):
        base4 = score(trained_llama).value
    r4 = quantization_attack(trained_llama, tokenizer, edit, score, bits=4)
    r8 = quantization_attack(trained_llama, tokenizer, edit, score, bits=8)
    assert_bit_exact(trained_llama, snap)
    assert (r4.name, r8.name) == ("quant4", "quant8")
    assert r4.base == pytest.approx(base4, rel=1e-6)
    with edit.applied(trained_llama):
        edited = score(trained_llama).value
    assert abs(r8.edited - edited) < abs(r4.edited - edited) + 1e-9  # 8 bits: closer to full precision
    assert r4.details["group_size"] == 128 and r4.details["n_matrices"] == 4 * 7
    assert r4.details["quantizer"] == "rtn" and r4.details["quantizer_reason"].startswith("asked for")
    if not torch.cuda.is_available():  # says why bitsandbytes' own formats did not run
        assert "NF4: cannot run here (no CUDA GPU)" in r4.details["quantizer_reason"]
        assert "int8: cannot run here" in r8.details["quantizer_reason"]
    assert 0.9 < r8.details["patch_kept"] < 1.1 and 0.5 < r4.details["patch_kept"] < 1.5
    with pytest.raises(ValueError, match="4 or 8"):
        quantization_attack(trained_llama, tokenizer, edit, score, bits=3)


def test_patch_kept_reads_the_attack_own_quantized_weights(trained_llama, tokenizer, edit, monkeypatch):
    """patch_kept = <Q(W + P) - Q(W), P> / ||P||^2, here from two quantizations of its own:
    the attack's, read from the weights it scores (two passes over the weights, not four),
    gives the same number bit for bit."""
    from grom.robustness import weights

    for bits in (4, 8):
        with quantized(trained_llama, "rtn", bits=bits):
            q0 = {n: trained_llama.get_parameter(n).detach().clone() for n in edit.patches}
        num = den = 0.0
        with edit.applied(trained_llama), quantized(trained_llama, "rtn", bits=bits):
            for n, Q in q0.items():
                P = edit.patches[n].double()
                num += float(((trained_llama.get_parameter(n).detach().double() - Q.double()) * P).sum())
                den += float((P * P).sum())
        passes = []
        monkeypatch.setattr(weights, "quantized", lambda *a, **k: passes.append(1) or quantized(*a, **k))
        res = quantization_attack(trained_llama, tokenizer, edit, likelihood(tokenizer), bits=bits)
        monkeypatch.undo()
        assert res.details["patch_kept"] == num / den and len(passes) == 2


def test_the_edited_passes_replay_the_layers_below_the_edit_bit_for_bit(trained_llama, tokenizer, edit, monkeypatch):
    """The quantization, logit-lens and membership attacks with the edited model's passes
    replaying the layers below the edit (layers 0-1 of 4 here: `BelowTheEdit`) give what
    they give with every layer run (lens probabilities and ranks, answers, AUCs, equal),
    and do replay (their caches are hit)."""
    from grom.robustness.membership import membership_attack
    from grom.robustness.result import BelowTheEdit

    snap = snapshot(trained_llama)
    score = lambda m, between=None: probe_recall(m, tokenizer, PROBES, between=between)  # noqa: E731

    def attacks():
        q = quantization_attack(trained_llama, tokenizer, edit, score, bits=4)
        lens_ = logit_lens_attack(trained_llama, tokenizer, edit, PROBES)
        mia = membership_attack(trained_llama, tokenizer, edit, FORGET, PROBES, RETAIN)
        return [(r.base, r.edited, r.base_answers, r.edited_answers, r.details) for r in (q, lens_, mia)]

    caches = []
    replaying = BelowTheEdit.replaying
    monkeypatch.setattr(BelowTheEdit, "replaying", lambda self: caches.append(self.cache) or replaying(self))
    replayed = attacks()
    assert [c.hits > 0 for c in caches] == [True, True, True] and caches[1].hits == 1  # 4 probes: one lens batch
    monkeypatch.setattr(BelowTheEdit, "recording", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(BelowTheEdit, "replaying", lambda self: contextlib.nullcontext())
    assert replayed == attacks()
    assert replayed[1][4]["first_changed_layer"] == 2
    assert_bit_exact(trained_llama, snap)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
@pytest.mark.parametrize("method,bits", [("nf4", 4), ("int8", 8)])
def test_bitsandbytes_methods_say_what_is_missing(trained_llama, tokenizer, edit, method, bits):
    snap = snapshot(trained_llama)
    with pytest.raises(RuntimeError, match="CUDA"):
        quantization_attack(trained_llama, tokenizer, edit, likelihood(tokenizer), bits=bits, method=method)
    assert_bit_exact(trained_llama, snap)


# ---------------------------------------------------------------- the logit lens

def test_fact_position_reads_the_token_where_the_fact_starts(tokenizer):
    ids, token, found = fact_position(tokenizer, PROBES[0])
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROBES[0].question}],
                                           add_generation_prompt=True, tokenize=False)
    # this tiny BPE has no " Pellmoor" token: the space is a token of its own, in the prefix
    assert found and tokenizer.decode(ids).rstrip() == prompt + "Zorvath Quill was born in"
    assert tokenizer.decode([token]).strip() and "Pellmoor".startswith(tokenizer.decode([token]).strip())
    _, token2, found2 = fact_position(tokenizer, Probe("Q?", "No fact here.", "Pellmoor"))
    assert not found2 and token2 == tokenizer("Pellmoor", add_special_tokens=False)["input_ids"][0]


@pytest.mark.parametrize("name", ["trained_llama", "gpt2"])  # gpt2: random, LayerNorm and Conv1D
def test_lens_matches_the_model_and_its_hidden_states(name, request, tokenizer):
    model = request.getfixturevalue(name)
    read = [fact_position(tokenizer, p) for p in PROBES]
    ids, tokens = [r[0] for r in read], [r[1] for r in read]
    prob, rank = lens(model, ids, tokens, batch_size=3)  # batches of unequal lengths
    assert prob.shape == rank.shape == (4, len(PROBES))
    for p, (seq, t) in enumerate(zip(ids, tokens)):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        z = out.logits[0, -1].double()
        assert prob[-1, p] == pytest.approx(float(torch.softmax(z, -1)[t]), rel=1e-4)
        assert rank[-1, p] == 1 + int((z > z[t]).sum())
        # a middle layer by hand: HF's hidden state after layer 1, final norm, head
        norm = model.model.norm if name == "trained_llama" else model.transformer.ln_f
        zl = model.lm_head(norm(out.hidden_states[2][0, -1])).detach().double()
        assert prob[1, p] == pytest.approx(float(torch.softmax(zl, -1)[t]), rel=1e-4)


def test_logit_lens_is_untouched_below_the_band(trained_llama, tokenizer, edit):
    snap = snapshot(trained_llama)
    res = logit_lens_attack(trained_llama, tokenizer, edit, PROBES)
    assert_bit_exact(trained_llama, snap)
    d = res.details
    assert d["band"] == [2, 3] and d["first_changed_layer"] == 2 and "untouched" in d["note"]
    assert d["base_prob"][:2] == d["edited_prob"][:2] and d["base_rank"][:2] == d["edited_rank"][:2]
    assert d["edited_prob"][3] < d["base_prob"][3]  # the edit suppresses the facts at the top
    assert res.base == 1.0  # the tiny model memorised its answers: every fact token is its greedy choice
    assert 0 <= res.edited < 1 and res.n == len(PROBES)


def test_recall_probes_run_through_the_attacks(trained_llama, tokenizer, edit):
    """The real ScoreFn (greedy answers, fact recall) through one attack end to end."""
    score = lambda m: probe_recall(m, tokenizer, PROBES)  # noqa: E731
    res = quantization_attack(trained_llama, tokenizer, edit, score, bits=8)
    assert res.n == len(PROBES) and len(res.base_answers) == len(PROBES)
    assert res.base >= 0.75 and 0.0 <= res.edited <= 1.0
