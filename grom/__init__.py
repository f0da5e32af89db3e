"""GROM: gradient-free rapid one-shot machine unlearning, as a library.

The public names: the math (`solve_update`, `ridge_mu`, `specificity_weights`,
`best_window`, `example_influence`, `example_influence_bruteforce`), the edit
(`EditConfig`, `PRESETS`, `demo_preset`, `run_edit`, `Edit`) and the layer scores (`LayerScores`,
`score_layers`).
"""
import grom.tasks  # noqa: F401 (registers the benchmarks and their tasks, which grom.data cannot import)
from grom.closed_form.config import PRESETS, EditConfig, demo_preset, preset
from grom.closed_form.directions import specificity_weights
from grom.closed_form.influence import example_influence, example_influence_bruteforce
from grom.closed_form.layer_scores import LayerScores, best_window, score_layers
from grom.closed_form.pipeline import run_edit
from grom.closed_form.solve import ridge_mu, solve_update
from grom.edit import Edit

__all__ = [
    "Edit", "EditConfig", "LayerScores", "PRESETS", "best_window", "demo_preset", "example_influence",
    "example_influence_bruteforce", "preset", "ridge_mu", "run_edit", "score_layers",
    "solve_update", "specificity_weights",
]
