"""GradDiff, gradient ascent on the forget answers plus the retain term (OpenUnlearning's
src/trainer/unlearn/grad_diff.py, GradDiff.yaml: gamma 1, alpha 1), registered as a
trained method."""
from __future__ import annotations

import torch

from grom.methods.trained.losses import ga_loss
from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method


def graddiff(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(ga_loss(x.forget_nll, x.forget_counts), x)


GRAD_DIFF = register_method(Method(
    "graddiff", "GradDiff", graddiff, "Gradient difference: gradient ascent on the forget "
    "answers plus ordinary training on the retain answers; needs a retain set.",
    needs_retain=True, defaults={"gamma": 1.0, "alpha": 1.0}), order=110)
