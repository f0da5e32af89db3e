"""The benchmark "custom": its loader, then its task (the loader was grom/data/custom.py).

A user's own forget and retain sets, from JSON, JSON lines or CSV files (or uploads).

Each row is either a question/answer pair or a text:

    question, answer                      required for a pair
    paraphrased_question, paraphrased_answer, perturbed_answers (or perturbed_answer: a
    list, one text, or in CSV a JSON array), fact, subject, id          optional
    text                                  a document (corpus keys), instead of a pair
    split                                 "forget", "retain" or "probe", to keep the sets in one file

`load_benchmark("custom", source={"forget": path, "retain": path})` or
`load_benchmark("custom", source=path_with_split_column)`. Rows of split "probe" (in the
one file, in the forget file, or in a file given as source["probe"]) are held-out probe
questions: the edit never sees them, and they come back as `eval_sets["probes"]` for
`grom.robustness` (does the forgetting carry to questions it was not fitted on?). GROM
needs retain keys, so a retain set is required. Files are parsed as data only and
size-limited; `max_rows` caps the rows read (the parse stops at the first row over it),
and a CSV's header is checked for the columns needed before any row is parsed.

The task of a user's own files ("custom"): ROUGE-L recall, probability and fact recall on
the forget and retain questions, the mean loss of their texts. The benchmark "custom".
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np

from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import PromptFormat
from grom.data.readers import (
    BenchmarkError,
    PathLike,
    Record,
    TooManyRows,
    parse_rows,
    read_rows,
    require_rows,
    resolve_source,
)
from grom.data.schema import Benchmark, Example, QAExample, TextExample
from grom.eval.metric_sources import ours
from grom.eval.results import Row
from grom.eval.runner import ModelScorer, score_texts
from grom.eval.shared_rows import qa_set
from grom.eval.tasks import Task, register_task

logger = logging.getLogger(__name__)

SPLITS = ("forget",)
ROLES = ("forget", "retain", "probe")
SUFFIXES = (".json", ".jsonl", ".csv")

Source = Union[PathLike, Mapping[str, PathLike]]


def example_from_row(rec: Record, id: str) -> Example:
    """A QAExample (a row with a question) or a TextExample (a row with a text)."""
    if rec.data.get("id") not in (None, ""):
        id = str(rec.data["id"])
    if "question" in rec.data:
        perturbed_key = "perturbed_answers" if "perturbed_answers" in rec.data else "perturbed_answer"
        return QAExample(
            question=rec.text("question"),
            answer=rec.text("answer"),
            paraphrased_question=rec.text("paraphrased_question", optional=True),
            paraphrased_answer=rec.text("paraphrased_answer", optional=True),
            perturbed_answers=rec.texts(perturbed_key, optional=True),
            fact=rec.text("fact", optional=True),
            subject=rec.text("subject", optional=True),
            id=id,
        )
    if "text" in rec.data:
        return TextExample(text=rec.text("text"), id=id)
    found = ", ".join(sorted(map(str, rec.data))) or "none"
    raise BenchmarkError(
        f"{rec.where}: expected 'question' and 'answer' fields, or a 'text' field; found: {found}"
    )


def _role(rec: Record) -> str | None:
    value = rec.data.get("split")
    if value is None:
        return None
    role = str(value).strip().lower()
    if role not in ROLES:
        raise BenchmarkError(f"{rec.where}: split {value!r} is unknown; use 'forget', 'retain' or 'probe'")
    return role


def _no_split(label: str) -> BenchmarkError:
    return BenchmarkError(
        f"custom: {label} has no 'split' column, so it gives no retain set; add a split column "
        "(forget/retain) or give source={'forget': path, 'retain': path}"
    )


def _check_columns(columns: Sequence[str], label: str, need_split: bool) -> None:
    """A CSV header with the columns a custom file needs (checked before its rows are read)."""
    if need_split and "split" not in columns:
        raise _no_split(label)
    if not ({"question", "answer"} <= set(columns) or "text" in columns):
        found = ", ".join(columns) or "none"
        raise BenchmarkError(
            f"{label}: expected 'question' and 'answer' columns, or a 'text' column; found columns: {found}"
        )


def _rows(data: PathLike | bytes, name: str | None, *, max_rows: int | None = None,
          need_split: bool = False) -> tuple[list[Record], str]:
    if isinstance(data, (bytes, bytearray)):
        if not name:
            raise BenchmarkError("an uploaded file needs its name, to tell JSON, JSON lines and CSV apart")
        label = name
    else:
        label = str(data)
    if Path(label).suffix.lower() not in SUFFIXES:
        raise BenchmarkError(f"{label}: unknown file type; expected one of {', '.join(SUFFIXES)}")
    check = partial(_check_columns, label=label, need_split=need_split)
    limits = {"max_rows": max_rows, "check_columns": check}
    if isinstance(data, (bytes, bytearray)):
        return parse_rows(bytes(data), label, **limits), label
    return read_rows(data, **limits), label


def _select(rows: list[Record], label: str, split: str | None) -> tuple[Example, ...]:
    """The examples of `rows` whose split is `split` (all rows if None or no split column)."""
    require_rows(rows, label)
    roles = [_role(r) for r in rows]
    if split is not None and any(roles):
        for rec, role in zip(rows, roles):
            if role is None:
                raise BenchmarkError(
                    f"{rec.where}: no split value; expected 'forget', 'retain' or 'probe' as in the other rows"
                )
    stem = Path(label).stem
    kept = [(i, r) for i, (r, role) in enumerate(zip(rows, roles)) if split is None or role in (None, split)]
    require_rows(kept, f"{label}: the {split} rows")
    return tuple(example_from_row(r, f"{stem}/{i}") for i, r in kept)


def load_custom_file(data: PathLike | bytes, name: str | None = None, *,
                     split: str | None = None, max_rows: int | None = None) -> tuple[Example, ...]:
    """The examples of a user's file: a path, or the bytes of an upload with its file `name`.

    split: "forget", "retain" or "probe" keeps only the rows of that split when the file
    has a `split` column (a file without one is all of it); None keeps every row.
    max_rows: at most this many rows in the file (`TooManyRows` at the first one over).
    """
    if split is not None and split not in ROLES:
        raise BenchmarkError(f"split {split!r} is unknown; use 'forget', 'retain' or 'probe'")
    rows, label = _rows(data, name, max_rows=max_rows)
    return _select(rows, label, split)


Sets = tuple[tuple[Example, ...], "tuple[Example, ...] | None", tuple[Example, ...]]


def _probe_rows(rows: list[Record], label: str) -> tuple[Example, ...]:
    """The rows of split "probe" of a file with a split column (none otherwise)."""
    if "probe" not in {_role(r) for r in rows}:
        return ()
    return _select(rows, label, "probe")


def _sets(source: Source, max_rows: int | None) -> Sets:
    """(forget, retain or None, probes) of a mapping of files or of one file with a split column."""
    if isinstance(source, Mapping):
        if set(source) - set(ROLES) or "forget" not in source:
            raise BenchmarkError(f"custom: source keys {sorted(source)}; expected 'forget' and 'retain' "
                                 "(and optionally 'probe')")
        rows, label = _rows(resolve_source(source["forget"], "custom"), None, max_rows=max_rows)
        forget, probes = _select(rows, label, "forget"), _probe_rows(rows, label)
        if source.get("probe"):
            probe_rows, probe_label = _rows(resolve_source(source["probe"], "custom"), None, max_rows=max_rows)
            probes += _select(probe_rows, probe_label, "probe")
        if not source.get("retain"):
            return forget, None, probes
        return forget, _retain_file(resolve_source(source["retain"], "custom"), max_rows, len(rows)), probes
    rows, label = _rows(resolve_source(source, "custom"), None, max_rows=max_rows, need_split=True)
    roles = {_role(r) for r in rows}
    if not roles - {None}:
        raise _no_split(label)
    retain = _select(rows, label, "retain") if "retain" in roles else None
    return _select(rows, label, "forget"), retain, _probe_rows(rows, label)


def _retain_file(path: Path, max_rows: int | None, n_forget: int) -> tuple[Example, ...]:
    """The retain examples of `path`, in the rows `max_rows` leaves after the forget file's."""
    left = None if max_rows is None else max_rows - n_forget
    try:
        rows, label = _rows(path, None, max_rows=left)
    except TooManyRows:
        raise TooManyRows(
            f"{path}: with the forget file's {n_forget} rows, more than the limit of {max_rows} rows in "
            f"all; upload fewer rows (at most {max_rows} forget and retain rows together)"
        ) from None
    return _select(rows, label, "retain")


