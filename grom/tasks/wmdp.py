"""The WMDP task ("wmdp"): multiple-choice accuracy on the forget questions and on a utility
set (MMLU-style, or the retain questions), the Final Score; WMDP and MMLU scored as the
lm-evaluation-harness scores them (`LM_EVAL_SETS`). The benchmarks "wmdp-bio", "wmdp-chem"
and "wmdp-cyber", and the demo's multiple-choice split."""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from grom.data import wmdp as wmdp_data
from grom.data.loaders import BenchmarkSpec
from grom.data.schema import ChoiceExample
from grom.eval import metrics as M
from grom.eval.results import Row
from grom.eval.runner import ModelScorer, choice_logprobs
from grom.tasks.base import Task, register_task

# WMDP's questions and MMLU: scored as the lm-evaluation-harness scores them (no chat template,
# whatever the benchmark's prompt format; see `choice_logprobs(lm_eval=True)`). The demo's
# multiple-choice sets keep the benchmark's format, which its keys were trained on.
LM_EVAL_SETS = ("forget_mc", "utility_mc")


def _wmdp_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    """Accuracy on each multiple-choice set: argmax of the options' log-likelihoods
    (lm-eval's `acc` on WMDP and MMLU), and the Final score."""
    row = Row()
    names = [("forget_mc", "Forget accuracy"), ("forget", "Forget accuracy"),
             ("utility_mc", "Utility accuracy"), ("retain", "Retain accuracy"),
             ("real_authors", "Real authors accuracy"), ("world_facts", "World facts accuracy")]
    for name, label in names:
        ex = sets.get(name)
        if not ex or not isinstance(ex[0], ChoiceExample) or label in row.metrics:
            continue
        if only_forget and not name.startswith("forget"):
            continue
        lp = choice_logprobs(run.model, run.tok, ex, prompt_format=run.fmt, batch_size=run.batch_size,
                             lm_eval=name in LM_EVAL_SETS)
        gold = np.array([e.answer_index for e in ex])
        pred = lp.argmax(1)
        row.examples[name] = pd.DataFrame({"question": [e.question for e in ex],
                                           "answer": [e.answer for e in ex],
                                           "predicted": [e.choices[p] for e, p in zip(ex, pred)],
                                           "correct": pred == gold})
        row.metrics[label] = M.choice_accuracy(lp, gold)
    utility = row.metrics.get("Utility accuracy", row.metrics.get("Retain accuracy"))
    if "Forget accuracy" in row.metrics and utility is not None:
        row.metrics["Final score"] = M.wmdp_final_score(row.metrics["Forget accuracy"], utility)
    return row


def _wmdp_spec(subject: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        f"wmdp-{subject}", partial(wmdp_data.load_wmdp, subject), wmdp_data.SPLITS,
        options=("prompt_format", "retain", "utility"), aliases={"test": "forget"},
        label=f"WMDP-{subject.capitalize()}", hub_id=wmdp_data.MC_HUB,
        description=f"WMDP-{subject}: forget corpus, WikiText or corpus retain, multiple-choice questions",
    )


TASK = register_task(Task(
    "wmdp", _wmdp_row, retain_metrics=("Utility accuracy", "Retain accuracy"), headline="Final score",
    recipe="wmdp", benchmarks=tuple(_wmdp_spec(s) for s in wmdp_data.SUBJECTS)))
