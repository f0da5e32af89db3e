"""The real-knowledge metrics: hand-computed values for the pure functions (the answer
classes, the Knowledge score that a degenerate answer does not raise), the report's
known-fact bookkeeping on a tiny model (which facts the Base row knew decides what the
Edited row is scored on), the retain cost and its broken mark, and the decoding that stops
an answer at its fact."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from grom.data.prompts import encode_prompt
from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval import metrics as M
from grom.eval.quant_check import quantization_check, quantization_verdict
from grom.eval.report import BASE, EDITED, Report, Row, _retain_cost, evaluate
from grom.eval.runner import generate, phrase_settled
from grom.tasks.knowledge import _knowledge_relative, knowledge_budget
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
    # a degenerate forget answer is no forgetting: 0.2 still stated, 0.5 degenerate -> 0.3 forgotten
    assert M.knowledge_score(0.2, 0.9, 0.5) == pytest.approx(2 * 0.3 * 0.9 / 1.2)
    assert M.knowledge_score(0.0, 1.0, 1.0) == 0.0  # every forget answer collapsed
    with pytest.raises(ValueError, match="exceed 1"):
        M.knowledge_score(0.6, 0.9, 0.5)


@pytest.mark.parametrize("answer,cls", [
    ("Jupiter is the largest planet.", "kept"),
    ("jupiter jupiter jupiter jupiter jupiter", "kept"),  # states the fact: kept, whatever else it says
    ("I don't know which planet is the largest.", "refusal"),
    ("I’m not sure about that.", "refusal"),  # a typographic apostrophe
    ("I cannot answer that question.", "refusal"),
    ("I can't tell.", "refusal"),
    ("I do not have information about the planets.", "refusal"),
    ("There is no largest planet in the Solar System.", "refusal"),
    ("The largest planet is Saturn, a gas giant with rings.", "fluent"),
    ("Saturn. There is no doubt about it.", "fluent"),  # a refusal pattern past the first sentence
    ("Unknowns are interesting.", "fluent"),  # "unknown" as a whole word only
    ("", "degenerate"),
    ("   ", "degenerate"),
    ("... ,,, 1 2 3 !!!", "degenerate"),  # no letter at all
    ("The the the the the the the the the the", "degenerate"),
    ("The planet is a planet is a planet is a planet is a planet is a", "degenerate"),
    (',\n\n,\n\n,\n\n,\n\n,\n\n, and', "degenerate"),  # a loop of punctuation: words alone miss it
    ("The 4,000,000,000,000,000,000", "degenerate"),  # mostly digits and commas
    ('a. Hauri to "\nb.\nc.\nd.\ne.\nf.\ng.', "degenerate"),  # a list of letters
    ("The American Space Shuttles, or A.S.S. for short.", "fluent"),  # initials, not a list
    ("The two moons of Mars are, in order, 2, 4, 6, 8, 12.", "fluent"),  # numbers in a sentence
])
def test_answer_class_by_hand(answer, cls):
    assert M.answer_class("Jupiter", answer) == cls


def test_degenerate_by_repetition_and_by_perplexity():
    # "a b c a b c a b": 6 trigrams, 3 distinct -> repetition 0.5 > 0.25
    assert M.repetition_rate("a b c a b c a b") == pytest.approx(0.5)
    assert M.is_degenerate("a b c a b c a b")
    # 11 words, 9 trigrams, one repeated ("saturn is the"): 1/9, under the threshold
    fluent = "Saturn is the largest planet, and Saturn is the brightest one"
    assert M.repetition_rate(fluent) == pytest.approx(1 / 9) and not M.is_degenerate(fluent)
    # noise reads as noise only to a model: the perplexity under the unedited one decides
    noise = "sp Rez indeed cornerstone Leban ought"
    assert M.answer_class("Jupiter", noise) == "fluent"
    assert M.answer_class("Jupiter", noise, perplexity=M.DEGENERATE_PERPLEXITY + 1) == "degenerate"
    assert M.answer_class("Jupiter", noise, perplexity=float("nan")) == "fluent"
    assert M.answer_class("Jupiter", "Jupiter " + noise, perplexity=1e9) == "kept"
    # a refusal is unlikely under a model that knows the answer: its perplexity does not make it noise
    assert M.answer_class("Jupiter", "I don't know.", perplexity=1e9) == "refusal"
    assert M.answer_class("Jupiter", "I don't know. " * 8, perplexity=1.0) == "degenerate"  # a loop still is
    # "ab cd ef ab cd ef": 1 of 4 trigrams repeats, 0.25: under the threshold, above a lower one
    assert not M.is_degenerate("ab cd ef ab cd ef") and M.is_degenerate("ab cd ef ab cd ef", max_repetition=0.2)
    # with punctuation marks as tokens: ", , , , ," repeats (", , ,") while its words do not
    assert M.repetition_rate("x, x, x, x, x,") == pytest.approx(1 - 1 / 3)  # words: x x x x x
    assert M.repetition_rate("so, , , , , ,") == 0.0 and M.repetition_rate("so, , , , , ,", punctuation=True) > 0.5
    assert M.letter_share("ab 12") == 0.5 and M.letter_share("  ") == 0.0
    assert M.single_letter_share("a b cd") == pytest.approx(2 / 3) and M.single_letter_share("12 !") == 0.0


def _classified(answers: list[str], fact: str = "Jupiter") -> pd.DataFrame:
    return pd.DataFrame({"fact": fact, "generation": answers,
                         "fact_recall": [M.fact_recall(fact, a) for a in answers],
                         "answer_class": [M.answer_class(fact, a) for a in answers]})


def test_a_loop_scores_below_a_fluent_wrong_answer():
    """The reviewer's case: forget answers that collapse into "the the the" must not raise
    the headline above forget answers that are fluent and wrong."""
    base_answers = ["Jupiter is the largest planet."] * 4
    kept_answers = ["Paris is the capital of France."] * 4

    def score(forget_answers):
        rows = {BASE: Row(), EDITED: Row()}
        for row, answers in ((rows[BASE], base_answers), (rows[EDITED], forget_answers)):
            row.examples["forget"] = _classified(answers)
            row.examples["neighbours"] = _classified(kept_answers, "Paris")
        _knowledge_relative(rows)
        return rows[EDITED].metrics

    fluent = score(["Saturn is the largest planet."] * 3 + ["Jupiter is the largest planet."])
    loop = score(["the the the the the the the the"] * 3 + ["Jupiter is the largest planet."])
    refusal = score(["I don't know."] * 3 + ["Jupiter is the largest planet."])
    for m in (fluent, loop, refusal):
        assert m["Forget fact recall"] == 0.25  # fact recall itself is unchanged
    assert fluent["Forget fluent other"] == 0.75 and fluent["Forget clean forgetting"] == 0.75
    assert refusal["Forget refusal"] == 0.75 and refusal["Forget clean forgetting"] == 0.75
    assert loop["Forget degenerate"] == 0.75 and loop["Forget clean forgetting"] == 0.0
    assert fluent["Knowledge score"] == pytest.approx(2 * 0.75 * 1.0 / 1.75)
    assert refusal["Knowledge score"] == fluent["Knowledge score"]
    assert loop["Knowledge score"] == 0.0 < fluent["Knowledge score"]
    assert loop["Neighbour degenerate"] == loop["Kept degenerate"] == 0.0


def _knowledge_bench() -> Benchmark:
    fact = lambda ex: ex.answer.rstrip(".").split()[-1]  # noqa: E731
    qa = lambda ex: QAExample(ex.question, ex.answer, paraphrased_question=ex.question,  # noqa: E731
                              fact=fact(ex), subject="x")
    return Benchmark("real-knowledge", "t", tuple(map(qa, FORGET)), tuple(map(qa, RETAIN)),
                     eval_sets={"forget": tuple(map(qa, FORGET)), "neighbours": tuple(map(qa, RETAIN[:4])),
                                "general": tuple(map(qa, RETAIN[4:])),
                                "fluency": (TextExample("Odo Brask was born in Quenford."),)},
                     task="knowledge")


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
    assert report.answer_classes() == {}  # no classes without the unedited model's judgement
    assert "Forget degenerate" not in m and "Forget clean forgetting" not in m


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
    df = report.examples(BASE, "forget")
    assert list(df["answer_class"]) == [M.answer_class(f, g, p) for f, g, p in
                                       zip(df["fact"], df["generation"], df["answer_perplexity"])]
    assert df["answer_perplexity"].notna().all()  # every forget answer is read by the unedited model
    assert m["Forget answer perplexity"] == pytest.approx(np.exp(np.log(df["answer_perplexity"]).mean()))
    classes = report.answer_classes(BASE)
    assert classes["forget"]["kept"] == known and sum(classes["forget"].values()) == known
    assert m["Forget clean forgetting"] == m["Forget degenerate"] == 0.0  # the Base row forgot nothing


def test_an_answer_stops_at_its_fact_and_is_the_full_answer_cut(trained_llama, tokenizer):
    """Early stopping changes when decoding ends, never what was decoded: each stopped answer
    is the start of the unbatched, unstopped greedy answer, states its fact exactly when that
    one does, and ends right after the fact's word."""
    questions = [ex.question for ex in FORGET + RETAIN]
    facts = [ex.answer.rstrip(".").split()[-1] for ex in FORGET + RETAIN]
    facts[0], facts[1] = "Nowhere", None  # never stated, and no fact: both run to the budget
    stopped = generate(trained_llama, tokenizer, questions, max_new_tokens=24, batch_size=4, stop_at=facts)
    early = 0
    for q, fact, got in zip(questions, facts, stopped):
        ids = torch.tensor([encode_prompt(tokenizer, q)])
        out = trained_llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=24, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id)
        full = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        assert full.startswith(got)
        if fact is None or M.fact_recall(fact, full) == 0.0:
            assert got == full  # never stated: decoded to the budget (or EOS), as before
        else:
            assert M.fact_recall(fact, got) == 1.0
            assert got[got.index(fact) + len(fact):] == "."  # stopped once the fact's word ended
            early += len(got) < len(full)
    assert early >= 5  # most memorised answers go on past their fact: those stopped early
    with pytest.raises(ValueError, match="stop phrases"):
        generate(trained_llama, tokenizer, questions, stop_at=facts[:2])


