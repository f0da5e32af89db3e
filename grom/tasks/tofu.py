"""TOFU, one file: the benchmark's loader, then its task (the loader was grom/data/tofu.py).

TOFU (Maini et al. 2024): question/answer pairs about 200 fictitious authors.

Hub: `locuslab/TOFU`, one config per file at the repository root, each with a single
split "train"; the files are JSON lines despite their `.json` names. A local `source`
folder holds the same files (`forget10.json`, `retain90.json`, ...; .jsonl, .csv and
.parquet are read too):

    forget01 / forget05 / forget10      question, answer
    retain99 / retain95 / retain90      question, answer (the complement of each forget split)
    forgetXX_perturbed                  + paraphrased_answer, perturbed_answer (5 wrong answers),
                                          paraphrased_question (in newer versions)
    retain_perturbed                    400 retain pairs with the same fields
    real_authors_perturbed,             question, answer, perturbed_answer (the other options)
    world_facts_perturbed
    holdout01 / holdout05 / holdout10   question, answer (authors never trained on)

Field names follow OpenUnlearning's `configs/data/datasets/TOFU_*.yaml`.

Subjects (for the locate-then-edit editors, which need (subject, relation, object) facts;
TOFU has no name field): TOFU holds 20 questions per author, in order, and each forget
split is whole authors (forget01 is 2 authors, forget05 10, forget10 20). Each block of 20
forget rows gets its author's name, found in the block's own text (`author_of_block`: the
run of capitalised words that the most rows of the block write, in a question or an
answer). A row's subject is the longest part of that name its question writes (most write
it whole, some only the surname), else the whole name: that row then keys on the
question's last token, as the real-knowledge rows do, and the editors say how many did
(`Edit.info["subject_last_keys"]`, in the baseline summary). A block where no name stands
out keeps no subject, and the editors then say which row lacks one.

Prompts: by default `TOFU_CHAT`, OpenUnlearning's TOFU inputs as its main branch builds them
from commit 8df2914 (2025-04-24) to the December 2025 head d3d7cf9, the version its released
retain-model logs and the papers' tables come from: the model's chat template with the system
prompt "You are a helpful assistant." and the fixed date "10 Apr 2025" (never today's), BOS
once, prompt + answer tokenised as one string and split at the prompt's length
(`grom.data.prompts.encode_qa`). Models without a chat template get the plain template. Locally only
the forget and retain files are required; missing evaluation files are skipped.

The TOFU task ("tofu": TOFU and the bundled demo world): per QA set (forget, retain,
real_authors, world_facts) ROUGE-L recall of greedy answers, fact recall where facts exist,
answer probability (normalised among the options on real_authors / world_facts), truth
ratio, extraction strength and exact memorization (forget, OpenUnlearning's: EOS not
scored); model utility (harmonic mean of the 9 retain, Real Authors, World Facts values);
forget quality (KS test against the reference model's forget truth ratios); MIA AUC
(Min-40% on forget against holdout) and privacy leakage (relative to the reference), with
the AUCs of the LOSS, zlib, Min-K++ and Reference attacks (`MIA_COLUMNS`, the same forward
passes); the paper's Final Score; the same per-set metrics with the paraphrased questions
asked ("Forget para-Q ..."), as OpenUnlearning's ``question_key: paraphrased_question``.
Answers: greedy, up to 200 new tokens. The benchmark "tofu" (Hub or a local folder).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import TOFU_CHAT, PromptFormat
from grom.data.readers import PathLike, Record, load_hub_rows, read_local, require_rows, resolve_source
from grom.data.schema import Benchmark, QAExample
from grom.eval import metrics as M
from grom.eval.metric_sources import upstream
from grom.eval.results import REFERENCE, Row
from grom.eval.runner import ModelScorer
from grom.eval.shared_rows import attack_aucs, attack_raw, qa_prompts, qa_set, reference_attack
from grom.eval.tasks import Task, register_task

logger = logging.getLogger(__name__)

HUB_ID = "locuslab/TOFU"
SPLITS = ("forget01", "forget05", "forget10")
RETAIN_OF = {"forget01": "retain99", "forget05": "retain95", "forget10": "retain90"}
EVAL_FILES = {  # eval set name -> file (config) name; "{pct}" is 01, 05 or 10
    "forget": "forget{pct}_perturbed",
    "retain": "retain_perturbed",
    "real_authors": "real_authors_perturbed",
    "world_facts": "world_facts_perturbed",
    "holdout": "holdout{pct}",
}


def qa_example(rec: Record, id: str) -> QAExample:
    """A TOFU row as a QAExample (the variant fields are optional)."""
    return QAExample(
        question=rec.text("question"),
        answer=rec.text("answer"),
        paraphrased_question=rec.text("paraphrased_question", optional=True),
        paraphrased_answer=rec.text("paraphrased_answer", optional=True),
        perturbed_answers=rec.texts("perturbed_answer", optional=True),
        id=id,
    )


def _read(folder: Path | None, config: str, *, required: bool) -> list[Record] | None:
    if folder is None:
        return load_hub_rows(HUB_ID, config, "train")
    return read_local(folder, [config], f"TOFU {config}", required=required)


def _examples(folder: Path | None, config: str, *, required: bool = True):
    rows = _read(folder, config, required=required)
    if rows is None:
        return None
    require_rows(rows, f"TOFU {config}")
    return tuple(qa_example(r, f"tofu/{config}/{i}") for i, r in enumerate(rows))


def enrich(pairs: Sequence[QAExample], richer: Sequence[QAExample] | None) -> tuple[QAExample, ...]:
    """`pairs` with the paraphrase/perturbation fields of the `richer` pair of the same
    question and answer (the forgetXX_perturbed rows), where there is one."""
    by_pair = {(r.question, r.answer): r for r in richer or ()}
    out = []
    for ex in pairs:
        match = by_pair.get((ex.question, ex.answer))
        if match is not None:
            ex = dataclasses.replace(
                ex,
                paraphrased_question=match.paraphrased_question,
                paraphrased_answer=match.paraphrased_answer,
                perturbed_answers=match.perturbed_answers,
            )
        out.append(ex)
    return tuple(out)


AUTHOR_BLOCK = 20  # TOFU's questions per author (200 authors, 4,000 pairs)
NAME_PARTICLES = frozenset({"al", "bin", "ibn", "de", "del", "der", "di", "da", "dos", "du", "el", "la", "le",
                            "van", "von", "y"})
_EDGE = re.compile(r"^[^\w]+|(?:['\u2019]s)?[^\w]*$")


def _words(text: str) -> list[str]:
    """The words of `text` without surrounding punctuation or a possessive 's."""
    return [w for w in (_EDGE.sub("", t) for t in text.split()) if w]


