"""A TOFU evaluation in OpenUnlearning's log format, written and read back, so a studio run
can be set beside an OpenUnlearning log or its leaderboard.

OpenUnlearning (locuslab/open-unlearning at commit `OU_COMMIT`) saves an evaluation as
``<output_dir>/TOFU_EVAL.json`` and ``TOFU_SUMMARY.json`` (``src/evals/base.py``:
``Evaluator.get_logs_file_path``, ``save_logs``, ``summarize``; the name is
``TOFUEvaluator``'s, ``src/evals/tofu.py``):

- TOFU_EVAL.json: ``{metric: result}``, sorted by metric, indented by 4; every metric
  computed, the pre-computed ones a metric depends on included (``UnlearningMetric.evaluate``
  puts each into the same cache). A result is ``{"agg_value": x, "value_by_index": {"<i>":
  {...}}}`` keyed by the example's index in its dataset (``QADataset`` adds it), the inner
  keys those of the function that scored it (``src/evals/metrics/``): ``probability``
  ``{"prob", "avg_loss"}``, ``probability_w_options`` ``{"prob"}``, ``rouge``
  ``{"rouge1_recall", "rougeL_f1", "rougeL_recall", "input", "ground_truth",
  "generation"}``, ``truth_ratio``, ``extraction_strength``, ``exact_memorization``
  ``{"score"}``; a membership attack (``mia/utils.mia_auc``) ``{"forget": {"agg_value",
  "value_by_index"}, "holdout": {...}, "auc", "agg_value"}``; ``ks_test`` (forget_quality),
  ``privleak`` and ``hm_aggregate`` (model_utility) only ``{"agg_value"}``.
- TOFU_SUMMARY.json: ``{metric: agg_value}`` of the metrics the evaluation was configured
  with (not their pre-computes), those whose value is not None.

Forget quality (``privacy.ks_test``) is the KS-test p-value between this model's
forget_truth_ratio values and those of a retain model's TOFU_EVAL.json
(``retain_logs_path``); without one upstream writes ``{"agg_value": null}``. Privleak
(``privacy.privleak``) reads the retain log's mia_min_k AUC, else 0.5.

What is exported (`STUDIO_NAMES`: the studio's metric of each key), only metrics whose
definition is upstream's (``grom.eval.metric_sources`` names the function each follows):

    forget_Q_A_Prob, forget_Q_A_ROUGE, forget_truth_ratio, extraction_strength,
    exact_memorization, forget_quality, privleak, model_utility; the pre-computes
    retain_Q_A_Prob, retain_Q_A_ROUGE, retain_Truth_Ratio, ra_/wf_Q_A_Prob_normalised,
    ra_/wf_Q_A_ROUGE, ra_/wf_Truth_Ratio; mia_min_k, mia_min_k_plus_plus, mia_loss,
    mia_zlib and mia_reference (the reference model being the report's retain model).

Not exported: fact recall, repetition, Final score, Retain cost (the studio's own, no
upstream key); the "para-Q" metrics (upstream runs them as a second evaluation,
``question_key: paraphrased_question``, into a log of its own); the paraphrased and
perturbed answers' probabilities (forget_Q_A_PARA_Prob, forget_Q_A_PERT_Prob, ra_Q_A_Prob,
ra_Q_A_PERT_Prob ...: the studio keeps their truth ratio and normalised probability, not
each probability); mia_gradnorm and forget_Q_A_gibberish (the studio does not compute
them). Two inner values are not the studio's numbers but computed here from its answers
the way upstream computes them: rouge1_recall and rougeL_f1 (rouge_score, stemmed, as
``eval_text_similarity``). The ROUGE ``input`` is the question, not the prompt upstream
decodes (its chat template applied); ``ground_truth`` is the answer.

Indices: with the `benchmark` the report evaluated, each example's position in that
benchmark's set (for TOFU, the row in the Hub split, as upstream indexes it; a report on
`max_examples` holds the evenly spread subset `grom.eval.results.subset` took); without
it, the position among the evaluated examples.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grom.eval import metrics as M
from grom.eval import mia
from grom.eval.results import EDITED, REFERENCE, Report, subset
from grom.eval.shared_rows import MIA_COLUMNS
from grom.eval.upstream import OU_COMMIT

__all__ = ["EVAL_FILE", "SUMMARY_FILE", "STUDIO_NAMES", "SUMMARY_METRICS", "OU_COMMIT", "OpenUnlearningLog",
           "ks_test", "read_openunlearning", "summarize", "to_openunlearning", "write_openunlearning"]

EVAL_FILE, SUMMARY_FILE = "TOFU_EVAL.json", "TOFU_SUMMARY.json"
"""The files' names: ``f"{evaluator.name}_EVAL.json"``, ``..._SUMMARY.json``, name "TOFU"."""

