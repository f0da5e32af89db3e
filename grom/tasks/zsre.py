"""zsRE, one file: the benchmark's loader, then its task (the loader was grom/data/zsre.py).

zsRE in the MEND/ROME evaluation format (`zsre_mend_eval.json`), split as the GROM
paper does: 50 facts to forget, 1,000 other facts to retain, one sample per seed
(the paper averages 10 seeds).

The file is a JSON list of objects (as read by ROME/MEMIT's `dsets/zsre.py`):

    subject    "Watts Humphrey"
    src        "What university did Watts Humphrey attend?"   (mentions the subject)
    answers    ["Illinois Institute of Technology"]            (the true answer first)
    rephrase   a paraphrase of src
    loc        "nq question: who played desmond doss father in hacksaw ridge"
    loc_ans    "Hugo Weaving"
    pred, alt, cond                                            (editing fields, unused)

Each record becomes `FactRecord(subject, prompt=src, answer=answers[0], rephrase,
neighborhood_prompt, neighborhood_answer=loc_ans)`. The neighbourhood prompt is built as
ROME builds it: `loc + "?"`, keeping the "nq question: " prefix.

Splits `forget50-seed0` ... `forget50-seed9` (`forget50` is seed 0): a seeded draw of
`N_FORGET` forget facts and `N_RETAIN` retain facts, disjoint. The forget set is the
forget facts (subject_last keys); the retain set is the retain facts' own prompts and
answers, `QAExample(question=src, answer=" " + answer)` (the answer carries the
separating space, as ROME tokenizes " " + the answer), read with the bare `RAW_TEXT`
format. Evaluation uses the forget facts only: efficacy on their prompts, generalisation
on their paraphrases, specificity on their neighbourhood prompts. No retain prompt is
any of those texts, so no metric measures what the edit was fitted to keep.

There is no Hub dataset: `source` is the JSON file or a folder holding it.

The zsRE task ("zsre"): efficacy, generalisation and specificity (token accuracy of the
original answer on the fact's prompt, its rephrasing and a neighbouring prompt). The
benchmark "zsre" (a local file).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import RAW_TEXT, PromptFormat
from grom.data.readers import BenchmarkError, PathLike, Record, read_rows, require_rows, resolve_source
from grom.data.schema import Benchmark, FactRecord, QAExample
from grom.eval import metrics as M
from grom.eval.metric_sources import MEMIT, MetricSource
from grom.eval.results import Row
from grom.eval.runner import ModelScorer
from grom.eval.tasks import QuantMetrics, Task, register_task

logger = logging.getLogger(__name__)

FILE_NAME = "zsre_mend_eval.json"
DATA_URL = "https://memit.baulab.info/data/dsets/zsre_mend_eval.json"  # MEMIT REMOTE_ROOT_URL
N_FORGET, N_RETAIN = 50, 1000  # the paper's protocol
SEEDS = tuple(range(10))  # the paper averages over 10 draws
SPLITS = tuple(f"forget{N_FORGET}-seed{s}" for s in SEEDS)
ALIASES = {f"forget{N_FORGET}": SPLITS[0]}


def neighborhood_prompt(loc: str) -> str:
    """ROME's neighbourhood prompt: the NQ question with a question mark."""
    return loc if loc.endswith("?") else loc + "?"


def fact_record(rec: Record, id: str) -> FactRecord | None:
    """A zsRE record as a FactRecord; None (skipped) if the subject is not in the prompt."""
    subject, src = rec.text("subject"), rec.text("src")
    if subject not in src:
        logger.warning("%s: subject %r does not occur in src %r; record skipped", rec.where, subject, src)
        return None
    return FactRecord(
        subject=subject,
        prompt=src,
        answer=rec.texts("answers")[0],
        rephrase=rec.text("rephrase", optional=True),
        neighborhood_prompt=neighborhood_prompt(rec.text("loc")),
        neighborhood_answer=rec.text("loc_ans"),
        id=id,
    )


