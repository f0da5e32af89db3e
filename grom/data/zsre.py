"""zsRE in the MEND/ROME evaluation format (`zsre_mend_eval.json`): one fact per record.

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

GROM needs retain keys, and zsRE has no retain set: the retain set is the neighbourhood
prompts, `QAExample(question=loc + "?", answer=" " + loc_ans)` (the answer carries the
separating space, as ROME tokenizes " " + loc_ans), read with the bare `RAW_TEXT` format.

There is no Hub dataset: `source` is the JSON file or a folder holding it.
"""
from __future__ import annotations

import logging
from pathlib import Path

from grom.data.prompts import RAW_TEXT, PromptFormat
from grom.data.schema import Benchmark, FactRecord, QAExample
from grom.data.sources import BenchmarkError, PathLike, Record, read_rows, require_rows, resolve_source

logger = logging.getLogger(__name__)

FILE_NAME = "zsre_mend_eval.json"
SPLITS = ("eval",)
DATA_URL = "https://memit.baulab.info/data/dsets/zsre_mend_eval.json"  # MEMIT REMOTE_ROOT_URL


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


def load_zsre(split: str = "eval", source: PathLike | None = None, *,
              prompt_format: PromptFormat | None = None) -> Benchmark:
    """All zsRE records of `source` as the forget set; neighbourhood prompts as retain."""
    path = _file(source)
    rows = read_rows(path)
    require_rows(rows, f"zsre ({path})")
    records = [fact_record(r, f"zsre/{i}") for i, r in enumerate(rows)]
    forget = tuple(r for r in records if r is not None)
    require_rows(forget, f"zsre ({path}): records whose subject occurs in the prompt")
    retain = tuple(
        QAExample(question=r.neighborhood_prompt, answer=" " + r.neighborhood_answer, id=f"{r.id}/loc")
        for r in forget
    )
    return Benchmark(
        name="zsre",
        split=split,
        forget=forget,
        retain=retain,
        eval_sets={"forget": forget, "neighborhood": retain},
        prompt_format=prompt_format or RAW_TEXT,
        task="zsre",
        description=(
            f"zsRE ({path.name}): {len(forget)} facts to forget. zsRE has no retain set: the "
            "retain set is each record's neighbourhood prompt (ROME's 'nq question: ...?') "
            "with its answer."
        ),
    )