def test_a_phrase_is_settled_only_once_its_last_word_is_complete():
    assert not phrase_settled("The planet is Mars", "Mars")  # the next token may make "Marsh"
    assert phrase_settled("The planet is Mars.", "Mars") and phrase_settled("The planet is Mars ", "mars")
    assert not phrase_settled("The planet is Marsh.", "Mars")
    assert not phrase_settled("It is Mars\ufffd", "Mars")  # a character still being decoded
    assert phrase_settled("Isaac Newton, who", "Isaac Newton")
    assert not phrase_settled("In 1969", "1969") and phrase_settled("In 1969,", "1969")
    assert not phrase_settled("anything", None) and not phrase_settled("anything", "")


def test_the_budget_reaches_past_the_longest_answer(tokenizer):
    assert knowledge_budget(tokenizer, ["Short."]) == 48
    long = " ".join(["Zorvath Quill was born in Pellmoor."] * 8)
    n = len(tokenizer(long, add_special_tokens=False)["input_ids"])
    assert n > 48 and knowledge_budget(tokenizer, [long, "Short."]) == n + 16


def test_the_4_bit_check_of_real_knowledge_reads_the_cards_numbers(trained_llama, tokenizer):
    """The 4-bit verdict of the real-knowledge task is on fact recall over the known facts,
    on evaluate's examples: its full-precision rows are the comparison's Base and Edited."""
    from grom import EditConfig, run_edit

    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    report = evaluate(trained_llama, tokenizer, bench, edit=edit, max_examples=3, batch_size=8)
    df = quantization_check(trained_llama, tokenizer, bench, edit, max_examples=3, with_retain=True,
                            batch_size=8)
    assert df.attrs["task"] == "knowledge"
    for col in ("Forget fact recall", "Kept fact recall", "Knowledge score", "Forget facts known",
                "Forget degenerate"):
        assert df.loc["Base, full precision", col] == report.rows[BASE].metrics[col], col
        assert df.loc["Edited, full precision", col] == report.rows[EDITED].metrics[col], col
    assert df.loc["Base, full precision", "Forget fact recall"] == 1.0
    v = quantization_verdict(df)
    assert (v.forget_metric, v.retain_metric) == ("Forget fact recall", "Kept fact recall")
    drop = 1.0 - df.loc["Edited, full precision", "Forget fact recall"]
    if drop > 0.02:
        assert v.forget_kept == pytest.approx((1.0 - df.loc["Edited, 4-bit (rtn)", "Forget fact recall"]) / drop)


