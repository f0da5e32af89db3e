"""The `duration` of each compute function on ZeroGPU: a function of the same arguments,
called in the main process before the call (`spaces.GPU(duration=callable)`), that reads
the loaded model's shape there and prices the work with `components.core.gpu_time`.

Each returns whole seconds within [1, GROM_GPU_SECONDS]; the 60 s default where the
model is not loaded (the call then fails at once with the message that says so). A
baseline's training is priced per optimizer step (`train_plan`), so that it can be split
into calls that each fit (components.core.train_parts)."""
from __future__ import annotations

import math

from components.core.gpu_time import (Shape, TrainPlan, edit_flops, eval_sets_of, eval_work, example_tokens,
                                      gpu_seconds, plan_training, train_flops)
from components.core.limits import limit
from components.core.session import REGISTRY, ModelKey
from grom.arch import decoder_layers
from grom.baselines import EDITORS, get_method
from grom.baselines.loop import planned_steps
from grom.baselines.optim import select_parameters
from grom.baselines.recipes import recipe_for_task
from grom.baselines.settings import resolve_settings

DEFAULT_S = 60  # what ZeroGPU grants a call that names no duration
EVAL_ROWS = 3  # Base, Edited and the Retain model, the most a comparison computes
ATTACK_PASSES = 8  # an attack reads its probes in a few prompt forms, relearning trains on them


def shape_of(key: ModelKey) -> Shape | None:
    """The loaded model's Shape (layers, parameters per layer, MLP width), or None."""
    handle = REGISTRY.get(key)
    if handle is None:
        return None
    layers = decoder_layers(handle.model)
    cfg = handle.model.config
    width = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size
    return Shape(len(layers), sum(p.numel() for p in layers[0].parameters()), int(width))


def edit_s(key: ModelKey, forget, retain, config, scores=None, *_rest, **_kw) -> int:
    """`compute_edit(key, forget, retain, config, scores, progress)`'s duration."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    band = len(config.layers) if config.layers else config.k
    return gpu_seconds(edit_flops(shape, example_tokens(forget) + example_tokens(retain), band, scores is None))


def scores_s(key: ModelKey, forget, retain, *_rest, **_kw) -> int:
    """`compute_scores`'s: one forward pass over the keys' examples."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    tokens = example_tokens(forget) + example_tokens(retain)
    return gpu_seconds(2.0 * tokens * shape.layers * shape.layer_params)


def report_s(key: ModelKey, bench, edit, n, *_rest, **_kw) -> int:
    """`compute_report(key, bench, edit, n, ...)`'s: every set, at most `n` examples each,
    teacher-forced and answered (up to GROM_MAX_NEW_TOKENS), for up to three models."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    sets = eval_sets_of(bench, n)
    tokens = sum(example_tokens(s) for s in sets)
    answers = sum(len(s) for s in sets)
    flops, steps = eval_work(shape, tokens, answers, limit("GROM_MAX_NEW_TOKENS"), EVAL_ROWS)
    return gpu_seconds(flops, steps)


def edit_and_report_s(key: ModelKey, bench, edit, n, *_rest, **_kw) -> int:
    """A diagnostic that may make the edit again with its keys, then evaluates."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    tokens = example_tokens(bench.forget) + example_tokens(bench.retain)
    band = len(edit.band) if edit is not None and edit.band else 1
    sets = eval_sets_of(bench, n)
    flops, steps = eval_work(shape, sum(example_tokens(s) for s in sets), sum(len(s) for s in sets),
                             limit("GROM_MAX_NEW_TOKENS"), 4)  # base and edited, full and 4-bit
    return gpu_seconds(edit_flops(shape, tokens, band, False) + flops, steps)


def rerun_s(key: ModelKey, edit, inputs, *_rest, **_kw) -> int:
    """A diagnostic on the edit made again with its keys (`inputs` its forget, retain)."""
    shape = shape_of(key)
    if shape is None or inputs is None:
        return DEFAULT_S
    tokens = example_tokens(inputs[0]) + example_tokens(inputs[1])
    return gpu_seconds(2 * edit_flops(shape, tokens, len(edit.band) or 1, False))


