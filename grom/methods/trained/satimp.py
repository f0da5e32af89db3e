"""SatImp, gradient ascent weighted by saturation and importance, registered as a trained
method (github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a:
satimp.py, SatImp.yaml: beta1 5, beta2 1, gamma 0.1, alpha 1)."""
from __future__ import annotations

import torch

from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import satimp_loss


def satimp(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    forget = satimp_loss(x.forget_logits, x.forget_labels, x.args["beta1"], x.args["beta2"])
    return with_retain(forget, x)


SATIMP = register_method(Method(
    "satimp", "SatImp", satimp, "Gradient ascent weighted toward forget tokens of middling "
    "probability (saturation and importance weights), plus a retain term; needs a retain set.",
    needs_retain=True, defaults={"beta1": 5.0, "beta2": 1.0, "gamma": 0.1, "alpha": 1.0}), order=180)
