"""RMU, representation misdirection, registered as a trained method, with its defaults
fitted to the model's depth.

github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: rmu.py,
RMU.yaml (steering_coeff 2, gamma 1, alpha 1, the activations of
``model.layers.7``, retain term EMBED_DIFF: the retain activations held to the unedited
model's), with the original recipe of centerforaisafety/wmdp rmu/unlearn.py (`RMU_RECIPE`:
constant lr 5e-5, 80 steps, only layers 5-7's ``mlp.down_proj`` trained; RMU.yaml trains
every parameter). The frozen copy is a copy of the trained matrices only, run through
``functional_call``. A caller changing `layer` should change `params` with it.

On a model too shallow for layer 7 to sit below the last (`fit_rmu`: fewer than 9 decoder
layers) the steering layer is the one two below the top and the trained layers the three
ending there (the demo's 6 layers: steering layer 4, layers 2-4 trained).
"""
from __future__ import annotations

import dataclasses

import torch

from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import rmu_activation_loss

UPSTREAM_LAYER = 7


def rmu(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gamma * |h_forget - c|^2 + alpha * |h_retain - h_retain_ref|^2`` at decoder layer
    `layer`; the control vector ``c = steering_coeff * u / |u|``, u uniform in [0, 1)^d,
    drawn once per run from the run's seeded generator (upstream: ``torch.rand``, once)."""
    st = x.state if x.state is not None else {}
    h = x.forget_hidden
    if "control" not in st:
        u = torch.rand(1, 1, h.shape[-1])
        st["control"] = u / u.norm() * x.args["steering_coeff"]
    forget = rmu_activation_loss(h, st["control"].expand_as(h), x.forget_labels)
    loss, terms = x.args["gamma"] * forget, {"forget": forget}
    if x.retain_hidden is not None:
        retain = rmu_activation_loss(x.retain_hidden, x.reference_retain_hidden, x.retain_labels)
        loss, terms["retain"] = loss + x.args["alpha"] * retain, retain
    return loss, terms


def trained_layers(layer: int) -> tuple[str, ...]:
    """The parameters RMU trains with steering layer `layer`: the MLP output matrices of
    the three layers ending there (upstream's param_ids [6] of layers 5-7)."""
    return tuple(f".layers.{i}.mlp.down_proj" for i in range(max(0, layer - 2), layer + 1))


# centerforaisafety/wmdp rmu/unlearn.py (bc5e1ba0367ea826caeeeaa50656336a1e87acfb, cited by
# OpenUnlearning's rmu.py): lr 5e-5, no schedule, 80 batches, layers 5-7's MLP down_proj
# (param_ids [6]); OpenUnlearning's WMDP experiment runs the same lr, steps and schedule.
RMU_RECIPE = dict(lr=5e-5, schedule="constant", max_steps=80, warmup_epochs=0.0, weight_decay=0.0,
                  params=trained_layers(UPSTREAM_LAYER))


def fit_rmu(row: Method, n_layers: int) -> Method:
    """RMU's row on a model of `n_layers` decoder layers: upstream's layer 7 (and layers
    5-7 trained) where it lies below the last layer but one, else the layer two below the
    top (an activation above it still reaches the answer) and the three ending there."""
    layer = min(UPSTREAM_LAYER, max(0, n_layers - 2))
    if layer == int(row.defaults["layer"]):
        return row
    return dataclasses.replace(row, defaults={**row.defaults, "layer": float(layer)},
                               recipe={**row.recipe, "params": trained_layers(layer)})


RMU = register_method(Method(
    "rmu", "RMU", rmu, "Representation misdirection: steers one layer's activations on the forget "
    "data toward a fixed random vector while holding the retain activations to the unedited "
    "model's; trains a few layers' MLP output matrices; needs a retain set.", needs_retain=True,
    needs_hidden=True, defaults={"layer": float(UPSTREAM_LAYER), "steering_coeff": 2.0, "gamma": 1.0, "alpha": 1.0},
    positive=("steering_coeff",), recipe=RMU_RECIPE, fit=fit_rmu), order=210)
