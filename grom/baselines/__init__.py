"""Gradient unlearning baselines (GA, GradDiff, NPO, SimNPO, and any method registered in
`METHODS`), to compare GROM against.

`run_baseline(method, model, tokenizer, forget, retain, ...)` fine-tunes a model with the
method's loss and OpenUnlearning's recipe and returns the weight change as a `grom.Edit`
(its `method` and `info` say what made it), leaving the model as it was found. A method is
a row of `METHODS` (grom.baselines.methods: its label, needs and defaults, for a UI to
read) around a loss; the losses are pure functions in `grom.baselines.losses`.
"""
from grom.baselines.losses import ga_loss, mean_nll, npo_loss, sequence_nll, simnpo_loss
from grom.baselines.methods import (METHODS, LossInputs, Method, UnknownMethod, get_method,
                                    register_method, unregister_method)
from grom.baselines.sequences import answer_nll, encode_sequences
from grom.baselines.train import BASELINES, Settings, run_baseline, train_in_place

__all__ = [
    "BASELINES", "LossInputs", "METHODS", "Method", "Settings", "UnknownMethod", "answer_nll",
    "encode_sequences", "ga_loss", "get_method", "mean_nll", "npo_loss", "register_method",
    "run_baseline", "sequence_nll", "simnpo_loss", "train_in_place", "unregister_method",
]
