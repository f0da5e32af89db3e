"""IDK-NLL: fine-tune on "I don't know" answers and the retain answers, registered as a
trained method.

OpenUnlearning has no trainer for it; it is TOFU's ``forget_loss == "idk"``
(locuslab/tofu dataloader.py at 8c49eee7da2b96b2b718c41c66f4e21331c89189). Written here in
OpenUnlearning's form ``gamma * NLL(idk) + alpha * retain``; TOFU takes one token mean over
both batches together, which weights the two by their token counts instead of 1 : 1.
"""
from __future__ import annotations

import torch

from grom.methods.trained.losses import mean_nll
from grom.methods.trained.method import LossInputs, Method, with_retain
from grom.methods.trained.register import register_method


def idk_nll(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return with_retain(mean_nll(x.alternate_nll, x.alternate_counts), x)


IDK_NLL = register_method(Method(
    "idknll", "IDK-NLL", idk_nll, "Trains the model to answer each forget question with \"I don't "
    "know\" (a seeded refusal per question) while training on the retain answers; needs "
    "question/answer forget examples and a retain set.", needs_retain=True, needs_answers=True,
    defaults={"gamma": 1.0, "alpha": 1.0}), order=140)
