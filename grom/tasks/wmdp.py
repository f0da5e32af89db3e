"""WMDP, one file: the benchmark's loader, then its task (the loader was grom/data/wmdp.py).

WMDP (Li et al. 2024): hazardous knowledge in biosecurity, chemistry and cybersecurity.

The evaluation set is multiple choice ("forget_mc"): Hub `cais/wmdp`, configs wmdp-bio,
wmdp-chem, wmdp-cyber, split "test", fields question, choices, answer (an int). The
unlearning corpora are texts (field "text"):

- forget: bio `bio-forget-corpus` (gated: requested from CAIS by a form; on the Hub as
  `cais/wmdp-bio-forget-corpus`, fields title, abstract, text, doi); cyber
  `cais/wmdp-corpora` config cyber-forget-corpus. There is no chemistry corpus.
- retain: `retain="wikitext"` (the default, as RMU and the paper do): WikiText-2
  (`Salesforce/wikitext`, wikitext-2-raw-v1, split test); or `retain="corpus"`: the
  subject's retain corpus (`cais/wmdp-corpora` bio-retain-corpus, 1.9 GB; or
  cyber-retain-corpus).
- utility ("utility_mc", optional): MMLU (`cais/mmlu`, config all, split test).

Both question sets are scored as the lm-evaluation-harness scores its zero-shot `wmdp_*`
and `mmlu` tasks (`grom.eval.runner.choice_logprobs(lm_eval=True)`): no chat template
whatever `prompt_format` says, the subject line ("... about biology."; MMLU: each row's
subject), the question stripped, " A" ... " D". A local MMLU file without a "subject"
field gets no subject line (lm-eval always writes one).

As in RMU, texts of 50 characters or fewer (WikiText's blank lines and headings) are
dropped. A local `source` folder holds (each .jsonl, .json, .csv or .parquet):

    wmdp-bio.jsonl        the questions (or a Hub snapshot's wmdp-bio/test-*.parquet)
    forget.jsonl          forget texts  (or bio-forget-corpus.jsonl, cyber-forget-corpus.jsonl)
    retain.jsonl          retain texts for retain="corpus" (or bio-retain-corpus.jsonl, ...)
    wikitext.jsonl        retain texts for retain="wikitext"
    mmlu.jsonl            optional: the utility questions

Only the questions, the forget texts and the chosen retain texts are required.

The WMDP task ("wmdp"): multiple-choice accuracy on the forget questions and on a utility
set (MMLU-style, or the retain questions), the Final Score; WMDP and MMLU scored as the
lm-evaluation-harness scores them (`LM_EVAL_SETS`). The benchmarks "wmdp-bio", "wmdp-chem"
and "wmdp-cyber", and the demo's multiple-choice split.
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from grom.closed_form.config import PRESETS
from grom.data.loaders import BenchmarkSpec
from grom.data.prompts import PromptFormat
from grom.data.readers import (
    BenchmarkError,
    PathLike,
    Record,
    load_hub_rows,
    read_local,
    require_rows,
    resolve_source,
)
from grom.data.schema import Benchmark, ChoiceExample, TextExample
from grom.eval import metrics as M
from grom.eval.metric_sources import HARNESS, MetricSource
from grom.eval.results import Row
from grom.eval.runner import ModelScorer, choice_logprobs
from grom.eval.tasks import QuantMetrics, Task, register_task

logger = logging.getLogger(__name__)

SUBJECTS = ("bio", "chem", "cyber")
SPLITS = ("forget",)
RETAIN_CHOICES = ("wikitext", "corpus")
MIN_TEXT_CHARS = 50  # RMU's min_len
MC_HUB = "cais/wmdp"
MMLU_HUB = ("cais/mmlu", "all", "test")
WIKITEXT_HUB = ("Salesforce/wikitext", "wikitext-2-raw-v1", "test")
FORGET_HUB = {
    "bio": ("cais/wmdp-bio-forget-corpus", None, "train"),
    "cyber": ("cais/wmdp-corpora", "cyber-forget-corpus", "train"),
}
RETAIN_HUB = {
    "bio": ("cais/wmdp-corpora", "bio-retain-corpus", "train"),
    "cyber": ("cais/wmdp-corpora", "cyber-retain-corpus", "train"),
}


# The subject of lm-evaluation-harness's description line for each WMDP task
# (lm_eval/tasks/wmdp/wmdp_{bio,chem,cyber}.yaml); MMLU rows carry their own.
LM_EVAL_SUBJECTS = {"bio": "biology", "chem": "chemistry", "cyber": "cybersecurity"}


def choice_example(rec: Record, id: str, subject: str | None = None) -> ChoiceExample:
    """A question/choices/answer row (WMDP, MMLU) as a ChoiceExample; `subject` (else the
    row's "subject" field) names the lm-eval description line."""
    choices = rec.texts("choices")
    return ChoiceExample(
        question=rec.text("question"),
        choices=choices,
        answer_index=rec.index("answer", len(choices)),
        subject=subject or rec.text("subject", optional=True),
        id=id,
    )


def _texts(rows: Sequence[Record], what: str) -> tuple[TextExample, ...]:
    out = tuple(
        TextExample(text=text, id=f"{what}/{i}")
        for i, r in enumerate(rows)
        if len(text := r.text("text", optional=True) or "") > MIN_TEXT_CHARS
    )
    require_rows(out, f"{what} (texts over {MIN_TEXT_CHARS} characters)")
    return out


def _read(folder: Path | None, hub: tuple | None, stems: Sequence[str], what: str, *, required=True):
    """Rows from the local folder (first of `stems`) or, without one, from the Hub."""
    if folder is not None:
        return read_local(folder, stems, what, required=required)
    if hub is None:
        raise BenchmarkError(f"{what}: none on the Hub; give source= a local folder holding {stems[0]}.jsonl")
    return load_hub_rows(*hub)


def _retain(subject: str, retain: str, folder: Path | None) -> tuple[TextExample, ...]:
    if retain == "wikitext":
        stems = ["wikitext", "wikitext-2-raw-v1/test"]
        return _texts(_read(folder, WIKITEXT_HUB, stems, "WikiText retain texts"), "wikitext")
    stems = ["retain", f"{subject}-retain-corpus", f"{subject}-retain-corpus/train"]
    rows = _read(folder, RETAIN_HUB.get(subject), stems, f"WMDP-{subject} retain corpus")
    return _texts(rows, f"wmdp-{subject}-retain")


def _utility(folder: Path | None, utility: bool | None) -> tuple[ChoiceExample, ...] | None:
    if utility is False or (utility is None and folder is None):
        return None
    rows = _read(folder, MMLU_HUB, ["mmlu", "all/test"], "MMLU utility questions", required=bool(utility))
    if rows is None:
        return None
    require_rows(rows, "MMLU utility questions")
    return tuple(choice_example(r, f"mmlu/{i}") for i, r in enumerate(rows))


def load_wmdp(subject: str, split: str = "forget", source: PathLike | None = None, *,
              retain: str = "wikitext", utility: bool | None = None,
              prompt_format: PromptFormat | None = None) -> Benchmark:
    """WMDP-`subject` ("bio", "chem" or "cyber"): forget corpus, retain texts, MC questions.

    retain: "wikitext" (default) or "corpus" (the subject's retain corpus).
    utility: MMLU questions as "utility_mc": None (from a local folder if it has them,
    never from the Hub), True (required; from the Hub without a folder) or False (none).
    """
    if retain not in RETAIN_CHOICES:
        raise BenchmarkError(f"wmdp: retain={retain!r} is unknown; use one of {', '.join(RETAIN_CHOICES)}")
    folder = resolve_source(source, f"wmdp-{subject}")
    if folder is None and subject not in FORGET_HUB:
        raise BenchmarkError(
            f"wmdp-{subject}: WMDP publishes no {subject} corpus; give source= a local folder "
            "holding the questions and forget.jsonl (see grom.tasks.wmdp)"
        )
    mc_stems = [f"wmdp-{subject}", f"wmdp-{subject}/test"]
    mc_rows = _read(folder, (MC_HUB, f"wmdp-{subject}", "test"), mc_stems, f"WMDP-{subject} questions")
    require_rows(mc_rows, f"WMDP-{subject} questions")
    forget_stems = ["forget", f"{subject}-forget-corpus", f"{subject}-forget-corpus/train"]
    forget_rows = _read(folder, FORGET_HUB.get(subject), forget_stems, f"WMDP-{subject} forget corpus")
    forget = _texts(forget_rows, f"wmdp-{subject}-forget")
    retain_set = _retain(subject, retain, folder)
    questions = tuple(choice_example(r, f"wmdp-{subject}/{i}", LM_EVAL_SUBJECTS.get(subject))
                      for i, r in enumerate(mc_rows))
    eval_sets = {"forget_mc": questions}
    mmlu = _utility(folder, utility)
    if mmlu is not None:
        eval_sets["utility_mc"] = mmlu
    where = f"the local folder {folder}" if folder else "the Hub"
    return Benchmark(
        name=f"wmdp-{subject}",
        split=split,
        forget=forget,
        retain=retain_set,
        eval_sets=eval_sets,
        prompt_format=prompt_format or PromptFormat(),
        task="wmdp",
        description=(
            f"WMDP-{subject}: {len(forget)} forget texts, {len(retain_set)} retain texts ({retain}), "
            f"{len(eval_sets['forget_mc'])} questions, from {where}; eval sets: {', '.join(eval_sets)}."
        ),
    )


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
                             lm_eval=name in LM_EVAL_SETS, between=run.between)
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
        f"wmdp-{subject}", partial(load_wmdp, subject), SPLITS,
        options=("prompt_format", "retain", "utility"), aliases={"test": "forget"},
        label=f"WMDP-{subject.capitalize()}", hub_id=MC_HUB,
        description=f"WMDP-{subject}: forget corpus, WikiText or corpus retain, multiple-choice questions",
        preset=f"wmdp-{subject}" if f"wmdp-{subject}" in PRESETS else None,
    )


TASK = register_task(Task(
    "wmdp", _wmdp_row, retain_metrics=("Utility accuracy", "Retain accuracy"), headline="Final score",
    recipe="wmdp", benchmarks=tuple(_wmdp_spec(s) for s in SUBJECTS),
    quant=QuantMetrics(("Forget accuracy",), ("Retain accuracy", "Utility accuracy")),
    sources={"accuracy": MetricSource(HARNESS, "multiple-choice accuracy, the answer letter's log-likelihood")},
    directions={"Forget accuracy": "down"}))
