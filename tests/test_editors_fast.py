"""The editors' fast paths against the slow ones they replaced: the value optimisation
(layers above L only, LM head at the scored positions, facts and essence prompts in two
batches) against the full-model path, kept here as the reference; the keys read from a
stream through the band against full forward passes of the model as each layer left it.
The deltas, and every editor's patches, agree to 1e-6 relative on tiny llama / gpt2 /
neox models, with the band's last layer inside the model and at its top. In float64, so that
what is compared is the math, not the rounding
of float32 sums taken in another order (in float32 they agree to ~1e-6, Adam's steps
carrying the last bits: checked too, at 1e-4)."""
from __future__ import annotations

import copy

import pytest
import torch

from grom.data.encoding import pad_id
from grom.data.schema import QAExample
from grom.methods.editors import locate_then_edit as editing
from grom.methods.editors.layers_above import capture_upper, head_logits, upper_logits
from grom.methods.editors.locate_then_edit import EDITORS, EditorConfig, run_editor
from grom.methods.editors.value_optimisation import (
    Values,
    ValueSettings,
    _object_probs,
    _pad,
    encode_fact,
    optimise_values,
)
from grom.model.arch import decoder_layers, model_device
from grom.model.hooks import hooked
from tests.conftest import FORGET, RETAIN, memorise, tiny_gpt2, tiny_llama, tiny_neox

FACTS = [QAExample(e.question, e.answer, subject=s, fact=f) for e, s, f in zip(
    FORGET, ["Zorvath Quill", "Zorvath Quill", "Ilsa Varn", "Ilsa Varn"],
    ["Pellmoor", "The Glass Orchard", "Tessaly Medal", "1874"])]
SETTINGS = ValueSettings(steps=6, lr=0.5, clamp_norm_factor=2.0)


def full_model_values(model, facts, layer, pad, settings, between=None) -> Values:
    """The value optimisation as it was before (grom.methods.editors.value_optimisation at 94a3e1f): one padded
    batch of facts and essence prompts, the whole model run at every step, delta added to
    layer `layer`'s output by a forward hook, logits at every position."""
    u, dev = len(facts), model_device(model)
    ids, mask = _pad([f.ids for f in facts] + [f.essence for f in facts], pad, dev)
    rows = torch.arange(2 * u, device=dev)
    cols = torch.tensor([f.key for f in facts] + [f.essence_key for f in facts], device=dev)
    dtype = torch.promote_types(model.dtype, torch.float32)
    delta = torch.zeros(u, model.get_input_embeddings().weight.shape[1], dtype=dtype, requires_grad=True)
    seen = {}

    def add_delta(_m, _a, output):
        h = output[0] if isinstance(output, tuple) else output
        seen.setdefault("h", h[rows[:u], cols[:u]].detach().to(dtype))
        h = h.index_put((rows, cols), torch.cat([delta, delta]).to(h.dtype), accumulate=True)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    def run():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return _object_probs(logits[:u], facts), torch.log_softmax(logits[rows[u:], cols[u:]].float(), -1)

    flags = [p.requires_grad for p in model.parameters()]  # given back as found: the fixtures are shared
    model.requires_grad_(False)
    opt = torch.optim.Adam([delta], lr=settings.lr)
    with hooked(decoder_layers(model)[layer], add_delta), torch.enable_grad():
        for step in range(settings.steps):
            probs, kl_logp = run()
            if step == 0:
                p_before, kl_init = torch.stack([p.mean() for p in probs]).detach(), kl_logp.detach()
            h_norm = seen["h"].norm(dim=1)
            unlikely = torch.stack([-torch.log1p(-p.clamp(max=1 - 1e-6)).mean() for p in probs])
            kl = (kl_logp.exp() * (kl_logp - kl_init)).sum(-1)
            loss = unlikely + settings.kl_factor * kl + settings.weight_decay * delta.norm(dim=1) / h_norm ** 2
            if bool((loss < settings.stop_loss).all()):
                break
            opt.zero_grad()
            loss.sum().backward()
            opt.step()
            with torch.no_grad():
                cap = settings.clamp_norm_factor * h_norm
                delta.mul_((cap / delta.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0).unsqueeze(1))
        with torch.no_grad():
            p_after = torch.stack([p.mean() for p in run()[0]])
    for p, flag in zip(model.parameters(), flags):
        p.requires_grad_(flag)
    return Values(layer, delta.detach(), seen["h"], p_before, p_after, step + 1)


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture(scope="module", params=[tiny_llama, tiny_gpt2, tiny_neox])
def trained(request, tokenizer):
    return memorise(request.param(len(tokenizer)), tokenizer, FORGET + RETAIN).double()


