"""The trained methods: the shared trainer (settings, recipes, sequences, the training loop,
its optimizer and checkpoints, `run_baseline`) and one file per method, each registering
its row in the method registry (grom.methods.registry) when imported, in this order (the
order a method box lists them: not sorted)."""
# isort: skip_file
from grom.methods.trained import ga, grad_diff, npo, simnpo  # noqa: F401  (the built-in four)
from grom.methods.trained import idk_nll, idk_dpo, undial, wga, satimp, ceu, pdu, rmu  # noqa: F401
from grom.methods.trained import task_vector, altpo, rkld  # noqa: F401

BASELINES = ("ga", "graddiff", "npo", "simnpo")  # the built-in four; METHODS has every registered one
