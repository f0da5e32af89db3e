"""`grom.eval.prefix`: evaluating an edit with the unedited layers below it replayed gives
the same numbers, bit for bit, as running every layer, on a tiny random model of every
supported family (sliding windows shorter than the prompts included), for teacher-forced
scores and for greedy generation (whose prompt pass replays the keys and values)."""
import numpy as np
import pandas as pd
import pytest
import torch

from grom.closed_form.config import EditConfig
from grom.edit import Edit
from grom.eval.prefix import PrefixCache, first_changed_layer
from grom.eval.runner import generate, score_answers
from grom.model.arch import ARCHITECTURES, edited_matrix, num_layers
from tests.conftest import FORGET, RETAIN, tiny_llama
from tests.test_stream_families import tiny_model

PAIRS = [(ex.question, ex.answer) for ex in FORGET + RETAIN]
PROMPTS = [ex.question for ex in FORGET + RETAIN]


def patch_edit(model, layer: int, kind: str = "down_proj", scale: float = 0.5, seed: int = 1) -> Edit:
    """An edit adding a seeded random patch to one matrix (what it is does not matter
    here: only which layers it changes)."""
    name = edited_matrix(model, kind, layer if kind != "lm_head" else None).param_name
    W = model.get_parameter(name)
    g = torch.Generator().manual_seed(seed)
    return Edit(EditConfig(), {name: scale * torch.randn(W.shape, generator=g) * W.detach().std()})


def run(model, tok):
    scores = score_answers(model, tok, PAIRS, batch_size=4)
    gens = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=4)
    return [s.logprobs for s in scores], gens


