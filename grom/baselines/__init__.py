"""Gradient unlearning baselines (GA, GradDiff, NPO, SimNPO), to compare GROM against.

`run_baseline(method, model, tokenizer, forget, retain, ...)` fine-tunes a model with
OpenUnlearning's losses and recipe and returns the weight change as a `grom.Edit` (its
`method` and `info` say what made it), leaving the model as it was found. The losses are
pure functions in `grom.baselines.losses`.
"""
from grom.baselines.losses import ga_loss, mean_nll, npo_loss, sequence_nll, simnpo_loss
from grom.baselines.train import (BASELINES, DEFAULTS, Settings, answer_nll, encode_sequences,
                                  run_baseline, train_in_place)

__all__ = [
    "BASELINES", "DEFAULTS", "Settings", "answer_nll", "encode_sequences", "ga_loss", "mean_nll",
    "npo_loss", "run_baseline", "sequence_nll", "simnpo_loss", "train_in_place",
]
