"""The metric citations (was grom/eval/sources.py): which implementation each reported metric
follows, so a researcher knows what a number can be compared with. Each is stated once: the
measures several tasks report here (`SHARED_SOURCES`), a metric only one task reports in its
task's `sources` (grom/tasks/<name>.py); `METRIC_SOURCES` reads them as one table, which the
app's glossary reads and the tests check against every metric name a report produces.

A report's metric names are "<set> <measure>" ("Forget ROUGE-L", "Real authors prob",
"Neighbour fact recall") or a name of their own ("Model utility", "MIA AUC (zlib)");
`metric_source` looks the full name up first, then the measure after a set label.
"""
from __future__ import annotations

from collections.abc import Mapping

from grom.eval.tasks import MetricSource, joined

__all__ = ["HARNESS", "IMPLEMENTATIONS", "MEMIT", "METRIC_SOURCES", "MetricSource", "OPENUNLEARNING", "OURS",
           "PAPER", "SET_LABELS", "SHARED_SOURCES", "metric_source", "ours", "upstream"]

OPENUNLEARNING, HARNESS, MEMIT, PAPER, OURS = (
    "OpenUnlearning", "lm-evaluation-harness", "MEMIT", "GROM paper", "GROM Studio")
IMPLEMENTATIONS = {
    OPENUNLEARNING: "locuslab/open-unlearning, src/evals/metrics/ (commit d3d7cf9e, Dec 2025); its "
                    "MUSE metrics re-implement jaechan-repo/muse_bench",
    HARNESS: "EleutherAI/lm-evaluation-harness, tasks wmdp and mmlu",
    MEMIT: "kmeng01/memit, experiments/py/eval_utils_zsre.py and experiments/summarize.py",
    PAPER: "the GROM paper's final scores, built from the metrics above",
    OURS: "this project's own metric: no upstream value to compare with",
}
"""Each implementation a metric can follow, with where its code lives."""


def upstream(follows: str, deviation: str = "") -> MetricSource:
    """A metric that follows OpenUnlearning's function `follows`."""
    return MetricSource(OPENUNLEARNING, follows, deviation)


def ours(follows: str) -> MetricSource:
    """A metric of this project's own (`follows`: its definition)."""
    return MetricSource(OURS, follows)



SHARED_SOURCES: dict[str, MetricSource] = {
    # TOFU's measures, which the custom and real-knowledge sets and MUSE report too
    "ROUGE-L": upstream("memorization.rouge, rougeL_recall of the greedy answer"),
    "prob": upstream("memorization.probability (exp of the mean token NLL, EOS included); "
                     "probability_w_options on Real authors / World facts"),
    "truth ratio": upstream("memorization.truth_ratio: closer_to_1_better on forget, true_better elsewhere"),
    "ES": upstream("memorization.extraction_strength (EOS dropped, k over range(n))"),
    "EM": upstream("memorization.exact_memorization (EOS dropped)"),
    "MIA AUC": upstream("mia_min_k (k = 0.4, EOS dropped), mia/utils.mia_auc: forget 0, holdout 1"),
    "MIA AUC (Min-K++)": upstream("mia_min_k_plus_plus (k = 0.4, EOS dropped)"),
    "MIA AUC (LOSS)": upstream("mia_loss (mean token NLL, EOS included)"),
    "MIA AUC (zlib)": upstream("mia_zlib (mean token NLL / zlib length of the decoded labels)"),
    "MIA AUC (Reference)": upstream("mia_reference", "the reference model is the report's retain model"),
    "Privacy leakage": upstream("privacy.privleak on the Min-K AUC (MUSE's PrivLeak in OpenUnlearning's "
                                "AUC convention), against the retain model's AUC, else 0.5"),
    # our own measures
    "fact recall": ours("fact_recall: the fact's words in the greedy answer (real knowledge: "
                        "over the facts the unedited model stated)"),
    "repetition": ours("repetition_rate: the share of repeated word triples"),
    "degenerate": ours("answer_class 'degenerate': loops, punctuation, noise"),
    "refusal": ours("answer_class 'refusal'"),
    "fluent other": ours("answer_class 'fluent': another fluent answer"),
    "Retain cost": ours("the largest relative drop of a retain metric against the unedited model"),
    "Retain broken": ours("Retain cost above a tenth"),
    "Final score": MetricSource(PAPER, "tofu_final_score / muse_final_score / wmdp_final_score"),
}
"""The measures several tasks report: a metric name, or the measure after a set label, -> its
source. A metric only one task reports is in that task's `sources`."""

METRIC_SOURCES: Mapping[str, MetricSource] = joined("sources", SHARED_SOURCES)
"""Every metric's source, the shared ones and every task's, read as one table."""

SET_LABELS = ("Forget", "Probe", "Retain", "Real authors", "World facts", "Neighbour", "General", "Kept",
              "Utility")
"""The set labels a report's metric names start with (longest match first is not needed:
no label is the start of another followed by a space)."""
PARA_Q = "para-Q"  # "Forget para-Q ROUGE-L": the measure with the paraphrased question asked


def metric_source(metric: str) -> MetricSource:
    """The source of a report's metric: its full name in `METRIC_SOURCES`, else the measure
    after its set label ("Real authors prob" -> "prob"). Unknown: KeyError naming it."""
    if metric in METRIC_SOURCES:
        return METRIC_SOURCES[metric]
    for label in SET_LABELS:
        measure = metric[len(label) + 1:] if metric.startswith(label + " ") else None
        if measure is not None and measure.startswith(PARA_Q + " ") and measure not in METRIC_SOURCES:
            measure = measure[len(PARA_Q) + 1:]  # TOFU's paraphrased-question evaluation: the same measure
        if measure in METRIC_SOURCES:
            return METRIC_SOURCES[measure]
    raise KeyError(f"no source for the metric {metric!r} in METRIC_SOURCES: add it (or its measure) to "
                   "the `sources` of the task that reports it, or to grom.eval.metric_sources.SHARED_SOURCES "
                   "where several tasks do")
