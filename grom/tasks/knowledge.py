"""The benchmark "real-knowledge": its loader, then its task (the loader was grom/data/knowledge.py).

The real-knowledge benchmark: facts a small pretrained chat model already knows,
grouped by subject (a book world, a person, a place, a science topic), bundled with GROM.

Forget one subject (or three, split "forget3"); keep the others and general knowledge.
The files live in `grom/data/knowledge/` (package data of `grom.data`; see its README.md);
a `source` folder with the same layout loads the same way:

    <subject>.json   {"id", "title", "kind", "intro"?, "qa": [{"question", "answer", "fact",
                     "paraphrased_question", "wrong_answers": [3 texts], "id"?}, ...]}
    general.json    the same format: general knowledge (utility)
    fluency.json    {"texts": [{"id"?, "text"}, ...]}: neutral paragraphs (perplexity)
    known.json      optional, written by bench/probe_knowledge.py: which questions the
                    probed model answers with the fact ({"known": {id: [question, paraphrase]}})

Every other subject, and general knowledge, is split once and for all into a retain part
(the edit's keys, about 60%) and a held-out part (evaluation), by a stable hash of each
pair's id, so evaluation never measures what the edit was fitted on. The forget subject's
own pairs are split the same way into the questions the edit is fitted on (`forget`, half)
and held-out probe questions it never sees (`eval_sets["probes"]`, the other half): does
the forgetting carry beyond the wording it was fitted to? (`grom.robustness`)

The real-knowledge task ("knowledge", was grom/eval/knowledge.py): every set's greedy
answers in one decoding loop that stops at each fact, fact recall and its counts on the
facts the unedited model knew, ROUGE-L, answer probability, TOFU's truth ratio against the
bundled wrong answers, each answer's class judged with the unedited model, and the headline
Knowledge score. The benchmark "real-knowledge" (bundled). Its evaluation also has the
stages "answers" and "forget" (`grom.eval.report.evaluate`).
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import PromptFormat
from grom.data.readers import BenchmarkError, PathLike, Record, check_size, resolve_source
from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval import metrics as M
from grom.eval.metric_sources import ours, upstream
from grom.eval.prefix import LowerStates
from grom.eval.results import BASE, EDITED, Row, known_mask
from grom.eval.runner import (
    ModelScorer,
    answers_until,
    encode_pair,
    generate,
    score_answers,
    score_sequences,
    score_texts,
)
from grom.eval.tasks import QuantMetrics, Task, register_task
from grom.model.arch import model_device
from grom.text import contains_phrase, normalise_text
from grom.turns import Between, give

REAL_MODEL = "smollm2-135m-instruct"  # the registry model its facts were probed on (grom.model.fetch)

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "knowledge"  # grom/data/knowledge/
# The splits: one per bundled subject, then "forget3". The default, first, is the subject
# SmolLM2-135M-Instruct knows best (README.md: it knows little of the book worlds). A
# source folder may hold other subjects: load_knowledge takes them.
SUBJECTS = (
    "the-solar-system", "harry-potter", "the-lord-of-the-rings", "sherlock-holmes", "star-wars",
    "albert-einstein", "marie-curie", "william-shakespeare", "the-beatles", "ancient-egypt",
    "france", "japan", "the-human-body", "world-war-ii",
)
FORGET3 = ("the-solar-system", "world-war-ii", "the-human-body")  # the three best known
SPLITS = (*SUBJECTS, "forget3")
GENERAL, FLUENCY, KNOWN = "general", "fluency", "known"  # the files that are no subject
RETAIN_FRACTION = 0.6  # of each kept subject and of general: edit keys; the rest is evaluated
FIT_FRACTION = 0.5  # of each forget subject: the edit's forget set; the rest are held-out probes
N_WRONG = 3


@dataclass(frozen=True)
class Subject:
    """One subject's QA pairs (general knowledge uses the same type)."""

    id: str
    title: str
    kind: str
    qa: tuple[QAExample, ...]
    intro: str = ""  # one sentence naming what it is: the description of RWKU's name-only setting


