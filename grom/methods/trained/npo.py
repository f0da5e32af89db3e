"""NPO, negative preference optimisation on top of GradDiff's retain term (OpenUnlearning's
src/trainer/unlearn/npo.py, NPO.yaml: beta 0.1, gamma 1, alpha 1), registered as a
trained method."""
from __future__ import annotations

import torch

from grom.methods.trained.losses import npo_loss
from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method


def npo(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(npo_loss(x.forget_nll, x.reference_nll, x.args["beta"]), x)


NPO = register_method(Method(
    "npo", "NPO", npo, "Negative preference optimisation: pushes each forget answer below the "
    "unedited model's likelihood of it, with a bounded loss, plus a retain term; needs a "
    "retain set and one reference pass.",
    needs_retain=True, needs_reference=True, defaults={"beta": 0.1, "gamma": 1.0, "alpha": 1.0},
    positive=("beta",)), order=120)