@pytest.mark.parametrize("layer", [1, 3])
def test_upper_logits_are_the_full_models(trained, tokenizer, layer):
    ids, mask = _pad([list(range(5, 17)), list(range(20, 27))], pad_id(tokenizer), "cpu")
    with torch.no_grad():
        full = trained(input_ids=ids, attention_mask=mask, use_cache=False).logits
        up = capture_upper(trained, layer, ids, mask)
        r, c = torch.tensor([0, 0, 1]), torch.tensor([3, 11, 6])
        got = upper_logits(trained, up, torch.zeros(2, up.hidden.shape[-1]), torch.tensor([0, 1]),
                           torch.tensor([2, 4]), r, c)
    torch.testing.assert_close(got, full[r, c], rtol=1e-12, atol=1e-12)
    assert head_logits(trained, up.hidden[0, :1]).shape == (1, full.shape[-1])


@pytest.mark.parametrize("layer", [1, 3])
def test_fast_values_equal_the_full_model_path(trained, tokenizer, layer):
    facts = [encode_fact(tokenizer, ex, None, 512) for ex in FACTS]
    ref = full_model_values(trained, facts, layer, pad_id(tokenizer), SETTINGS)
    got = optimise_values(trained, facts, layer, pad_id(tokenizer), SETTINGS)
    assert got.steps == ref.steps and ref.delta.norm() > 0
    assert _rel(got.delta, ref.delta) < 1e-6 and _rel(got.h, ref.h) < 1e-6
    torch.testing.assert_close(got.p_after, ref.p_after, rtol=1e-9, atol=1e-12)


def test_fast_values_in_float32_agree_to_its_rounding(trained_llama, tokenizer):
    facts = [encode_fact(tokenizer, ex, None, 512) for ex in FACTS]
    ref = full_model_values(trained_llama, facts, 2, pad_id(tokenizer), SETTINGS)
    got = optimise_values(trained_llama, facts, 2, pad_id(tokenizer), SETTINGS)
    assert got.delta.dtype == torch.float32 and _rel(got.delta, ref.delta) < 1e-4


@pytest.mark.parametrize("name", list(EDITORS))
def test_every_editors_patch_is_unchanged_by_the_fast_path(name, trained_llama, tokenizer, monkeypatch):
    model = copy.deepcopy(trained_llama).double()
    cfg = EditorConfig(layers=(1, 2), w_r=1.0, values=SETTINGS)
    fast = run_editor(name, model, tokenizer, FACTS, RETAIN, cfg)
    monkeypatch.setattr(editing, "optimise_values", full_model_values)
    monkeypatch.setattr(editing, "HIDDEN_CACHE_BYTES", 0)  # every key from a full pass of the model as edited
    slow = run_editor(name, model, tokenizer, FACTS, RETAIN, cfg)
    assert fast.patches.keys() == slow.patches.keys()
    for k, P in slow.patches.items():
        assert P.norm() > 0 and _rel(fast.patches[k], P) < 1e-6, k


def test_a_value_layer_at_the_top_is_reported_unable_to_move_the_facts(trained_llama, tokenizer, caplog):
    cfg = EditorConfig(layers=(3,), w_r=1.0, values=SETTINGS)  # layer 3: the tiny model's last
    edit = run_editor("rome", trained_llama, tokenizer, FACTS, RETAIN, cfg)
    assert edit.info["unreachable_facts"] == len(FACTS) and "cannot move" in caplog.text
    torch.testing.assert_close(torch.tensor(edit.info["p_answer_value"]), torch.tensor(edit.info["p_answer_before"]))
    below = EditorConfig(layers=(2,), w_r=1.0, values=SETTINGS)
    assert run_editor("rome", trained_llama, tokenizer, FACTS, RETAIN, below).info["unreachable_facts"] == 0
