"""The real-knowledge metrics: hand-computed values for the pure functions, and the
report's known-fact bookkeeping on a tiny model (which facts the Base row knew decides
what the Edited row is scored on), the retain cost and its broken mark."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval import metrics as M
from grom.eval.report import BASE, EDITED, Report, Row, _knowledge_relative, _retain_cost, evaluate
from tests.conftest import FORGET, RETAIN


def test_repetition_rate_by_hand():
    assert M.repetition_rate("the cat sat on the mat") == 0.0  # 4 trigrams, all distinct
    assert M.repetition_rate("a b c a b c") == pytest.approx(1 - 3 / 4)  # abc bca cab abc
    assert M.repetition_rate("no no no no no") == pytest.approx(1 - 1 / 3)
    assert M.repetition_rate("short") == 0.0 and M.repetition_rate("") == 0.0


def test_perplexity_and_knowledge_score_by_hand():
    assert M.perplexity([1.0, 3.0]) == pytest.approx(math.exp(2.0))
    assert M.knowledge_score(1.0, 1.0) == 0.0  # nothing forgotten
    assert M.knowledge_score(0.0, 0.0) == 0.0  # forgot by wrecking everything
    assert M.knowledge_score(0.0, 1.0) == 1.0
    assert M.knowledge_score(0.2, 0.9) == pytest.approx(2 * 0.8 * 0.9 / 1.7)
    with pytest.raises(ValueError):
        M.knowledge_score(1.2, 0.5)


def _row(forget_recall, para_recall, neigh_recall) -> Row:
    row = Row()
    row.examples["forget"] = pd.DataFrame({"fact_recall": forget_recall, "paraphrase_recall": para_recall})
    row.examples["neighbours"] = pd.DataFrame({"fact_recall": neigh_recall})
    return row


def test_known_facts_decide_what_is_scored():
    base = _row([1, 1, 0, 1], [1, 0, 0, 1], [1, 1, 1, 0])
    edited = _row([0, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1])
    rows = {BASE: base, EDITED: edited}
    _knowledge_relative(rows)
    m = edited.metrics
    assert m["Forget facts known"] == 3 and m["Forget fact recall"] == pytest.approx(1 / 3)  # rows 0,1,3
    assert m["Forget paraphrase recall"] == pytest.approx(1 / 2)  # paraphrases known: rows 0, 3
    assert m["Neighbour fact recall"] == pytest.approx(2 / 3)  # rows 0,1,2
    assert m["Kept fact recall"] == pytest.approx(2 / 3)
    assert m["Knowledge score"] == pytest.approx(M.knowledge_score(1 / 3, 2 / 3))
    assert base.metrics["Forget fact recall"] == 1.0 and base.metrics["Knowledge score"] == 0.0
    report = Report("real-knowledge", "x", "knowledge", rows, 0.0)
    assert report.known_facts() == {"forget": (3, 1), "neighbours": (3, 2)}


def test_retain_cost_marks_a_broken_retain_set():
    rows = {BASE: Row({"Model utility": 0.5, "Retain fact recall": 0.9}),
            EDITED: Row({"Model utility": 0.55, "Retain fact recall": 0.65}),
            "Retain model": Row({"Model utility": 0.49, "Retain fact recall": 0.88})}
    _retain_cost(rows, "tofu")
    assert rows[EDITED].metrics["Retain cost"] == pytest.approx(1 - 0.65 / 0.9)
    assert rows[EDITED].metrics["Retain broken"] == 1.0  # 28% lost: more than a tenth
    assert rows["Retain model"].metrics["Retain broken"] == 0.0
    assert "Retain cost" not in rows[BASE].metrics


def test_the_knowledge_report_on_a_tiny_model(trained_llama, tokenizer):
    """The trained tiny model knows its facts; the report scores every set and keeps the
    counts consistent with the per-example frames."""
    fact = lambda ex: ex.answer.rstrip(".").split()[-1]  # noqa: E731
    qa = lambda ex: QAExample(ex.question, ex.answer, paraphrased_question=ex.question,  # noqa: E731
                              fact=fact(ex), subject="x")
    bench = Benchmark("real-knowledge", "t", tuple(map(qa, FORGET)), tuple(map(qa, RETAIN)),
                      eval_sets={"forget": tuple(map(qa, FORGET)), "neighbours": tuple(map(qa, RETAIN)),
                                 "fluency": (TextExample("Odo Brask was born in Quenford."),)},
                      task="knowledge")
    report = evaluate(trained_llama, tokenizer, bench, batch_size=8)
    m = report.rows[BASE].metrics
    for key in ("Forget ROUGE-L", "Forget prob", "Neighbour prob", "Forget repetition", "Text perplexity",
                "Forget answer perplexity"):
        assert np.isfinite(m[key]), key
    known, still = report.known_facts(BASE)["forget"]
    assert known == still == m["Forget facts known"]
    assert known == int(report.examples(BASE, "forget")["fact_recall"].sum())
