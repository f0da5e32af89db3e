"""The metric citations table (was grom/eval/sources.py): which implementation each reported
metric follows, so a researcher knows what a number can be compared with: one table,
`METRIC_SOURCES`, read by the app's glossary and checked by the tests against every metric
name a report produces.

A report's metric names are "<set> <measure>" ("Forget ROUGE-L", "Real authors prob",
"Neighbour fact recall") or a name of their own ("Model utility", "MIA AUC (zlib)");
`metric_source` looks the full name up first, then the measure after a set label.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["IMPLEMENTATIONS", "METRIC_SOURCES", "MetricSource", "SET_LABELS", "metric_source"]

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


@dataclass(frozen=True)
class MetricSource:
    """Where one metric comes from."""

    implementation: str
    """A key of `IMPLEMENTATIONS`."""
    follows: str
    """The upstream function (or our own definition) it computes."""
    deviation: str = ""
    """Where the project deliberately differs, and why (empty: none)."""


def _ou(follows: str, deviation: str = "") -> MetricSource:
    return MetricSource(OPENUNLEARNING, follows, deviation)


def _ours(follows: str) -> MetricSource:
    return MetricSource(OURS, follows)


METRIC_SOURCES: dict[str, MetricSource] = {
    # TOFU (and the custom / real-knowledge sets that reuse its measures)
    "ROUGE-L": _ou("memorization.rouge, rougeL_recall of the greedy answer"),
    "prob": _ou("memorization.probability (exp of the mean token NLL, EOS included); "
                "probability_w_options on Real authors / World facts"),
    "truth ratio": _ou("memorization.truth_ratio: closer_to_1_better on forget, true_better elsewhere"),
    "truth ratio closeness": _ou("memorization.truth_ratio, closer_to_1_better",
                                 "on the real-knowledge benchmark: the answer against its bundled wrong answers"),
    "para-Q quality": _ou("privacy.ks_test on the paraphrased questions' forget truth ratios"),
    "ES": _ou("memorization.extraction_strength (EOS dropped, k over range(n))"),
    "EM": _ou("memorization.exact_memorization (EOS dropped)"),
    "Model utility": _ou("utility.hm_aggregate of the retain, Real authors and World facts values"),
    "Forget quality": _ou("privacy.ks_test on the forget truth ratios against the retain model's"),
    "MIA AUC": _ou("mia_min_k (k = 0.4, EOS dropped), mia/utils.mia_auc: forget 0, holdout 1"),
    "MIA AUC (Min-K++)": _ou("mia_min_k_plus_plus (k = 0.4, EOS dropped)"),
    "MIA AUC (LOSS)": _ou("mia_loss (mean token NLL, EOS included)"),
    "MIA AUC (zlib)": _ou("mia_zlib (mean token NLL / zlib length of the decoded labels)"),
    "MIA AUC (Reference)": _ou("mia_reference", "the reference model is the report's retain model"),
    "Privacy leakage": _ou("privacy.privleak on the Min-K AUC (MUSE's PrivLeak in OpenUnlearning's "
                           "AUC convention), against the retain model's AUC, else 0.5"),
    # MUSE
    "VerbMem forget": _ou("MUSE forget_verbmem_ROUGE: rougeL_f1 of the continuation"),
    "KnowMem forget": _ou("MUSE forget_knowmem_ROUGE: rougeL_f1 of the few-shot answer"),
    "KnowMem retain": _ou("MUSE retain_knowmem_ROUGE: rougeL_f1 of the few-shot answer"),
    # WMDP / MMLU
    "accuracy": MetricSource(HARNESS, "multiple-choice accuracy, the answer letter's log-likelihood"),
    # zsRE
    "Efficacy": MetricSource(MEMIT, "rewrite_prompts_correct: the answer's token accuracy on its prompt"),
    "Generalisation": MetricSource(MEMIT, "paraphrase_prompts_correct: the same on a rephrased prompt"),
    "Specificity": MetricSource(MEMIT, "neighborhood_prompts_correct: a neighbour's answer, kept"),
    # our own measures
    "fact recall": _ours("fact_recall: the fact's words in the greedy answer (real knowledge: "
                         "over the facts the unedited model stated)"),
    "paraphrase recall": _ours("fact recall on the question in other words"),
    "facts known": _ours("how many facts the unedited model stated"),
    "repetition": _ours("repetition_rate: the share of repeated word triples"),
    "answer perplexity": _ours("the unedited model's perplexity of the new answers"),
    "degenerate": _ours("answer_class 'degenerate': loops, punctuation, noise"),
    "refusal": _ours("answer_class 'refusal'"),
    "fluent other": _ours("answer_class 'fluent': another fluent answer"),
    "clean forgetting": _ours("refusal + fluent other"),
    "Knowledge score": _ours("knowledge_score: harmonic mean of clean forgetting and kept facts"),
    "text loss": _ours("mean token NLL of the set's raw texts"),
    "Text perplexity": _ours("perplexity of neutral texts"),
    "Retain cost": _ours("the largest relative drop of a retain metric against the unedited model"),
    "Retain broken": _ours("Retain cost above a tenth"),
    "Final score": MetricSource(PAPER, "tofu_final_score / muse_final_score / wmdp_final_score"),
}
"""The one table: a metric name, or the measure after a set label, -> its source."""

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
    raise KeyError(f"no source for the metric {metric!r}: add it (or its measure) to "
                   "grom.eval.metric_sources.METRIC_SOURCES")
