"""The gradient unlearning baselines (grom.methods): losses, training, the model left as found."""
from __future__ import annotations

import copy
import gc
import json
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from grom import Edit, EditConfig
from grom.data.encoding import answer_letter, pad_id
from grom.data.schema import ChoiceExample, QAExample, TextExample
from grom.methods import (
    BASELINES,
    METHODS,
    LossInputs,
    Method,
    RunSettings,
    UnknownMethod,
    answer_nll,
    encode_sequences,
    get_method,
    npo_loss,
    register_method,
    run_baseline,
    sequence_nll,
    simnpo_loss,
    train_in_place,
    unregister_method,
)
from grom.methods.trained.losses import ga_loss, mean_nll
from grom.methods.trained.optimizer import linear_schedule
from grom.methods.trained.sequences import collate
from tests.conftest import FORGET, RETAIN, tiny_gpt2, tiny_llama

FAST = dict(lr=1e-3, max_steps=8, batch_size=2, grad_accum=1, warmup_epochs=0)
LONGER = dict(FAST, max_steps=16)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same(model, snap):
    now = dict(model.named_parameters())
    assert now.keys() == snap.keys()
    for n, W in snap.items():
        assert torch.equal(now[n].detach(), W), n


def state_flags(model):
    return ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()],
            [p.grad is None for p in model.parameters()])


# ----------------------------------------------------------------------------- losses

def test_sequence_nll_by_hand_and_masked_positions_ignored():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[-100, 3, 1, -100], [-100, -100, 4, 0]])
    nll, n = sequence_nll(logits, labels)
    lp = F.log_softmax(logits, -1)
    # label at t is predicted by position t - 1
    want = torch.stack([-(lp[0, 0, 3] + lp[0, 1, 1]), -(lp[1, 1, 4] + lp[1, 2, 0])])
    assert torch.allclose(nll, want, atol=1e-6)
    assert n.tolist() == [2, 2]
    assert math.isclose(float(mean_nll(nll, n)), float(want.sum() / 4), rel_tol=1e-6)
    assert math.isclose(float(ga_loss(nll, n)), -float(want.sum() / 4), rel_tol=1e-6)
    # logits at masked / last positions do not matter
    changed = logits.clone()
    changed[0, 2] += 100.0  # predicts labels[0, 3] = -100
    changed[:, 3] -= 50.0  # the last position predicts nothing
    assert torch.allclose(sequence_nll(changed, labels)[0], nll)


def test_npo_loss_by_hand():
    nll, ref, beta = torch.tensor([2.0, 1.0, 5.0]), torch.tensor([1.0, 1.0, 0.5]), 0.5
    # (2/beta) log(1 + (pi/pi_ref)^beta), log pi = -nll
    want = sum((2 / beta) * math.log(1 + math.exp(beta * (r - x)))
               for x, r in zip(nll.tolist(), ref.tolist())) / 3
    assert math.isclose(float(npo_loss(nll, ref, beta)), want, rel_tol=1e-6)
    # at pi = pi_ref it is (2/beta) log 2 whatever beta
    assert math.isclose(float(npo_loss(ref, ref, 0.1)), 20 * math.log(2), rel_tol=1e-6)


def test_simnpo_loss_is_length_normalised():
    nll, n, beta, delta = torch.tensor([4.0, 3.0]), torch.tensor([2, 3]), 4.5, 0.25
    want = sum(-(2 / beta) * math.log(1 / (1 + math.exp(-beta * (x / k - delta))))
               for x, k in zip(nll.tolist(), n.tolist())) / 2
    assert math.isclose(float(simnpo_loss(nll, n, beta, delta)), want, rel_tol=1e-6)
    # doubling a sequence's length and its summed NLL changes nothing
    assert math.isclose(float(simnpo_loss(nll * 2, n * 2, beta, delta)), want, rel_tol=1e-6)


def test_linear_schedule_is_hf_linear_with_warmup():
    f = linear_schedule(2, 6)
    assert [f(s) for s in range(7)] == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert linear_schedule(0, 4)(0) == 1.0


# ----------------------------------------------------------------------------- data