def same(a, b):
    (lp_a, gen_a), (lp_b, gen_b) = a, b
    assert gen_a == gen_b
    for x, y in zip(lp_a, lp_b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_replayed_layers_give_the_same_scores_and_generations(tokenizer, model_type):
    model = tiny_model(model_type, len(tokenizer))
    edit = patch_edit(model, 2)
    assert first_changed_layer(model, edit) == 2
    with edit.applied(model):
        full = run(model, tokenizer)

    # recorded on the unedited model, replayed on the edited one
    cache = PrefixCache()
    with cache.reusing(model, None, capture=(2,)):
        base = run(model, tokenizer)
    assert len(cache) > 0 and cache.hits == 0
    batches = -(-len(PAIRS) // 4)
    assert len(cache) == 2 * batches  # each scored batch, and each prompt pass with its keys/values
    with edit.applied(model), cache.reusing(model, 2):
        replayed = run(model, tokenizer)
    assert cache.hits == len(cache) and cache.misses == 0  # every prompt pass and scored batch
    same(replayed, full)
    same(run(model, tokenizer), base)  # the model is left as found

    # recorded on the edited model's first evaluation (its layers below 2 are unedited)
    cache = PrefixCache()
    with edit.applied(model), cache.reusing(model, 2):
        first = run(model, tokenizer)
    assert cache.misses == len(cache) > 0
    with edit.applied(model), cache.reusing(model, 2):
        second = run(model, tokenizer)
    assert cache.hits == len(cache)
    same(first, full)
    same(second, full)


def test_an_lm_head_edit_replays_every_layer(tokenizer):
    model = tiny_llama(len(tokenizer))
    edit = patch_edit(model, 0, kind="lm_head")
    n = num_layers(model)
    assert first_changed_layer(model, edit) == n
    with edit.applied(model):
        full = run(model, tokenizer)
    cache = PrefixCache()
    with cache.reusing(model, None, capture=(n,)):
        run(model, tokenizer)
    with edit.applied(model), cache.reusing(model, n):
        same(run(model, tokenizer), full)
    assert cache.hits == len(cache) > 0


def test_which_layers_an_edit_leaves_alone(tokenizer):
    model = tiny_llama(len(tokenizer))
    tied = tiny_llama(len(tokenizer), tie=True)
    n = num_layers(model)
    assert first_changed_layer(model, None) == n
    assert first_changed_layer(model, patch_edit(model, 3)) == 3
    assert first_changed_layer(model, patch_edit(model, 1, kind="o_proj")) == 1
    assert first_changed_layer(model, patch_edit(model, 0, kind="lm_head")) == n
    # a tied head is the input embedding: patching it changes every layer's input
    assert first_changed_layer(tied, patch_edit(tied, 0, kind="lm_head")) == 0
    untied = patch_edit(tied, 0, kind="lm_head")
    untied.unties_lm_head = True
    assert first_changed_layer(tied, untied) == n
    everything = Edit(EditConfig(), {k: torch.zeros_like(p) for k, p in model.named_parameters()})
    assert first_changed_layer(model, everything) == 0  # a gradient baseline: nothing reusable
    assert first_changed_layer(model, Edit(EditConfig(), {"no.such.weight": torch.zeros(1)})) == 0


def test_a_different_batch_or_layer_misses_and_the_cache_stays_bounded(tokenizer):
    model = tiny_llama(len(tokenizer))
    cache = PrefixCache()
    with cache.reusing(model, None, capture=(2,)):
        score_answers(model, tokenizer, PAIRS[:3])
    with patch_edit(model, 3).applied(model), cache.reusing(model, 3):
        score_answers(model, tokenizer, PAIRS[:3])  # another layer: recorded anew
    with patch_edit(model, 2).applied(model), cache.reusing(model, 2):
        score_answers(model, tokenizer, PAIRS[1:4])  # another batch
    assert cache.hits == 0 and cache.misses == 2 and len(cache) == 3
    small = PrefixCache(max_bytes=cache.nbytes // 3 + 1)
    for pairs in (PAIRS[:3], PAIRS[1:4], PAIRS[2:5]):
        with small.reusing(model, None, capture=(2,)):
            score_answers(model, tokenizer, pairs)
    assert len(small) == 1 and small.nbytes <= small.max_bytes
    other = tiny_llama(len(tokenizer), seed=3)
    with small.reusing(other, 2):
        pass
    assert len(small) == 0  # another model: nothing kept applies


def _knowledge_bench():
    from grom.data.schema import Benchmark, QAExample, TextExample

    fact = lambda ex: ex.answer.rstrip(".").split()[-1]  # noqa: E731
    qa = lambda ex: QAExample(ex.question, ex.answer, paraphrased_question=ex.question + " Say it.",  # noqa: E731
                              fact=fact(ex), subject="x")
    return Benchmark("real-knowledge", "t", tuple(map(qa, FORGET)), tuple(map(qa, RETAIN)),
                     eval_sets={"forget": tuple(map(qa, FORGET)), "neighbours": tuple(map(qa, RETAIN)),
                                "fluency": (TextExample("Odo Brask was born in Quenford."),)},
                     task="knowledge")


@pytest.mark.parametrize("task", ["knowledge", "tofu"])
def test_evaluate_with_a_prefix_cache_gives_the_same_report(tokenizer, trained_llama, task):
    """The app's path: the Base row records for the band's first layer, every later edit of
    that band replays it; the reports equal those computed without the cache."""
    from grom import EditConfig, run_edit
    from grom.eval import evaluate
    from tests.test_eval_report import _tofu_like

    bench = _knowledge_bench() if task == "knowledge" else _tofu_like()
    cache = PrefixCache()
    first = evaluate(trained_llama, tokenizer, bench, batch_size=8, prefix=cache, record_at=(1,))
    assert len(cache) > 0 and cache.hits == 0
    for beta in (10.0, 30.0):
        edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                        EditConfig(layers=(1, 2), beta=beta, w_r=30.0))
        hits = cache.hits
        fast = evaluate(trained_llama, tokenizer, bench, edit=edit, batch_size=8, reuse=first, prefix=cache)
        assert cache.hits > hits and cache.misses == 0
        full = evaluate(trained_llama, tokenizer, bench, edit=edit, batch_size=8)
        # the same answers and classes; a judged answer's perplexity read from the states an earlier
        # decoding kept below the band (`LowerStates`, `Recall`) to the rounding of another batch
        pd.testing.assert_frame_equal(fast.table(), full.table(), check_exact=False, rtol=1e-6)
        for name, df in full.rows["Edited"].examples.items():
            pd.testing.assert_frame_equal(fast.rows["Edited"].examples[name], df, check_exact=False, rtol=1e-6)


def test_a_pass_that_raises_leaves_no_layer_replaced(tokenizer):
    """A forward pass that fails midway (a cancelled job) must not leave the layers below
    the band replaced for the next pass, inside the block or after it."""
    from grom.model.arch import decoder_layers

    model = tiny_llama(len(tokenizer))
    edit = patch_edit(model, 2)
    cache = PrefixCache()
    with cache.reusing(model, None, capture=(2,)):
        score_answers(model, tokenizer, PAIRS[:3])
    boom = decoder_layers(model)[3].register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(RuntimeError))
    with edit.applied(model), cache.reusing(model, 2):
        with pytest.raises(RuntimeError):
            score_answers(model, tokenizer, PAIRS[:3])  # replayed up to layer 2, then fails
        boom.remove()
        inside = score_answers(model, tokenizer, PAIRS[3:6])  # another batch: every layer runs
    assert not any("forward" in layer.__dict__ for layer in decoder_layers(model))
    with edit.applied(model):
        full = score_answers(model, tokenizer, PAIRS[3:6])
    for a, b in zip(inside, full):
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
