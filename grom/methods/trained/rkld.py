"""RKLD, reverse-KL distillation, registered as a trained method.

No OpenUnlearning trainer; the paper (Wang et al. 2024, arXiv 2406.01983) trains the
reverse KL to a teacher formed from a model strengthened on the forget set, plus a retain
term. Here the teacher needs no second run (`grom.methods.trained.token_losses.rkld_loss`
says how): the unedited model with the answer token's logit lowered by beta, 10 as UNDIAL's,
so that the two differ only in the divergence and its positions; gamma 1 and alpha 1 (a
retain NLL term) as OpenUnlearning's other methods.
"""
from __future__ import annotations

import torch

from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import rkld_loss


def rkld(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gamma * RKL(forget answers) + alpha * retain`` (`rkld_loss`: the teacher is the
    unedited model's logits, from a copy of the trained weights, with the answer lowered)."""
    return with_retain(rkld_loss(x.forget_logits, x.reference_logits, x.forget_labels, x.args["beta"]), x)


RKLD = register_method(Method(
    "rkld", "RKLD", rkld, "Reverse-KL distillation: trains each forget answer's next-token "
    "distribution toward the unedited model's with the answer token's logit lowered by beta, "
    "weighted by the model's own distribution, plus a retain term; needs a retain set (a copy "
    "of the trained weights as the teacher).", needs_retain=True, needs_reference_logits=True,
    defaults={"beta": 10.0, "gamma": 1.0, "alpha": 1.0}, positive=("beta",)), order=240)