SUMMARY_METRICS = ("forget_truth_ratio", "forget_quality", "forget_Q_A_Prob", "forget_Q_A_ROUGE", "model_utility",
                   "privleak", "extraction_strength", "exact_memorization", "mia_min_k_plus_plus", "mia_min_k",
                   "mia_loss", "mia_zlib", "mia_reference")
"""The metrics the studio's evaluation is configured with, in upstream's terms: those of
``configs/eval/tofu.yaml`` and the ones it lists commented out that the studio computes
too; the summary holds these (``Evaluator.summarize``), the log their pre-computes as well."""

_SETS = {"forget": "forget", "retain": "retain", "real_authors": "ra", "world_facts": "wf"}
_MIA = {"min_k": "mia_min_k", "min_k++": "mia_min_k_plus_plus", "loss": "mia_loss", "zlib": "mia_zlib",
        "reference": "mia_reference"}
_UTILITY = tuple(f"{p}_{m}" for p in ("retain", "ra", "wf")
                 for m in (("Q_A_Prob" if p == "retain" else "Q_A_Prob_normalised"), "Q_A_ROUGE", "Truth_Ratio"))
"""model_utility's pre-computes (``configs/eval/tofu_metrics/model_utility.yaml``)."""

STUDIO_NAMES = {
    "forget_Q_A_Prob": "Forget prob", "forget_Q_A_ROUGE": "Forget ROUGE-L", "forget_truth_ratio": "Forget truth ratio",
    "extraction_strength": "Forget ES", "exact_memorization": "Forget EM", "forget_quality": "Forget quality",
    "privleak": "Privacy leakage", "model_utility": "Model utility",
    "retain_Q_A_Prob": "Retain prob", "retain_Q_A_ROUGE": "Retain ROUGE-L", "retain_Truth_Ratio": "Retain truth ratio",
    "ra_Q_A_Prob_normalised": "Real authors prob", "ra_Q_A_ROUGE": "Real authors ROUGE-L",
    "ra_Truth_Ratio": "Real authors truth ratio", "wf_Q_A_Prob_normalised": "World facts prob",
    "wf_Q_A_ROUGE": "World facts ROUGE-L", "wf_Truth_Ratio": "World facts truth ratio",
    **{key: MIA_COLUMNS[attack] for attack, key in _MIA.items()},
}
"""Each exported upstream key -> the studio's metric with the same definition."""

_VALUE_KEY = {"Q_A_Prob": "prob", "Q_A_Prob_normalised": "prob", "Q_A_ROUGE": "rougeL_recall"}


def _value_key(metric: str) -> str:
    """The inner key of a metric's headline per-example value: prob, rougeL_recall or score."""
    for suffix, key in _VALUE_KEY.items():
        if metric.endswith("_" + suffix):
            return key
    return "score"


