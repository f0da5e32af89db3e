"""OpenUnlearning's recipes for the baselines (grom.methods.trained.recipes): the settings against
upstream's configs, the chunking of a joined corpus, the constant schedule, the KL retain
term against a hand computation, and bf16 weights trained in their own dtype."""
from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import processors
from torch import nn

from grom.data.encoding import pad_id
from grom.data.schema import TextExample
from grom.methods import run_baseline, train_in_place
from grom.methods.trained.losses import kl_to_reference
from grom.methods.trained.optimizer import adamw, optimizer_step, updated_tensors
from grom.methods.trained.recipes import RECIPES, chunk_corpus, chunk_texts, recipe_for_task
from grom.methods.trained.sequences import batch_logits, collate, encode_chunk, encode_sequences
from grom.methods.trained.settings import resolve_settings
from tests.conftest import FORGET, RETAIN, make_tokenizer, tiny_llama

# My transcription of the HF TrainingArguments that locuslab/open-unlearning runs each
# benchmark with, at commit d3d7cf9e6b3c125d16687d4232680d8d83548f1a: configs/trainer/
# finetune.yaml (batch 8, accumulation 4, lr 1e-5, weight decay 0.00, 10 epochs, HF's
# linear schedule, max_grad_norm 1.0 by HF default) overridden by configs/experiment/
# unlearn/{tofu,muse,wmdp}/default.yaml, and the datasets' max_length (configs/data/
# datasets/{TOFU_QA_forget,MUSE_forget,WMDP_forget}.yaml).
UPSTREAM = {
    "tofu": dict(batch_size=8, grad_accum=4, lr=1e-5, epochs=10, max_steps=None, schedule="linear",
                 warmup_epochs=1.0, weight_decay=0.01, max_grad_norm=1.0, max_length=512, chunk_corpus=False),
    "muse": dict(batch_size=4, grad_accum=8, lr=1e-5, epochs=10, max_steps=None, schedule="constant",
                 warmup_epochs=0.0, weight_decay=0.0, max_grad_norm=1.0, max_length=2048, chunk_corpus=True),
    "wmdp": dict(batch_size=1, grad_accum=16, lr=5e-5, max_steps=80, schedule="constant",
                 warmup_epochs=0.0, weight_decay=0.0, max_grad_norm=1.0, max_length=512, chunk_corpus=True),
}


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_recipes_are_open_unlearnings(name):
    s = resolve_settings("graddiff", recipe=name)
    for key, value in UPSTREAM[name].items():
        assert getattr(RECIPES[name], key) == value, key
        assert getattr(s, key) == value, key
    assert s.recipe == name and s.master_weights is False and s.retain_loss == "nll"


def test_defaults_are_tofus_with_the_effective_batch_of_32_and_overrides_win():
    s = resolve_settings("npo")
    assert (s.recipe, s.batch_size * s.grad_accum, s.schedule) == ("tofu", 32, "linear")
    m = resolve_settings("npo", recipe="muse", lr=3e-5, grad_accum=None)
    assert (m.lr, m.grad_accum, m.weight_decay) == (3e-5, 8, 0.0)  # None takes the recipe's
    assert resolve_settings("npo", recipe="wmdp", epochs=2).max_steps is None  # epochs given: epochs run
    assert [recipe_for_task(t).name for t in ("muse", "wmdp", "tofu", "knowledge")] == ["muse", "wmdp", "tofu", "tofu"]
    with pytest.raises(ValueError, match="use one of tofu, muse, wmdp"):
        resolve_settings("npo", recipe="rwku")
    with pytest.raises(ValueError, match="no retain term"):
        resolve_settings("ga", retain_loss="kl")
    with pytest.raises(ValueError, match="retain_loss 'mse'"):
        resolve_settings("npo", retain_loss="mse")


# ----------------------------------------------------------------------------- chunks

