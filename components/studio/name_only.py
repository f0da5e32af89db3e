"""RWKU's name-only setting in the studio (`grom.tasks.name_only`): the loaded model writes
passages and question/answer pairs about a bundled subject and its neighbours, as a table
the visitor reads and edits, and the benchmark "name-only" is built from that table.

Writing is a model job like any other: `write_rows` takes the device in turn
(`on_device`, its GPU seconds from `components.server.durations.write_s`), and how much one
request writes is bounded by GROM_MAX_WRITTEN (limits.py)."""
from __future__ import annotations

import math

import pandas as pd

from components.server.device import DEVICE_LOCK, give_turn, on_device
from components.server.durations import write_s
from components.server.errors import UserError
from components.server.limits import limit, over
from components.server.session import ModelKey, resident
from components.server.validate import whole_number
from grom.data.readers import BenchmarkError
from grom.tasks.name_only import USES, WritingConfig, from_records, name_only_benchmark, to_records, write_name_only

COLUMNS = ("text", "prompt", "kind", "side", "subject")  # what was written first: the column people read
MAX_NEIGHBOURS = 4


def writing_config(passages, questions, neighbours, seed=0) -> WritingConfig:
    """The sliders' values as a `WritingConfig`: about each neighbour a quarter of the
    passages and half of the questions asked about the subject (bench/name_only.py's
    proportions); the whole within GROM_MAX_WRITTEN texts."""
    p = whole_number(passages, "passages", 0, 256)
    q = whole_number(questions, "questions", 0, 256)
    n = whole_number(neighbours, "neighbouring subjects", 0, MAX_NEIGHBOURS)
    if p + q == 0:
        raise UserError("Ask for some passages or questions about the subject (both sliders are at 0).")
    config = WritingConfig(passages=p, questions=q, neighbours=n, neighbour_passages=math.ceil(p / 4),
                           neighbour_questions=math.ceil(q / 2), seed=int(seed))
    if texts_written(config) > limit("GROM_MAX_WRITTEN"):
        raise over("This request would write {n} texts (passages, question tries and answers)",
                   texts_written(config), "GROM_MAX_WRITTEN")
    return config


def texts_written(config: WritingConfig) -> int:
    """The texts one request writes: passages, question tries (one a question as RWKU keeps
    every one; twice the questions where only those that read as questions are kept, the
    project's variant) and answers, about the subject and each neighbour."""
    tries = 1 if config.questions_kept == "all" else 2
    per = lambda p, q: p + (tries + 1) * q  # noqa: E731  (a passage; the tries and an answer per question)
    return per(config.passages, config.questions) + config.neighbours * per(config.neighbour_passages,
                                                                             config.neighbour_questions)


@on_device(duration=write_s)
def write_rows(key: ModelKey, subject: str, config: WritingConfig, progress=None) -> list[dict]:
    """What the model of `key` writes about `subject` and its neighbours, as plain records;
    a visitor's job waiting goes between its batches and decoding steps (`give_turn`)."""
    with DEVICE_LOCK:
        handle = resident(key, "writing")
        say = None if progress is None else (lambda msg: progress(0.0, desc=msg))
        return to_records(write_name_only(handle.model, handle.tokenizer, subject, config, progress=say,
                                          between=give_turn))


def as_table(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[r.get(c, "") for c in COLUMNS] for r in records], columns=list(COLUMNS))


def written_benchmark(subject: str, table, use: str, known_only: bool):
    """The benchmark "name-only" of `subject` from the (edited) table; every problem is a
    message that says what to do."""
    if use not in USES:
        raise UserError(f"Fit on one of {', '.join(USES)}, not {use!r}.")
    if table is None or (isinstance(table, pd.DataFrame) and table.empty):
        raise UserError("Nothing written yet: press **Write with the model** first (Name only, under the "
                        "benchmark), read and edit what it wrote, then load.")
    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"The written table lacks the column(s) {', '.join(missing)}: write it again.")
    if len(frame) > limit("GROM_MAX_UPLOAD_ROWS"):
        raise over("The written table has {n} rows", len(frame), "GROM_MAX_UPLOAD_ROWS")
    try:
        rows = from_records(frame[list(COLUMNS)].fillna("").astype(str).to_dict("records"))
        return name_only_benchmark(subject, rows, use=use, known_only=known_only)
    except BenchmarkError as err:
        raise UserError(str(err)) from None
