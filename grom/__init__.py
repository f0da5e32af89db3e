"""GROM: gradient-free rapid one-shot machine unlearning, as a library.

The public names: the math (`solve_update`, `ridge_mu`, `specificity_weights`,
`best_window`, `example_influence`, `example_influence_bruteforce`), the edit
(`EditConfig`, `PRESETS`, `demo_preset`, `keyed_at`, `run_edit`, `Edit`) and the layer scores (`LayerScores`,
`score_layers`).

Each is imported on its first use (a module `__getattr__`, PEP 562, as PEFT loads its
optional backends), so that `import grom` and `python -m grom --help` load no torch
(seconds). The two registries are told here how to fill themselves: before its first read,
the benchmarks' (`grom.data.BENCHMARKS`) imports `grom.tasks`, and the methods'
(`grom.registry`) imports `grom.methods`, whose modules register their rows (and import
their registry, which therefore cannot import them itself).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from grom import registry
from grom.data.loaders import fill_before_reading

__all__ = [
    "Edit", "EditConfig", "LayerScores", "PRESETS", "best_window", "demo_preset", "example_influence",
    "example_influence_bruteforce", "keyed_at", "preset", "ridge_mu", "run_edit", "score_layers",
    "solve_update", "specificity_weights",
]


def __getattr__(name: str):
    """`grom.X` for a public name X: its module imported now, the value kept."""
    if name in ("PRESETS", "EditConfig", "demo_preset", "keyed_at", "preset"):
        from grom.closed_form import config as module
    elif name == "LayerScores":
        from grom import edit as module
    elif name in ("best_window", "score_layers"):
        from grom.closed_form import layer_scores as module
    elif name in ("example_influence", "example_influence_bruteforce"):
        from grom.closed_form import influence as module
    elif name in ("ridge_mu", "solve_update"):
        from grom.closed_form import solve as module
    elif name == "specificity_weights":
        from grom.closed_form import directions as module
    elif name == "run_edit":
        from grom.closed_form import pipeline as module
    elif name == "Edit":
        from grom import edit as module
    else:
        raise AttributeError(f"module 'grom' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _register_tasks() -> None:
    """Fill the benchmarks' registry: the tasks register their benchmarks when imported."""
    import grom.tasks  # noqa: F401


def _register_methods() -> None:
    """Fill the method registry: each method's module registers its row when imported."""
    import grom.methods  # noqa: F401


fill_before_reading(_register_tasks)
registry.fill_before_reading(_register_methods)

if TYPE_CHECKING:  # what type checkers and editors read: the same names, as plain imports
    from grom.closed_form.config import PRESETS, EditConfig, demo_preset, keyed_at, preset
    from grom.closed_form.directions import specificity_weights
    from grom.closed_form.influence import example_influence, example_influence_bruteforce
    from grom.closed_form.layer_scores import LayerScores, best_window, score_layers
    from grom.closed_form.pipeline import run_edit
    from grom.closed_form.solve import ridge_mu, solve_update
    from grom.edit import Edit
