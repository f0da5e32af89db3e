"""grom.robustness.depth, the Unlearning Depth Score, against a transcription of upstream's
computation (gnueaj/unlearning-depth-score, compute_uds.py: `get_eval_span`,
`build_logprob_ctx`, `_prepare_batch_inputs`, the baseline and the patched log-probs, the
S1/S2 deltas, the KE layers and the UDS sum), on tiny memorised models: an edited copy and a
retain model trained without the forget set."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from grom import EditConfig, run_edit
from grom.data.prompts import encode_prompt
from grom.robustness import Probe
from grom.robustness.depth import THRESHOLD, depth_attack, fact_tokens, uds_of, unlearning_depth
from grom.robustness.suite import attack_names, run_attacks
from tests.conftest import FORGET, RETAIN, assert_bit_exact, memorise, snapshot, tiny_llama

FACTS = ("Pellmoor", "Glass Orchard", "Tessaly Medal", "1874")
PROBES = [Probe(ex.question, ex.answer, fact) for ex, fact in zip(FORGET, FACTS)]


@pytest.fixture(scope="module")
def edit(trained_llama, tokenizer):
    return run_edit(trained_llama, tokenizer, FORGET, RETAIN, EditConfig(layers=(2, 3), beta=30.0, w_r=30.0, rho=0.05))


@pytest.fixture(scope="module")
def retain_model(tokenizer):
    """Trained as the unedited model was, without the forget set (a retain model)."""
    return memorise(tiny_llama(len(tokenizer)), tokenizer, RETAIN)


# ------------------------------------------------ the transcription of upstream's computation

def upstream_span(tokenizer, reference: str, entity: str):
    """`get_eval_span` with scope "entity" and a fast tokenizer."""
    enc = tokenizer(reference, add_special_tokens=False, return_offsets_mapping=True)
    char_start = reference.find(entity)
    char_end = char_start + len(entity)
    idx = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > char_start and s < char_end]
    return min(idx), max(idx) + 1


def upstream_ctx(prompt_ids, ref_ids, span):
    """`build_logprob_ctx` with patch_scope "span"."""
    start = max(len(prompt_ids) - 1, 0)
    return {"ids": prompt_ids + ref_ids, "start": start, "ps": start + span[0], "pe": start + span[1],
            "eval": ref_ids[span[0]:span[1]]}


def upstream_inputs(ctxs, pad):
    """`_prepare_batch_inputs`: right padding and its mask."""
    longest = max(len(c["ids"]) for c in ctxs)
    ids = torch.full((len(ctxs), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(ctxs), longest), dtype=torch.long)
    for i, c in enumerate(ctxs):
        ids[i, :len(c["ids"])] = torch.tensor(c["ids"])
        mask[i, :len(c["ids"])] = 1
    return ids, mask


@torch.no_grad()
def upstream_logprob(model, ids, mask, ctxs, patch=None):
    """The baseline (patch None) or the layer-patched mean log-prob of each row's eval span;
    patch = (layer, the source's hidden state entering layer+1), the span's positions replaced."""
    handle = None
    if patch is not None:
        layer, source = patch

        def hook(_m, _i, output):
            hs = (output[0] if isinstance(output, tuple) else output).clone()
            for b, c in enumerate(ctxs):
                hs[b, c["ps"]:c["pe"]] = source[b, c["ps"]:c["pe"]]
            return (hs,) + output[1:] if isinstance(output, tuple) else hs
        handle = model.model.layers[layer].register_forward_hook(hook)
    logits = model(ids, attention_mask=mask).logits
    if handle is not None:
        handle.remove()
    out = []
    for b, c in enumerate(ctxs):
        lp = torch.log_softmax(logits[b:b + 1, c["ps"]:c["pe"]], -1)
        out.append(lp.gather(-1, torch.tensor([c["eval"]])[..., None])[..., 0].mean().item())
    return out


@torch.no_grad()
def upstream_uds(full, retain, unlearn, tokenizer, probes, layers):
    """S1/S2 deltas per probe and layer, and the UDS per probe, as upstream computes them."""
    ctxs = []
    for p in probes:
        prompt_ids = encode_prompt(tokenizer, p.question)
        ref_ids = tokenizer(p.answer, add_special_tokens=False)["input_ids"]
        ctxs.append(upstream_ctx(prompt_ids, ref_ids, upstream_span(tokenizer, p.answer, p.fact)))
    ids, mask = upstream_inputs(ctxs, tokenizer.pad_token_id)
    full_score = upstream_logprob(full, ids, mask, ctxs)
    unlearn_hidden = unlearn(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    retain_hidden = retain(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    s1 = [[full_score[b] - v for b, v in enumerate(upstream_logprob(full, ids, mask, ctxs, (l, retain_hidden[l + 1])))]
          for l in layers]
    s2 = [[full_score[b] - v for b, v in enumerate(upstream_logprob(full, ids, mask, ctxs, (l, unlearn_hidden[l + 1])))]
          for l in layers]
    s1, s2 = [list(r) for r in zip(*s1)], [list(r) for r in zip(*s2)]  # (probe, layer)
    uds = []
    for d1s, d2s in zip(s1, s2):
        numer = denom = 0.0
        for d1, d2 in zip(d1s, d2s):
            if d1 <= THRESHOLD:
                continue
            denom += d1
            numer += d1 * min(max(d2 / d1, 0.0), 1.0)
        uds.append(numer / denom if denom > 0 else None)
    return full_score, s1, s2, uds


def test_depth_matches_upstreams_computation(trained_llama, tokenizer, edit, retain_model):
    snap = snapshot(trained_llama)
    d = unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=retain_model)
    assert_bit_exact(trained_llama, snap)
    assert not edit.is_applied
    unlearn = copy.deepcopy(trained_llama)
    copy.deepcopy(edit).apply(unlearn)
    n = len(d.layers)
    # upstream's last hidden state has the final norm applied (transformers' output_hidden_states):
    # compared below the last layer, where both take the layer's own output
    full, s1, s2, uds = upstream_uds(trained_llama, retain_model, unlearn, tokenizer, PROBES, range(n - 1))
    assert d.base == pytest.approx(full, abs=1e-5)
    wants = []
    for i in range(len(PROBES)):
        assert d.s1[i][:n - 1] == pytest.approx(s1[i], abs=1e-5)
        assert d.s2[i][:n - 1] == pytest.approx(s2[i], abs=1e-5)
        want = uds_of(s1[i] + [d.s1[i][-1]], s2[i] + [d.s2[i][-1]])
        wants.append(want)
        assert (d.uds[i] is None) if want is None else d.uds[i] == pytest.approx(want, abs=1e-6), (d.uds[i], want)
    assert any(u is not None for u in d.uds)
    # at the last layer every fact position carries the edited model's own output: S2 is its fall
    assert [r[-1] for r in d.s2] == pytest.approx(list(d.output_drop), abs=1e-5)
    # below the band (layers 0, 1) the edited states are the unedited ones: no fall, and no pass needed
    assert all(r[0] == 0.0 and r[1] == 0.0 for r in d.s2)
    assert [v for r in s2 for v in r[:2]] == pytest.approx([0.0] * 2 * len(PROBES), abs=1e-6)
    defined = [u for u in wants if u is not None]
    assert d.mean_uds == pytest.approx(sum(defined) / len(defined), abs=1e-6)
    # upstream's own UDS over the layers below the last, from its own deltas
    ler = d.erased_share()  # upstream's layer erasure ratio, over the probes whose S1 passes tau there
    for j in range(n - 1):
        counted = [min(max(s2[i][j] / s1[i][j], 0.0), 1.0) for i in range(len(PROBES)) if s1[i][j] > THRESHOLD]
        assert (math.isnan(ler[j]) if not counted else ler[j] == pytest.approx(sum(counted) / len(counted), abs=1e-5))
    assert [u is None for u in uds] == [uds_of(a[:n - 1], b[:n - 1]) is None for a, b in zip(d.s1, d.s2)]


def test_uds_by_hand():
    assert uds_of([0.5, 0.01, 1.0], [0.25, 5.0, 2.0]) == pytest.approx((0.5 * 0.5 + 1.0 * 1.0) / 1.5)
    assert uds_of([0.5, 1.0], [-1.0, 0.0]) == 0.0  # clipped at 0: patching raised the score
    assert uds_of([0.04, 0.05], [1.0, 1.0]) is None  # no layer above tau: no knowledge-encoding layer


def test_the_retain_model_itself_and_the_unedited_model(trained_llama, tokenizer, edit, retain_model):
    """Patching the unedited model into itself loses nothing (S1 0, no UDS); with the edited
    model as the retain model, S2 = S1 and UDS is 1 wherever defined."""
    same = unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=trained_llama)
    assert all(abs(v) < 1e-6 for r in same.s1 for v in r) and all(u is None for u in same.uds)
    edited = copy.deepcopy(trained_llama)
    copy.deepcopy(edit).apply(edited)
    own = unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=edited)
    assert [v for r in own.s1 for v in r] == pytest.approx([v for r in own.s2 for v in r], abs=1e-5)
    assert all(u == pytest.approx(1.0) for u in own.uds if u is not None) and own.mean_uds == pytest.approx(1.0)


def test_output_referenced_depth_without_a_retain_model(trained_llama, tokenizer, edit):
    d = unlearning_depth(trained_llama, tokenizer, edit, PROBES)
    assert d.s1 is None and all(u is None for u in d.uds) and math.isnan(d.mean_uds)
    share = d.erased_share()
    assert share[0] == share[1] == 0.0  # below the band the edited states carry none of the fall
    assert share[3] == pytest.approx(1.0)  # the last layer carries all of it
    assert d.output_depth == pytest.approx(sum(share) / len(share))
    res = depth_attack(trained_llama, tokenizer, edit, PROBES[:2], fitted=PROBES[2:])
    assert res.name == "depth" and res.base == 0.0 and res.n == 2 and res.details["measure"] == "output"
    assert res.details["fitted"]["n"] == 2 and len(res.details["s2"]) == 4 and res.details["s1"] == []
    assert res.details["first_changed_layer"] == 2 and res.details["band"] == [2, 3]


def test_fact_tokens_are_the_answers_tokens_over_the_fact(tokenizer):
    p = Probe("Where was Zorvath Quill born?", "Zorvath Quill was born in Pellmoor.", "pellmoor")
    f = fact_tokens(tokenizer, p)
    assert f.found and tokenizer.decode(list(f.tokens)).strip() == "Pellmoor"
    assert [f.ids[i + 1] for i in f.at] == list(f.tokens)  # each position predicts the next token
    missing = fact_tokens(tokenizer, Probe(p.question, "I do not know.", "Pellmoor"))
    assert not missing.found and tokenizer.decode(list(missing.tokens)).strip() == "Pellmoor"


def test_depth_in_the_suite_turns_and_leaves_the_model_as_found(trained_llama, tokenizer, edit):
    snap = snapshot(trained_llama)
    hooks = lambda m: [list(layer._forward_hooks) for layer in m.model.layers]  # noqa: E731
    before = hooks(trained_llama)
    seen = []

    def between(as_found):
        seen.append(edit.is_applied)  # a turn finds the model unedited
    assert "depth" in attack_names("all")
    out = run_attacks(trained_llama, tokenizer, edit, PROBES, fitted=FORGET, attacks="depth", between=between)
    assert_bit_exact(trained_llama, snap)
    assert seen and not any(seen)
    assert hooks(trained_llama) == before  # no patch left behind (transformers' own capture hooks stay)
    assert 0.0 < out["depth"].edited < 1.0


def test_a_retain_model_of_another_depth_is_refused(trained_llama, tokenizer, edit):
    with pytest.raises(ValueError, match="layers"):
        unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=tiny_llama(len(tokenizer), layers=2))


def test_patched_passes_replay_the_unedited_layers_below_them(trained_llama, tokenizer, edit, retain_model,
                                                              monkeypatch):
    """A pass patched at layer l runs only the layers above l, the rest replayed from the
    unedited pass (`BelowTheEdit.replaying_from`): the same Depth, bit for bit, as passes
    that run every layer, and the replays hit."""
    from contextlib import nullcontext

    from grom.robustness import result

    real = result.BelowTheEdit.replaying_from
    hits = []

    def counted(self, layer):
        hits.append(self.cache)
        return real(self, layer)
    monkeypatch.setattr(result.BelowTheEdit, "replaying_from", counted)
    fast = unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=retain_model)
    n = len(fast.layers)
    assert len(hits) == n + (n - edit.band[0]) and len({id(c) for c in hits}) == 1
    assert hits[0].hits == len(hits) + 1 and hits[0].misses == 0  # and the edited pass replays below the band
    monkeypatch.setattr(result.BelowTheEdit, "replaying_from", lambda self, layer: nullcontext())
    whole = unlearning_depth(trained_llama, tokenizer, edit, PROBES, reference=retain_model)
    assert fast == whole
