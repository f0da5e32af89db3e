"""Every unlearning method, in one registry (grom.registry): GROM (grom.methods.grom,
closed-form), the trained methods (grom.methods.trained: GA, GradDiff, NPO, SimNPO,
IDK-NLL, IDK-DPO, UNDIAL, WGA, SatImp, CE-U, PDU, RMU, TaskVector, AltPO, RKLD) and the
locate-then-edit editors (grom.methods.editors: ROME, MEMIT, AlphaEdit, ZeroUnlearn) and
LUNAR (grom.methods.lunar, family "redirection": one down_proj refitted so the forget
activations move along a refusal direction); each method is a file that registers its row
when imported (was grom/baselines/).

A row (`MethodEntry`) says what data and model the method can run on (`can_run(model,
data)`: None or a `Reason`), its defaults fitted to a model (`defaults(model)`) and how to
run it (`run(model, tokenizer, forget, retain, settings) -> grom.Edit`):

    from grom.methods import ALL, get
    for name, entry in ALL.items():
        print(name, entry.family, entry.can_run(model, split) or "can run")
    edit = get("npo").run(model, tokenizer, split.forget, split.retain, RunSettings(epochs=5))

`METHODS` and `EDITORS` are the trained and editor families of it, as their own rows.
`run_baseline(method, model, tokenizer, forget, retain, RunSettings(...))` fine-tunes with
a trained method's loss and OpenUnlearning's recipe for the benchmark
(grom.methods.trained.recipes) and returns the weight change as a `grom.Edit` (its
`method` and `info` say what made it), leaving the model as it was found; a trained
method is a `Method` row around a loss (grom.methods.trained.method), the losses pure
functions in grom.methods.trained.losses. `run_editor(name, model, tokenizer, forget,
retain, EditorConfig())` (grom.methods.editors.locate_then_edit) gives an editor's edit
from GROM's keys and retain covariance and one shared value optimisation.
"""
# every method's module registers its row when imported; its place in every list is its row's `order`
from grom.methods import editors as _editors  # noqa: F401  (registers ROME, MEMIT, AlphaEdit, ZeroUnlearn)
from grom.methods import grom as _grom  # noqa: F401  (registers GROM first)
from grom.methods import lunar as _lunar  # noqa: F401  (registers LUNAR, after the editors)
from grom.methods.editors.locate_then_edit import (
                                   EDITORS,
                                   EditorConfig,
                                   EditorMethod,
                                   editor_band,
                                   editor_reason,
                                   get_editor,
                                   register_editor,
                                   run_editor,
)
from grom.methods.editors.value_optimisation import ValueSettings
from grom.methods.lunar import LunarConfig, run_lunar
from grom.methods.trained import BASELINES
from grom.methods.trained.alternates import generate_alternates
from grom.methods.trained.idk import IDK_ANSWERS, idk_alternates
from grom.methods.trained.losses import ga_loss, kl_to_reference, mean_nll, npo_loss, sequence_nll, simnpo_loss
from grom.methods.trained.method import METHODS, LossInputs, Method, get_method, trainable_reason
from grom.methods.trained.recipes import RECIPES, Recipe, chunk_texts, get_recipe, recipe_for_task
from grom.methods.trained.register import register_method, unregister_method
from grom.methods.trained.sequences import answer_nll, encode_sequences
from grom.methods.trained.settings import RunSettings, Settings, resolve_settings
from grom.methods.trained.starting_points import MODEL_DEFAULTS, StartingPoint, starting_point
from grom.methods.trained.trained_edit import run_baseline, train_in_place
from grom.registry import (
                                   ALL,
                                   FAMILIES,
                                   BadSetting,
                                   Box,
                                   MethodEntry,
                                   Reason,
                                   UnknownMethod,
                                   can_run,
                                   family_of,
                                   get,
                                   names,
                                   register,
                                   unregister,
)

__all__ = [
    "ALL", "BASELINES", "EDITORS", "FAMILIES", "IDK_ANSWERS", "METHODS", "MODEL_DEFAULTS", "RECIPES", "BadSetting",
    "Box", "EditorConfig", "EditorMethod", "LossInputs", "LunarConfig", "Method", "MethodEntry", "Reason", "Recipe",
    "RunSettings", "Settings", "StartingPoint", "UnknownMethod", "ValueSettings", "answer_nll", "can_run",
    "chunk_texts", "editor_band", "editor_reason", "encode_sequences", "family_of", "ga_loss", "generate_alternates",
    "get", "get_editor", "get_method", "get_recipe", "idk_alternates", "kl_to_reference", "mean_nll", "names",
    "npo_loss", "recipe_for_task", "register", "register_editor", "register_method", "resolve_settings", "run_baseline",
    "run_editor", "run_lunar", "sequence_nll", "simnpo_loss", "starting_point", "train_in_place",
    "trainable_reason", "unregister", "unregister_method",
]