def upstream_chunks(tokenizer, texts, max_length):
    """My transcription of PretrainingDataset._chunk_raw_text (src/data/pretraining.py at
    d3d7cf9): join by a blank line, tokenize without specials, len // max_length + 1 pieces."""
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    return [tokenizer.decode(ids[i * max_length:(i + 1) * max_length]) for i in range(len(ids) // max_length + 1)]


def test_chunks_of_the_joined_corpus_match_upstream(tokenizer):
    texts = [ex.question + " " + ex.answer for ex in FORGET + RETAIN]
    n = len(tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"])
    for size in (7, 16, n, n // 2 if n % 2 == 0 else (n - 1) // 2):
        ours, theirs = chunk_texts(tokenizer, texts, size), upstream_chunks(tokenizer, texts, size)
        if n % size == 0:  # upstream's last piece is empty: it carries no label, dropped here
            assert theirs[-1] == "" and ours == theirs[:-1]
        else:
            assert ours == theirs
    assert "\n\n" in "".join(chunk_texts(tokenizer, texts, 7))  # the documents' boundary is kept


def test_2048_token_chunks_of_a_long_corpus(tokenizer):
    docs = [" ".join(ex.answer for ex in FORGET + RETAIN) * 20 for _ in range(8)]
    ids = tokenizer("\n\n".join(docs), add_special_tokens=False)["input_ids"]
    assert len(ids) > 2 * 2048
    out = chunk_corpus(tokenizer, [TextExample(d) for d in docs] + [FORGET[0]], RECIPES["muse"].max_length)
    assert out[0] == FORGET[0]  # a QA example is kept as it is
    chunks = [c.text for c in out[1:]]
    assert len(chunks) == -(-len(ids) // 2048)
    assert chunks == [tokenizer.decode(ids[k:k + 2048]) for k in range(0, len(ids), 2048)]
    enc = encode_sequences(tokenizer, out[1:], None, 2048, chunked=True)
    assert len(enc) == len(chunks) and all(len(e.input_ids) <= 2048 for e in enc)


def test_a_chunk_is_one_sequence_cut_after_its_bos_with_labels_from_the_second_token():
    tok = make_tokenizer()
    text = " ".join(ex.answer for ex in RETAIN)
    (plain,) = encode_chunk(tok, text, 10, 0)  # no BOS: 10 tokens, a loss on all but the first
    ids = tok(text, add_special_tokens=True)["input_ids"]
    assert plain.input_ids == tuple(ids[:10]) and plain.positions == tuple(range(9))
    bos = tok.convert_tokens_to_ids("<s>")
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    (e,) = encode_chunk(tok, text, 10, 0)  # upstream: cut at len(tokenizer("")) + max_length
    assert e.input_ids[0] == bos and len(e.input_ids) == 11
    labels = collate([e], pad_id(tok)).labels[0].tolist()
    assert labels == [-100] + list(e.input_ids[1:])  # preprocess_pretraining_instance's labels
    assert encode_chunk(tok, "", 10, 0) == []


def test_muse_recipe_trains_on_chunks_at_a_constant_lr(tokenizer, llama):
    docs = [TextExample(ex.question + " " + ex.answer) for ex in FORGET]
    edit = run_baseline("graddiff", llama, tokenizer, docs, RETAIN, recipe="muse", max_length=16,
                        max_steps=3, grad_accum=1, lr=1e-3)
    info = edit.info
    assert info["n_forget_sequences"] == len(chunk_texts(tokenizer, [d.text for d in docs], 16))
    assert info["schedule"] == "constant" and info["weight_decay"] == 0.0 and info["warmup_steps"] == 0
    assert [h["lr"] for h in info["history"]] == [1e-3] * 3


# ----------------------------------------------------------------------------- KL retain term

def test_kl_term_by_hand_on_a_tiny_model(tokenizer):
    model = tiny_llama(len(tokenizer), layers=2)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = collate(encode_sequences(tokenizer, RETAIN[:3], None, 512), pad_id(tokenizer))
    logits, ref_logits = batch_logits(model, batch), batch_logits(ref, batch)
    # by hand: sum over every position (padding included, as upstream) of
    # sum_v p_ref (log p_ref - log p), divided by B * T
    lq, lp = ref_logits.double().log_softmax(-1), logits.double().log_softmax(-1)
    B, T, _ = logits.shape
    hand = (lq.exp() * (lq - lp)).sum() / (B * T)
    assert float(kl_to_reference(logits, ref_logits).detach()) == pytest.approx(float(hand.detach()), rel=1e-5)
    assert float(kl_to_reference(ref_logits, ref_logits).detach()) == pytest.approx(0.0, abs=1e-6)
    # the unedited weights run through the edited model give the unedited logits
    originals = dict(ref.named_parameters())
    assert torch.allclose(batch_logits(model, batch, originals), ref_logits, atol=1e-6)


def test_kl_retain_run_starts_at_zero_and_leaves_the_model_as_found(tokenizer):
    model = tiny_llama(len(tokenizer), layers=2)
    snap = {n: p.detach().clone() for n, p in model.named_parameters()}
    edit = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, retain_loss="kl", lr=1e-2,
                        max_steps=3, batch_size=4, grad_accum=1, warmup_epochs=0)
    hist = edit.info["history"]
    assert hist[0]["retain"] == pytest.approx(0.0, abs=1e-6)  # the first step: the model is its reference
    assert hist[-1]["retain"] > 1e-4 and "retain_nll" in hist[-1]
    assert all(torch.equal(p, snap[n]) for n, p in model.named_parameters())


# ----------------------------------------------------------------------------- precision

class One(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("master", [False, True])
def test_bf16_steps_below_half_a_unit_round_away_without_masters(master):
    """bf16's step at 1.0 is 2**-7; AdamW's first steps move by lr = 0.4 of it. In the
    model's dtype every step rounds back to 1.0; with float32 masters two steps add up."""
    model = One()
    slots = [("w", model.w)]
    s = resolve_settings("ga", lr=0.4 * 2 ** -7, weight_decay=0.0, max_grad_norm=0.0)
    up = updated_tensors(slots, master_weights=master)
    assert bool(up.masters) == master and len(up.work) == (not master)
    opt = adamw(model, s, slots, up.pairs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    for _ in range(3):
        model.w.grad = -torch.ones(4, dtype=torch.bfloat16)
        optimizer_step(opt, sched, up, s)
        assert model.w.dtype == torch.bfloat16
    assert opt.state[up.pairs[0][1]]["exp_avg"].dtype == torch.float32  # float32 moments either way
    if master:
        assert float(model.w[0].detach()) == 1.0 + 2 ** -7
    else:
        assert torch.equal(model.w, torch.ones(4, dtype=torch.bfloat16))
        assert torch.equal(up.work[0][1], model.w.float())  # nothing beyond bf16 survives a step


def test_a_bf16_model_trains_in_bf16_by_default(tokenizer):
    model = tiny_llama(len(tokenizer), layers=2).to(torch.bfloat16)
    trained = copy.deepcopy(model)
    kw = dict(lr=1e-3, max_steps=2, batch_size=4, warmup_epochs=0)
    edit = run_baseline("npo", model, tokenizer, FORGET, RETAIN, **kw)
    assert edit.info["fp32_master_weights"] == [] and edit.info["trained_dtypes"] == ["bfloat16"]
    assert edit.patches and all(P.dtype == torch.bfloat16 for P in edit.patches.values())
    train_in_place("npo", trained, tokenizer, FORGET, RETAIN, **kw)
    assert all(p.dtype == torch.bfloat16 for p in trained.parameters())
    W0 = {n: p.detach().float() for n, p in model.named_parameters()}
    with edit.applied(model):  # the patch gives the weights the run trained, up to rounding
        for (n, p), q in zip(model.named_parameters(), trained.parameters()):
            # a bf16 patch holds final - W0 to 8 bits, and W0 + P rounds again: exact where the
            # change is a few units of the weight's last place, within those roundings elsewhere
            d, err = q.float() - W0[n], (p.float() - q.float()).abs()
            assert bool((err <= 2 ** -8 * d.abs() + 2 ** -8 * q.float().abs()).all()), n
            assert float((err == 0).float().mean()) > 0.75, n


def test_starting_points_per_model_family():
    from grom.methods.trained.starting_points import MODEL_DEFAULTS, starting_point

    rows = {r.family: r for r in MODEL_DEFAULTS}
    smol = starting_point("HuggingFaceTB/SmolLM2-135M-Instruct", "NPO")
    assert smol == rows["smollm2"].methods["npo"] and "grid" in smol.why
    assert starting_point("demo", "simnpo").lr == 1e-3
    other = starting_point("meta-llama/Llama-3.2-1B-Instruct", "npo")
    assert (other.lr, other.epochs) == (1e-5, 10) and "tofu" in other.why  # the recipe's
    assert starting_point(None, "ga", recipe="wmdp").lr == 5e-5
