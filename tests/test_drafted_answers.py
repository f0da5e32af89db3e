"""Answers read off drafts (`grom.eval.runner.greedy_answers`): the unedited model's answers
read teacher-forced as each edited answer's likely start give the very greedy answers,
in fewer decoding steps; and the knowledge task's card stages that use them on a CPU
(the unedited row records the drafted passes in a prefix cache, the edited rows replay
them: `grom.tasks.knowledge._decode_drafted`)."""
from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from grom.data.prompts import encode_prompt
from grom.eval import evaluate
from grom.eval.prefix import PrefixCache
from grom.eval.report import BASE, DRAFTS, EDITED, record_drafts
from grom.eval.runner import eos_ids, generate, greedy_answers, greedy_until, left_padded
from tests.conftest import FORGET, RETAIN
from tests.test_eval_knowledge import _knowledge_bench

BUDGET = 20


def _batch(tokenizer, questions):
    ids, mask = left_padded([encode_prompt(tokenizer, q) for q in questions], tokenizer.pad_token_id)
    return ids, mask


def test_drafts_give_the_greedy_answers_whatever_they_guess(trained_llama, tokenizer):
    """Right, half right, wrong, empty, too long: each draft gives the answers decoding alone gives."""
    questions = [ex.question for ex in FORGET + RETAIN]
    facts = [ex.answer.rstrip(".").split()[-1] for ex in FORGET + RETAIN]
    facts[0], facts[1] = "Nowhere", None  # never stated: run to the budget
    ids, mask = _batch(tokenizer, questions)
    eos = eos_ids(trained_llama, tokenizer)
    plain = greedy_until(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts)
    wrong = tokenizer(" the the the", add_special_tokens=False)["input_ids"]
    drafts = []
    for r, answer in enumerate(plain):
        kind = r % 5
        drafts.append(answer if kind == 0 else answer[:len(answer) // 2] + wrong if kind == 1 else wrong
                      if kind == 2 else [] if kind == 3 else answer + wrong * 10)
    steps = []
    new, done = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, drafts=drafts,
                               on_step=steps.append)
    assert new == plain and all(done)
    right = sum(1 for r in range(len(plain)) if r % 5 in (0, 4))
    assert steps[0] >= right  # the rows whose draft held finished in the pass
    # no decoding past the pass: the rows finished are final, the others read as far as they agreed
    first, finished = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, drafts=drafts,
                                     decode=False)
    for r, (got, full) in enumerate(zip(first, plain)):
        if finished[r]:
            assert got == full
        else:
            assert full[:len(got)] == got and len(got) < len(full)  # the greedy answer's start
    assert sum(finished) >= right
    # rows not wanted stop after the pass too
    some, _ = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, drafts=drafts,
                             wanted=[r % 2 == 0 for r in range(len(plain))])
    assert [some[r] for r in range(0, len(plain), 2)] == plain[::2]
    with pytest.raises(ValueError, match="drafts"):
        greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, drafts=drafts[:2])


def test_generate_reads_text_drafts(trained_llama, tokenizer):
    questions = [ex.question for ex in FORGET + RETAIN]
    facts = [ex.answer.rstrip(".").split()[-1] for ex in FORGET + RETAIN]
    plain = generate(trained_llama, tokenizer, questions, max_new_tokens=BUDGET, batch_size=4, stop_at=facts)
    guesses = [t if i % 2 else "Something else entirely." for i, t in enumerate(plain)]
    assert generate(trained_llama, tokenizer, questions, max_new_tokens=BUDGET, batch_size=4, stop_at=facts,
                    drafts=guesses) == plain
    with pytest.raises(ValueError, match="drafts"):
        generate(trained_llama, tokenizer, questions, drafts=guesses)  # no stop phrases