def test_sequences_mask_the_prompt_and_end_with_eos(tokenizer):
    qa = QAExample("Where was Odo Brask born?", "Odo Brask was born in Quenford.")
    (e,) = encode_sequences(tokenizer, [qa], None, 512)
    eos = tokenizer.eos_token_id
    answer = tokenizer(qa.answer, add_special_tokens=False)["input_ids"]
    assert list(e.gold) == answer + [eos] and e.input_ids[-1] == eos
    b = collate([e], pad_id(tokenizer))
    labelled = (b.labels[0] != -100).nonzero().flatten().tolist()
    n_prompt = len(e.input_ids) - len(answer) - 1
    assert labelled == list(range(n_prompt, len(e.input_ids)))  # answer + EOS only
    assert b.labels[0, labelled].tolist() == answer + [eos]

    (t,) = encode_sequences(tokenizer, [TextExample("Mira Sel won the Harrow Cup.")], None, 512)
    bt = collate([t], pad_id(tokenizer))
    assert bt.labels[0, 0] == -100 and (bt.labels[0, 1:] == bt.input_ids[0, 1:]).all()  # plain LM, no EOS

    ch = ChoiceExample("Who won the Harrow Cup?", ("Odo Brask", "Mira Sel"), 1)
    (c,) = encode_sequences(tokenizer, [ch], None, 512)
    # the option letter as the keys and the accuracy metric take it ("B" after a chat template)
    assert list(c.gold) == tokenizer(answer_letter(tokenizer, None, 1), add_special_tokens=False)["input_ids"] + [eos]


# ----------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def deltas(trained_llama, tokenizer):
    """Change of forget / retain answer NLL for each run, on the memorised tiny Llama."""
    f0, r0 = answer_nll(trained_llama, tokenizer, FORGET), answer_nll(trained_llama, tokenizer, RETAIN)
    out = {}
    runs = {m: {} for m in BASELINES}
    runs.update({f"{m}-noretain": {"method_args": {"alpha": 0.0}} for m in ("graddiff", "npo", "simnpo")})
    for name, extra in runs.items():
        edit = run_baseline(name.split("-")[0], trained_llama, tokenizer, FORGET, RETAIN, **LONGER, **extra)
        with edit.applied(trained_llama):
            out[name] = (answer_nll(trained_llama, tokenizer, FORGET) - f0,
                         answer_nll(trained_llama, tokenizer, RETAIN) - r0)
    return out


@pytest.mark.parametrize("run", ["ga", "graddiff", "npo", "simnpo-noretain"])
def test_unlearning_raises_forget_nll(deltas, run):
    assert deltas[run][0] > 0.5, deltas[run]


@pytest.mark.parametrize("method", ["graddiff", "npo", "simnpo"])
def test_retain_term_moves_retain_nll_less(deltas, method):
    # (seeded, so not flaky; on this setup the margins are > 0.9 nats)
    assert deltas[method][1] < deltas["ga"][1] - 0.3, deltas
    assert deltas[method][1] < deltas[f"{method}-noretain"][1] - 0.3, deltas


def test_npo_reference_is_the_initial_model(trained_llama, tokenizer):
    edit = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, **FAST)
    first = edit.info["history"][0]
    # at the first step pi = pi_ref, so the NPO term is (2/beta) log 2
    assert first["forget"] == pytest.approx(2 / 0.1 * math.log(2), rel=1e-4)
    assert edit.info["beta"] == 0.1 and edit.info["alpha"] == 1.0 and edit.info["gamma"] == 1.0


def test_model_left_exactly_as_found(trained_llama, tokenizer):
    model = copy.deepcopy(trained_llama)
    model.train()
    model.model.layers[0].mlp.down_proj.weight.requires_grad_(True)
    snap, flags = snapshot(model), state_flags(model)
    edit = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, **FAST)
    assert edit.patches and edit.method == "graddiff" and edit.layers == []
    assert_same(model, snap)
    assert state_flags(model) == flags
    assert set(edit.timings) == {"train", "total"}


def test_model_restored_when_training_fails(trained_llama, tokenizer):
    snap, flags = snapshot(trained_llama), state_flags(trained_llama)
    calls = []

    def boom(fraction, message):
        calls.append(fraction)
        if len(calls) == 4:  # "tokenizing", then 3 optimizer steps
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, progress=boom, **FAST)
    assert_same(trained_llama, snap)
    assert state_flags(trained_llama) == flags


def test_same_seed_same_patches(trained_llama, tokenizer):
    a = run_baseline("simnpo", trained_llama, tokenizer, FORGET, RETAIN, seed=3, **FAST)
    b = run_baseline("simnpo", trained_llama, tokenizer, FORGET, RETAIN, seed=3, **FAST)
    c = run_baseline("simnpo", trained_llama, tokenizer, FORGET, RETAIN, seed=4, **FAST)
    assert a.patches.keys() == b.patches.keys()
    assert all(torch.equal(a.patches[k], b.patches[k]) for k in a.patches)
    assert a.info["history"] == b.info["history"]
    assert any(not torch.equal(a.patches[k], c.patches[k]) for k in a.patches)