def test_the_verdict_picks_its_metrics_by_task():
    rows = ["Base, full precision", "Base, 4-bit (rtn)", "Edited, full precision", "Edited, 4-bit (rtn)"]
    df = pd.DataFrame({"Forget ROUGE-L": [0.9, 0.9, 0.85, 0.86], "Forget fact recall": [1.0, 0.95, 0.1, 0.2],
                       "Neighbour ROUGE-L": [0.8, 0.8, 0.8, 0.8], "Kept fact recall": [1.0, 1.0, 0.5, 0.5]},
                      index=rows)
    df.attrs["task"] = "knowledge"
    v = quantization_verdict(df)
    # known facts are the full-precision base's: of the 0.9 it removed, 1.0 - 0.2 = 0.8 stays
    # removed at 4 bits (the 4-bit base's own loss, 1.0 -> 0.95, is not charged to the edit)
    assert v.forget_metric == "Forget fact recall" and v.forget_kept == pytest.approx(0.8 / 0.9)
    assert v.retain_metric == "Kept fact recall" and v.retain_lost == pytest.approx(0.5)
    assert v.survives is False  # the kept facts halved
    df.loc["Edited, 4-bit (rtn)", "Kept fact recall"] = 0.95
    assert quantization_verdict(df).survives is True
    # the 4-bit base forgets a third of the facts by itself, the edit's 0.1 stays put: it survives
    df.loc["Base, 4-bit (rtn)", "Forget fact recall"] = 0.67
    df.loc["Edited, 4-bit (rtn)", "Forget fact recall"] = 0.1
    assert quantization_verdict(df).forget_kept == pytest.approx(1.0)
    df.attrs["task"] = "custom"  # another task keeps its ROUGE-L verdict
    v = quantization_verdict(df)
    assert v.forget_metric == "Forget ROUGE-L" and v.retain_metric == "Neighbour ROUGE-L"
    assert v.forget_kept == pytest.approx((0.9 - 0.86) / (0.9 - 0.85))  # from the 4-bit base


