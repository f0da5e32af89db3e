"""WGA, weighted gradient ascent, registered as a trained method
(github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: wga.py,
WGA.yaml: beta 1, gamma 1, alpha 1)."""
from __future__ import annotations

import torch

from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import wga_loss


def wga(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(wga_loss(x.forget_logits, x.forget_labels, x.args["beta"]), x)


WGA = register_method(Method(
    "wga", "WGA", wga, "Weighted gradient ascent: each forget token weighted by its own probability, "
    "so confident tokens are pushed first, plus a retain term; needs a retain set.",
    needs_retain=True, defaults={"beta": 1.0, "gamma": 1.0, "alpha": 1.0}), order=170)
