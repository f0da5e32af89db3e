"""The trained methods: the shared trainer (settings, recipes, sequences, the training loop,
its optimizer and checkpoints, `run_baseline`) and one file per method, each registering
its row in the method registry (grom.registry) when imported, at the place in every list
of methods its `register_method` call gives it."""
from grom.methods.trained import (  # noqa: F401  (each registers its row when imported)
    altpo,
    ceu,
    ga,
    grad_diff,
    idk_dpo,
    idk_nll,
    npo,
    pdu,
    rkld,
    rmu,
    satimp,
    simnpo,
    task_vector,
    undial,
    wga,
)

BASELINES = ("ga", "graddiff", "npo", "simnpo")  # the built-in four; METHODS has every registered one
