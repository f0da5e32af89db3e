"""TaskVector, task arithmetic, registered as a trained method.

MUSE's baselines/baselines/task_vector.py (jaechan-repo/muse_bench at
e0000386e5318665693db28e27b41711674256ef): fine-tune on the forget set, then
``theta_0 - scale * (theta_ft - theta_0)`` (MUSE's ``alpha``, 1 by default). The fine-tuning
is this trainer's run with the benchmark's recipe; the Edit is the negated, scaled change.
"""
from __future__ import annotations

import torch

from grom.methods.trained.losses import mean_nll
from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.register import register_method


def finetune(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plain fine-tuning on the forget answers (the task vector's training run)."""
    nll = mean_nll(x.forget_nll, x.forget_counts)
    return nll, {"finetune": nll}


def negate_scaled(patches: dict, args) -> dict:
    """The task vector's edit: ``-scale * (theta_ft - theta_0)`` per parameter, in float32,
    cast back to the weight's dtype."""
    return {n: (-args["scale"] * d.float()).to(d.dtype) for n, d in patches.items()}


TASK_VECTOR = register_method(Method(
    "taskvector", "TaskVector", finetune, "Task arithmetic: fine-tunes on the forget set, then "
    "subtracts the scaled weight change from the unedited model; needs the forget set only.",
    defaults={"scale": 1.0}, positive=("scale",), finish=negate_scaled), order=220)
