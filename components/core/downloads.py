"""Every table of the page as files a researcher can take away: CSV and JSON.

`table_files(frame, name)` writes a table the page shows into a fresh folder under
gradio's cache (so gradio serves it; uploads older than half an hour go with the rest of
the cache, `app.py`'s delete_cache) and returns the two paths. A comparison's per-answer
generations are written the same way (`report_files`). The files are small (a table of a
few hundred cells; a comparison's answers, tens of kilobytes), and the folder keeps at
most `MAX_FOLDERS` of them.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from components.core.files import upload_folder

DOWNLOADS = "grom-studio-tables"
MAX_FOLDERS = 200  # written tables kept, the oldest removed first


def _folder() -> Path:
    root = upload_folder() / DOWNLOADS
    root.mkdir(parents=True, exist_ok=True)
    folders = sorted(root.glob("t-*"), key=lambda f: f.stat().st_mtime)
    for old in folders[:max(0, len(folders) - MAX_FOLDERS + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix="t-", dir=root))


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


def table_files(value, name: str) -> list[str] | None:
    """The table as `<name>.csv` and `<name>.json` (records), or None when it has no rows."""
    frame = _frame(value)
    if frame is None or frame.empty:
        return None
    folder, stem = _folder(), safe_name(name)
    csv, js = folder / f"{stem}.csv", folder / f"{stem}.json"
    frame.to_csv(csv, index=False)
    js.write_text(frame.to_json(orient="records", force_ascii=False, indent=1), encoding="utf-8")
    return [str(csv), str(js)]


def report_files(report, name: str) -> list[str]:
    """A comparison as files: its metrics table (CSV) and, per model row and evaluation set,
    every example's question, answer and generation with its per-example scores (CSV),
    and the whole report (JSON: metrics and examples)."""
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
             "seconds": report.seconds, "rows": {
                 name: {"metrics": row.metrics,
                        "examples": {s: json.loads(df.to_json(orient="records")) for s, df in row.examples.items()}}
                 for name, row in report.rows.items()}}
    (folder / f"{stem}.json").write_text(json.dumps(whole, indent=1, default=str), encoding="utf-8")
    paths.append(folder / f"{stem}.json")
    return [str(p) for p in paths]