def test_the_card_stages_read_drafts_where_a_prefix_cache_replays_them(trained_llama, tokenizer, monkeypatch):
    """On a CPU, with the Base row's drafted passes recorded in a prefix cache for the edit's
    first layer (`record_drafts`), the edited row's first verdict (stage "forget") reads the
    forget side off one replayed pass: what it calls stated is final, the rest is "cut"
    (not stated yet, no class); the answers stage after it gives the answers a plain
    evaluation gives, and so does a full evaluation."""
    from grom import EditConfig, run_edit
    from grom.eval import runner as R

    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    plain = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers")
    cache = PrefixCache()
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers", prefix=cache, record_at=(1,))
    assert not cache.marked(DRAFTS, 1)  # evaluate records its own passes, not the drafted ones
    assert record_drafts(trained_llama, tokenizer, bench, base, cache, (1,), batch_size=8)
    assert cache.marked(DRAFTS, 1) and not cache.marked(DRAFTS, 2)
    recorded = len(cache)
    drafted, real = [], R.greedy_answers

    def spying(*args, **kwargs):
        drafted.append(kwargs.get("drafts") is not None)
        return real(*args, **kwargs)
    monkeypatch.setattr(R, "greedy_answers", spying)
    hits = cache.hits
    first = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="forget", reuse=base, prefix=cache)
    assert drafted == [True] and cache.hits > hits and len(cache) == recorded  # replayed, nothing new
    mine, whole = first.examples(EDITED, "forget"), plain.examples(EDITED, "forget")
    cut = mine["cut"].to_numpy(dtype=bool)
    assert list(mine["generation"][~cut]) == list(whole["generation"][~cut])  # finished: the whole answer
    assert (mine["fact_recall"][cut] == 0.0).all() and (mine["answer_class"][cut] == "pending").all()
    for g, w in zip(mine["generation"][cut], whole["generation"][cut]):
        assert w.startswith(g)  # read as far as it agreed, then one token
    said = []
    rest = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", reuse=first,
                    answers=first, prefix=cache, progress=lambda f, m: said.append(m))
    counts = [tuple(map(int, re.search(r"(\d+) of (\d+) answers", m).groups())) for m in said if "answers" in m]
    assert counts and all(d <= t for d, t in counts) and [d for d, _ in counts] == sorted(d for d, _ in counts)
    sets = bench.eval_sets  # decoded now: the cut forget answers, the paraphrases, the kept sets' questions
    assert counts[-1][0] == counts[-1][1] == sum(cut) + len(sets["forget"]) + len(sets["neighbours"]) + len(
        sets["general"])
    assert rest.rows[EDITED].metrics == plain.rows[EDITED].metrics
    for name in plain.rows[EDITED].examples:
        pd.testing.assert_frame_equal(rest.examples(EDITED, name), plain.examples(EDITED, name))
    assert rest.rows[BASE] is base.rows[BASE]


def test_no_drafts_without_a_replay_or_off_the_cpu(trained_llama, tokenizer, monkeypatch):
    """Without the drafted passes recorded at the edit's first layer the edited row decodes
    as before (a drafted pass that runs every layer costs more than it saves on a CPU)."""
    from grom import EditConfig, run_edit
    from grom.eval import runner as R

    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    cache = PrefixCache()
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers", prefix=cache, record_at=(3,))
    record_drafts(trained_llama, tokenizer, bench, base, cache, (3,), batch_size=8)  # another band's
    drafted, real = [], R.greedy_answers

    def spying(*args, **kwargs):
        drafted.append(kwargs.get("drafts") is not None)
        return real(*args, **kwargs)
    monkeypatch.setattr(R, "greedy_answers", spying)
    evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", reuse=base, prefix=cache)
    evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", reuse=base)
    assert drafted and not any(drafted)


def test_a_base_report_from_elsewhere_records_its_drafts_without_being_evaluated_again(trained_llama, tokenizer,
                                                                                        monkeypatch):
    """`record_drafts`: a Base report computed without the cache (kept on disk by an earlier
    process, say) records the same drafted passes, and the first verdict then replays them."""
    from grom import EditConfig, run_edit
    from grom.eval import runner as R
    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8)
    cache = PrefixCache()
    assert not cache.marked(DRAFTS, 1)
    calls, real = [], R.greedy_answers

    def spying(*args, **kwargs):
        calls.append((kwargs.get("drafts") is not None, kwargs.get("decode", True)))
        return real(*args, **kwargs)
    monkeypatch.setattr(R, "greedy_answers", spying)
    assert record_drafts(trained_llama, tokenizer, bench, base, cache, (1,), batch_size=8)
    assert calls == [(True, False), (True, False)] and cache.marked(DRAFTS, 1)  # the forget side's, every set's
    calls.clear()
    hits = cache.hits
    first = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="forget", reuse=base, prefix=cache)
    assert calls == [(True, False)] and cache.hits == hits + 1
    assert not record_drafts(trained_llama, tokenizer, bench, base, cache, ())  # nowhere to record for
    assert first.stage == "forget"


def test_an_eviction_unmarks_its_layer():
    cache = PrefixCache(max_bytes=1000)
    cache.mark(DRAFTS, (3,))
    assert cache.marked(DRAFTS, 3)
    from grom.eval.prefix import _Entry
    cache._store(("kv", 3, "a"), _Entry(3, torch.zeros(100)))  # 400 bytes
    cache._store(("kv", 3, "b"), _Entry(3, torch.zeros(200)))  # 800 bytes: "a" goes
    assert not cache.marked(DRAFTS, 3)