@dataclass(frozen=True)
class Knowledge:
    """Everything in a knowledge folder, validated."""

    subjects: Mapping[str, Subject]
    general: Subject
    fluency: tuple[TextExample, ...]
    known: Mapping[str, tuple[bool, bool]] | None  # id -> (question known, paraphrase known)


# ----------------------------------------------------------------------------- reading


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise BenchmarkError(f"real-knowledge: {path}: no such file")
    check_size(path.stat().st_size, str(path))
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise BenchmarkError(f"{path}: not UTF-8 text; save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"{path} line {e.lineno}, column {e.colno}: malformed JSON ({e.msg})") from None


def _qa(rec: Record, subject: str, default_id: str) -> QAExample:
    """One validated pair: every field present, the fact inside the answer (as fact recall
    matches it), three distinct wrong answers that differ from the answer and lack the fact."""
    answer, fact = rec.text("answer"), rec.text("fact")
    wrong = rec.texts("wrong_answers")
    if not contains_phrase(answer, fact):
        raise BenchmarkError(f"{rec.where}: the fact {fact!r} is not a whole-word part of the answer "
                             f"{answer!r}")
    if len(wrong) != N_WRONG or len(set(wrong)) != N_WRONG or answer in wrong:
        raise BenchmarkError(f"{rec.where}: expected {N_WRONG} distinct wrong answers, each unlike the "
                             f"answer; found {list(wrong)}")
    leaking = [w for w in wrong if contains_phrase(w, fact)]
    if leaking:
        raise BenchmarkError(f"{rec.where}: the wrong answer {leaking[0]!r} contains the fact {fact!r}")
    return QAExample(question=rec.text("question"), answer=answer,
                     paraphrased_question=rec.text("paraphrased_question"),
                     perturbed_answers=wrong, fact=fact, subject=subject,
                     id=rec.text("id", optional=True) or default_id)


def read_subject(path: PathLike) -> Subject:
    """A subject file (or general.json), validated; errors name the file and the item."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("qa"), list) or not doc["qa"]:
        raise BenchmarkError(f"{path}: expected an object with a non-empty list \"qa\" of question/answer "
                             "pairs")
    head, tid = Record(str(path), doc), path.stem
    if head.text("id", optional=True) not in (None, tid):
        raise BenchmarkError(f"{path}: its id {doc['id']!r} should be its file name, {tid!r}")
    qa = tuple(_qa(Record(f"{path} qa item {i + 1}", item if isinstance(item, dict) else {}),
                   tid, f"{tid}/{i + 1:02d}")
               for i, item in enumerate(doc["qa"]))
    return Subject(tid, head.text("title", optional=True) or tid, head.text("kind", optional=True) or "", qa,
                  head.text("intro", optional=True) or "")


def read_fluency(path: PathLike) -> tuple[TextExample, ...]:
    path = Path(path)
    doc = _read_json(path)
    items = doc.get("texts") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise BenchmarkError(f"{path}: expected an object with a non-empty list \"texts\"")
    out = []
    for i, item in enumerate(items):
        rec = Record(f"{path} text {i + 1}", item if isinstance(item, dict) else {"text": item})
        out.append(TextExample(rec.text("text"), id=rec.text("id", optional=True) or f"fluency/{i + 1:02d}"))
    return tuple(out)


def _read_known(path: Path, ids: set[str]) -> Mapping[str, tuple[bool, bool]] | None:
    if not path.is_file():
        return None
    doc = _read_json(path)
    known = doc.get("known") if isinstance(doc, dict) else None
    if not isinstance(known, dict):
        raise BenchmarkError(f"{path}: expected an object with a mapping \"known\" of pair id -> "
                             "[question known, paraphrase known]")
    stray = sorted(set(known) - ids)
    if stray:
        raise BenchmarkError(f"{path}: unknown pair id {stray[0]!r}; re-run bench/probe_knowledge.py")
    bad = [k for k, v in known.items() if not (isinstance(v, list) and len(v) == 2)]
    if bad:
        raise BenchmarkError(f"{path}: {bad[0]!r} should map to [question known, paraphrase known] (0 or 1)")
    return {k: (bool(v[0]), bool(v[1])) for k, v in known.items()}


def _check_unique(groups: list[Subject]) -> None:
    """No question and no id twice in the whole folder (retain and evaluation stay disjoint)."""
    seen_q: dict[str, str] = {}
    seen_id: set[str] = set()
    for group in groups:
        for ex in group.qa:
            q = normalise_text(ex.question)
            if q in seen_q:
                raise BenchmarkError(f"real-knowledge: {group.id}: the question {ex.question!r} "
                                     f"is already in {seen_q[q]}")
            if ex.id in seen_id:
                raise BenchmarkError(f"real-knowledge: {group.id}: the id {ex.id!r} is used twice")
            seen_q[q] = group.id
            seen_id.add(ex.id)


def read_knowledge(folder: PathLike) -> Knowledge:
    """Every file of a knowledge folder, validated (bundled: cached, see `knowledge`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BenchmarkError(f"real-knowledge: {folder}: expected a folder of subject files")
    special = {GENERAL, FLUENCY, KNOWN}
    files = [p for p in sorted(folder.glob("*.json")) if p.stem not in special]
    subjects = {t.id: t for t in map(read_subject, files)}
    if not subjects:
        raise BenchmarkError(f"real-knowledge: {folder}: no subject files (<subject>.json)")
    general = read_subject(folder / f"{GENERAL}.json")
    _check_unique([*subjects.values(), general])
    ids = {ex.id for group in [*subjects.values(), general] for ex in group.qa}
    return Knowledge(subjects, general, read_fluency(folder / f"{FLUENCY}.json"),
                     _read_known(folder / f"{KNOWN}.json", ids))


@functools.lru_cache(maxsize=1)
def _bundled() -> Knowledge:
    return read_knowledge(BUNDLED)


def knowledge(source: PathLike | None = None) -> Knowledge:
    """The bundled knowledge (read once) or that of a `source` folder (read every call)."""
    folder = resolve_source(source, "real-knowledge")
    return _bundled() if folder is None else read_knowledge(folder)


# ----------------------------------------------------------------------------- splitting


def _rank(ex: QAExample) -> str:
    return hashlib.sha256(ex.id.encode("utf-8")).hexdigest()


def _split(qa: tuple[QAExample, ...], fraction: float) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(first part, rest): the first `fraction` of the pairs in the order of the SHA-256 of
    their ids, each part in file order. A pair is on the same side whatever the split;
    rewording a pair moves none, adding pairs moves only pairs next to the cut."""
    n = round(fraction * len(qa))
    keep = {ex.id for ex in sorted(qa, key=_rank)[:n]}
    return tuple(ex for ex in qa if ex.id in keep), tuple(ex for ex in qa if ex.id not in keep)


def split_retain(qa: tuple[QAExample, ...]) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(retain part, held-out part) of a kept subject: `RETAIN_FRACTION` of it retained."""
    return _split(qa, RETAIN_FRACTION)


def split_probes(qa: tuple[QAExample, ...]) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(fitted part, probe part) of a forget subject: `FIT_FRACTION` of it for the edit, the
    rest held out as probes the edit never sees (the same hash order as `split_retain`, so
    a subject's fitted pairs are among its retained ones when it is kept)."""
    return _split(qa, FIT_FRACTION)


def forget_subjects(split: str, know: Knowledge) -> tuple[str, ...]:
    """The subject ids `split` forgets; an unknown one lists what exists."""
    names = FORGET3 if split == "forget3" else (split,)
    missing = [n for n in names if n not in know.subjects]
    if missing:
        valid = ", ".join([*know.subjects, *(["forget3"] if set(FORGET3) <= set(know.subjects) else [])])
        raise BenchmarkError(f"real-knowledge: no subject {missing[0]!r}; valid splits: {valid}")
    return names


def _sets(know: Knowledge, names: tuple[str, ...]) -> dict[str, tuple[QAExample, ...]]:
    """forget (the fitted part of the subjects `names`), probes (their held-out part), retain,
    neighbours and general (held out) for forgetting the subjects `names`."""
    kept = [split_retain(t.qa) for tid, t in know.subjects.items() if tid not in names]
    general_retain, general_eval = split_retain(know.general.qa)
    forgotten = [split_probes(know.subjects[n].qa) for n in names]
    return {"forget": tuple(ex for fitted, _ in forgotten for ex in fitted),
            "probes": tuple(ex for _, probes in forgotten for ex in probes),
            "retain": tuple(ex for part, _ in kept for ex in part) + general_retain,
            "neighbours": tuple(ex for _, part in kept for ex in part),
            "general": general_eval}


def _only_known(sets: dict[str, tuple[QAExample, ...]], known: Mapping[str, tuple[bool, bool]] | None,
                split: str) -> dict[str, tuple[QAExample, ...]]:
    """`sets` with only the pairs whose question the probed model answered; retain whole."""
    if known is None:
        raise BenchmarkError("real-knowledge: known_only needs known.json; run "
                             "bench/probe_knowledge.py --write-known")
    out = {k: v if k == "retain" else tuple(ex for ex in v if known.get(ex.id, (False,))[0])
           for k, v in sets.items()}
    if not out["forget"]:
        raise BenchmarkError(f"real-knowledge {split}: the probed model knows none of its facts")
    return out


# ----------------------------------------------------------------------------- benchmark


def load_knowledge(split: str = SUBJECTS[0], source: PathLike | None = None, *,
                   prompt_format: PromptFormat | None = None, known_only: bool = False) -> Benchmark:
    """The real-knowledge benchmark: forget the subject(s) of `split`, keep the rest.

    forget: the fitted half of the forget subject(s)' pairs (`split_probes`); retain: the
    retain parts of the other subjects and of general knowledge. eval_sets: "forget" (the
    fitted pairs), "probes" (the forget subjects' other half, never fitted: held-out
    probes), "neighbours" (held-out pairs of the other subjects), "general" (held-out
    general pairs), "fluency" (texts).
    prompt_format: None, the tokenizer's chat template (what the chat model answers best).
    known_only: keep only the pairs the probed model answered with the fact (known.json,
    bench/probe_knowledge.py) in forget and in the QA evaluation sets; retain is unchanged.
    """
    know = knowledge(source)
    names = forget_subjects(split, know)
    sets = _sets(know, names)
    if known_only:
        sets = _only_known(sets, know.known, split)
    n_eval = len(sets["neighbours"]) + len(sets["general"])
    return Benchmark(
        name="real-knowledge", split=split, forget=sets["forget"], retain=sets["retain"],
        eval_sets={"forget": sets["forget"], "probes": sets["probes"], "neighbours": sets["neighbours"],
                   "general": sets["general"], "fluency": know.fluency},
        prompt_format=prompt_format, task="knowledge",
        description=(f"Real knowledge: forget {', '.join(know.subjects[n].title for n in names)} "
                     f"({len(sets['forget'])} {'known ' if known_only else ''}facts fitted, "
                     f"{len(sets['probes'])} held out as probes); keep "
                     f"{len(know.subjects) - len(names)} other subjects and general knowledge "
                     f"({len(sets['retain'])} retain pairs, {n_eval} held out)."),
    )


# ----------------------------------------------------------------------------- task


KNOWLEDGE_SETS = {"forget": "Forget", "probes": "Probe", "neighbours": "Neighbour", "general": "General"}
"""The real-knowledge sets: the forget questions the edit was fitted on ("Forget"), the
forget subject's held-out questions it never saw ("Probe": does the forgetting carry beyond
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
FIRST_VERDICT_BUDGET = 24
"""New tokens of a first verdict's answers (the "forget" stage of an edited row, on a CPU:
`split_decoding`): an answer that keeps its fact states it within 24 tokens in most cases
(median 11 on SmolLM2's default split), while a forgotten one runs its whole budget, so
the first verdict comes in about half the decoding. Its answers that do not state their
fact (column "cut") are decoded again with the whole budget by the answers stage that
follows, whose card replaces the first verdict: a fact stated only past token 24 is
counted there (BENCHMARKS.md measures how often the two verdicts differ)."""
KNOWLEDGE_GEN_BATCH = 128  # prompts per decoding loop: one loop serves every set of a row


def knowledge_budget(tokenizer, answers) -> int:
    """New tokens for a row's answers: `KNOWLEDGE_BUDGET`, or the longest reference answer
    plus `KNOWLEDGE_MARGIN` where that is more."""
    longest = max((len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers), default=0)
    return max(KNOWLEDGE_BUDGET, longest + KNOWLEDGE_MARGIN)


JUDGED = ("answer_perplexity", "answer_class")  # `_judge_answers`'s columns
PENDING = "pending"  # the class of a first verdict's answer cut short (column "cut"): not read in full yet


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


def _given_answers(run: ModelScorer, chosen: dict[str, tuple]) -> dict[str, tuple[list, list[str] | None]]:
    """The answers `run.given` (an earlier evaluation of this model on these sets) holds,
    per set it holds for the same questions: (the questions' answers, None for each one a
    first verdict cut short (`FIRST_VERDICT_BUDGET`, column "cut"): decoded again; the
    forget set's paraphrases' answers or None where it lacks them: the forget stage
    decodes none)."""
    out = {}
    for name, ex in chosen.items():
        df = run.given.get(name)
        if df is None or list(df.get("question", ())) != [e.question for e in ex]:
            continue
        para = list(df["paraphrase_generation"]) if name == "forget" and "paraphrase_generation" in df else None
        cut = df["cut"].to_numpy(dtype=bool) if "cut" in df else np.zeros(len(df), dtype=bool)
        out[name] = ([None if c else g for g, c in zip(df["generation"], cut)], para)
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
    tails = score_sequences(run.model, run.tok, seqs, run.batch_size, between=run.between)
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
        if held is not None and None in held:  # a first verdict's answers cut short: again, with the whole budget
            loops["rest"] += [(name, "again", e.question, e.fact) for e, h in zip(ex, held) if h is None]
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
        if short_first(run):
            budget = min(budget, FIRST_VERDICT_BUDGET)
        total, done = len(loops["first"]) + len(loops["rest"]), 0
        batches = (loops["first"], loops["rest"]) if split_decoding(run.model) else \
            (loops["first"] + loops["rest"],)
        for items in batches:
            if not items:
                continue
            # generate's on_step hears (finished in this loop, this loop's size): the count goes on
            # from the loops before, out of every loop's answers
            step = None if run.answered is None else (lambda k, _size, d=done: run.answered(d + k, total))
            texts = generate(run.model, run.tok, [t for _, _, t, _ in items], prompt_format=run.fmt,
                             max_new_tokens=budget, batch_size=max(run.batch_size, KNOWLEDGE_GEN_BATCH),
                             stop_at=[f for _, _, _, f in items], on_step=step, between=run.between,
                             lower=run.lower)
            for (name, part, _, _), text in zip(items, texts):
                gens.setdefault((name, part), []).append(text)
            done += len(items)
    return gens


def _draft_batch(chosen: dict[str, tuple], forget_only: bool) -> list[tuple[str, str, int, QAExample]]:
    """The questions of one drafted pass (`_decode_drafted`) as (set, part, index, example),
    in an order the unedited row and an edited one build alike, so that the edited row's
    pass is the very batch the unedited one recorded in a prefix cache: the forget side's
    questions, then, unless `forget_only`, the forget set's paraphrases and the kept sets'
    questions."""
    items = [(name, "questions", i, e) for name in FORGET_SIDE if name in chosen for i, e in enumerate(chosen[name])]
    if not forget_only:
        items += [("forget", "paraphrases", i, e) for i, e in enumerate(chosen.get("forget", ()))]
        items += [(name, "questions", i, e) for name, ex in chosen.items() if name not in FORGET_SIDE
                  for i, e in enumerate(ex)]
    return items


def _asked(item: tuple) -> str:
    _, part, _, e = item
    return e.question if part == "questions" else (e.paraphrased_question or e.question)


def _drafts_for(frames: Mapping[str, pd.DataFrame], chosen: dict[str, tuple], items: list) -> list[str | None]:
    """Each item's draft: the answer `frames` (the unedited row's, on the same questions)
    gave it; None where they hold none."""
    same = {name: df for name, df in frames.items()
            if name in chosen and list(df.get("question", ())) == [e.question for e in chosen[name]]}
    out = []
    for name, part, i, _ in items:
        col = "generation" if part == "questions" else "paraphrase_generation"
        df = same.get(name)
        out.append(None if df is None or col not in df else str(df[col].iloc[i]))
    return out


def _decode_drafted(run: ModelScorer, chosen: dict[str, tuple], given: dict, paraphrased: bool,
                    budget: int) -> tuple[dict[tuple[str, str], list[str]], dict[str, np.ndarray]]:
    """The answers a row still needs, read off one drafted pass (`grom.eval.runner.greedy_answers`):
    each question's draft is the unedited model's answer to it (`run.drafts`), so an
    answer the edit left alone costs no decoding step, and only those that depart from
    it decode on, in one loop. In the "forget" stage (a first verdict) only the forget
    side's questions, and nothing is decoded past the pass: an answer that departs from
    the unedited one before stating its fact is "cut" (read in full by the next stage).
    Returns `_decode_loops`' answers (the "again" part: the cut answers of a given first
    verdict) and, in the forget stage, each set's cut flags."""
    first = run.stage == "forget"
    items = _draft_batch(chosen, forget_only=first)
    held = {name: given.get(name, (None, None)) for name in chosen}
    wanted = []
    for name, part, i, _ in items:
        answers, para = held[name]
        if part == "questions":
            wanted.append(answers is None or answers[i] is None)
        else:
            wanted.append(paraphrased and para is None)
    gens: dict[tuple[str, str], list[str]] = {}
    cut: dict[str, np.ndarray] = {}
    if not any(wanted):
        return gens, cut
    total = sum(wanted) if not first else len(items)
    skipped = len(items) - total  # given already: finished after the pass, not counted as answered here
    step = None if run.answered is None else (lambda k, _size: run.answered(max(0, min(k - skipped, total)), total))
    out = answers_until(run.model, run.tok, [_asked(it) for it in items], prompt_format=run.fmt,
                        max_new_tokens=budget, batch_size=max(run.batch_size, KNOWLEDGE_GEN_BATCH),
                        stop_at=[e.fact for *_, e in items], on_step=step, between=run.between,
                        drafts=_drafts_for(run.drafts, chosen, items), decode=not first, wanted=wanted,
                        lower=run.lower)
    for (name, part, i, _), w, (text, done) in zip(items, wanted, out):
        if not w:
            continue
        answers = held[name][0]
        key = (name, "again") if part == "questions" and answers is not None else (name, part)
        gens.setdefault(key, []).append(text)
        if first:
            cut.setdefault(name, np.zeros(len(chosen[name]), dtype=bool))[i] = not done
    return gens, cut


def _record(run: ModelScorer, sets: dict[str, tuple], frames: Mapping[str, pd.DataFrame]) -> None:
    """`Task.record`: the unedited row's drafted passes on its answers `frames`
    (`_record_drafted`), as evaluating it with a recording prefix cache runs them."""
    _record_drafted(run, _chosen_sets(sets, False), frames, run.max_new_tokens or knowledge_budget(
        run.tok, [e.answer for name in KNOWLEDGE_SETS for e in sets.get(name, ()) if isinstance(e, QAExample)
                  and e.fact]))


def _record_drafted(run: ModelScorer, chosen: dict[str, tuple], frames: Mapping[str, pd.DataFrame],
                    budget: int) -> None:
    """The unedited row's drafted passes on its own answers (nothing decoded), so that a
    prefix cache recording this row holds the batches an edited row's first verdict and
    its whole card then read (`_decode_drafted`): both replay the layers below the edit."""
    for forget_only in (True, False):
        items = _draft_batch(chosen, forget_only)
        if items:
            give(run.between)
            answers_until(run.model, run.tok, [_asked(it) for it in items], prompt_format=run.fmt,
                          max_new_tokens=budget, batch_size=max(run.batch_size, KNOWLEDGE_GEN_BATCH),
                          stop_at=[e.fact for *_, e in items], between=run.between,
                          drafts=_drafts_for(frames, chosen, items), decode=False)


def short_first(run: ModelScorer) -> bool:
    """Whether this row's answers are a first verdict's, cut at `FIRST_VERDICT_BUDGET`: the
    forget stage on a CPU, where the evaluation fixed no budget of its own."""
    return run.stage == "forget" and not run.unedited and not run.max_new_tokens and split_decoding(run.model)


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
    budget = run.max_new_tokens or knowledge_budget(run.tok, [e.answer for name in KNOWLEDGE_SETS for e in sets.get(
        name, ()) if isinstance(e, QAExample) and e.fact])
    cut: dict[str, np.ndarray] = {}
    if run.drafts:
        gens, cut = _decode_drafted(run, chosen, given, paraphrased, budget)
    else:
        gens = _decode_loops(run, sets, chosen, _decoding_loops(chosen, given, paraphrased))

    for name, ex in chosen.items():
        held, held_para = given.get(name, (None, None))
        again = iter(gens.get((name, "again"), ()))
        answers = [h if h is not None else next(again) for h in held] if held is not None \
            else list(gens[name, "questions"])
        paraphrase = name == "forget" and (paraphrased or held_para is not None)
        if paraphrase:
            answers += held_para if held_para is not None else gens[name, "paraphrases"]
        lent = run.given.get(name) if held is not None and None not in held else None  # classes of the same answers
        df = _knowledge_qa(run, ex, answers, paraphrase=paraphrase, given=lent)
        if name in cut:  # departed from the unedited answer before its fact: read in full next
            df["cut"] = cut[name]
            df.loc[df["cut"], "fact_recall"] = 0.0  # not stated yet; the whole answer may still state it
        elif short_first(run) and not run.drafts:
            df["cut"] = ~df["fact_recall"].astype(bool)  # not stated within the short budget: decoded again
        _add_set_metrics(row, name, df)
    if "forget" in row.examples:
        row.metrics["Forget repetition"] = float(row.examples["forget"]["repetition"].mean())
    texts = [e.text for e in sets.get("fluency", ()) if isinstance(e, TextExample)]
    if texts and not only_forget and run.stage == "full":
        scores = score_texts(run.model, run.tok, texts, batch_size=run.batch_size, between=run.between)
        row.metrics["Text perplexity"] = M.perplexity([s.avg_loss for s in scores])
    return row



def _judge_answers(model, tokenizer, rows: dict[str, Row], fmt, batch_size: int, stage: str = "full",
                   between: Between | None = None, lower: LowerStates | None = None) -> None:
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
    with it. between: the step boundary of the teacher-forced batches (`grom.turns`; the
    model is unedited here). lower: the states below an edit that the Edited row's
    decodings kept (`grom.eval.prefix.LowerStates`): an answer read there runs only the
    layers from the edit's first changed one (the unedited model's too below it)."""
    for i, (key, row) in enumerate(rows.items()):
        if i:
            give(between)
        frames = {n: df for n, df in row.examples.items() if n in KNOWLEDGE_SETS}
        unjudged = {n: df for n, df in frames.items() if "answer_class" not in df}
        mine = lower if key == EDITED else None  # the other rows' numbers never depend on an edit beside them
        if unjudged:
            _judge_row(model, tokenizer, unjudged, fmt, batch_size, needed=True, between=between, lower=mine)
        if stage == "full" and frames:
            give(between)
            _judge_row(model, tokenizer, frames, fmt, batch_size, needed=False, between=between, lower=mine)
        forget = row.examples.get("forget")
        if stage == "full" and forget is not None and len(forget) and "answer_perplexity" in forget:
            row.metrics["Forget answer perplexity"] = M.perplexity(np.log(forget["answer_perplexity"].to_numpy()))


def _judged(name: str, fact_recall: float) -> bool:
    """Whether an answer gets a perplexity: every forget answer, and any other that does
    not state its fact."""
    return name == "forget" or fact_recall != 1.0


def _judge_row(model, tokenizer, frames: dict[str, pd.DataFrame], fmt, batch_size: int, needed: bool,
               between: Between | None = None, lower: LowerStates | None = None) -> None:
    """One pass of `_judge_answers` over a row's frames: `needed`, the answers whose class
    waits for their perplexity, then every frame's classes; else the judged answers whose
    perplexity is still missing (NaN). An answer the unedited model judged before, for an
    earlier edit of the band (`lower`'s `grom.eval.prefix.Recall`), keeps that perplexity."""
    ppl, where, pairs, recalled = {}, [], [], False
    memo = lower.recall if lower is not None and lower.layer else None
    for name, df in frames.items():
        ppl[name] = df["answer_perplexity"].to_numpy(dtype=float, copy=True) if "answer_perplexity" in df \
            else np.full(len(df), np.nan)
        cut = df["cut"].to_numpy(dtype=bool) if "cut" in df else np.zeros(len(df), dtype=bool)
        for i, (q, g, fr) in enumerate(zip(df["question"], df["generation"], df["fact_recall"])):
            if not _judged(name, fr) or not np.isnan(ppl[name][i]) or cut[i]:
                continue
            if needed == (fr != 1.0 and not M.is_degenerate(g) and not M.is_refusal(g)):
                pair = (q, g if g.strip() else ".")
                if memo is not None and (known := memo.judge((repr(fmt), *pair))) is not None:
                    ppl[name][i], recalled = known, True  # the same answer an earlier edit gave: the same perplexity
                    continue
                pairs.append(pair)
                where.append((name, i))
    scores = score_answers(model, tokenizer, pairs, prompt_format=fmt, batch_size=batch_size,
                           between=between, share_opening=True, lower=lower) if pairs else []
    for (name, i), s, pair in zip(where, scores, pairs):
        ppl[name][i] = float(np.exp(s.avg_loss))
        if memo is not None:
            memo.judge((repr(fmt), *pair), ppl[name][i])
    for name, df in frames.items():
        if needed or where or recalled or "answer_perplexity" not in df:
            df["answer_perplexity"] = ppl[name]
        if needed:  # an answer cut short (a first verdict's, column "cut") is classed once read in full
            cut = df["cut"].to_numpy(dtype=bool) if "cut" in df else np.zeros(len(df), dtype=bool)
            df["answer_class"] = [PENDING if c else M.answer_class(f, g, None if np.isnan(x) else x)
                                  for f, g, x, c in zip(df["fact"], df["generation"], ppl[name], cut)]


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
    quant_sets=tuple(KNOWLEDGE_SETS), recipe="tofu", stages=("answers", "forget"), record=_record,
    benchmarks=(BenchmarkSpec("real-knowledge", load_knowledge, SPLITS,
                              options=("prompt_format", "known_only"), bundled=True,
                              label="Real knowledge: famous facts (bundled)",
                              description="facts a small chat model knows, by subject: forget one, keep the rest "
                                          "(offline)",
                              preset="smollm2", known_to=(REAL_MODEL,)),),
    sources={
        "truth ratio closeness": upstream("memorization.truth_ratio, closer_to_1_better",
                                          "on the real-knowledge benchmark: the answer against its bundled wrong "
                                          "answers"),
        "paraphrase recall": ours("fact recall on the question in other words"),
        "facts known": ours("how many facts the unedited model stated"),
        "answer perplexity": ours("the unedited model's perplexity of the new answers"),
        "clean forgetting": ours("refusal + fluent other"),
        "Knowledge score": ours("knowledge_score: harmonic mean of clean forgetting and kept facts"),
        "Text perplexity": ours("perplexity of neutral texts")},
    directions={"Knowledge score": "up", "Kept fact recall": "up", "Forget paraphrase recall": "down",
                "Forget answer perplexity": "down", "Text perplexity": "keep", "Forget clean forgetting": "up",
                "Forget truth ratio closeness": "up", "Probe truth ratio closeness": "up"}))
