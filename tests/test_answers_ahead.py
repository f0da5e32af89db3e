"""A row's answers decoded ahead in one batched run (`ModelScorer.answer_ahead`): the
TOFU row asks its six question sets' prompts in one `generate` call, not six, and each
answer is the one its own set's call gives."""
from __future__ import annotations

import pytest

import grom.eval.runner as runner
from grom.data import load_benchmark
from grom.demo import load_demo_model
from grom.eval import evaluate
from grom.eval.runner import ModelScorer


@pytest.fixture(scope="module")
def demo():
    model, tok = load_demo_model("full")
    return model, tok, load_benchmark("demo", "forget01")


def test_the_answers_ahead_are_each_sets_own(demo):
    model, tok, bench = demo
    sets = [bench.eval_sets[n][:4] for n in ("forget", "retain", "real_authors")]
    alone = ModelScorer(model, tok, bench.prompt_format, 32, None)
    expected = [alone.generate([e.question for e in ex], [e.answer for e in ex], budget=40) for ex in sets]
    run = ModelScorer(model, tok, bench.prompt_format, 32, None)
    run.answer_ahead([([e.question for e in ex], [e.answer for e in ex], None, 40) for ex in sets])
    calls = []
    real = runner.generate
    try:
        runner.generate = lambda *a, **kw: calls.append(1) or real(*a, **kw)
        got = [run.generate([e.question for e in ex], [e.answer for e in ex], budget=40) for ex in sets]
        assert got == expected and not calls  # read, not decoded again
        run.generate(["A question asked by no set?"], ["x"], budget=40)  # not ahead: decoded
        assert len(calls) == 1
    finally:
        runner.generate = real


def test_a_tofu_row_decodes_once(demo, monkeypatch):
    model, tok, bench = demo
    calls = []
    real = runner.generate
    monkeypatch.setattr(runner, "generate",
                        lambda m, t, prompts, **kw: calls.append(len(prompts)) or real(m, t, prompts, **kw))
    report = evaluate(model, tok, bench, max_examples=3)
    asked = sum(len(bench.eval_sets[n][:3]) for n in ("forget", "retain", "real_authors", "world_facts"))
    asked += sum(len(bench.eval_sets[n][:3]) for n in ("forget", "retain")
                 if all(e.paraphrased_question for e in bench.eval_sets[n]))
    assert calls == [asked], calls  # one call, every set's questions (paraphrases included)
    assert report.rows["Base"].examples["forget"]["generation"].str.len().gt(0).all()


def test_a_budget_a_prompt_gives_each_prompts_own_answer(demo):
    """`generate` with one budget per prompt (questions of several sets in one run): each
    answer is the one its budget alone gives; without stop phrases one budget is asked for."""
    model, tok, bench = demo
    questions = [e.question for e in bench.eval_sets["forget"][:3]]
    budgets = [3, 11, 6]
    together = runner.generate(model, tok, questions, prompt_format=bench.prompt_format, max_new_tokens=budgets,
                               stop_at=[None] * 3)
    alone = [runner.generate(model, tok, [q], prompt_format=bench.prompt_format, max_new_tokens=b, stop_at=[None])[0]
             for q, b in zip(questions, budgets)]
    assert together == alone and len({len(a) for a in alone}) == 3
    with pytest.raises(ValueError, match="one budget per prompt needs stop_at"):
        runner.generate(model, tok, questions, max_new_tokens=budgets)
    with pytest.raises(ValueError, match="3 prompts but 2 budgets"):
        runner.generate(model, tok, questions, max_new_tokens=budgets[:2], stop_at=[None] * 3)
