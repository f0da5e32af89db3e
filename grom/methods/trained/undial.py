"""UNDIAL, self-distillation toward the unedited model with the answer token lowered,
registered as a trained method.

github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: undial.py,
UNDIAL.yaml (beta 10, gamma 1, alpha 0: no retain term by default).
UNDIAL.yaml's own lr 1e-4 is overridden by the experiment's in upstream TOFU runs, so the
benchmark's recipe applies here too.
"""
from __future__ import annotations

import torch

from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import undial_loss


def undial(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(undial_loss(x.forget_logits, x.reference_logits, x.forget_labels, x.args["beta"]), x)


UNDIAL = register_method(Method(
    "undial", "UNDIAL", undial, "Self-distillation: trains toward the unedited model's next-token "
    "distribution with the answer token's logit lowered by beta; needs the forget set only "
    "(a copy of the trained weights as the teacher).", needs_retain=True,
    needs_reference_logits=True, defaults={"beta": 10.0, "gamma": 1.0, "alpha": 0.0}), order=160)