def test_apply_reproduces_the_trained_model(trained_llama, tokenizer):
    trained = copy.deepcopy(trained_llama)
    train_in_place("graddiff", trained, tokenizer, FORGET, RETAIN, **FAST)
    edit = run_baseline("graddiff", trained_llama, tokenizer, FORGET, RETAIN, **FAST)
    ids = collate(encode_sequences(tokenizer, FORGET + RETAIN, None, 512), pad_id(tokenizer))
    with torch.no_grad():
        want = trained(input_ids=ids.input_ids, attention_mask=ids.attention_mask).logits
        before = trained_llama(input_ids=ids.input_ids, attention_mask=ids.attention_mask).logits
        with edit.applied(trained_llama):
            for n, W in trained.named_parameters():
                assert torch.allclose(trained_llama.get_parameter(n), W, atol=1e-7, rtol=0), n
            got = trained_llama(input_ids=ids.input_ids, attention_mask=ids.attention_mask).logits
    assert (want - before).abs().max() > 1e-3  # the training did something
    # fp32: W0 + (W1 - W0) is W1 up to an ulp where the difference is not exact
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unknown_method_lists_the_baselines(llama, tokenizer):
    with pytest.raises(ValueError, match="ga, graddiff, npo, simnpo"):
        run_baseline("nosuch", llama, tokenizer, FORGET, RETAIN)


def test_retain_needed_except_for_ga(llama, tokenizer):
    with pytest.raises(ValueError, match="retain"):
        run_baseline("npo", llama, tokenizer, FORGET, [], max_steps=1)
    assert run_baseline("ga", llama, tokenizer, FORGET, [], **FAST).patches


@pytest.mark.parametrize("make", [lambda v: tiny_gpt2(v, layers=2),
                                  lambda v: tiny_llama(v, layers=2, tie=True)], ids=["gpt2", "llama-tied"])
def test_tied_embeddings_patched_once(tokenizer, make):
    model = make(len(tokenizer))
    names = [n for n, _ in model.named_parameters()]
    edit = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, lr=1e-3, max_steps=2, batch_size=4)
    assert set(edit.patches) <= set(names) and "lm_head.weight" not in edit.patches
    emb = model.get_input_embeddings().weight
    (emb_name,) = [n for n, p in model.named_parameters() if p is emb]
    assert emb_name in edit.patches
    with edit.applied(model):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_params_restricts_what_is_trained(llama, tokenizer):
    edit = run_baseline("ga", llama, tokenizer, FORGET, RETAIN, params=["mlp"], **FAST)
    assert edit.patches and all(".mlp." in n for n in edit.patches)
    assert edit.info["params"] == ["mlp"]
    with pytest.raises(ValueError, match="no parameter"):
        run_baseline("ga", llama, tokenizer, FORGET, RETAIN, params=["nothing_like_this"])


def test_budget_schedule_and_progress(llama, tokenizer):
    seen = []
    edit = run_baseline("graddiff", llama, tokenizer, FORGET, RETAIN, epochs=2, batch_size=2, grad_accum=1, lr=1e-3,
                        progress=lambda f, m: seen.append(f))
    info = edit.info
    assert info["steps"] == 4 and info["warmup_steps"] == 2  # 2 epochs x ceil(4/2); 1 epoch warm-up
    assert [h["lr"] for h in info["history"]] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
    assert seen == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert set(info["final"]) == {"loss", "forget", "forget_nll", "retain"}
    json.dumps(info)


def test_bf16_model_trains_through_fp32_masters_when_asked(tokenizer):
    model = tiny_llama(len(tokenizer), layers=2).to(torch.bfloat16)
    snap = snapshot(model)
    edit = run_baseline("npo", model, tokenizer, FORGET, RETAIN, lr=1e-2, max_steps=2, batch_size=4,
                        warmup_epochs=0, master_weights=True)
    assert_same(model, snap)
    assert edit.patches and all(P.dtype == torch.bfloat16 for P in edit.patches.values())
    assert edit.info["fp32_master_weights"]
    with edit.applied(model):
        pass
    assert_same(model, snap)


