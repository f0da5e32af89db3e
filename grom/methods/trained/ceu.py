"""CE-U, cross-entropy unlearning, registered as a trained method
(github.com/locuslab/open-unlearning at d3d7cf9e6b3c125d16687d4232680d8d83548f1a: ceu.py,
CEU.yaml: ignore_first_n_answer_tokens 1, no retain term)."""
from __future__ import annotations

import torch

from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.register import register_method
from grom.methods.trained.token_losses import ceu_loss


def ceu(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    forget = ceu_loss(x.forget_logits, x.forget_labels, int(x.args["ignore_first"]))
    return forget, {"forget": forget}


CEU = register_method(Method(
    "ceu", "CE-U", ceu, "Cross-entropy unlearning: trains toward the model's own distribution with "
    "the answer token removed, a bounded loss; needs the forget set only.",
    defaults={"ignore_first": 1.0}), order=190)