def eval_texts(fact: FactRecord) -> set[str]:
    """The prompts a forget fact is evaluated on: prompt, paraphrase, neighbourhood prompt."""
    return {t for t in (fact.prompt, fact.rephrase, fact.neighborhood_prompt) if t}


def retain_example(fact: FactRecord) -> QAExample:
    """A retain fact as the QA pair its keys come from (answer positions after the prompt)."""
    return QAExample(question=fact.prompt, answer=" " + fact.answer, subject=fact.subject,
                     id=f"{fact.id}/retain")


def sample_facts(facts: Sequence[FactRecord], n_forget: int, n_retain: int,
                 seed: int) -> tuple[tuple[FactRecord, ...], tuple[FactRecord, ...]]:
    """(forget, retain): a seeded draw of n_forget facts, then n_retain other facts whose
    prompt is none of the forget facts' evaluation texts (`eval_texts`) and which are not
    a forget fact again (same prompt and answer). The permutation is numpy's legacy
    `RandomState(seed)`, whose stream numpy keeps fixed, so a seed means one sample on
    every machine. Too few facts: a BenchmarkError saying how many there are.
    """
    need = n_forget + n_retain
    if len(facts) < need:
        raise BenchmarkError(f"{len(facts)} usable facts; the split needs {need}: {n_forget} to "
                             f"forget and {n_retain} other facts to retain")
    order = np.random.RandomState(seed).permutation(len(facts))
    forget = tuple(facts[i] for i in order[:n_forget])
    banned = set().union(*map(eval_texts, forget))
    pairs = {(f.prompt, f.answer) for f in forget}
    retain = []
    for i in order[n_forget:]:
        if len(retain) == n_retain:
            break
        if facts[i].prompt not in banned and (facts[i].prompt, facts[i].answer) not in pairs:
            retain.append(facts[i])
    if len(retain) < n_retain:
        raise BenchmarkError(f"only {len(retain)} of the {len(facts) - n_forget} other facts do not "
                             f"repeat a forget fact's prompt, paraphrase or neighbourhood prompt; "
                             f"the split needs {n_retain} to retain")
    return forget, tuple(retain)


def seed_of(split: str) -> int:
    """The seed of a split name (`forget50-seed3` -> 3; `forget50` -> 0)."""
    split = ALIASES.get(split, split)
    if split not in SPLITS:
        raise BenchmarkError(f"zsre: unknown split {split!r}; valid splits: "
                             f"{', '.join([*SPLITS, *ALIASES])}")
    return int(split.rsplit("seed", 1)[1])


def _file(source: PathLike | None) -> Path:
    if source is None:
        raise BenchmarkError(
            f"zsre: there is no Hub dataset for zsRE here; give source= the path of {FILE_NAME} "
            f"(the ROME/MEMIT data, {DATA_URL}) or a folder holding it"
        )
    path = resolve_source(source, "zsre")
    if path.is_dir():
        path = path / FILE_NAME
        if not path.is_file():
            raise BenchmarkError(f"zsre: the folder {path.parent} holds no {FILE_NAME}")
    return path


def read_facts(path: Path) -> tuple[FactRecord, ...]:
    """Every usable record of the file (subject in its prompt), ids `zsre/<row index>`."""
    rows = read_rows(path)
    require_rows(rows, f"zsre ({path})")
    facts = tuple(f for f in (fact_record(r, f"zsre/{i}") for i, r in enumerate(rows)) if f is not None)
    require_rows(facts, f"zsre ({path}): records whose subject occurs in the prompt")
    return facts


