"""How large a trained method's run is, counted without running it: its resolved settings,
the weights it trains, the sequences an epoch holds and their tokens, as the trainer counts
them (`planned_steps`); from these its FLOPs and the bytes it keeps between its turns on the
device (`grom.methods.costs`), which its registry row answers with."""
from __future__ import annotations

import math
from typing import NamedTuple

from grom.methods.costs import example_tokens, held_while_training, shape_of, train_flops
from grom.methods.trained.method import get_method
from grom.methods.trained.optimizer import select_parameters
from grom.methods.trained.recipes import recipe_for_task
from grom.methods.trained.settings import Settings, resolve_settings


class RunSize(NamedTuple):
    settings: Settings
    trained: list  # the trained parameters
    sequences: int  # per epoch
    tokens_per_sequence: float

    @property
    def tokens_per_step(self) -> float:
        s = self.settings
        return min(self.sequences, s.batch_size * s.grad_accum) * self.tokens_per_sequence


def run_size(model, data, method: str, epochs) -> RunSize:
    """A trained method's run on `data` (its benchmark's recipe, `epochs`): one sequence per
    forget example (times the alternates a method writes), or the corpus's max_length chunks
    under MUSE's and WMDP's recipes."""
    s = resolve_settings(method, recipe=recipe_for_task(getattr(data, "task", None)).name, epochs=float(epochs),
                         model=model)
    row = get_method(s.method)
    tokens = example_tokens(data.forget)
    if s.chunk_corpus:
        n, per_sequence = max(1, math.ceil(tokens / s.max_length)), float(s.max_length)
    else:
        copies = int(row.defaults.get("n_alternates", 1)) if row.make_alternates is not None else 1
        n, per_sequence = len(data.forget) * copies, min(float(s.max_length), tokens / len(data.forget))
    return RunSize(s, [p for _, p in select_parameters(model, s.params)], n, per_sequence)


def trained_flops(method: str, model, data, values) -> float:
    """A whole run's FLOPs: `train_flops` of every epoch's sequences."""
    size = run_size(model, data, method, values["epochs"])
    return train_flops(shape_of(model), size.sequences * size.tokens_per_sequence, float(values["epochs"]))


def trained_holds(method: str, model, data, values) -> int:
    """What the run keeps between its turns (`held_while_training`)."""
    size = run_size(model, data, method, values["epochs"])
    return held_while_training(size.trained, size.tokens_per_step, shape_of(model))