def sweep_point_s(key: ModelKey, forget, retain, config, f_eval, r_eval, *_rest, **_kw) -> int:
    """One point of a sweep: the edit (or none) and the two sets' answer probabilities."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    edit = 0.0 if config is None else edit_flops(
        shape, example_tokens(forget) + example_tokens(retain),
        len(config.layers) if config.layers else config.k, False)
    probe = 2.0 * (example_tokens(f_eval) + example_tokens(r_eval)) * shape.layers * shape.layer_params
    return gpu_seconds(edit + probe)


def train_s(key: ModelKey, bench, method, epochs, *_rest, **_kw) -> int:
    """An editor's `train_call`: its value steps count as epochs over its facts."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    tokens = example_tokens(bench.forget) + example_tokens(bench.retain)
    return gpu_seconds(train_flops(shape, tokens, float(epochs)))


def train_plan(key: ModelKey, bench, method: str, epochs) -> TrainPlan | None:
    """A trained method's run on `bench` (its recipe, `epochs`) priced per optimizer step
    and split into calls (None where the model is not loaded). The steps are counted as the
    trainer counts them (`planned_steps`) from the forget sequences: one per example (times
    the alternates a method writes), or the corpus's max_length chunks under MUSE's and
    WMDP's recipes. A step costs `train_flops` of its sequences (forward and backward, and
    as much again for the retain or reference pass); between calls its state is the trained
    weights in their dtype and AdamW's two float32 moments."""
    handle, shape = REGISTRY.get(key), shape_of(key)
    if handle is None or shape is None or not bench.forget:
        return None
    s = resolve_settings(method, recipe=recipe_for_task(bench.task).name, epochs=float(epochs))
    row = get_method(s.method)
    tokens = example_tokens(bench.forget)
    if s.chunk_corpus:
        n, per_sequence = max(1, math.ceil(tokens / s.max_length)), float(s.max_length)
    else:
        copies = int(row.defaults.get("n_alternates", 1)) if row.make_alternates is not None else 1
        n, per_sequence = len(bench.forget) * copies, min(float(s.max_length), tokens / len(bench.forget))
    total, _ = planned_steps(s, n)
    step_flops = train_flops(shape, min(n, s.batch_size * s.grad_accum) * per_sequence, 1.0)
    state = sum(p.numel() * (p.element_size() + 8) for _, p in select_parameters(handle.model, s.params))
    return plan_training(step_flops, total, state)


def train_call_s(key: ModelKey, bench, method, epochs, rate=None, band=None, part=None, *_rest, **_kw) -> int:
    """`train_call(key, bench, method, epochs, lr, band, part)`'s: an editor's value
    optimisation; a trained method's whole run (`part` None) or one part of the plan's
    steps per call, with its checkpoint."""
    if str(method).strip().lower() in EDITORS:
        return train_s(key, bench, method, epochs)
    plan = train_plan(key, bench, method, epochs)
    if plan is None:
        return DEFAULT_S
    return plan.seconds(plan.total_steps if part is None else max(1, plan.steps_per_call))


def attack_s(key: ModelKey, bench, edit, name, *_rest, **_kw) -> int:
    """One attack on one edit: its probes read in a few forms, a short relearning run."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    tokens = example_tokens(bench.forget) + sum(example_tokens(s) for s in eval_sets_of(bench, None))
    passes = ATTACK_PASSES * (2 if name == "relearn" else 1)  # relearning runs twice: the edit, the control
    flops, steps = eval_work(shape, passes * tokens, len(bench.forget), limit("GROM_MAX_NEW_TOKENS"), passes)
    return gpu_seconds(flops, steps)


def generate_s(key: ModelKey, prompt, edit, *_rest, **_kw) -> int:
    """A typed question answered before and after."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    flops, steps = eval_work(shape, len(prompt) / 3.0, 1, limit("GROM_MAX_NEW_TOKENS"), 2)
    return gpu_seconds(flops, steps)