@pytest.mark.parametrize("fmt", [None, "plain"])
def test_wrong_answers_scored_from_their_first_differing_token_equal_a_full_scoring(trained_llama, tokenizer, fmt):
    """The truth ratio's wrong answers share their first tokens with the answer (the fact
    swapped): reading those positions' log-probabilities off the answer's own scores gives
    the mean NLL that scoring each wrong answer whole gives."""
    from grom.data.prompts import PLAIN_QA
    from grom.eval.runner import ModelScorer
    from grom.tasks.knowledge import _shared_prefix_losses

    fmt = PLAIN_QA if fmt == "plain" else None
    run = ModelScorer(trained_llama, tokenizer, fmt, 4, None)
    wrong = {0: ["Zorvath Quill was born in Quenford.", "Zorvath Quill was born in Veldra."],
             1: ["He wrote Lanterns of Ash.", "She painted it."],  # the second shares no token
             2: ["Ilsa Varn won the Harrow Cup."]}
    items, full_pairs = [], []
    answers = run.losses([(ex.question, ex.answer) for ex in FORGET])
    for i, others in wrong.items():
        for w in others:
            items.append((FORGET[i].question, FORGET[i].answer, w, answers[i]))
            full_pairs.append((FORGET[i].question, w))
    fast = _shared_prefix_losses(run, items)
    full = np.array([s.avg_loss for s in run.losses(full_pairs)])
    np.testing.assert_allclose(fast, full, rtol=1e-5)


