"""The task of a user's own files ("custom"): ROUGE-L recall, probability and fact recall on
the forget and retain questions, the mean loss of their texts. The benchmark "custom"."""
from __future__ import annotations

import numpy as np

from grom.data import custom as custom_data
from grom.data.loaders import BenchmarkSpec
from grom.data.schema import QAExample, TextExample
from grom.eval.results import Row
from grom.eval.runner import ModelScorer, score_texts
from grom.eval.shared_rows import qa_set
from grom.tasks.base import Task, register_task


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
            s = score_texts(run.model, run.tok, [e.text for e in texts])
            row.metrics[f"{name.capitalize()} text loss"] = float(np.mean([x.avg_loss for x in s]))
    return row


TASK = register_task(Task(
    "custom", _custom_row, retain_metrics=("Retain fact recall", "Retain ROUGE-L"), headline=None, recipe="tofu",
    benchmarks=(BenchmarkSpec("custom", custom_data.load_custom, custom_data.SPLITS,
                              options=("prompt_format", "max_rows"), label="Custom: your own files",
                              description="your own forget and retain files (JSON, JSON lines, CSV)"),)))
