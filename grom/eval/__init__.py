"""Evaluation: the benchmarks' metrics as pure functions (`grom.eval.metrics`, the
membership attacks in `grom.eval.mia`, the implementation each follows in
`grom.eval.metric_sources`), the code that runs the model for them (`grom.eval.runner`),
the row pieces several tasks share (`grom.eval.shared_rows`), before/after reports
(`grom.eval.report`, `grom.eval.results`; each benchmark's task in grom/tasks/),
question-by-question comparisons (`grom.eval.generations`), the reuse of the layers below
an edit (`grom.eval.prefix`), the 4-bit quantization check (`grom.eval.quant_check`,
the quantization in `grom.eval.quant`) and a TOFU report in OpenUnlearning's log format
(`grom.eval.openunlearning`)."""
from grom.eval.generations import answer_probabilities, compare_generations
from grom.eval.metric_sources import METRIC_SOURCES, metric_source
from grom.eval.metrics import (
                               answer_class,
                               choice_accuracy,
                               exact_memorization,
                               extraction_strength,
                               fact_recall,
                               forget_quality,
                               knowledge_score,
                               mia_auc,
                               min_k_score,
                               model_utility,
                               muse_final_score,
                               normalised_probability,
                               privacy_leakage,
                               probability,
                               rouge_l_f1,
                               rouge_l_recall,
                               tofu_final_score,
                               token_accuracy,
                               truth_ratio,
                               truth_ratio_forget,
                               truth_ratio_retain,
                               wmdp_final_score,
)
from grom.eval.mia import min_k_plus_plus_score
from grom.eval.prefix import PrefixCache, first_changed_layer
from grom.eval.quant import nf4_quantize, quantized, rtn_quantize
from grom.eval.quant_check import quantization_check, quantization_verdict
from grom.eval.report import DIRECTION, Report, evaluate

__all__ = [
    "DIRECTION", "METRIC_SOURCES", "PrefixCache", "Report", "answer_class", "answer_probabilities",
    "choice_accuracy", "compare_generations", "evaluate", "exact_memorization", "extraction_strength",
    "fact_recall", "first_changed_layer", "forget_quality", "knowledge_score", "metric_source", "mia_auc",
    "min_k_plus_plus_score", "min_k_score", "model_utility", "muse_final_score", "nf4_quantize",
    "normalised_probability", "privacy_leakage", "probability", "quantization_check",
    "quantization_verdict", "quantized", "rouge_l_f1", "rouge_l_recall", "rtn_quantize", "token_accuracy",
    "tofu_final_score", "truth_ratio", "truth_ratio_forget", "truth_ratio_retain", "wmdp_final_score",
]
