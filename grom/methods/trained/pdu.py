"""PDU, primal-dual unlearning, registered as a trained method.

github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: pdu.py,
PDU.yaml (gamma 1, alpha 1, dual_step_size 1, dual_warmup_epochs 5,
primal-dual on, the dual updated at every micro-batch). Upstream has no default for
``retain_loss_eps`` (the retain loss the constraint allows); here a negative value (the
default, -1) takes the retain loss of the first retain batch under the unedited model.
"""
from __future__ import annotations

import torch

from grom.methods.trained.losses import mean_nll
from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import pdu_forget_loss


def pdu(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gamma * forget + lambda * (retain - eps)``, the retain weight lambda a dual variable
    (starting at alpha) raised by ``dual_step_size * (retain - eps)`` after each micro-batch
    once `dual_warmup_epochs` passes are done (clipped at 0), as upstream's
    ``final_loss_value``; the loss uses lambda before the update."""
    a, st = x.args, x.state if x.state is not None else {}
    forget = pdu_forget_loss(x.forget_logits, x.forget_labels)
    retain = mean_nll(x.retain_nll, x.retain_counts) if x.retain_kl is None else x.retain_kl
    eps = a["retain_loss_eps"] if a["retain_loss_eps"] >= 0 else st.setdefault("eps", float(retain.detach()))
    shifted = retain - eps
    lam = st.setdefault("retain_preference", a["alpha"])
    loss = a["gamma"] * forget + lam * shifted
    if a["primal_dual"] and x.epoch >= a["dual_warmup_epochs"]:
        st["retain_preference"] = max(0.0, lam + a["dual_step_size"] * float(shifted.detach()))
    return loss, {"forget": forget, "retain": retain, "retain_preference": torch.tensor(lam)}


PDU = register_method(Method(
    "pdu", "PDU", pdu, "Primal-dual unlearning: flattens the next-token distribution on the forget "
    "answers, with a retain weight that rises while the retain loss is above its bound; needs a "
    "retain set.", needs_retain=True,
    defaults={"gamma": 1.0, "alpha": 1.0, "retain_loss_eps": -1.0, "dual_step_size": 1.0,
              "dual_warmup_epochs": 5.0, "primal_dual": 1.0}, positive=("alpha",)), order=200)