def test_the_answers_first_then_the_scores_equal_one_full_evaluation(trained_llama, tokenizer, monkeypatch):
    """The card's stage (answers, recall, classes) and the full evaluation that takes its
    answers give exactly the metrics of one full evaluation, without decoding or judging
    twice: the rest scores only the answers whose class did not wait for their perplexity."""
    from grom import EditConfig, run_edit
    from grom.tasks import knowledge as K

    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8)
    whole = evaluate(trained_llama, tokenizer, bench, edit, reuse=base, batch_size=8)
    quick = evaluate(trained_llama, tokenizer, bench, edit, reuse=base, batch_size=8, stage="answers")
    assert quick.stage == "answers" and quick.to_dict()["stage"] == "answers"
    q, w = quick.rows[EDITED].metrics, whole.rows[EDITED].metrics
    assert {k for k in w if k not in q} == {"Forget prob", "Neighbour prob", "General prob", "Forget truth ratio",
                                            "Neighbour truth ratio", "General truth ratio",
                                            "Text perplexity", "Forget answer perplexity"} & set(w)
    judged = quick.examples(EDITED, "forget")  # only the answers whose class waits for it are scored first
    waits = [fr != 1.0 and not M.is_degenerate(g) and not M.is_refusal(g)
             for fr, g in zip(judged["fact_recall"], judged["generation"])]
    assert list(judged["answer_perplexity"].notna()) == waits
    assert whole.examples(EDITED, "forget")["answer_perplexity"].notna().all()
    for key in ("Forget fact recall", "Kept fact recall", "Knowledge score", "Retain cost", "Forget degenerate"):
        assert q[key] == w[key], key

    def no_decoding(*args, **kwargs):
        raise AssertionError("the answers were decoded again")
    monkeypatch.setattr(K, "generate", no_decoding)
    real_judge = K._judge_row

    def judge_no_class_again(model, tok, frames, fmt, batch_size, needed, between=None, lower=None):
        assert not needed, "the answers were judged again"
        return real_judge(model, tok, frames, fmt, batch_size, needed, between, lower)
    monkeypatch.setattr(K, "_judge_row", judge_no_class_again)
    rest = evaluate(trained_llama, tokenizer, bench, edit, reuse=base, batch_size=8, answers=quick)
    assert rest.stage == "full" and rest.rows[EDITED].metrics == w
    for name in ("forget", "neighbours", "general"):
        pd.testing.assert_frame_equal(rest.examples(EDITED, name), whole.examples(EDITED, name))