_CLAUSE = re.compile(r"[,.;:!?()\"\u201c\u201d]+(?:\s|$)")


def _name_runs(text: str) -> set[str]:
    """Every run of two or more capitalised words in `text` within a clause (particles
    such as "de" or "bin" allowed inside a run), and every contiguous part of such a run of
    two or more words: the candidates for an author's name."""
    runs = []
    for clause in _CLAUSE.split(text):
        words, run = _words(clause), []
        for i, w in enumerate(words):
            after = next((v for v in words[i + 1:] if v.lower() not in NAME_PARTICLES), "")
            inner = w.lower() in NAME_PARTICLES and run and after[:1].isupper()
            if w[:1].isupper() or inner:
                run.append(w)
            else:
                runs.append(run)
                run = []
        runs.append(run)
    out = set()
    for r in runs:
        for a in range(len(r)):
            for b in range(a + 2, len(r) + 1):
                if r[a].lower() not in NAME_PARTICLES and r[b - 1].lower() not in NAME_PARTICLES:
                    out.add(" ".join(r[a:b]))
    return out


def author_of_block(rows: Sequence[QAExample], min_rows: int = 5, share: float = 0.5) -> str | None:
    """The author a block of TOFU rows is about: of the candidate names (`_name_runs`) that
    at least `share` as many rows write (question or answer) as the most written one, the
    longest, so "Basil Mahfouz Al-Kuwaiti" rather than its part "Basil Mahfouz", which every
    row writing the whole name writes too, and a few rows more that shorten it; None where
    the most written is in fewer than `min_rows` rows."""
    counts = Counter(c for ex in rows for c in _name_runs(ex.question) | _name_runs(ex.answer))
    top = max(counts.values(), default=0)
    if top < min_rows:
        return None
    near = [c for c, n in counts.items() if n >= max(min_rows, share * top)]
    return max(near, key=lambda c: (len(c.split()), counts[c], len(c)))


