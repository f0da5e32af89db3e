"""The zsRE task ("zsre"): efficacy, generalisation and specificity (token accuracy of the
original answer on the fact's prompt, its rephrasing and a neighbouring prompt). The
benchmark "zsre" (a local file)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from grom.data import zsre as zsre_data
from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import RAW_TEXT
from grom.data.schema import FactRecord
from grom.eval import metrics as M
from grom.eval.results import Row
from grom.eval.runner import ModelScorer
from grom.tasks.base import Task, register_task


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
    benchmarks=(BenchmarkSpec("zsre", zsre_data.load_zsre, zsre_data.SPLITS, aliases=zsre_data.ALIASES,
                              label="zsRE (local file)",
                              description=f"zsRE facts from a local {zsre_data.FILE_NAME}: {zsre_data.N_FORGET} to "
                                          f"forget, {zsre_data.N_RETAIN} to retain, one draw per seed split"),)))