def test_save_and_load_keep_method_and_info(llama, tokenizer, tmp_path):
    edit = run_baseline("ga", llama, tokenizer, FORGET, RETAIN, **FAST)
    back = Edit.load(edit.save(tmp_path / "ga"))
    assert back.method == "ga" and back.info == json.loads(json.dumps(edit.info))
    assert all(torch.equal(back.patches[k], edit.patches[k]) for k in edit.patches)
    assert back.settings == edit.settings and back.settings.method == "ga"  # the run's own settings, read back
    meta = json.loads((tmp_path / "ga" / "edit.json").read_text())
    # a file written before edits carried their method's settings: a default GROM "config", the
    # trained run's settings spread in its "info"
    old_style = {k: v for k, v in meta.items() if k != "settings"} | {"config": EditConfig().to_dict()}
    (tmp_path / "ga" / "edit.json").write_text(json.dumps(old_style))
    assert Edit.load(tmp_path / "ga").settings == edit.settings
    del old_style["method"], old_style["info"]  # and one saved before these fields existed: GROM's
    (tmp_path / "ga" / "edit.json").write_text(json.dumps(old_style))
    old = Edit.load(tmp_path / "ga")
    assert old.method == "grom" and old.info == {} and old.settings == EditConfig()


# ----------------------------------------------------------------------------- the method registry

def test_registry_rows_of_the_built_in_methods():
    assert list(METHODS)[:4] == list(BASELINES) == ["ga", "graddiff", "npo", "simnpo"]
    npo = get_method(" NPO ")
    assert npo is METHODS["npo"] and npo.label == "NPO" and npo.description
    assert npo.needs_retain and npo.needs_reference and not npo.needs_answers
    assert dict(npo.defaults) == {"beta": 0.1, "gamma": 1.0, "alpha": 1.0}
    assert not METHODS["ga"].needs_retain and dict(METHODS["ga"].defaults) == {}
    assert not METHODS["simnpo"].needs_reference
    with pytest.raises(TypeError):
        npo.defaults["beta"] = 1.0  # read-only: a run cannot change a row
    with pytest.raises(TypeError):
        METHODS["mine"] = npo  # register_method validates; the registry itself is read-only
    assert npo.uses_retain(npo.defaults) and not npo.uses_retain({**npo.defaults, "alpha": 0.0})


def test_unknown_method_names_the_registered_ones():
    with pytest.raises(UnknownMethod,
                       match=r"unknown unlearning method 'nosuch'; use one of ga, graddiff, npo, simnpo"):
        get_method("nosuch")
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("npo", "NPO again", METHODS["ga"].loss, "A second NPO."), order=999)
    assert METHODS["npo"].label == "NPO"
    with pytest.raises(ValueError, match="lower-case"):
        Method("My Method", "Mine", METHODS["ga"].loss, "Upper case.")


def test_a_method_needing_answers_refuses_forget_rows_without_a_question(trained_llama, tokenizer):
    # alternate answers (a seeded "I don't know" per question) are built for QA forget sets
    # (tests/test_baseline_methods_more.py); a text forget set has no question to answer
    register_method(Method("idk", "IdkGA", METHODS["ga"].loss, "Toward \"I don't know\".", needs_answers=True),
                    order=999)
    try:
        with pytest.raises(ValueError, match="needs question/answer"):
            run_baseline("idk", trained_llama, tokenizer, [TextExample("a text to forget")], RETAIN, **FAST)
        with pytest.raises(ValueError, match="GA trains toward no alternate answer"):
            run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, alternates=["x"] * len(FORGET), **FAST)
    finally:
        unregister_method("idk")


def capped_ascent(x: LossInputs):
    """Gradient ascent that stops pushing a forget sequence once its NLL is `cap` nats above
    the reference's, plus the retain NLL: a method the library does not know."""
    forget = -torch.clamp(x.forget_nll - x.reference_nll, max=x.args["cap"]).mean()
    retain = mean_nll(x.retain_nll, x.retain_counts)
    return forget + retain, {"forget": forget, "retain": retain}


@pytest.fixture
def capped():
    row = register_method(Method("capped", "Capped GA", capped_ascent, "Capped gradient ascent.",
                                 needs_retain=True, needs_reference=True, defaults={"cap": 20.0}), order=999)
    yield row
    unregister_method("capped")


