"""MUSE, one file: the benchmark's loader, then its task (the loader was grom/data/muse.py).

MUSE (Shi et al. 2024): unlearning news articles (MUSE-News) or Harry Potter books
(MUSE-Books).

Hub: `muse-bench/MUSE-News`, `muse-bench/MUSE-Books`, parquet files `<config>/<split>-*`:

    raw       forget, retain1, retain2, holdout     text
    verbmem   forget                                prompt, gt (the true continuation)
    knowmem   forget_qa, retain_qa,                 question, answer
              forget_qa_icl, retain_qa_icl          (few-shot examples for the QA prompts)
    privleak  forget, retain, holdout               text

Older revisions named the knowmem/privleak retain splits "retain2_qa" / "retain2"; local
folders may use either name. A local `source` folder mirrors the Hub layout, e.g.
`raw/forget.jsonl` or `raw/forget-00000-of-00001.parquet` (a Hub snapshot works as is);
only `raw/forget` and `raw/retain1` are required.

forget = raw forget texts, retain = raw retain1 texts (as OpenUnlearning's MUSE_retain);
both are `TextExample`s (corpus keys). Evaluation sets:

- "verbmem_forget": `QAExample(question=prompt, answer=" " + gt)`: prompt + answer is
  the text OpenUnlearning scores (it always inserts that space, `insert_space: True`,
  even before a gt that starts with whitespace);
- "knowmem_forget", "knowmem_retain" and their few-shot sets "knowmem_forget_icl",
  "knowmem_retain_icl": QA pairs, asked after the whole few-shot set in OpenUnlearning's
  "Question: ...\\nAnswer: " prompt (`grom.eval.upstream.knowmem_prompt`);
- "privleak_forget", "privleak_retain", "privleak_holdout": `TextExample`s.

The MUSE task ("muse"): VerbMem (ROUGE-L F1 of the continuation), KnowMem on forget and
retain QA (few-shot, ROUGE-L F1), extraction strength on the VerbMem items, MIA AUC and
PrivLeak, the other attacks' AUCs, the Final Score; inputs, references, budgets and stop
strings as OpenUnlearning's (`grom.eval.upstream`). The benchmarks "muse-news" and
"muse-books".
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import PLAIN_QA, PromptFormat
from grom.data.readers import PathLike, Record, load_hub_rows, read_local, require_rows, resolve_source
from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval import metrics as M
from grom.eval import mia
from grom.eval import upstream as U
from grom.eval.metric_sources import upstream
from grom.eval.results import REFERENCE, Row
from grom.eval.runner import ModelScorer, generate_ids, score_sequences
from grom.eval.shared_rows import attack_aucs, reference_attack
from grom.eval.tasks import QuantMetrics, Task, register_task

logger = logging.getLogger(__name__)

HUB_IDS = {"news": "muse-bench/MUSE-News", "books": "muse-bench/MUSE-Books"}
SPLITS = ("forget",)
# eval set -> (config, split names: the Hub's first, then older local names, kind)
EVAL_TABLES = {
    "verbmem_forget": ("verbmem", ("forget",), "verbmem"),
    "knowmem_forget": ("knowmem", ("forget_qa",), "qa"),
    "knowmem_retain": ("knowmem", ("retain_qa", "retain2_qa"), "qa"),
    "knowmem_forget_icl": ("knowmem", ("forget_qa_icl",), "qa"),
    "knowmem_retain_icl": ("knowmem", ("retain_qa_icl", "retain2_qa_icl"), "qa"),
    "privleak_forget": ("privleak", ("forget",), "text"),
    "privleak_retain": ("privleak", ("retain", "retain2"), "text"),
    "privleak_holdout": ("privleak", ("holdout",), "text"),
}


def _read(corpus: str, folder: Path | None, config: str, splits: tuple[str, ...], *, required: bool):
    if folder is None:
        return load_hub_rows(HUB_IDS[corpus], config, splits[0])
    stems = [f"{config}/{s}" for s in splits]
    return read_local(folder, stems, f"MUSE-{corpus} {config}/{splits[0]}", required=required)


def _example(rec: Record, kind: str, id: str):
    if kind == "text":
        return TextExample(text=rec.text("text"), id=id)
    if kind == "qa":
        return QAExample(question=rec.text("question"), answer=rec.text("answer"), id=id)
    # OpenUnlearning's CompletionDataset (insert_space: True) always joins prompt + " " + gt
    return QAExample(question=rec.text("prompt"), answer=" " + rec.text("gt"), id=id)


def _examples(corpus, folder, config, splits, kind, *, required=True):
    rows = _read(corpus, folder, config, splits, required=required)
    if rows is None:
        return None
    what = f"MUSE-{corpus} {config}/{splits[0]}"
    require_rows(rows, what)
    return tuple(_example(r, kind, f"muse-{corpus}/{config}/{splits[0]}/{i}") for i, r in enumerate(rows))


def load_muse(corpus: str, split: str = "forget", source: PathLike | None = None, *,
              prompt_format: PromptFormat | None = None) -> Benchmark:
    """MUSE-News (`corpus="news"`) or MUSE-Books (`"books"`); the one split is "forget".

    prompt_format: the format of the knowmem questions (default `PLAIN_QA`).
    """
    folder = resolve_source(source, f"muse-{corpus}")
    forget = _examples(corpus, folder, "raw", ("forget",), "text")
    retain = _examples(corpus, folder, "raw", ("retain1",), "text")
    eval_sets = {}
    for name, (config, splits, kind) in EVAL_TABLES.items():
        examples = _examples(corpus, folder, config, splits, kind, required=False)
        if examples is not None:
            eval_sets[name] = examples
    where = f"the local folder {folder}" if folder else f"the Hub ({HUB_IDS[corpus]})"
    return Benchmark(
        name=f"muse-{corpus}",
        split=split,
        forget=forget,
        retain=retain,
        eval_sets=eval_sets,
        prompt_format=prompt_format or PLAIN_QA,
        task="muse",
        description=(
            f"MUSE-{corpus.capitalize()}: {len(forget)} forget texts, {len(retain)} retain texts "
            f"(raw retain1), from {where}; eval sets: {', '.join(eval_sets)}. verbmem pairs are "
            "read with the bare RAW_TEXT format (prompt + answer is the original text)."
        ),
    )


def _rouge_frame(inputs, gens: list[str], questions: list[str]) -> tuple[pd.DataFrame, float]:
    """Per-example ROUGE-L F1 of each generation against its upstream reference."""
    refs = [x.reference for x in inputs]
    f1 = np.array([M.rouge_l_f1(r, g) for r, g in zip(refs, gens)])
    return pd.DataFrame({"question": questions, "answer": refs, "generation": gens, "rougeL_f1": f1}), float(f1.mean())


def _long_batch(run: ModelScorer) -> int:
    """Texts of up to 2048 tokens are scored 8 at a time at most (OpenUnlearning's batch
    size for extraction strength and Min-K): the logits of 32 such texts of a 32k-vocab
    model would take 8 GB."""
    return min(run.batch_size, 8)


def _verbmem(run: ModelScorer, ex: tuple, row: Row) -> None:
    """VerbMem (ROUGE-L F1 of 128 greedy new tokens after the prefix, against the true
    continuation's first 2048 tokens) and MUSE's extraction strength on the same items
    (on by default in OpenUnlearning's configs/eval/muse.yaml), as `grom.eval.upstream`
    transcribes them. `max_new_tokens` given to `evaluate` replaces the 128."""
    pairs = [U.verbmem_input(run.tok, e.question, e.answer) for e in ex]
    new = generate_ids(run.model, run.tok, [g.prompt_ids for _, g in pairs],
                       max_new_tokens=run.max_new_tokens or U.VERBMEM_NEW_TOKENS, batch_size=run.batch_size,
                       between=run.between)
    gens = [U.cut_at_stops(U.decode(run.tok, ids), (), U.eos_text(run.tok)) for ids in new]
    df, row.metrics["VerbMem forget"] = _rouge_frame([g for _, g in pairs], gens, [e.question for e in ex])
    scores = score_sequences(run.model, run.tok, [(list(c.ids), c.start) for c, _ in pairs], _long_batch(run),
                             between=run.between)
    df["es"] = [M.extraction_strength(s.predicted, s.labels) for s in scores]  # OpenUnlearning's: last dropped
    row.examples["verbmem_forget"] = df
    row.metrics["Forget ES"] = float(df["es"].mean())


def _knowmem(run: ModelScorer, ex: tuple, icl: tuple) -> tuple[pd.DataFrame, float]:
    """KnowMem: ROUGE-L F1 of 32 greedy new tokens after the few-shot prompt, cut at
    OpenUnlearning's stop strings, against the reference answer (`grom.eval.upstream`)."""
    inputs = [U.knowmem_input(run.tok, icl, e.question, e.answer) for e in ex]
    new = generate_ids(run.model, run.tok, [x.prompt_ids for x in inputs],
                       max_new_tokens=run.max_new_tokens or U.KNOWMEM_NEW_TOKENS, batch_size=run.batch_size,
                       between=run.between)
    gens = [U.cut_at_stops(U.decode(run.tok, ids), U.KNOWMEM_STOPS, U.eos_text(run.tok)) for ids in new]
    return _rouge_frame(inputs, gens, [e.question for e in ex])


def _mia_texts(run: ModelScorer, texts: tuple) -> dict[str, np.ndarray]:
    """Each membership attack's scores of MUSE texts (`grom.eval.mia.attack_scores`) as
    OpenUnlearning's MUSE_MIA reads them: the text's first 2048 tokens after the
    tokenizer's special prefix; Min-K and Min-K++ on all positions but the last. A text with
    no token to score scores 0 (upstream has none)."""
    encs = [U.completion_input(run.tok, "", e.text) for e in texts]
    seqs = [(list(c.ids), c.start) for c in encs if len(c.ids) > c.start]
    scored = score_sequences(run.model, run.tok, seqs, _long_batch(run), True, between=run.between)
    decoded = [run.tok.decode(s.labels.tolist(), skip_special_tokens=True) for s in scored]
    found = mia.attack_scores(scored, decoded) if scored else {}
    keep = np.array([len(c.ids) > c.start for c in encs])
    out = {}
    for attack, values in found.items():
        full = np.zeros(len(encs))
        full[keep] = values
        out[attack] = full
    return out


def _muse_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    """MUSE's metrics as OpenUnlearning's configs/eval/muse.yaml computes them (see
    `grom.eval.upstream`): VerbMem, KnowMem forget / retain, extraction strength, Min-K
    (the MIA AUC behind PrivLeak)."""
    row = Row()
    if "verbmem_forget" in sets:
        _verbmem(run, sets["verbmem_forget"], row)
    for name, label in (("knowmem_forget", "KnowMem forget"), ("knowmem_retain", "KnowMem retain")):
        if name not in sets or (only_forget and name == "knowmem_retain"):
            continue
        row.examples[name], row.metrics[label] = _knowmem(run, sets[name], sets.get(f"{name}_icl", ()))
    if "privleak_forget" in sets and "privleak_holdout" in sets:
        for side in ("forget", "holdout"):
            row.raw.update({f"{side}/{k}": v for k, v in _mia_texts(run, sets[f"privleak_{side}"]).items()})
        attack_aucs(row)
    return row


def _muse_relative(rows: dict[str, Row]) -> None:
    """PrivLeak against the retrained (reference) model (without one: against 0.5, the
    AUC of a model that never saw either set, as OpenUnlearning does), then Final score."""
    reference_attack(rows)
    ref = rows.get(REFERENCE)
    for row in rows.values():
        m = row.metrics
        if "MIA AUC" in m:
            ref_auc = ref.metrics.get("MIA AUC", 0.5) if ref else 0.5
            m["Privacy leakage"] = M.privacy_leakage(m["MIA AUC"], ref_auc)
        if all(k in m for k in ("VerbMem forget", "KnowMem forget", "KnowMem retain", "Privacy leakage")):
            m["Final score"] = M.muse_final_score(m["VerbMem forget"], m["KnowMem forget"],
                                                  m["KnowMem retain"], m["Privacy leakage"])


def _muse_spec(corpus: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        f"muse-{corpus}", partial(load_muse, corpus), SPLITS, aliases={"raw": "forget"},
        label=f"MUSE-{corpus.capitalize()}", hub_id=HUB_IDS[corpus],
        description=f"MUSE-{corpus.capitalize()} (Hub {HUB_IDS[corpus]}): texts; verbmem, knowmem, privleak",
        preset=f"muse-{corpus}",
    )


TASK = register_task(Task(
    "muse", _muse_row, retain_metrics=("KnowMem retain",), headline="Final score", relative=_muse_relative,
    recipe="muse", benchmarks=(_muse_spec("news"), _muse_spec("books")),
    quant=QuantMetrics(("KnowMem forget", "VerbMem forget"), ("KnowMem retain",)),
    sources={"VerbMem forget": upstream("MUSE forget_verbmem_ROUGE: rougeL_f1 of the continuation"),
             "KnowMem forget": upstream("MUSE forget_knowmem_ROUGE: rougeL_f1 of the few-shot answer"),
             "KnowMem retain": upstream("MUSE retain_knowmem_ROUGE: rougeL_f1 of the few-shot answer")},
    directions={"VerbMem forget": "down", "KnowMem forget": "down", "KnowMem retain": "up"}))
