"""The real-knowledge evaluation on SmolLM2-135M-Instruct (fetched once, as in
test_real_model.py; skipped where it cannot be): answers that stop at their fact are the
full-length answers cut there, with the same fact recall, and the headline falls when an
edit turns the forget answers into degenerate text instead of rising with it.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from grom import PRESETS, run_edit
from grom.data import load_benchmark
from grom.data.prompts import encode_prompt
from grom.eval import evaluate
from grom.eval import metrics as M
from grom.eval.runner import generate
from grom.tasks.knowledge import knowledge_budget


@pytest.fixture(scope="module")
def bench():
    """The studio's benchmark on SmolLM2: the known facts, and its seeded sample of 128
    retain examples for the keys."""
    bench = load_benchmark("real-knowledge", "the-solar-system", known_only=True)
    return dataclasses.replace(bench, retain=tuple(random.Random(0).sample(bench.retain, 128)))


@pytest.fixture(scope="module")
def edits(real, bench):
    """The preset's edit (beta 65) and one whose forget answers collapse (beta 200)."""
    model, tok = real
    clean = run_edit(model, tok, bench.forget, bench.retain, PRESETS["smollm2"])
    collapsed = run_edit(model, tok, bench.forget, bench.retain, PRESETS["smollm2"].replace(beta=200.0),
                         scores=clean.scores)  # the same layer scores: the same band
    return {65.0: clean, 200.0: collapsed}


def _questions(bench):
    """Every known forget fact's question, and every other known fact's but one in three."""
    prompts, facts = [], []
    for name, step in (("forget", 1), ("neighbours", 3), ("general", 3)):
        for ex in bench.eval_sets[name][::step]:
            prompts.append(ex.question)
            facts.append(ex.fact)
    return prompts, facts


def test_stopped_answers_are_the_full_answers_cut_at_their_fact(real, bench, edits):
    """On the edited real model: the answer that stops at its fact is the start of the
    unstopped one (batched as the report batches, and one at a time for a few), and both
    state the fact or neither does."""
    model, tok = real
    prompts, facts = _questions(bench)
    budget = knowledge_budget(tok, [ex.answer for n in ("forget", "neighbours", "general")
                                    for ex in bench.eval_sets[n]])
    with edits[65.0].applied(model):
        stopped = generate(model, tok, prompts, max_new_tokens=budget, batch_size=128, stop_at=facts)
        full = generate(model, tok, prompts, max_new_tokens=budget, batch_size=128)
        alone = []
        for q in prompts[::12]:
            ids = torch.tensor([encode_prompt(tok, q)])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=budget, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
            alone.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
    for fact, cut, whole in zip(facts, stopped, full):
        assert whole.startswith(cut), (cut, whole)
        assert M.fact_recall(fact, cut) == M.fact_recall(fact, whole), (fact, cut, whole)
    assert sum(len(c) < len(w) for c, w in zip(stopped, full)) >= 10  # the kept facts stop early
    for cut, whole in zip(stopped[::12], alone):
        assert whole.startswith(cut), (cut, whole)


def test_a_collapsed_edit_scores_below_a_clean_one(real, bench, edits):
    """beta 200 turns most forget answers into loops ("The the the ..."): its forget fact
    recall is as low as the clean edit's (beta 65), but its Knowledge score must be lower,
    since a degenerate answer is no forgetting. Every one of these metrics comes from the
    greedy answers: the answers stage (`stage="answers"`, what the studio's card reads)
    gives them without the teacher-forced scores (about 40% of a full evaluation here)."""
    model, tok = real
    base = None
    out = {}
    for beta, edit in edits.items():
        report = evaluate(model, tok, bench, edit=edit, max_examples=10, reuse=base, stage="answers")
        base = base or report
        out[beta] = report.rows["Edited"].metrics
        classes = report.answer_classes()
        assert sum(classes["forget"].values()) == out[beta]["Forget facts known"]
    clean, collapsed = out[65.0], out[200.0]
    assert collapsed["Forget fact recall"] <= clean["Forget fact recall"] + 0.1
    assert collapsed["Forget degenerate"] >= 0.5 > clean["Forget degenerate"]
    assert collapsed["Knowledge score"] < clean["Knowledge score"]
    assert clean["Forget clean forgetting"] >= 0.5