def test_a_registered_method_trains_with_its_row_alone(capped, trained_llama, tokenizer):
    f0 = answer_nll(trained_llama, tokenizer, FORGET)
    snap = snapshot(trained_llama)
    edit = run_baseline("capped", trained_llama, tokenizer, FORGET, RETAIN, **LONGER)
    assert_same(trained_llama, snap)
    assert isinstance(edit, Edit) and edit.method == "capped" and edit.patches
    assert edit.info["cap"] == 20.0 and "beta" not in edit.info
    first = edit.info["history"][0]
    assert set(first) == {"step", "lr", "loss", "forget", "forget_nll", "retain"}
    assert abs(first["forget"]) < 1e-4  # the reference is the initial model
    with edit.applied(trained_llama):
        assert answer_nll(trained_llama, tokenizer, FORGET) > f0 + 0.5
    small = run_baseline("capped", trained_llama, tokenizer, FORGET, RETAIN, method_args={"cap": 0.01}, **LONGER)
    assert small.info["cap"] == 0.01 and min(h["forget"] for h in small.info["history"]) >= -0.01 - 1e-6
    with pytest.raises(ValueError, match="retain"):
        run_baseline("capped", trained_llama, tokenizer, FORGET, [], **FAST)


def test_unregistered_method_is_gone(trained_llama, tokenizer):
    register_method(Method("ga2", "GA again", METHODS["ga"].loss, "Gradient ascent, twice."), order=999)
    assert run_baseline("ga2", trained_llama, tokenizer, FORGET, [], max_steps=1, batch_size=4).method == "ga2"
    assert unregister_method("GA2").name == "ga2"
    with pytest.raises(UnknownMethod, match="use one of ga, graddiff, npo, simnpo"):
        run_baseline("ga2", trained_llama, tokenizer, FORGET, [])


def test_settings_value_and_keywords_agree(trained_llama, tokenizer):
    """One settings value is the interface (keywords change its fields); a method's
    hyperparameter is a method_args entry, not a keyword of its own."""
    a = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, RunSettings(method_args={"beta": 0.5}, **FAST))
    b = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, method_args={"beta": 0.5}, **FAST)
    assert a.info["history"] == b.info["history"] and a.info["beta"] == 0.5
    with pytest.raises(TypeError, match="'beta' is no run setting .* method_args"):
        run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, beta=0.5)


# ----------------------------------------------------------------------------- memory

class Cancel(RuntimeError):
    pass


def run_tensors() -> int:
    gc.collect()
    return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())


@pytest.fixture
def optimizers():
    """Weak references to every optimizer a run steps, its state tensors and the tensors it
    updates (the fp32 masters of a bf16 model)."""
    seen: list[weakref.ref] = []

    def record(opt, args, kwargs):
        if not seen:
            seen.append(weakref.ref(opt))
            seen.extend(weakref.ref(t) for st in opt.state.values() for t in st.values()
                        if isinstance(t, torch.Tensor))
            seen.extend(weakref.ref(p) for g in opt.param_groups for p in g["params"])

    handle = register_optimizer_step_post_hook(record)
    yield seen
    handle.remove()


@pytest.mark.parametrize("ending", ["finished", "progress raises", "hook raises"])
def test_a_run_leaves_nothing_behind(tokenizer, optimizers, ending):
    model = tiny_llama(len(tokenizer), layers=2).to(torch.bfloat16)
    kw = dict(lr=1e-2, max_steps=3, batch_size=2, grad_accum=1, warmup_epochs=0)
    run_baseline("npo", model, tokenizer, FORGET, RETAIN, **{**kw, "max_steps": 1})  # lazy caches
    optimizers.clear()
    snap, before = snapshot(model), run_tensors()
    steps = []

    def progress(fraction, message):
        steps.append(fraction)
        if ending == "progress raises" and fraction == pytest.approx(2 / 3):
            raise Cancel("cancelled in step 3")

    def hook(module, args):
        if ending == "hook raises" and len(steps) == 3:  # step 3's forward: the moments exist
            raise Cancel("cancelled in a forward pass")

    handle = model.model.layers[1].register_forward_pre_hook(hook)
    try:
        kept = run_baseline("npo", model, tokenizer, FORGET, RETAIN, progress=progress, **kw)
    except Cancel as err:
        kept = err  # a caller may keep the exception (and its traceback) a while
    finally:
        handle.remove()
    assert isinstance(kept, Edit) == (ending == "finished")
    assert len(optimizers) > 10 and all(ref() is None for ref in optimizers)  # optimizer, moments, masters
    assert_same(model, snap)
    assert all(p.grad is None for p in model.parameters())
    if ending != "hook raises":  # (torch's hook runner keeps that forward's input while `kept` lives)
        assert run_tensors() == before + (len(kept.patches) if ending == "finished" else 0)
    del kept
    assert run_tensors() == before