def subject_in(question: str, name: str) -> str:
    """The longest contiguous part of `name` (whole words, particles not at its ends) that
    `question` writes as whole words, else `name` itself."""
    words = name.split()
    for size in range(len(words), 0, -1):
        for a in range(len(words) - size + 1):
            part = words[a:a + size]
            if part[0].lower() in NAME_PARTICLES or part[-1].lower() in NAME_PARTICLES:
                continue
            phrase = " ".join(part)
            if re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", question):
                return phrase
    return name


def with_authors(rows: Sequence[QAExample], block: int = AUTHOR_BLOCK) -> tuple[QAExample, ...]:
    """`rows` (a TOFU forget split, whole authors in order) with each row's subject (module
    docstring); unchanged where the rows are not whole blocks of `block` or a row has a
    subject already."""
    rows = tuple(rows)
    if not rows or len(rows) % block or any(ex.subject for ex in rows):
        return rows
    out = []
    for a in range(0, len(rows), block):
        name = author_of_block(rows[a:a + block])
        out.extend(ex if name is None else dataclasses.replace(ex, subject=subject_in(ex.question, name))
                   for ex in rows[a:a + block])
    return tuple(out)


def load_tofu(split: str, source: PathLike | None = None, *,
              prompt_format: PromptFormat | None = None) -> Benchmark:
    """TOFU forget split `split` ("forget01", "forget05" or "forget10").

    forget: the forget pairs (with the perturbed file's variants); retain: the complement
    retain split; eval_sets: "forget", "retain", "real_authors", "world_facts", "holdout".
    prompt_format: how questions become prompts (default `TOFU_CHAT`, OpenUnlearning's
    pinned Llama-3 arguments; `LLAMA2_INST` for its Llama-2-7b-chat model).
    """
    folder = resolve_source(source, "tofu")
    pct = split[-2:]
    forget = _examples(folder, split)
    retain = _examples(folder, RETAIN_OF[split])
    eval_sets = {}
    for name, config in EVAL_FILES.items():
        examples = _examples(folder, config.format(pct=pct), required=False)
        if examples is not None:
            eval_sets[name] = examples
    forget = with_authors(enrich(forget, eval_sets.get("forget")))
    if "forget" in eval_sets:
        eval_sets["forget"] = with_authors(eval_sets["forget"])
    eval_sets.setdefault("forget", forget)
    where = f"the local folder {folder}" if folder else f"the Hub ({HUB_ID})"
    return Benchmark(
        name="tofu",
        split=split,
        forget=forget,
        retain=retain,
        eval_sets=eval_sets,
        prompt_format=prompt_format or TOFU_CHAT,
        task="tofu",
        description=(
            f"TOFU {split}: {len(forget)} forget pairs, {len(retain)} retain pairs "
            f"({RETAIN_OF[split]}), from {where}; eval sets: {', '.join(eval_sets)}."
        ),
    )


TOFU_SETS = {"forget": "Forget", "retain": "Retain", "real_authors": "Real authors",
             "world_facts": "World facts"}
TOFU_NEW_TOKENS = 200
"""TOFU answers: greedy, up to 200 new tokens, stopped at EOS, as OpenUnlearning generates
them (configs/generation/default.yaml, commit d3d7cf9), so ROUGE-L reads the same text."""
PARA_Q = "para-Q"  # the metric names of the paraphrased-question evaluation: "Forget para-Q ROUGE-L"


def _tofu_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    row = Row()
    utility = []
    asked = [(sets[n], False) for n in _plain_sets(sets, only_forget)]
    asked += [(sets[n], True) for n in _paraphrased_sets(sets, only_forget)]
    run.answer_ahead([(*qa_prompts(ex, para), None, TOFU_NEW_TOKENS) for ex, para in asked])
    for name in _plain_sets(sets, only_forget):
        label = TOFU_SETS[name]
        vals, df, raw = qa_set(run, sets[name], name, options=name in ("real_authors", "world_facts"),
                                budget=TOFU_NEW_TOKENS)
        row.examples[name] = df
        for k, v in raw.items():
            row.raw[f"{name}/{k}"] = v
        for k, v in vals.items():
            row.metrics[f"{label} {k}"] = v
        if name != "forget":
            utility += [vals["prob"], vals["ROUGE-L"]] + ([vals["truth ratio"]] if "truth ratio" in vals else [])
    if utility:
        row.metrics["Model utility"] = M.model_utility(np.clip(utility, 0, None))
    _tofu_paraphrased(run, sets, row, only_forget)
    if "holdout" in sets and "forget/min_k" in row.raw:
        hold = run.losses([(ex.question, ex.answer) for ex in sets["holdout"]], moments=True)
        row.raw.update({f"holdout/{k}": v for k, v in attack_raw(run, hold).items()})
        attack_aucs(row)
    m = row.metrics
    if "Model utility" in m and "Forget ES" in m:
        m["Final score"] = M.tofu_final_score(m["Model utility"], m["Forget ROUGE-L"],
                                              min(1.0, m["Forget prob"]), m["Forget ES"])
    return row


