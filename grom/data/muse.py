"""MUSE (Shi et al. 2024): unlearning news articles (MUSE-News) or Harry Potter books
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
"""
from __future__ import annotations

import logging
from pathlib import Path

from grom.data.prompts import PLAIN_QA, PromptFormat
from grom.data.readers import PathLike, Record, load_hub_rows, read_local, require_rows, resolve_source
from grom.data.schema import Benchmark, QAExample, TextExample

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