def _num(x):
    """A JSON number: a Python float, NaN / inf (and None) as null, as upstream writes None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _mean(values) -> float | None:
    """np.mean of the values that are not None (upstream's filter), None when there are none."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _result(values: dict[str, dict], agg) -> dict:
    return {"agg_value": _num(agg), "value_by_index": values}


# ---------------------------------------------------------------- upstream's aggregates, transcribed

def ks_test(forget: dict, retain: dict | None) -> dict:
    """``privacy.ks_test``: ``{"agg_value": ks_2samp(forget TRs, retain TRs).pvalue}``, each
    side the ``score`` of every index of a forget_truth_ratio result; None without `retain`."""
    if retain is None:
        return {"agg_value": None}
    from scipy.stats import ks_2samp

    f = np.array([v["score"] for v in forget["value_by_index"].values()])
    r = np.array([v["score"] for v in retain["value_by_index"].values()])
    return {"agg_value": _num(ks_2samp(f, r).pvalue)}


def _privleak(forget_auc: float, retain_auc: float | None) -> dict:
    """``privacy.privleak`` on mia_min_k: against the retain log's AUC, else ``ref_value`` 0.5."""
    return {"agg_value": _num(mia.privacy_leakage(forget_auc, 0.5 if retain_auc is None else retain_auc))}


# ---------------------------------------------------------------- the studio's report -> upstream's log

def _indices(n: int, total: int | None) -> list[str]:
    """The indices of `n` evaluated examples of a set of `total` (None: n): the positions
    `subset` picks, as strings (json.dump writes upstream's int keys so)."""
    total = n if total is None else total
    if total < n:
        raise ValueError(f"{n} evaluated examples but the benchmark's set has {total}: not this benchmark's report")
    return [str(i) for i in subset(range(total), n)]


def _rouge_values(df, index: list[str]) -> dict[str, dict]:
    from rouge_score import rouge_scorer  # eval_text_similarity's scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    out = {}
    for i, q, a, g, r in zip(index, df["question"], df["answer"], df["generation"], df["rougeL_recall"]):
        s = scorer.score(a, g)
        out[i] = {"rouge1_recall": float(s["rouge1"].recall), "rougeL_f1": float(s["rougeL"].fmeasure),
                  "rougeL_recall": float(r), "input": q, "ground_truth": a, "generation": g}
    return out


TRUTH_RATIO_AGGREGATORS = ("closer_to_1_better", "prob_mean")
"""forget_truth_ratio's aggregator (upstream's configs/eval/tofu_metrics/forget_Truth_Ratio.yaml):
``closer_to_1_better``, upstream's default, each question's wrong/correct ratio scored by its
distance from 1; ``prob_mean`` (#163), each question's correct / (correct + wrong), averaged."""


def _qa_logs(prefix: str, df, index: list[str], truth_ratio: str = "closer_to_1_better") -> dict[str, dict]:
    """One QA set's results from its per-example frame (the columns it has); the forget set's
    truth ratio with the `truth_ratio` aggregator."""
    logs = {}
    forget = prefix == "forget"
    if "prob" in df:
        prob = [float(p) for p in df["prob"]]
        if prefix in ("ra", "wf"):  # probability_w_options: the answer among its perturbations
            logs[f"{prefix}_Q_A_Prob_normalised"] = _result({i: {"prob": p} for i, p in zip(index, prob)},
                                                            np.mean(prob))
        else:  # probability: exp(-avg_loss), the loss given back
            logs[f"{prefix}_Q_A_Prob"] = _result({i: {"prob": p, "avg_loss": -math.log(p) if p > 0 else None}
                                                  for i, p in zip(index, prob)}, np.mean(prob))
    if "generation" in df and "rougeL_recall" in df:
        logs[f"{prefix}_Q_A_ROUGE"] = _result(_rouge_values(df, index), np.mean(df["rougeL_recall"]))
    if "truth_ratio" in df:
        tr = np.asarray(df["truth_ratio"], dtype=float)
        agg = M.truth_ratio_forget(tr) if forget else M.truth_ratio_retain(tr)  # closer_to_1_better / true_better
        if forget and truth_ratio == "prob_mean":  # upstream scores each index by its share too
            tr, agg = M.truth_ratio_probs(tr), M.truth_ratio_prob_mean(tr)
        logs["forget_truth_ratio" if forget else f"{prefix}_Truth_Ratio"] = _result(
            {i: {"score": float(v)} for i, v in zip(index, tr)}, agg)
    for column, key in (("es", "extraction_strength"), ("em", "exact_memorization")):
        if forget and column in df:
            values = {i: {"score": _num(v)} for i, v in zip(index, df[column])}
            logs[key] = _result(values, _mean(v["score"] for v in values.values()))
    return logs


def _mia_logs(raw: dict, index: dict[str, list[str]]) -> dict[str, dict]:
    """``mia_auc``'s result of each attack whose forget and holdout scores the row has."""
    logs = {}
    for attack, key in _MIA.items():
        f, h = raw.get(f"forget/{attack}"), raw.get(f"holdout/{attack}")
        if f is None or h is None:
            continue
        side = {name: {"agg_value": float(np.mean(s)),
                       "value_by_index": {i: {"score": float(v)} for i, v in zip(index[name], s)}}
                for name, s in (("forget", f), ("holdout", h))}
        auc = mia.mia_auc(f, h)
        logs[key] = {**side, "auc": auc, "agg_value": auc}
    return logs


def _set_sizes(benchmark) -> dict[str, int]:
    if benchmark is None:
        return {}
    sets = dict(benchmark.eval_sets) or {"forget": benchmark.forget, "retain": benchmark.retain}
    return {k: len(v) for k, v in sets.items()}


def _check_questions(df, name: str, index: list[str], benchmark) -> None:
    """The frame's questions are the benchmark's at those indices (else its indices would lie)."""
    if benchmark is None or "question" not in df:
        return
    sets = dict(benchmark.eval_sets) or {"forget": benchmark.forget, "retain": benchmark.retain}
    for i, q in zip(index, df["question"]):
        if getattr(sets[name][int(i)], "question", q) != q:
            raise ValueError(f"the report's {name} example {i} is not the benchmark's: give the benchmark the "
                             "report evaluated (its split and files)")


def _row_logs(report: Report, row: str, benchmark, truth_ratio: str = "closer_to_1_better") -> dict[str, dict]:
    """Every result of one row but forget_quality and privleak (they need a retain log)."""
    if report.task != "tofu":
        raise ValueError(f"OpenUnlearning's TOFU log holds a TOFU evaluation (TOFU or the demo world), not the "
                         f"{report.task!r} task's")
    if row not in report.rows:
        raise KeyError(f"no row {row!r}; rows: {', '.join(report.rows)}")
    r, sizes = report.rows[row], _set_sizes(benchmark)
    logs: dict[str, dict] = {}
    for name, prefix in _SETS.items():
        df = r.examples.get(name)
        if df is None:
            continue
        index = _indices(len(df), sizes.get(name))
        _check_questions(df, name, index, benchmark)
        logs.update(_qa_logs(prefix, df, index, truth_ratio))
    if "forget/min_k" in r.raw and "holdout/min_k" in r.raw:
        logs.update(_mia_logs(r.raw, {name: _indices(len(r.raw[f"{name}/min_k"]), sizes.get(name))
                                      for name in ("forget", "holdout")}))
    if all(k in logs for k in _UTILITY):  # hm_aggregate of the nine (scipy.stats.hmean)
        logs["model_utility"] = {"agg_value": M.model_utility([max(0.0, logs[k]["agg_value"]) for k in _UTILITY])}
    return logs


def to_openunlearning(report: Report, row: str = EDITED, *, benchmark=None,
                      retain_logs: dict | str | Path | None = None, truth_ratio: str = "closer_to_1_better") -> dict:
    """The TOFU_EVAL.json of `row` of a TOFU-task report (see the module's docstring for
    which metrics): ``{metric: {"agg_value": ..., "value_by_index": {"<i>": {...}}}}``,
    sorted by metric as upstream saves it.

    benchmark: the Benchmark the report evaluated, for the examples' indices in its sets.
    retain_logs: a retain model's TOFU_EVAL.json (a path, or the dict) for forget_quality
    and privleak, as upstream's ``retain_logs_path``; None: the report's "Retain model" row
    (its log built here), else none (forget_quality null, privleak against 0.5).
    truth_ratio: forget_truth_ratio's aggregator (`TRUTH_RATIO_AGGREGATORS`); forget_quality's
    KS test compares its per-question scores with the retain log's, which must have been
    written with the same one (a log built here is)."""
    if truth_ratio not in TRUTH_RATIO_AGGREGATORS:
        raise ValueError(f"truth_ratio={truth_ratio!r}: use one of {', '.join(TRUTH_RATIO_AGGREGATORS)}")
    logs = _row_logs(report, row, benchmark, truth_ratio)
    if isinstance(retain_logs, (str, Path)):
        retain_logs = read_openunlearning(retain_logs).logs
    if retain_logs is None and REFERENCE in report.rows:
        retain_logs = logs if row == REFERENCE else _row_logs(report, REFERENCE, benchmark, truth_ratio)
    retain_logs = retain_logs or {}
    if "forget_truth_ratio" in logs:
        logs["forget_quality"] = ks_test(logs["forget_truth_ratio"], retain_logs.get("forget_truth_ratio"))
    if "mia_min_k" in logs:
        ref = (retain_logs.get("mia_min_k") or {}).get("agg_value")
        logs["privleak"] = _privleak(logs["mia_min_k"]["agg_value"], ref)
    return dict(sorted(logs.items()))


def summarize(logs: dict) -> dict:
    """``Evaluator.summarize``: ``{metric: agg_value}`` of the configured metrics
    (`SUMMARY_METRICS`) whose agg_value is not None."""
    return {k: v["agg_value"] for k, v in logs.items()
            if k in SUMMARY_METRICS and isinstance(v, dict) and v.get("agg_value") is not None}


def write_openunlearning(report: Report, folder: str | Path, row: str = EDITED, *, benchmark=None,
                         retain_logs: dict | str | Path | None = None,
                         truth_ratio: str = "closer_to_1_better") -> tuple[Path, Path]:
    """Write `row`'s TOFU_EVAL.json and TOFU_SUMMARY.json into `folder` (made if missing),
    as ``Evaluator.save_logs`` writes them (``json.dump(..., indent=4)``). Returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    logs = to_openunlearning(report, row, benchmark=benchmark, retain_logs=retain_logs, truth_ratio=truth_ratio)
    paths = folder / EVAL_FILE, folder / SUMMARY_FILE
    for path, doc in zip(paths, (logs, dict(sorted(summarize(logs).items())))):
        path.write_text(json.dumps(doc, indent=4, allow_nan=False), encoding="utf-8")
    return paths


# ---------------------------------------------------------------- upstream's log -> the studio

@dataclass
class OpenUnlearningLog:
    """An OpenUnlearning evaluation log (ours or upstream's), read back."""

    logs: dict
    """The file's results as written: ``{metric: {"agg_value", "value_by_index", ...}}``."""
    path: Path | None = None
    summary: dict = field(init=False)
    """``{metric: agg_value}`` of every result that has a number (not only the configured
    ones: a log does not say which were)."""

    def __post_init__(self):
        self.summary = {k: v["agg_value"] for k, v in self.logs.items()
                        if isinstance(v, dict) and isinstance(v.get("agg_value"), (int, float))}

    def values(self, metric: str, key: str | None = None, side: str = "forget") -> dict[str, object]:
        """``{index: value}`` of a metric's per-example results: `key` of each (default
        prob, rougeL_recall or score, as the metric holds); a membership attack's `side`
        (forget or holdout). A multi-answer metric's value is upstream's list."""
        if metric not in self.logs:
            raise KeyError(f"no {metric!r} in this log; it holds: {', '.join(sorted(self.logs))}")
        result = self.logs[metric]
        if side in result and "value_by_index" not in result:
            result = result[side]
        if "value_by_index" not in result:
            raise KeyError(f"{metric!r} has an aggregate only, no per-example values")
        key = key or _value_key(metric)
        return {i: (v or {}).get(key) for i, v in result["value_by_index"].items()}

    def forget_quality(self, retain: OpenUnlearningLog | str | Path) -> float | None:
        """Forget quality against a retain model's log, as ``privacy.ks_test`` computes it
        from ``retain_logs_path``: the KS-test p-value of the two forget_truth_ratio samples."""
        if not isinstance(retain, OpenUnlearningLog):
            retain = read_openunlearning(retain)
        for log in (self, retain):
            if "forget_truth_ratio" not in log.logs:
                raise KeyError(f"{log.path or 'a log'} holds no forget_truth_ratio values")
        return ks_test(self.logs["forget_truth_ratio"], retain.logs["forget_truth_ratio"])["agg_value"]

    def studio_metrics(self) -> dict[str, float]:
        """The aggregates under the studio's metric names (`STUDIO_NAMES`), to set beside a
        report's row; keys the studio has no metric for are left out."""
        return {STUDIO_NAMES[k]: float(v) for k, v in self.summary.items() if k in STUDIO_NAMES}


def read_openunlearning(path: str | Path) -> OpenUnlearningLog:
    """Read a TOFU_EVAL.json (or the folder holding one). A TOFU_SUMMARY.json reads too,
    its numbers as aggregates without per-example values."""
    path = Path(path)
    if path.is_dir():
        path = path / EVAL_FILE
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not an OpenUnlearning log: a JSON object of metrics was expected")
    logs = {k: v if isinstance(v, dict) else {"agg_value": v} for k, v in doc.items()}
    return OpenUnlearningLog(logs, path)
