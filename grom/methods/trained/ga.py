"""GA, gradient ascent on the forget answers (OpenUnlearning's
src/trainer/unlearn/grad_ascent.py), registered as a trained method."""
from __future__ import annotations

import torch

from grom.methods.trained.losses import ga_loss
from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.register import register_method


def ga(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    forget = ga_loss(x.forget_nll, x.forget_counts)
    return forget, {"forget": forget}


GA = register_method(Method(
    "ga", "GA", ga, "Gradient ascent: makes the forget answers unlikely, with nothing to "
    "hold the rest in place; needs only the forget set."), order=100)
