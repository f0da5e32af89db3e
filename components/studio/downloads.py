"""Every table of the page as files a researcher can take away: CSV and JSON.

`table_files(frame, name)` writes a table the page shows into a folder under gradio's cache
(so gradio serves it; uploads older than half an hour go with the rest of the cache,
`app.py`'s delete_cache) and returns the two paths. A comparison's per-answer generations
are written the same way (`report_files`), once per comparison.

A table's change event runs outside the queue (components/studio/wiring.py `offer_files`), and
what it writes is the table the client sends, so anyone can call it with any table
(issue 45: a 150 KB body of one 50,000-character header and 20,000 rows once wrote a 1 GB
JSON file, each row repeating the header). So what it writes is bounded by what it is sent:
- at most MAX_CELLS cells and MAX_TABLE_BYTES of CSV (a larger table gets no files);
- the JSON records repeat each column name per row: they are written only where that keeps
  them within JSON_GROWTH times the CSV (plus JSON_SLACK), else the CSV alone;
- a folder is named by the hash of what it holds: the same table sent again is the same
  folder, not another;
- the folder keeps at most `MAX_FOLDERS` tables and MAX_BYTES on disk, the oldest removed first.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from components.server.files import upload_folder

DOWNLOADS = "grom-studio-tables"
MAX_FOLDERS = 200  # written tables kept, the oldest removed first
MAX_BYTES = 64 << 20  # and on disk at most this
MAX_CELLS = 200_000  # the largest table written (the page's own: a few hundred cells)
MAX_TABLE_BYTES = 8 << 20  # its CSV at most this
JSON_GROWTH, JSON_SLACK = 1.5, 64 << 10  # the JSON records at most 1.5 x the CSV + 64 KB


def _root() -> Path:
    root = upload_folder() / DOWNLOADS
    root.mkdir(parents=True, exist_ok=True)
    return root


def _bound(root: Path, keep: Path) -> None:
    """At most MAX_FOLDERS folders and MAX_BYTES under `root`, the oldest removed first (never `keep`)."""
    folders = []
    for folder in root.glob("t-*"):
        try:
            folders.append((folder.stat().st_mtime, sum(f.stat().st_size for f in folder.iterdir()), folder))
        except OSError:
            continue
    folders.sort()
    total = sum(size for _, size, _ in folders)
    for i, (_, size, folder) in enumerate(folders):
        if len(folders) - i <= MAX_FOLDERS and total <= MAX_BYTES:
            break
        if folder != keep:
            shutil.rmtree(folder, ignore_errors=True)
            total -= size


def _folder(content: bytes | None = None) -> Path:
    """A folder for new files: named by `content`'s hash when given (the same content, the
    same folder: its mtime renewed), else fresh; the folder is then bounded (`_bound`)."""
    root = _root()
    if content is None:
        folder = Path(tempfile.mkdtemp(prefix="t-", dir=root))
    else:
        folder = root / f"t-{hashlib.sha256(content).hexdigest()[:32]}"
        folder.mkdir(exist_ok=True)
        now = time.time()
        os.utime(folder, (now, now))  # the newest again
    _bound(root, folder)
    return folder


def _frame(value) -> pd.DataFrame | None:
    """A table's value as a DataFrame: a DataFrame, a pandas Styler, or gradio's
    {"headers", "data"} dict; None when there is no table."""
    if value is None:
        return None
    if isinstance(value, pd.DataFrame):
        return value
    if hasattr(value, "data") and isinstance(value.data, pd.DataFrame):  # a Styler
        return value.data
    if isinstance(value, dict) and "headers" in value:
        return pd.DataFrame(value.get("data") or [], columns=value["headers"])
    return None


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "table"


def _records_bytes(frame: pd.DataFrame, csv_bytes: int) -> int:
    """About the size of `frame` as JSON records: its cells (the CSV's bytes) plus every
    column name once per row."""
    names = sum(len(str(c).encode()) + 4 for c in frame.columns)  # "name": per cell
    return csv_bytes + len(frame) * names


def table_files(value, name: str) -> list[str] | None:
    """The table as `<name>.csv` and `<name>.json` (records; the CSV alone where records would
    be far larger, module docstring), or None when it has no rows or is larger than the
    page's tables ever are."""
    frame = _frame(value)
    if frame is None or frame.empty or frame.size > MAX_CELLS:
        return None
    text = frame.to_csv(index=False).encode("utf-8")
    if len(text) > MAX_TABLE_BYTES:
        return None
    stem = safe_name(name)
    folder = _folder(stem.encode() + b"\0" + text)
    csv, js = folder / f"{stem}.csv", folder / f"{stem}.json"
    if not csv.is_file():
        csv.write_bytes(text)
    if _records_bytes(frame, len(text)) > JSON_GROWTH * len(text) + JSON_SLACK:
        return [str(csv)]
    if not js.is_file():
        js.write_text(frame.to_json(orient="records", force_ascii=False), encoding="utf-8")
    return [str(csv), str(js)]


def report_files(report, name: str) -> list[str]:
    """A comparison as files: its metrics table (CSV) and, per model row and evaluation set,
    every example's question, answer and generation with its per-example scores (CSV),
    and the whole report (JSON: metrics, examples and the counts of the facts the unedited
    model knew, `Report.tallies`: the card's)."""
    folder, stem = _folder(), safe_name(name)
    paths = []
    metrics = report.table()
    metrics.to_csv(folder / f"{stem}-metrics.csv")
    paths.append(folder / f"{stem}-metrics.csv")
    frames = []
    for row_name, row in report.rows.items():
        for set_name, df in row.examples.items():
            frames.append(df.assign(model=row_name, set=set_name))
    if frames:
        answers = pd.concat(frames, ignore_index=True)
        front = ["model", "set"] + [c for c in answers.columns if c not in ("model", "set")]
        answers[front].to_csv(folder / f"{stem}-answers.csv", index=False)
        paths.append(folder / f"{stem}-answers.csv")
    whole = {"benchmark": report.benchmark, "split": report.split, "task": report.task,
             "seconds": report.seconds, "tallies": report.to_dict()["tallies"], "rows": {
                 name: {"metrics": row.metrics,
                        "examples": {s: json.loads(df.to_json(orient="records")) for s, df in row.examples.items()}}
                 for name, row in report.rows.items()}}
    (folder / f"{stem}.json").write_text(json.dumps(whole, indent=1, default=str), encoding="utf-8")
    paths.append(folder / f"{stem}.json")
    return [str(p) for p in paths]
