"""LUNAR (Shen et al., "LLM Unlearning via Neural Activation Redirection", NeurIPS 2025;
github.com/facebookresearch/LUNAR, read at commit dfa56eb0291a93e967284a9ec2d28d5572d235b1):
the method closest to GROM, which also rewrites one MLP down_proj from forward-pass
activations. The refusal prompts it measures its direction against (prompts.py), the
forward passes that read the direction and the rows (activations.py), upstream's AdamW
fit and the same objective in closed form on GROM's solver (fit.py), and the run with its
registry row, family "redirection" (run.py)."""
from grom.methods.lunar.activations import Activations, encode_instructions, read_activations, refusal_direction
from grom.methods.lunar.direction_prompts import HARMFUL, UNVERIFIABLE, refusal_prompts
from grom.methods.lunar.fit import Rows, closed_form_patch, fit_adamw, mse, training_rows
from grom.methods.lunar.run import (
    DTYPES,
    LUNAR,
    SOLVERS,
    SOURCE,
    LunarConfig,
    lunar_defaults,
    lunar_layer,
    lunar_reason,
    run_lunar,
)

__all__ = [
    "DTYPES", "HARMFUL", "LUNAR", "SOLVERS", "SOURCE", "UNVERIFIABLE", "Activations", "LunarConfig", "Rows",
    "closed_form_patch", "encode_instructions", "fit_adamw", "lunar_defaults", "lunar_layer", "lunar_reason", "mse",
    "read_activations", "refusal_direction", "refusal_prompts", "run_lunar", "training_rows",
]