def load_zsre(split: str = SPLITS[0], source: PathLike | None = None, *,
              prompt_format: PromptFormat | None = None) -> Benchmark:
    """The paper's zsRE protocol for one seed: N_FORGET facts to forget, N_RETAIN disjoint
    facts to retain; evaluation sets from the forget facts only."""
    seed, path = seed_of(split), _file(source)
    facts = read_facts(path)
    try:
        forget, retain_facts = sample_facts(facts, N_FORGET, N_RETAIN, seed)
    except BenchmarkError as e:
        raise BenchmarkError(f"zsre ({path}), split {split}: {e}. Use the full {FILE_NAME} "
                             f"({DATA_URL}).") from None
    neighbours = tuple(QAExample(question=f.neighborhood_prompt, answer=" " + f.neighborhood_answer,
                                 id=f"{f.id}/loc") for f in forget)
    return Benchmark(
        name="zsre",
        split=ALIASES.get(split, split),
        forget=forget,
        retain=tuple(retain_example(f) for f in retain_facts),
        eval_sets={"forget": forget, "neighborhood": neighbours},
        prompt_format=prompt_format or RAW_TEXT,
        task="zsre",
        description=(
            f"zsRE ({path.name}), the paper's protocol, seed {seed}: {N_FORGET} facts to forget "
            f"and {N_RETAIN} other facts to retain (their own prompts and answers), drawn "
            f"disjointly from {len(facts)} records. Efficacy and generalisation are measured on "
            "the forget facts' prompts and paraphrases, specificity on their neighbourhood "
            "prompts ('nq question: ...?'), none of which is in the retain set."
        ),
    )


def _token_acc(run: ModelScorer, pairs) -> np.ndarray:
    scores = run.losses(pairs, fmt=RAW_TEXT, add_eos=False)
    return np.array([M.token_accuracy(s.predicted, s.labels) for s in scores])


def _zsre_answer(prompt: str, answer: str) -> str:
    return answer if prompt[-1:].isspace() or answer[:1].isspace() else " " + answer


def _zsre_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    row = Row()
    recs = [r for r in sets.get("forget", ()) if isinstance(r, FactRecord)]
    if recs:
        eff = _token_acc(run, [(r.prompt, _zsre_answer(r.prompt, r.answer)) for r in recs])
        df = pd.DataFrame({"question": [r.prompt for r in recs], "answer": [r.answer for r in recs],
                           "efficacy": eff})
        row.metrics["Efficacy"] = float(eff.mean())
        para = [r for r in recs if r.rephrase]
        if para:
            gen = _token_acc(run, [(r.rephrase, _zsre_answer(r.rephrase, r.answer)) for r in para])
            row.metrics["Generalisation"] = float(gen.mean())
        if not only_forget:
            loc = [r for r in recs if r.neighborhood_prompt and r.neighborhood_answer]
            if loc:
                spec = _token_acc(run, [(r.neighborhood_prompt,
                                         _zsre_answer(r.neighborhood_prompt, r.neighborhood_answer))
                                        for r in loc])
                row.metrics["Specificity"] = float(spec.mean())
        row.examples["forget"] = df
    return row


TASK = register_task(Task(
    "zsre", _zsre_row, retain_metrics=("Specificity",), headline=None, recipe="tofu",
    benchmarks=(BenchmarkSpec("zsre", load_zsre, SPLITS, aliases=ALIASES,
                              label="zsRE (local file)",
                              description=f"zsRE facts from a local {FILE_NAME}: {N_FORGET} to "
                                          f"forget, {N_RETAIN} to retain, one draw per seed split",
                              preset="zsre"),),
    quant=QuantMetrics(("Efficacy",), ("Specificity",)),
    sources={
        "Efficacy": MetricSource(MEMIT, "rewrite_prompts_correct: the answer's token accuracy on its prompt"),
        "Generalisation": MetricSource(MEMIT, "paraphrase_prompts_correct: the same on a rephrased prompt"),
        "Specificity": MetricSource(MEMIT, "neighborhood_prompts_correct: a neighbour's answer, kept")},
    directions={"Efficacy": "down", "Generalisation": "down"}))
