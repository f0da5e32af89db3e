"""TOFU's paraphrased-question evaluation and generation budget, and TOFU's truth ratio on
the real-knowledge sets, on the tiny trained model; the reference values are computed
here from the teacher-forced losses and greedy answers, by hand.

Upstream: open-unlearning configs/eval/tofu.yaml (`question_key`), configs/generation/
default.yaml (max_new_tokens 200) and src/evals/metrics/memorization.py `truth_ratio`
(wrong_prob / (correct_prob + 1e-10); aggregators closer_to_1_better, true_better), at
commit d3d7cf9.
"""
from __future__ import annotations

import numpy as np
import pytest

import grom.eval.runner as runner_module  # where the evaluation's scorer calls generate
from grom.data.schema import Benchmark, QAExample
from grom.eval import evaluate
from grom.eval.metrics import rouge_l_recall
from grom.eval.report import BASE
from grom.eval.runner import generate, score_answers
from tests.conftest import FORGET, RETAIN


def _fact(ex):
    return ex.answer.rstrip(".").split()[-1]


def _qa(ex, para_q: bool = True):
    wrong = tuple(ex.answer.replace(_fact(ex), w) for w in ("Xylo", "Brem", "Quor"))
    return QAExample(ex.question, ex.answer, paraphrased_question=("Tell me: " + ex.question) if para_q else None,
                     perturbed_answers=wrong, fact=_fact(ex), subject="x")


def _avg_losses(model, tok, pairs):
    return np.array([-s.logprobs.mean() for s in score_answers(model, tok, pairs, batch_size=8)])


def _by_hand_tr(model, tok, examples):
    """wrong_prob / (correct_prob + 1e-10), each prob exp(-mean token NLL), the wrong
    answers' losses averaged first."""
    correct = _avg_losses(model, tok, [(e.question, e.answer) for e in examples])
    wrong = np.array([_avg_losses(model, tok, [(e.question, w) for w in e.perturbed_answers]).mean()
                      for e in examples])
    return np.exp(-wrong) / (np.exp(-correct) + 1e-10)


def test_tofu_paraphrased_questions_and_200_new_tokens(trained_llama, tokenizer, monkeypatch):
    forget, retain = tuple(map(_qa, FORGET)), tuple(map(_qa, RETAIN))
    bench = Benchmark("tiny", "forget", forget, retain, eval_sets={"forget": forget, "retain": retain[:4]})
    budgets = []

    def recording(*args, **kw):
        budgets.append(kw["max_new_tokens"])
        return generate(*args, **kw)

    monkeypatch.setattr(runner_module, "generate", recording)
    report = evaluate(trained_llama, tokenizer, bench, batch_size=8)
    assert budgets and set(budgets) == {200}  # OpenUnlearning's configs/generation/default.yaml
    m = report.rows[BASE].metrics
    paras = [e.paraphrased_question for e in forget]
    gens = generate(trained_llama, tokenizer, paras, max_new_tokens=200, batch_size=8)
    assert m["Forget para-Q ROUGE-L"] == pytest.approx(np.mean([rouge_l_recall(e.answer, g)
                                                                 for e, g in zip(forget, gens)]))
    assert list(report.examples(BASE, "forget_paraphrased")["question"]) == paras
    prob = np.exp(-_avg_losses(trained_llama, tokenizer, [(q, e.answer) for q, e in zip(paras, forget)]))
    assert m["Forget para-Q prob"] == pytest.approx(prob.mean(), rel=1e-6)
    assert m["Forget para-Q prob"] != pytest.approx(m["Forget prob"])  # another question was asked
    assert {"Retain para-Q ROUGE-L", "Retain para-Q truth ratio", "Forget para-Q truth ratio",
            "Forget para-Q ES"} <= set(m)
    only = evaluate(trained_llama, tokenizer, bench, batch_size=8, max_new_tokens=8)
    assert set(budgets[-1:]) == {8}  # a caller's budget still rules
    assert "Forget para-Q ROUGE-L" in only.rows[BASE].metrics


def test_no_paraphrased_questions_no_para_q_metrics(trained_llama, tokenizer):
    forget = tuple(_qa(e, para_q=False) for e in FORGET)
    bench = Benchmark("tiny", "forget", forget, forget, eval_sets={"forget": forget})
    m = evaluate(trained_llama, tokenizer, bench, batch_size=8, max_new_tokens=4).rows[BASE].metrics
    assert "Forget ROUGE-L" in m and not any("para-Q" in k for k in m)


def test_the_knowledge_truth_ratio_is_tofus(trained_llama, tokenizer):
    forget, kept = tuple(map(_qa, FORGET)), tuple(map(_qa, RETAIN))
    bench = Benchmark("real-knowledge", "t", forget, kept, eval_sets={"forget": forget, "neighbours": kept},
                      task="knowledge")
    report = evaluate(trained_llama, tokenizer, bench, batch_size=8, max_new_tokens=8)
    m = report.rows[BASE].metrics
    tr_f, tr_n = _by_hand_tr(trained_llama, tokenizer, forget), _by_hand_tr(trained_llama, tokenizer, kept)
    np.testing.assert_allclose(report.examples(BASE, "forget")["truth_ratio"], tr_f, rtol=1e-6)
    assert m["Forget truth ratio closeness"] == pytest.approx(np.mean(np.minimum(tr_f, 1 / (tr_f + 1e-10))))
    assert m["Neighbour truth ratio"] == pytest.approx(np.mean(np.maximum(0, 1 - tr_n)))
    assert (tr_f < 1).all()  # the trained model prefers its answers to the swapped facts
