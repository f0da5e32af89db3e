"""SimNPO, NPO's bounded loss on the length-normalised likelihood with no reference model
(OpenUnlearning's src/trainer/unlearn/simnpo.py, SimNPO.yaml: beta 4.5, delta 0, gamma
0.125, alpha 1), registered as a trained method."""
from __future__ import annotations

import torch

from grom.methods.trained.losses import simnpo_loss
from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method


def simnpo(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(simnpo_loss(x.forget_nll, x.forget_counts, x.args["beta"], x.args["delta"]), x)


SIMNPO = register_method(Method(
    "simnpo", "SimNPO", simnpo, "Simple NPO: NPO's bounded loss on the length-normalised forget "
    "likelihood, with no reference model, plus a retain term; needs a retain set.",
    needs_retain=True, defaults={"beta": 4.5, "delta": 0.0, "gamma": 0.125, "alpha": 1.0},
    positive=("beta",)), order=130)
