"""What several tasks' rows share: one QA set's metrics (`qa_set`: ROUGE-L, fact recall,
probability, truth ratio, extraction strength, exact memorization) and the membership
attacks' per-example scores, AUCs (`MIA_COLUMNS`) and Reference attack. The metrics
themselves are in `grom.eval.metrics` and `grom.eval.mia`; the tasks in grom/tasks/."""
from __future__ import annotations

import numpy as np
import pandas as pd

from grom.eval import metrics as M
from grom.eval import mia
from grom.eval.results import REFERENCE, Row
from grom.eval.runner import ModelScorer

MIA_COLUMNS = {"min_k": "MIA AUC", "min_k++": "MIA AUC (Min-K++)", "loss": "MIA AUC (LOSS)",
               "zlib": "MIA AUC (zlib)", "reference": "MIA AUC (Reference)"}
"""The column of each membership attack's AUC (`grom.eval.mia`); Min-K's is "MIA AUC", the
one PrivLeak reads, as OpenUnlearning's privleak reads mia_min_k."""


def qa_set(run: ModelScorer, examples: tuple, name: str, *, options: bool,
            paraphrased: bool = False, budget: int | None = None) -> tuple[dict, pd.DataFrame, dict]:
    """ROUGE-L, fact recall, probability, truth ratio for one QA set; on the forget set also
    extraction strength and exact memorization (OpenUnlearning's: EOS dropped) and each
    membership attack's per-example scores (`attack_raw`).

    paraphrased: ask each `paraphrased_question` instead of its question (every metric,
    the answers unchanged), as OpenUnlearning's TOFU evaluation with ``question_key:
    paraphrased_question`` (configs/eval/tofu.yaml, commit d3d7cf9). budget: new tokens
    per answer (None: room for the set's longest answer, `answer_budget`)."""
    qs, answers = qa_prompts(examples, paraphrased)
    gens = run.generate(qs, answers, budget=budget)
    main = run.losses(list(zip(qs, answers)), moments=name == "forget" and not paraphrased)
    rouge = np.array([M.rouge_l_recall(a, g) for a, g in zip(answers, gens)])
    es = np.array([M.extraction_strength(s.predicted, s.labels) for s in main])
    em = np.array([M.exact_memorization(s.predicted, s.labels) for s in main])
    avg = np.array([s.avg_loss for s in main])
    df = pd.DataFrame({"question": qs, "answer": answers, "generation": gens,
                       "rougeL_recall": rouge, "prob": M.probability(avg), "es": es, "em": em})
    out = {"ROUGE-L": float(rouge.mean())}
    facts = [ex.fact for ex in examples]
    if all(facts):
        fr = np.array([M.fact_recall(f, g) for f, g in zip(facts, gens)])
        df["fact_recall"] = fr
        out["fact recall"] = float(fr.mean())
    raw: dict[str, np.ndarray] = attack_raw(run, main) if name == "forget" and not paraphrased else {}
    perturbed = [ex.perturbed_answers for ex in examples]
    if all(perturbed):
        counts = [len(p) for p in perturbed]
        flat = run.losses([(q, p) for q, ps in zip(qs, perturbed) for p in ps])
        pert = np.split(np.array([s.avg_loss for s in flat]), np.cumsum(counts)[:-1])
        if options:  # Real Authors / World Facts: the answer against its perturbations
            prob = np.array([M.normalised_probability(c, p) for c, p in zip(avg, pert)])
            tr = np.array([M.truth_ratio(c, p) for c, p in zip(avg, pert)])
        else:  # the paraphrased answer against the perturbed ones
            para_pairs = [(q, ex.paraphrased_answer or ex.answer) for q, ex in zip(qs, examples)]
            para = np.array([s.avg_loss for s in run.losses(para_pairs)])
            prob = M.probability(avg)
            tr = np.array([M.truth_ratio(c, p) for c, p in zip(para, pert)])
        df["prob"] = prob
        df["truth_ratio"] = tr
        out["prob"] = float(np.mean(prob))
        out["truth ratio"] = M.truth_ratio_forget(tr) if name == "forget" else M.truth_ratio_retain(tr)
        raw["truth_ratio"] = tr
    else:
        out["prob"] = float(np.mean(M.probability(avg)))
    if name == "forget":
        out["ES"] = float(es.mean())
        out["EM"] = float(np.mean(em[~np.isnan(em)])) if (~np.isnan(em)).any() else float("nan")
    return out, df, raw


def qa_prompts(examples: tuple, paraphrased: bool = False) -> tuple[list[str], list[str]]:
    """(the questions `qa_set` asks, their gold answers): for `ModelScorer.answer_ahead`."""
    return ([ex.paraphrased_question if paraphrased else ex.question for ex in examples],
            [ex.answer for ex in examples])


def attack_raw(run: ModelScorer, scores) -> dict[str, np.ndarray]:
    """Each membership attack's per-example scores (`grom.eval.mia.attack_scores`), zlib's
    text being the labelled tokens decoded as OpenUnlearning decodes them."""
    texts = [run.tok.decode(s.labels.tolist(), skip_special_tokens=True) for s in scores]
    return mia.attack_scores(scores, texts)


def attack_aucs(row: Row) -> None:
    """Each attack's AUC, forget against holdout, where the row has both sides' scores."""
    for attack, column in MIA_COLUMNS.items():
        f, h = row.raw.get(f"forget/{attack}"), row.raw.get(f"holdout/{attack}")
        if f is not None and h is not None:
            row.metrics[column] = mia.mia_auc(f, h)


def reference_attack(rows: dict[str, Row]) -> None:
    """The Reference attack's AUC of every row but the reference: its per-text mean NLL
    minus the retain model's (`grom.eval.mia.reference_score`), forget against holdout."""
    ref = rows.get(REFERENCE)
    if ref is None or "forget/loss" not in ref.raw or "holdout/loss" not in ref.raw:
        return
    for name, row in rows.items():
        if name == REFERENCE or "forget/loss" not in row.raw or "holdout/loss" not in row.raw:
            continue
        row.raw["forget/reference"] = row.raw["forget/loss"] - ref.raw["forget/loss"]
        row.raw["holdout/reference"] = row.raw["holdout/loss"] - ref.raw["holdout/loss"]
        attack_aucs(row)
