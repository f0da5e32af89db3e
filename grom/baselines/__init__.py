"""Gradient unlearning baselines (GA, GradDiff, NPO, SimNPO, IDK-NLL, IDK-DPO, UNDIAL, WGA,
SatImp, CE-U, PDU, RMU, TaskVector, AltPO, RKLD, and any method registered in
`METHODS`), to compare GROM against.

`run_baseline(method, model, tokenizer, forget, retain, ...)` fine-tunes a model with the
method's loss and OpenUnlearning's recipe for the benchmark (grom.baselines.recipes) and returns the weight change as a `grom.Edit`
(its `method` and `info` say what made it), leaving the model as it was found. A method is
a row of `METHODS` (grom.baselines.methods: its label, needs and defaults, for a UI to
read) around a loss; the losses are pure functions in `grom.baselines.losses`.

The locate-then-edit editors (ROME, MEMIT, AlphaEdit, ZeroUnlearn) are no trained loss:
`run_editor(name, model, tokenizer, forget, retain, EditorConfig())` (grom.baselines.editing)
gives their edit as a `grom.Edit` from GROM's keys and retain covariance and one shared value
optimisation; they have their own registry, `EDITORS`.
"""
from grom.baselines.defaults import MODEL_DEFAULTS, StartingPoint, starting_point
from grom.baselines.editing import EDITORS, Editor, EditorConfig, get_editor, run_editor
from grom.baselines.losses import ga_loss, kl_to_reference, mean_nll, npo_loss, sequence_nll, simnpo_loss
from grom.baselines.methods import (METHODS, LossInputs, Method, UnknownMethod, get_method,
                                    register_method, unregister_method)
from grom.baselines import methods_more  # noqa: F401  (registers IDK-NLL, IDK-DPO, UNDIAL, WGA, SatImp, CE-U, PDU, RMU, TaskVector, AltPO, RKLD)
from grom.baselines.alternates import generate_alternates
from grom.baselines.idk import REFUSALS, idk_alternates
from grom.baselines.recipes import RECIPES, Recipe, chunk_texts, get_recipe, recipe_for_task
from grom.baselines.sequences import answer_nll, encode_sequences
from grom.baselines.train import BASELINES, Settings, run_baseline, train_in_place
from grom.baselines.values import ValueSettings

__all__ = [
    "BASELINES", "EDITORS", "REFUSALS", "generate_alternates", "idk_alternates", "Editor", "EditorConfig", "LossInputs", "METHODS", "MODEL_DEFAULTS", "Method", "RECIPES", "Recipe", "Settings",
    "StartingPoint", "UnknownMethod", "answer_nll", "chunk_texts", "encode_sequences", "ga_loss",
    "get_editor", "get_method", "get_recipe", "kl_to_reference", "mean_nll", "npo_loss", "recipe_for_task",
    "register_method", "run_baseline", "run_editor", "sequence_nll", "simnpo_loss", "starting_point",
    "train_in_place", "unregister_method", "ValueSettings",
]