def load_custom(split: str = "forget", source: Source | None = None, *,
                prompt_format: PromptFormat | None = None, max_rows: int | None = None) -> Benchmark:
    """A benchmark from the user's files: `source` is {"forget": path, "retain": path}, or
    one file whose `split` column says which rows are forget, retain (and probe).
    eval_sets: "forget", "retain", and "probes" where the files hold probe rows.

    max_rows: at most this many rows in all, the forget and retain files together (the
    total, not per file); `TooManyRows` as soon as one more is read, so a huge file costs
    no more than the cap.
    """
    if source is None:
        raise BenchmarkError(
            "custom: give source= a file with a 'split' column (forget/retain) or "
            "{'forget': path, 'retain': path}"
        )
    forget, retain, probes = _sets(source, max_rows)
    if not retain:
        raise BenchmarkError(
            "custom: a retain set is needed (GROM takes retain keys from it to keep the rest of "
            "the model's behaviour); give source={'forget': ..., 'retain': ...} or add retain rows"
        )
    return Benchmark(
        name="custom",
        split=split,
        forget=forget,
        retain=retain,
        eval_sets={"forget": forget, "retain": retain, **({"probes": probes} if probes else {})},
        prompt_format=prompt_format or PromptFormat(),
        task="custom",
        description=(f"Custom: {len(forget)} forget and {len(retain)} retain examples"
                     + (f", {len(probes)} held-out probes." if probes else ".")),
    )


def _custom_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    row = Row()
    for name in ("forget", "retain"):
        ex = [e for e in sets.get(name, ()) if isinstance(e, QAExample)]
        if not ex or (only_forget and name != "forget"):
            continue
        vals, df, _ = qa_set(run, tuple(ex), name, options=False)
        row.examples[name] = df
        for k, v in vals.items():
            row.metrics[f"{name.capitalize()} {k}"] = v
        texts = [e for e in sets.get(name, ()) if isinstance(e, TextExample)]
        if texts:
            s = score_texts(run.model, run.tok, [e.text for e in texts], between=run.between)
            row.metrics[f"{name.capitalize()} text loss"] = float(np.mean([x.avg_loss for x in s]))
    return row


TASK = register_task(Task(
    "custom", _custom_row, retain_metrics=("Retain fact recall", "Retain ROUGE-L"), headline=None, recipe="tofu",
    benchmarks=(BenchmarkSpec("custom", load_custom, SPLITS,
                              options=("prompt_format", "max_rows"), label="Custom: your own files",
                              description="your own forget and retain files (JSON, JSON lines, CSV)",
                              session_only="uploaded benchmark files"),),
    sources={"text loss": ours("mean token NLL of the set's raw texts")},
    directions={"Forget text loss": "up", "Retain text loss": "keep"}))
