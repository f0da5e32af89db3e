"""The TOFU task ("tofu": TOFU and the bundled demo world): per QA set (forget, retain,
real_authors, world_facts) ROUGE-L recall of greedy answers, fact recall where facts exist,
answer probability (normalised among the options on real_authors / world_facts), truth
ratio, extraction strength and exact memorization (forget, OpenUnlearning's: EOS not
scored); model utility (harmonic mean of the 9 retain, Real Authors, World Facts values);
forget quality (KS test against the reference model's forget truth ratios); MIA AUC
(Min-40% on forget against holdout) and privacy leakage (relative to the reference), with
the AUCs of the LOSS, zlib, Min-K++ and Reference attacks (`MIA_COLUMNS`, the same forward
passes); the paper's Final Score; the same per-set metrics with the paraphrased questions
asked ("Forget para-Q ..."), as OpenUnlearning's ``question_key: paraphrased_question``.
Answers: greedy, up to 200 new tokens. The benchmark "tofu" (Hub or a local folder)."""
from __future__ import annotations

import numpy as np

from grom.data import tofu as tofu_data
from grom.data.loaders import BenchmarkSpec
from grom.eval import metrics as M
from grom.eval.results import REFERENCE, Row
from grom.eval.runner import ModelScorer
from grom.eval.shared_rows import attack_aucs, attack_raw, qa_set, reference_attack
from grom.tasks.base import Task, register_task

TOFU_SETS = {"forget": "Forget", "retain": "Retain", "real_authors": "Real authors",
             "world_facts": "World facts"}
TOFU_NEW_TOKENS = 200
"""TOFU answers: greedy, up to 200 new tokens, stopped at EOS, as OpenUnlearning generates
them (configs/generation/default.yaml, commit d3d7cf9), so ROUGE-L reads the same text."""
PARA_Q = "para-Q"  # the metric names of the paraphrased-question evaluation: "Forget para-Q ROUGE-L"


def _tofu_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    row = Row()
    utility = []
    for name, label in TOFU_SETS.items():
        if name not in sets or (only_forget and name != "forget"):
            continue
        vals, df, raw = qa_set(run, sets[name], name, options=name in ("real_authors", "world_facts"),
                                budget=TOFU_NEW_TOKENS)
        row.examples[name] = df
        for k, v in raw.items():
            row.raw[f"{name}/{k}"] = v
        for k, v in vals.items():
            row.metrics[f"{label} {k}"] = v
        if name != "forget":
            utility += [vals["prob"], vals["ROUGE-L"]] + ([vals["truth ratio"]] if "truth ratio" in vals else [])
    if utility:
        row.metrics["Model utility"] = M.model_utility(np.clip(utility, 0, None))
    _tofu_paraphrased(run, sets, row, only_forget)
    if "holdout" in sets and "forget/min_k" in row.raw:
        hold = run.losses([(ex.question, ex.answer) for ex in sets["holdout"]], moments=True)
        row.raw.update({f"holdout/{k}": v for k, v in attack_raw(run, hold).items()})
        attack_aucs(row)
    m = row.metrics
    if "Model utility" in m and "Forget ES" in m:
        m["Final score"] = M.tofu_final_score(m["Model utility"], m["Forget ROUGE-L"],
                                              min(1.0, m["Forget prob"]), m["Forget ES"])
    return row


def _tofu_paraphrased(run: ModelScorer, sets: dict[str, tuple], row: Row, only_forget: bool) -> None:
    """TOFU's paraphrased-question evaluation of the forget and retain sets, where every
    pair has a `paraphrased_question` (TOFU's newer files, the bundled world): the same
    metrics with the paraphrase asked, as "Forget para-Q ROUGE-L", "Retain para-Q prob" ...
    and per-example frames "forget_paraphrased" ... OpenUnlearning runs it as a second
    evaluation (``question_key: paraphrased_question``); here it sits beside the first.
    Model utility stays that of the original questions, as in OpenUnlearning's default."""
    for name in ("forget", "retain"):
        ex = sets.get(name, ())
        if not ex or (only_forget and name != "forget") or not all(e.paraphrased_question for e in ex):
            continue
        vals, df, raw = qa_set(run, ex, name, options=False, paraphrased=True, budget=TOFU_NEW_TOKENS)
        row.examples[f"{name}_paraphrased"] = df
        for k, v in raw.items():
            row.raw[f"{name}_paraphrased/{k}"] = v
        for k, v in vals.items():
            row.metrics[f"{TOFU_SETS[name]} {PARA_Q} {k}"] = v


def _tofu_relative(rows: dict[str, Row]) -> None:
    """Forget quality of each row against the reference row; privacy leakage against the
    reference's Min-K AUC, or 0.5 without one (OpenUnlearning's tofu privleak ``ref_value``,
    as grom.tasks.muse `_muse_relative`)."""
    reference_attack(rows)
    ref = rows.get(REFERENCE)
    ref_auc = ref.metrics.get("MIA AUC", 0.5) if ref is not None else 0.5
    for row in rows.values():
        if "MIA AUC" in row.metrics:
            row.metrics["Privacy leakage"] = M.privacy_leakage(row.metrics["MIA AUC"], ref_auc)
    if ref is None or "forget/truth_ratio" not in ref.raw:
        return
    for row in rows.values():
        if "forget/truth_ratio" in row.raw:
            row.metrics["Forget quality"] = M.forget_quality(row.raw["forget/truth_ratio"],
                                                             ref.raw["forget/truth_ratio"])
        para = "forget_paraphrased/truth_ratio"
        if para in row.raw and para in ref.raw:
            row.metrics[f"Forget {PARA_Q} quality"] = M.forget_quality(row.raw[para], ref.raw[para])


TASK = register_task(Task(
    "tofu", _tofu_row, retain_metrics=("Model utility", "Retain fact recall"), headline="Final score",
    relative=_tofu_relative, recipe="tofu",
    benchmarks=(BenchmarkSpec("tofu", tofu_data.load_tofu, tofu_data.SPLITS, label="TOFU (Hub or local)",
                              hub_id=tofu_data.HUB_ID,
                              description=f"TOFU fictitious authors (Hub {tofu_data.HUB_ID})"),)))
