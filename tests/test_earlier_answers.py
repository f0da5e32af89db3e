"""An earlier edit's answers read as guesses (`grom.eval.prefix.Recall`,
`grom.eval.runner.greedy_answers`): the answers a later decoding gives are the greedy
answers whatever the earlier edit was; where they are the same, they cost one
teacher-forced pass of the layers from the band up instead of decoding steps; the store
keeps each sequence once, within its bytes, per layer; an evaluation with a prefix cache
reads the answers of the one before it."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from grom import EditConfig, run_edit
from grom.data.prompts import encode_prompt
from grom.eval import evaluate
from grom.eval import runner as R
from grom.eval.prefix import LowerStates, PrefixCache, Recall
from grom.eval.report import EDITED, record_drafts
from grom.eval.runner import eos_ids, greedy_answers, greedy_until, left_padded
from grom.model.arch import decoder_layers
from grom.tasks import knowledge as K
from tests.conftest import FORGET, RETAIN
from tests.test_eval_knowledge import _knowledge_bench
from tests.test_lower_states import _entering

LAYER, BUDGET = 2, 12


def _batch(tokenizer):
    questions = [ex.question for ex in FORGET + RETAIN]
    facts = [ex.answer.rstrip(".").split()[-1] for ex in FORGET + RETAIN]
    facts[0], facts[1] = "Nowhere", None  # never stated: the budget ends them
    ids, mask = left_padded([encode_prompt(tokenizer, q) for q in questions], tokenizer.pad_token_id)
    return ids, mask, facts


def test_a_repeated_decoding_reads_the_earlier_answers_in_one_pass(trained_llama, tokenizer):
    ids, mask, facts = _batch(tokenizer)
    eos = eos_ids(trained_llama, tokenizer)
    plain = greedy_until(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts)
    recall = Recall()
    first, _ = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts,
                              lower=LowerStates(LAYER, recall))
    assert first == plain and len(recall) == len(plain)
    steps = []
    again, done = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts,
                                 lower=LowerStates(LAYER, recall), on_step=steps.append)
    assert again == plain and all(done)
    assert steps == [len(plain)]  # every row finished before a single decoding step
    assert len(recall) == len(plain)  # nothing held twice


@pytest.mark.parametrize("scale", [-3.0, 0.0])
def test_an_earlier_edits_answers_give_a_later_edits_greedy_answers(trained_llama, tokenizer, monkeypatch, scale):
    """The guesses come from the unedited model; the edited one (a layer from LAYER up
    changed) departs from some, after some of their tokens or at once: its answers are
    those plain decoding gives, and the states kept for them those of a plain pass."""
    ids, mask, facts = _batch(tokenizer)
    eos = eos_ids(trained_llama, tokenizer)
    recall = Recall()
    greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, lower=LowerStates(LAYER, recall))
    unedited = greedy_until(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts)
    fed, real = [], R._feed_pending
    monkeypatch.setattr(R, "_feed_pending", lambda *a: fed.append(dict(a[5])) or real(*a))
    w = decoder_layers(trained_llama)[LAYER].mlp.down_proj.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(scale)
        plain = greedy_until(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts)
        got, done = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts,
                                   lower=LowerStates(LAYER, recall))
        prompts = [ids[r, mask[r] == 1].tolist() for r in range(len(plain))]
        entering = [_entering(trained_llama, p + a, LAYER) for p, a in zip(prompts, plain)]
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert got == plain and all(done)
    assert unedited != plain  # the edit changed some answers: the guesses were not all right
    assert fed and any(len(tokens) > 1 for tokens in fed[0].values())  # some went on from a guess's tokens
    for p, a, want in zip(prompts, plain, entering):
        held = recall.states_for(LAYER, p + a)
        assert held is not None, "every token of the answer was fed"
        torch.testing.assert_close(held, want, rtol=1e-4, atol=1e-5)


def test_the_recall_keeps_each_sequence_once_within_its_bytes_and_per_layer():
    recall = Recall(max_bytes=3 * 4 * 4 * 2)  # three sequences of 4 states of 2 floats
    s = lambda n: torch.ones((n, 2))  # noqa: E731
    recall.hold(1, [1, 2], s(2))
    recall.hold(1, [1, 2, 3, 4], s(4))  # extends [1, 2]: replaces it
    assert len(recall) == 1 and recall.nbytes == 32
    recall.hold(1, [1, 2, 3], s(3))  # starts one held: adds nothing
    assert len(recall) == 1
    assert recall.extending(1, [1, 2])[0] == (1, 2, 3, 4)
    assert recall.extending(1, [1, 2, 3, 4]) is None  # nothing goes on past it
    assert recall.extending(2, [1, 2]) is None  # another layer's states are another thing
    recall.hold(2, [1, 2], s(4)[:2])
    torch.testing.assert_close(recall.states_for(1, [1, 2, 3]), s(3))
    recall.hold(1, [5, 6, 7, 8], s(4))
    recall.hold(1, [9, 9, 9, 9], s(4))  # past the bytes: the least recently used goes
    assert recall.nbytes <= recall.max_bytes and recall.extending(1, [1, 2]) is None
    tagged = Recall()
    tagged.hold(1, [1, 2, 3, 4], s(4), tag="a")
    tagged.hold(1, [1, 2], s(2), tag="b")  # an answer that ends where the held one goes on: served by it
    assert len(tagged) == 1 and tagged.extending(1, [1], tag="b", only=True)[0] == (1, 2, 3, 4)
    tagged.hold(1, [1, 2, 5, 6], s(4), tag="c")
    assert tagged.extending(1, [1, 2])[0] == (1, 2, 5, 6)  # the most recently used
    assert tagged.extending(1, [1, 2], tag="a")[0] == (1, 2, 3, 4)  # but the edit's own first
    assert tagged.extending(1, [1, 2], tag="z")[0] == (1, 2, 3, 4)  # (now the most recently used)
    assert tagged.extending(1, [1, 2], tag="z", only=True) is None
    tagged.hold(1, [1, 2, 5, 6, 7], s(5), tag="d")  # extends c's: takes its tag
    assert tagged.extending(1, [1, 2], tag="c", only=True)[0] == (1, 2, 5, 6, 7)
    cache = PrefixCache()
    cache.recall.hold(1, [1, 2], s(2))
    cache.clear()
    assert len(cache.recall) == 0  # dropped with the cache's entries (another model, say)


@pytest.mark.parametrize("drafted", [False, True])
def test_an_evaluation_reads_the_edited_answers_of_the_one_before(trained_llama, tokenizer, monkeypatch, drafted):
    """The same edit again: its answers read in one pass, no drafted pass and no decoding
    step, its perplexities not computed again; another edit after it: the answers of
    the one before read as guesses. Each gives what an evaluation without them gives."""
    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain, EditConfig(layers=(1, 2), beta=30.0,
                                                                                       w_r=30.0))
    plain = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers")
    cache = PrefixCache()
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers", prefix=cache, record_at=(1,))
    if drafted:
        assert record_drafts(trained_llama, tokenizer, bench, base, cache, (1,), batch_size=8)
    evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", prefix=cache, reuse=base)
    assert len(cache.recall) and len(cache.recall.judged)
    read, passes, scored = [], [], []
    real_read, real_pass, real_score = R.read_guesses, R._drafted_pass, K.score_answers

    def spying(model, fed, live, *args, **kwargs):
        out = real_read(model, fed, live, *args, **kwargs)
        read.append((kwargs.get("same", False), len(live), len(out)))
        return out
    monkeypatch.setattr(R, "read_guesses", spying)
    monkeypatch.setattr(R, "_drafted_pass", lambda *a, **k: passes.append(1) or real_pass(*a, **k))
    monkeypatch.setattr(K, "score_answers", lambda m, t, pairs, **k: scored.append(len(pairs)) or real_score(
        m, t, pairs, **k))
    again = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", prefix=cache, reuse=base)
    assert read and all(same and after == 0 for same, _, after in read)  # every answer read, none decoded
    assert not passes and not scored  # no drafted pass, no perplexity computed again
    other = run_edit(trained_llama, tokenizer, bench.forget, bench.retain, EditConfig(layers=(1, 2), beta=5.0,
                                                                                        w_r=30.0))
    read.clear()
    later = evaluate(trained_llama, tokenizer, bench, other, batch_size=8, stage="answers", prefix=cache, reuse=base)
    assert read and not any(same for same, *_ in read)  # another edit: read after the first pass
    unread = evaluate(trained_llama, tokenizer, bench, other, batch_size=8, stage="answers")
    read.clear()
    back = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", prefix=cache, reuse=base)
    assert read and all(same and after == 0 for same, _, after in read)  # the first edit's answers, read again
    whole = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, prefix=cache, reuse=base)
    twice = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, prefix=cache, reuse=base)
    pd.testing.assert_frame_equal(twice.table(), whole.table())  # every kept perplexity written into the frames
    for name in plain.rows[EDITED].examples:
        pd.testing.assert_frame_equal(again.examples(EDITED, name), plain.examples(EDITED, name))
        pd.testing.assert_frame_equal(back.examples(EDITED, name), plain.examples(EDITED, name))
        pd.testing.assert_frame_equal(later.examples(EDITED, name), unread.examples(EDITED, name))