def _tofu_paraphrased(run: ModelScorer, sets: dict[str, tuple], row: Row, only_forget: bool) -> None:
    """TOFU's paraphrased-question evaluation of the forget and retain sets, where every
    pair has a `paraphrased_question` (TOFU's newer files, the bundled world): the same
    metrics with the paraphrase asked, as "Forget para-Q ROUGE-L", "Retain para-Q prob" ...
    and per-example frames "forget_paraphrased" ... OpenUnlearning runs it as a second
    evaluation (``question_key: paraphrased_question``); here it sits beside the first.
    Model utility stays that of the original questions, as in OpenUnlearning's default."""
    for name in _paraphrased_sets(sets, only_forget):
        ex = sets[name]
        vals, df, raw = qa_set(run, ex, name, options=False, paraphrased=True, budget=TOFU_NEW_TOKENS)
        row.examples[f"{name}_paraphrased"] = df
        for k, v in raw.items():
            row.raw[f"{name}_paraphrased/{k}"] = v
        for k, v in vals.items():
            row.metrics[f"{TOFU_SETS[name]} {PARA_Q} {k}"] = v


def _plain_sets(sets: dict[str, tuple], only_forget: bool) -> list[str]:
    """The TOFU sets a row asks with their own questions (only forget in the forget stage)."""
    return [n for n in TOFU_SETS if n in sets and not (only_forget and n != "forget")]


def _paraphrased_sets(sets: dict[str, tuple], only_forget: bool) -> list[str]:
    """The sets the paraphrased-question evaluation asks: forget and retain, where each pair
    has a paraphrased question (and only forget in the forget stage)."""
    return [n for n in ("forget", "retain") if sets.get(n) and not (only_forget and n != "forget")
            and all(e.paraphrased_question for e in sets[n])]


def _tofu_relative(rows: dict[str, Row]) -> None:
    """Forget quality of each row against the reference row; privacy leakage against the
    reference's Min-K AUC, or 0.5 without one (OpenUnlearning's tofu privleak ``ref_value``,
    as grom.tasks.muse `_muse_relative`)."""
    reference_attack(rows)
    ref = rows.get(REFERENCE)
    ref_auc = ref.metrics.get("MIA AUC", 0.5) if ref is not None else 0.5
    for row in rows.values():
        if "MIA AUC" in row.metrics:
            row.metrics["Privacy leakage"] = M.privacy_leakage(row.metrics["MIA AUC"], ref_auc)
    if ref is None or "forget/truth_ratio" not in ref.raw:
        return
    for row in rows.values():
        if "forget/truth_ratio" in row.raw:
            row.metrics["Forget quality"] = M.forget_quality(row.raw["forget/truth_ratio"],
                                                             ref.raw["forget/truth_ratio"])
        para = "forget_paraphrased/truth_ratio"
        if para in row.raw and para in ref.raw:
            row.metrics[f"Forget {PARA_Q} quality"] = M.forget_quality(row.raw[para], ref.raw[para])


TASK = register_task(Task(
    "tofu", _tofu_row, retain_metrics=("Model utility", "Retain fact recall"), headline="Final score",
    relative=_tofu_relative, recipe="tofu",
    benchmarks=(BenchmarkSpec("tofu", load_tofu, SPLITS, label="TOFU (Hub or local)",
                              hub_id=HUB_ID,
                              description=f"TOFU fictitious authors (Hub {HUB_ID})", preset="tofu10"),),
    sources={
        "Model utility": upstream("utility.hm_aggregate of the retain, Real authors and World facts values"),
        "Forget quality": upstream("privacy.ks_test on the forget truth ratios against the retain model's"),
        "para-Q quality": upstream("privacy.ks_test on the paraphrased questions' forget truth ratios")},
    directions={"Forget quality": "up", "Model utility": "up", f"Forget {PARA_Q} quality": "up"}))