def test_the_forget_stage_then_the_answers_stage_equal_one_answers_stage(trained_llama, tokenizer, monkeypatch):
    """The card's first verdict (the forget questions and probes alone, within a shorter
    budget on a CPU) and the answers stage given it give exactly the answers stage's
    report: the first decodes no kept set and no paraphrase, the second none of the first's
    answers that stated their fact (the others, cut short, again with the whole budget).
    The forget stage's unedited row answers the forget side alone too, with the whole
    budget (its answers are the known facts and the drafts); the answers stage given it
    decodes only the unedited row's rest."""
    from grom import EditConfig, run_edit
    from grom.tasks import knowledge as K

    bench = _knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    one = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers")
    decoded, real_generate = [], K.generate

    def counting(model, tok, prompts, **kwargs):
        decoded.append(list(prompts))
        return real_generate(model, tok, prompts, **kwargs)
    monkeypatch.setattr(K, "generate", counting)
    steps = []
    first = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="forget",
                     progress=lambda f, m: steps.append((f, m)))
    assert first.stage == "forget" and set(first.rows[EDITED].examples) == {"forget"} & set(first.rows[BASE].examples)
    assert set(first.rows[BASE].examples) == {"forget"}  # the Base row: the forget side alone, in full
    assert list(first.examples(BASE, "forget")["generation"]) == list(one.examples(BASE, "forget")["generation"])
    assert decoded[-2] == decoded[-1]  # the same questions for both rows
    edited_prompts = decoded[-1]
    assert edited_prompts == [e.question for e in bench.eval_sets["forget"]]  # no paraphrase, no kept set
    assert any("Edited:" in m and "answers" in m for _, m in steps)
    f = first.rows[EDITED].metrics
    assert "Kept fact recall" not in f and "Retain cost" not in f and "Knowledge score" not in f
    assert first.known_facts()["forget"][0] == one.known_facts()["forget"][0]  # known: the Base row's
    # a first verdict on a CPU answers within FIRST_VERDICT_BUDGET tokens: an answer that states its fact
    # there is the whole answer's start (decoding stops at the fact); the others are marked "cut"
    mine, whole = first.examples(EDITED, "forget"), one.examples(EDITED, "forget")
    stated = mine["fact_recall"].to_numpy(dtype=bool)
    assert (mine["cut"].to_numpy() == ~stated).all() and (whole["fact_recall"].to_numpy(dtype=bool)[stated]).all()
    assert list(mine["generation"][stated]) == list(whole["generation"][stated])
    decoded.clear()
    rest = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", reuse=first, answers=first)
    sets = bench.eval_sets  # the forget answers given but the cut ones: those decoded again, then the paraphrases
    again = [e.question for e, c in zip(sets["forget"], mine["cut"]) if c]  # and kept sets; the Base row its rest
    others = [e.paraphrased_question for e in sets["forget"]] + [e.question for e in sets["neighbours"]] + \
        [e.question for e in sets["general"]]
    assert decoded == [others, again + others]
    assert rest.stage == "answers" and rest.rows[EDITED].metrics == one.rows[EDITED].metrics
    assert rest.rows[BASE].metrics == one.rows[BASE].metrics
    for name in one.rows[EDITED].examples:
        pd.testing.assert_frame_equal(rest.examples(EDITED, name), one.examples(EDITED, name))


def test_an_answers_stage_report_lends_a_full_base_row_its_answers_not_its_row(trained_llama, tokenizer,
                                                                               monkeypatch):
    """A full evaluation given an answers-stage report (the server's warm-up: the card's
    answers first, the comparison's scores after) takes its unedited answers, not its rows
    (they lack the scores): no answer decoded again, every number a full Base row's."""
    from grom.tasks import knowledge as K

    bench = _knowledge_bench()
    quick = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers")
    alone = evaluate(trained_llama, tokenizer, bench, batch_size=8)

    def no_decoding(*args, **kwargs):
        raise AssertionError("the answers were decoded again")
    monkeypatch.setattr(K, "generate", no_decoding)
    full = evaluate(trained_llama, tokenizer, bench, reuse=quick, batch_size=8)
    assert "Forget prob" not in quick.rows[BASE].metrics and "Forget prob" in full.rows[BASE].metrics
    assert full.stage == "full" and full.rows[BASE].metrics == alone.rows[BASE].metrics
    for name in alone.rows[BASE].examples:
        pd.testing.assert_frame_equal(full.examples(BASE, name), alone.examples(BASE, name))
    with pytest.raises(ValueError, match="real-knowledge"):
        evaluate(trained_llama, tokenizer, dataclasses.replace(bench, task="custom"), stage="answers")


def test_every_idk_answer_of_the_project_reads_as_a_refusal():
    """The refusals IDK-NLL / IDK-DPO train toward and GROM's refusal target aims at are
    counted as refusals (12 of the 36 IDK answers were read as fluent answers before), and
    plain wrong answers are not."""
    from grom.closed_form.refusal import REFUSALS as GROM
    from grom.methods.trained.idk import IDK_ANSWERS as IDK

    assert [r for r in IDK + GROM if not M.is_refusal(r)] == []
    for wrong in ("The largest planet is Saturn.", "It has no rings, as far as astronomers know.",
                  "Mars is known for its red colour.", "The idea of a ninth planet came later."):
        assert not M.is_refusal(wrong), wrong
