"""The real-knowledge task ("knowledge", was grom/eval/knowledge.py): every set's greedy
answers in one decoding loop that stops at each fact, fact recall and its counts on the
facts the unedited model knew, ROUGE-L, answer probability, TOFU's truth ratio against the
bundled wrong answers, each answer's class judged with the unedited model, and the headline
Knowledge score. The benchmark "real-knowledge" (bundled). Its evaluation also has the
stages "answers" and "forget" (`grom.eval.report.evaluate`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from grom.data import knowledge as knowledge_data
from grom.data.loaders import BenchmarkSpec
from grom.data.schema import QAExample, TextExample
from grom.eval import metrics as M
from grom.eval.results import BASE, Row, known_mask
from grom.eval.runner import (
    ModelScorer,
    encode_pair,
    generate,
    score_answers,
    score_sequences,
    score_texts,
)
from grom.model.arch import model_device
from grom.tasks.base import QuantMetrics, Task, register_task

KNOWLEDGE_SETS = {"forget": "Forget", "probes": "Probe", "neighbours": "Neighbour", "general": "General"}
"""The real-knowledge sets: the forget questions the edit was fitted on ("Forget"), the
forget target's held-out questions it never saw ("Probe": does the forgetting carry beyond
the fitted wording?), and the kept sets ("Neighbour", "General", pooled as "Kept")."""
FORGET_SIDE = ("forget", "probes")
KNOWLEDGE_BUDGET = 48
"""New tokens an answer may take at most, whatever its reference: room to reach its fact.
On the default split's known facts SmolLM2's answers state their fact within 28 new tokens
(median 11), after a preamble such as "The largest planet in our solar system is ...";
after GROM edits (beta 65 to 1000) the answers that keep a fact state it within 36 but
one (61). The former budget, the longest reference answer + 8 (24 tokens there), cut 6
of the 86 unedited answers before their fact, which then counted as unknown. Answers
stop once their fact is stated (`grom.eval.runner.greedy_until`), so only answers that
never state it, and never end, run the whole budget."""
KNOWLEDGE_MARGIN = 16  # tokens beyond the longest reference answer, where that is longer
KNOWLEDGE_GEN_BATCH = 128  # prompts per decoding loop: one loop serves every set of a row


def knowledge_budget(tokenizer, answers) -> int:
    """New tokens for a row's answers: `KNOWLEDGE_BUDGET`, or the longest reference answer
    plus `KNOWLEDGE_MARGIN` where that is more."""
    longest = max((len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers), default=0)
    return max(KNOWLEDGE_BUDGET, longest + KNOWLEDGE_MARGIN)


JUDGED = ("answer_perplexity", "answer_class")  # `_judge_answers`'s columns


def _knowledge_qa(run: ModelScorer, examples: tuple, gens: list[str], paraphrase: bool,
                  given: pd.DataFrame | None = None) -> pd.DataFrame:
    """Fact recall, ROUGE-L, answer probability and truth ratio of one QA set from its
    greedy answers `gens` (the questions', then the paraphrased questions' for the forget
    set). In the "answers" stage only what the answers give (no probability, no truth
    ratio: the teacher-forced passes); `given`, the frame these answers came from, lends
    its answer classes (judged on the same answers)."""
    qs, answers = [ex.question for ex in examples], [ex.answer for ex in examples]
    df = pd.DataFrame({"question": qs, "answer": answers, "fact": [ex.fact for ex in examples],
                       "generation": gens[:len(qs)],
                       "fact_recall": [M.fact_recall(ex.fact, g) for ex, g in zip(examples, gens)],
                       "rougeL_recall": [M.rouge_l_recall(a, g) for a, g in zip(answers, gens)]})
    if run.stage == "full":
        scored = run.losses(list(zip(qs, answers)))
        df["prob"] = M.probability(np.array([s.avg_loss for s in scored]))
    df["repetition"] = [M.repetition_rate(g) for g in gens[:len(qs)]]
    if paraphrase:
        df["paraphrase"] = [ex.paraphrased_question or ex.question for ex in examples]
        df["paraphrase_generation"] = gens[len(qs):]
        df["paraphrase_recall"] = [M.fact_recall(ex.fact, g) for ex, g in zip(examples, gens[len(qs):])]
    if run.stage == "full" and all(ex.perturbed_answers for ex in examples):
        df["truth_ratio"] = _knowledge_truth_ratios(run, examples, scored)
    if given is not None and all(c in given for c in JUDGED):
        for c in JUDGED:
            df[c] = given[c].to_numpy()
    return df


def _given_answers(run: ModelScorer, chosen: dict[str, tuple]) -> dict[str, tuple[list[str], list[str] | None]]:
    """The answers `run.given` (an earlier evaluation of this model on these sets) holds,
    per set it holds for the same questions: (the questions' answers, the forget set's
    paraphrases' answers or None where it lacks them: the forget stage decodes none)."""
    out = {}
    for name, ex in chosen.items():
        df = run.given.get(name)
        if df is None or list(df.get("question", ())) != [e.question for e in ex]:
            continue
        para = list(df["paraphrase_generation"]) if name == "forget" and "paraphrase_generation" in df else None
        out[name] = (list(df["generation"]), para)
    return out


def _knowledge_truth_ratios(run: ModelScorer, examples: tuple, answer_scores: list) -> np.ndarray:
    """(n,) TOFU's truth ratio per question (`grom.eval.metrics.truth_ratio`): the wrong
    answers (the bundled `wrong_answers`, the fact swapped) against the paraphrased answer,
    each after the question; the bundled files have no paraphrased answers, so the answer
    itself stands for it (`answer_scores`: its `TokenScores`), as TOFU does on Real
    Authors and World Facts. Each wrong answer's mean NLL is `_shared_prefix_losses`'s."""
    correct = np.array([s.avg_loss for s in answer_scores])
    if any(ex.paraphrased_answer for ex in examples):
        pairs = [(ex.question, ex.paraphrased_answer or ex.answer) for ex in examples]
        correct = np.array([s.avg_loss for s in run.losses(pairs)])
    counts = [len(ex.perturbed_answers) for ex in examples]
    flat = _shared_prefix_losses(run, [(ex.question, ex.answer, w, s) for ex, s in zip(examples, answer_scores)
                                       for w in ex.perturbed_answers])
    wrong = np.split(flat, np.cumsum(counts)[:-1])
    return np.array([M.truth_ratio(c, w) for c, w in zip(correct, wrong)])


def _shared_prefix_losses(run: ModelScorer, items: list[tuple]) -> np.ndarray:
    """(m,) mean NLL per label token of each `other` answer after its question, for items
    (question, answer, other, answer's TokenScores): what `run.losses` gives for (question,
    other), computed without reading the LM head where `other` begins with the same tokens
    as `answer` (a wrong answer is the answer with its fact swapped): those positions have
    the same context, so their log-probabilities are the answer's, taken from its scores;
    only the positions from the first differing token on go through the head (on SmolLM2
    the head, 49k x 576, costs more than the 5 edited layers a prefix-cached pass runs).
    The same numbers as scoring the whole answer, up to float rounding across batches."""
    seqs, reused, lengths = [], [], []
    for question, answer, other, scores in items:
        ids_o, start_o = encode_pair(run.tok, question, other, run.fmt)
        ids_a, start_a = encode_pair(run.tok, question, answer, run.fmt)
        shared = 0
        if start_o == start_a and ids_o[:start_o] == ids_a[:start_a] and len(scores.logprobs) == len(ids_a) - start_a:
            limit = min(len(ids_o), len(ids_a)) - start_o - 1  # at least the last label is scored here
            while shared < limit and ids_o[start_o + shared] == ids_a[start_a + shared]:
                shared += 1
        seqs.append((ids_o, start_o + shared))
        reused.append(float(scores.logprobs[:shared].sum()))
        lengths.append(len(ids_o) - start_o)
    tails = score_sequences(run.model, run.tok, seqs, run.batch_size)
    return np.array([-(r + t.logprobs.sum()) / n for r, t, n in zip(reused, tails, lengths)])


def split_decoding(model) -> bool:
    """Whether a row's answers decode in two loops (the forget side's questions, then the
    rest) rather than one: on a CPU, where a decoding step costs what its rows cost, so
    the forget side alone (30 of SmolLM2's 109 rows) decodes a first verdict in about half
    the time and the two loops together cost about what one does; not on a GPU, where a
    step of a small model costs its kernel launches whatever its rows (SmolLM2 on an H200:
    about 35 ms a step for 30 or 109 rows), so two loops would take twice as long."""
    return model_device(model).type == "cpu"


def _chosen_sets(sets: dict[str, tuple], only_forget: bool) -> dict[str, tuple]:
    """The knowledge sets a row answers (`_knowledge_row`): each set's examples that have a
    fact, in `KNOWLEDGE_SETS` order; with `only_forget`, the forget side's sets alone."""
    chosen = {}
    for name in KNOWLEDGE_SETS:
        ex = tuple(e for e in sets.get(name, ()) if isinstance(e, QAExample) and e.fact)
        if ex and not (only_forget and name not in FORGET_SIDE):
            chosen[name] = ex
    return chosen


def _decoding_loops(chosen: dict[str, tuple], given: dict, paraphrased: bool) -> dict[str, list]:
    """The questions a row still has to answer (those `given` lacks), as (set, part, text,
    fact) items in two loops: "first", the forget side's questions; "rest", the others
    (the forget set's paraphrases where `paraphrased`, the kept sets)."""
    loops: dict[str, list] = {"first": [], "rest": []}  # the forget side's questions; the rest
    for name, ex in chosen.items():
        held, held_para = given.get(name, (None, None))
        parts = [("questions", [e.question for e in ex])] if held is None else []
        if name == "forget" and paraphrased and held_para is None:
            parts.append(("paraphrases", [e.paraphrased_question or e.question for e in ex]))
        for part, texts in parts:
            first = name in FORGET_SIDE and part == "questions"
            loops["first" if first else "rest"] += [(name, part, text, e.fact) for text, e in zip(texts, ex)]
    return loops


def _decode_loops(run: ModelScorer, sets: dict[str, tuple], chosen: dict[str, tuple],
                  loops: dict[str, list]) -> dict[tuple[str, str], list[str]]:
    """The answers to `loops`' questions by (set, part), in batched greedy decoding with one
    budget (`knowledge_budget`), in two loops on a CPU (`split_decoding`), else in one."""
    gens: dict[tuple[str, str], list[str]] = {}
    if loops["first"] or loops["rest"]:
        # one budget for every set, whichever of them this stage decodes: the forget stage's
        # answers are those the answers stage gives
        everyone = [e for name in KNOWLEDGE_SETS for e in sets.get(name, ())
                    if isinstance(e, QAExample) and e.fact] if run.stage == "forget" else \
            [e for ex in chosen.values() for e in ex]
        budget = run.max_new_tokens or knowledge_budget(run.tok, [e.answer for e in everyone])
        total, done = len(loops["first"]) + len(loops["rest"]), 0
        batches = (loops["first"], loops["rest"]) if split_decoding(run.model) else \
            (loops["first"] + loops["rest"],)
        for items in batches:
            if not items:
                continue
            step = None if run.answered is None else (lambda k, d=done: run.answered(d + k, total))
            texts = generate(run.model, run.tok, [t for _, _, t, _ in items], prompt_format=run.fmt,
                             max_new_tokens=budget, batch_size=max(run.batch_size, KNOWLEDGE_GEN_BATCH),
                             stop_at=[f for _, _, _, f in items], on_step=step)
            for (name, part, _, _), text in zip(items, texts):
                gens.setdefault((name, part), []).append(text)
            done += len(items)
    return gens


def _add_set_metrics(row: Row, name: str, df: pd.DataFrame) -> None:
    """A knowledge set's answers frame and its plain metrics (ROUGE-L, prob, the truth ratio
    aggregate of its side) into `row`."""
    label = KNOWLEDGE_SETS[name]
    row.examples[name] = df
    row.metrics[f"{label} ROUGE-L"] = float(df["rougeL_recall"].mean())
    if "prob" in df:
        row.metrics[f"{label} prob"] = float(df["prob"].mean())
    if "truth_ratio" in df:
        tr = df["truth_ratio"].to_numpy()
        if name in FORGET_SIDE:  # TOFU's forget aggregate, mean min(TR, 1/TR): 1 = cannot tell
            row.metrics[f"{label} truth ratio closeness"] = M.truth_ratio_forget(tr)
        else:  # TOFU's retain aggregate, mean max(0, 1 - TR): 1 = the right answer far likelier
            row.metrics[f"{label} truth ratio"] = M.truth_ratio_retain(tr)


def _knowledge_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    """Per-set answers and plain metrics; the answer classes need the unedited model and
    are added by `_judge_answers`, the known-fact metrics need the Base row and are added
    by `_knowledge_relative`.

    The questions are answered in batched greedy decoding with one budget
    (`knowledge_budget`): on a CPU in two loops (`split_decoding`), the forget side's
    questions (the forget set's and the held-out probes'), then the rest (the forget set's
    paraphrases, the kept sets), so that a first verdict on the forget side can come first
    on the batches the unedited row decoded (a prefix cache keeps batches whole); on a GPU
    in one. A decoding step costs about as much for 100 prompts as for 15 on SmolLM2 (the
    paraphrases' 15 answers in a loop of their own took 4-5 s, and removing them from the
    shared loop saved under 1 s), so not one loop per set. Each answer stops as soon
    as it states its fact (or ends): the text is the full-length answer up to there, so
    fact recall is what the full-length answer gives, while ROUGE-L, repetition and the
    answer's perplexity read the answer up to its fact where it states it.

    The "forget" stage (a first verdict, `grom.eval.report.evaluate`) answers the forget
    questions and the held-out probes alone (the first loop); the answers stage given its
    report (`run.given`) then answers the rest (the second), the same answers.
    `run.answered`, where set, hears (answers finished, answers) after each decoding step."""
    row = Row()
    chosen = _chosen_sets(sets, only_forget)
    paraphrased = run.stage != "forget"  # the forget stage leaves the paraphrases to the next one
    given = _given_answers(run, chosen) if run.given else {}
    gens = _decode_loops(run, sets, chosen, _decoding_loops(chosen, given, paraphrased))

    for name, ex in chosen.items():
        held, held_para = given.get(name, (None, None))
        answers = list(held if held is not None else gens[name, "questions"])
        paraphrase = name == "forget" and (paraphrased or held_para is not None)
        if paraphrase:
            answers += held_para if held_para is not None else gens[name, "paraphrases"]
        df = _knowledge_qa(run, ex, answers, paraphrase=paraphrase,
                           given=run.given.get(name) if held is not None else None)
        _add_set_metrics(row, name, df)
    if "forget" in row.examples:
        row.metrics["Forget repetition"] = float(row.examples["forget"]["repetition"].mean())
    texts = [e.text for e in sets.get("fluency", ()) if isinstance(e, TextExample)]
    if texts and not only_forget and run.stage == "full":
        scores = score_texts(run.model, run.tok, texts, batch_size=run.batch_size)
        row.metrics["Text perplexity"] = M.perplexity([s.avg_loss for s in scores])
    return row



def _judge_answers(model, tokenizer, rows: dict[str, Row], fmt, batch_size: int, stage: str = "full") -> None:
    """Each answer's class (`grom.eval.metrics.answer_class`, column "answer_class") and,
    where it does not state its fact or answers a forget question, its perplexity under
    the model as it is now, the UNEDITED one (column "answer_perplexity", NaN elsewhere):
    a fluent non-answer reads as ordinary text (low), noise does not (high). The forget
    answers' perplexity is also the row's "Forget answer perplexity".

    In two passes: first the answers whose class depends on it (no fact, neither
    degenerate by form nor a refusal: `answer_class`), then, in the "full" stage, the
    rest (the "answers" stage, the card's, stops after the first: on the default edit 21
    of the 27). Rows whose frames have their classes already (reused ones, or lent by an
    answers-stage report) get only the second pass, where it is missing; each row is
    scored on its own, so its numbers never depend on which other rows were evaluated
    with it."""
    for row in rows.values():
        frames = {n: df for n, df in row.examples.items() if n in KNOWLEDGE_SETS}
        unjudged = {n: df for n, df in frames.items() if "answer_class" not in df}
        if unjudged:
            _judge_row(model, tokenizer, unjudged, fmt, batch_size, needed=True)
        if stage == "full" and frames:
            _judge_row(model, tokenizer, frames, fmt, batch_size, needed=False)
        forget = row.examples.get("forget")
        if stage == "full" and forget is not None and len(forget) and "answer_perplexity" in forget:
            row.metrics["Forget answer perplexity"] = M.perplexity(np.log(forget["answer_perplexity"].to_numpy()))


def _judged(name: str, fact_recall: float) -> bool:
    """Whether an answer gets a perplexity: every forget answer, and any other that does
    not state its fact."""
    return name == "forget" or fact_recall != 1.0


def _judge_row(model, tokenizer, frames: dict[str, pd.DataFrame], fmt, batch_size: int, needed: bool) -> None:
    """One pass of `_judge_answers` over a row's frames: `needed`, the answers whose class
    waits for their perplexity, then every frame's classes; else the judged answers whose
    perplexity is still missing (NaN)."""
    ppl, where, pairs = {}, [], []
    for name, df in frames.items():
        ppl[name] = df["answer_perplexity"].to_numpy(dtype=float, copy=True) if "answer_perplexity" in df \
            else np.full(len(df), np.nan)
        for i, (q, g, fr) in enumerate(zip(df["question"], df["generation"], df["fact_recall"])):
            if not _judged(name, fr) or not np.isnan(ppl[name][i]):
                continue
            if needed == (fr != 1.0 and not M.is_degenerate(g) and not M.is_refusal(g)):
                pairs.append((q, g if g.strip() else "."))
                where.append((name, i))
    scores = score_answers(model, tokenizer, pairs, prompt_format=fmt, batch_size=batch_size) if pairs else []
    for (name, i), s in zip(where, scores):
        ppl[name][i] = float(np.exp(s.avg_loss))
    for name, df in frames.items():
        if needed or where or "answer_perplexity" not in df:
            df["answer_perplexity"] = ppl[name]
        if needed:
            df["answer_class"] = [M.answer_class(f, g, None if np.isnan(x) else x)
                                  for f, g, x in zip(df["fact"], df["generation"], ppl[name])]


def _class_shares(df: pd.DataFrame, known: np.ndarray) -> dict[str, float]:
    """Share of each answer class among the known facts' answers."""
    classes = df["answer_class"].to_numpy()[known]
    return {c: float(np.mean(classes == c)) for c in M.ANSWER_CLASSES}


def _knowledge_relative(rows: dict[str, Row]) -> None:
    """Fact recall on the facts the unedited model knew (its greedy answer held the fact),
    the counts, "Kept fact recall" (pooled over the known neighbour and general facts),
    the answer classes' shares of the known facts (where `_judge_answers` gave them):
    "Forget refusal", "Forget fluent other", "Forget degenerate", their sum of the first
    two "Forget clean forgetting", each kept set's and the pooled "Kept degenerate"; and
    the headline `knowledge_score`, where a degenerate forget answer is no forgetting."""
    base = rows.get(BASE)
    if base is None:
        return
    for row in rows.values():
        m, kept, kept_degenerate = row.metrics, [], []
        for name, label in KNOWLEDGE_SETS.items():
            known, df = known_mask(base, name), row.examples.get(name)
            if known is None or df is None:
                continue
            m[f"{label} facts known"] = float(known.sum())
            if not known.any():
                continue
            m[f"{label} fact recall"] = float(df["fact_recall"].to_numpy()[known].mean())
            shares = _class_shares(df, known) if "answer_class" in df else None
            if shares is not None:
                m[f"{label} degenerate"] = shares[M.DEGENERATE]
            if name == "forget":
                para = known_mask(base, name, "paraphrase_recall")
                if para is not None and para.any() and "paraphrase_recall" in df:  # none in the forget stage
                    m["Forget paraphrase recall"] = float(df["paraphrase_recall"].to_numpy()[para].mean())
                if shares is not None:
                    m["Forget refusal"], m["Forget fluent other"] = shares[M.REFUSAL], shares[M.FLUENT]
                    m["Forget clean forgetting"] = shares[M.REFUSAL] + shares[M.FLUENT]
            elif name not in FORGET_SIDE:
                kept.extend(df["fact_recall"].to_numpy()[known])
                if shares is not None:
                    kept_degenerate.extend(df["answer_class"].to_numpy()[known] == M.DEGENERATE)
        if kept_degenerate:
            m["Kept degenerate"] = float(np.mean(kept_degenerate))
        if "Forget fact recall" in m and kept:
            m["Kept fact recall"] = float(np.mean(kept))  # pooled: every known kept fact counts once
            m["Knowledge score"] = M.knowledge_score(m["Forget fact recall"], m["Kept fact recall"],
                                                     m.get("Forget degenerate", 0.0))


TASK = register_task(Task(
    "knowledge", _knowledge_row, retain_metrics=("Kept fact recall",), headline="Knowledge score",
    relative=_knowledge_relative, judge=_judge_answers,
    quant=QuantMetrics(("Forget fact recall",), ("Kept fact recall",), from_full_base=True),
    quant_sets=tuple(KNOWLEDGE_SETS), recipe="tofu", stages=("answers", "forget"),
    benchmarks=(BenchmarkSpec("real-knowledge", knowledge_data.load_knowledge, knowledge_data.SPLITS,
                              options=("prompt_format", "known_only"), bundled=True,
                              label="Real knowledge: famous facts (bundled)",
                              description="facts a small chat model knows, by target: forget one, keep the rest "
                                          "(offline)"),)))
