"""IDK-DPO: DPO with the "I don't know" answer as the winner and the forget answer as the
loser, registered as a trained method.

github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: dpo.py,
DPO.yaml (beta 0.1, gamma 1, alpha 1), run by
configs/experiment/unlearn/tofu/idk.yaml on ``QAwithIdkDataset``.
"""
from __future__ import annotations

import torch

from grom.methods.trained.losses import dpo_loss
from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method


def idk_dpo(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    forget = dpo_loss(x.alternate_nll, x.reference_alternate_nll, x.forget_nll, x.reference_nll, x.args["beta"])
    return with_retain(forget, x)


IDK_DPO = register_method(Method(
    "idkdpo", "IDK-DPO", idk_dpo, "Preference optimisation: prefers \"I don't know\" to the forget "
    "answer, relative to the unedited model, plus a retain term; needs question/answer forget "
    "examples, a retain set and one reference pass.", needs_retain=True, needs_reference=True,
    needs_answers=True, defaults={"beta": 0.1, "gamma": 1.0, "alpha": 1.0}, positive=("beta",)), order=150)
