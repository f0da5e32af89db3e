"""Can this weight be edited in place? Checked before any forward pass.

GROM adds a float patch P to a weight W (`grom.edit.Edit.apply`, `grom.closed_form.layer_solver.LayerSolver`).
That needs W to be a floating-point tensor of the shape its layer computes with, held on
a real device. Two ways of loading a large model break this, and both used to fail only
after all the key work, or not at all:

- quantized weights (bitsandbytes ``Linear8bitLt``: an int8 weight, so ``W.add_(P)``
  truncates the patch to int8 zeros while the patch norm reported is not zero;
  ``Linear4bit``: a packed uint8 weight of another shape, a shape error after the keys);
- offloaded weights (``device_map`` with "disk" or "cpu" beside a GPU: accelerate keeps
  the weight on the meta device and its hook loads it for each forward, so there is
  nothing to add a patch to).

`weight_problem` says what is wrong with one layer (None: editable); `check_editable`
raises `NotEditable` for the first of a list of layers, naming it and what to do.

(Was `grom/editable.py`.)
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from grom.model.arch import arch_spec, edited_matrix, num_layers

# Class names of bitsandbytes' quantized layers and parameters (matched by name, so this
# works without bitsandbytes installed, and on stand-ins in tests).
QUANTIZED_CLASSES = ("Linear8bitLt", "Linear4bit", "LinearNF4", "LinearFP4", "Int8Params", "Params4bit",
                     "QuantLinear", "QLinear")

LOAD_FLOAT = "load the model in bfloat16, float16 or float32 (no load_in_8bit / load_in_4bit)"
LOAD_ON_DEVICE = ("load the model so that the edited layers live on a device (more GPU memory in max_memory, "
                  "a smaller dtype, or no device_map), or choose layers that are not offloaded")


class NotEditable(ValueError):
    """A weight GROM would edit (or read) cannot be; the message names it and what to do."""


def _expected_shape(module: nn.Module) -> tuple[int, int] | None:
    """The (out, in) a Linear computes with, or Conv1D's (in, out); None if unknown."""
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return int(module.out_features), int(module.in_features)
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx"):
        return int(module.nx), int(module.nf)
    return None


def _offloaded(module: nn.Module) -> bool:
    """Whether an accelerate hook offloads the module's weights (loads them per forward)."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return False
    hooks = getattr(hook, "hooks", None) or [hook]  # a SequentialHook holds several
    return any(bool(getattr(h, "offload", False)) for h in hooks)


def weight_problem(module: nn.Module, name: str) -> str | None:
    """Why the weight of `module` (called `name` in messages) cannot take a float patch in
    place, or None when it can."""
    W = getattr(module, "weight", None)
    kind = type(module).__name__
    if not isinstance(W, torch.Tensor):
        return f"{name} ({kind}) has no weight tensor to patch"
    quantized = kind in QUANTIZED_CLASSES or type(W).__name__ in QUANTIZED_CLASSES
    if quantized or not W.is_floating_point():
        return (f"{name} is quantized ({kind}, weight {str(W.dtype).removeprefix('torch.')} of shape "
                f"{tuple(W.shape)}): a float patch cannot be added to it exactly; {LOAD_FLOAT}")
    if W.device.type == "meta" or _offloaded(module):
        return f"{name} is offloaded (its weight is not on a device: meta/disk/cpu offload); {LOAD_ON_DEVICE}"
    shape = _expected_shape(module)  # a norm's or an embedding's weight has no layer shape to check
    if shape is not None and (W.ndim != 2 or tuple(W.shape) != shape):
        return (f"{name} ({kind}) holds a weight of shape {tuple(W.shape)}, not the {shape} it computes "
                f"with (a packed or wrapped weight); {LOAD_FLOAT}")
    return None


def check_editable(model: nn.Module, module_names: Iterable[str]) -> None:
    """Raise `NotEditable` for the first named module whose weight cannot be patched."""
    for name in module_names:
        problem = weight_problem(model.get_submodule(name), name)
        if problem:
            raise NotEditable(problem)


def edited_modules(model: nn.Module, matrix: str, layers: Iterable[int] | None) -> list[str]:
    """The module names an edit of `matrix` may patch: the LM head, or the matrix in each
    of `layers` (None: every layer, as the automatic band may pick any)."""
    if matrix == "lm_head":
        return [arch_spec(model).lm_head]
    chosen = range(num_layers(model)) if layers is None else layers
    return [edited_matrix(model, matrix, l).module_name for l in chosen]


def check_edit_inputs(model: nn.Module, matrix: str, layers: Iterable[int] | None,
                      reads_head: bool = True) -> None:
    """Before an edit's first forward pass: every matrix it may patch can be patched, and
    (reads_head) the LM head, whose rows make the suppression target, is a float tensor on
    a device."""
    check_editable(model, edited_modules(model, matrix, layers))
    if reads_head and matrix != "lm_head":
        head = arch_spec(model).lm_head
        problem = weight_problem(model.get_submodule(head), head)
        if problem:
            raise NotEditable(f"the LM head, whose rows the target reads: {problem}")
