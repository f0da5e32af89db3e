"""The `duration` of each compute function on ZeroGPU: a function of the same arguments,
called in the main process before the call (`spaces.GPU(duration=callable)`), that reads
the loaded model's shape there and prices the work with `components.server.gpu_time`.

Each returns whole seconds within [1, GROM_GPU_SECONDS]; the 60 s default where the
model is not loaded (the call then fails at once with the message that says so). A
baseline's training is priced per optimizer step (`train_plan`), so that it can be split
into calls that each fit (components.server.train_parts).

Beside them, the work the wall-time estimates a visitor sees count (`Work`: each attack's,
`attack_work`; a trained method's run, `training_work`) and its price at a `WallRate`
(`wall_seconds`): the constants below until this host is measured, then the rate, the
kind's pace and the load `components.server.pace` measures here."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from components.server.device import ON_ZEROGPU
from components.server.gpu_time import (
    RATE,
    Shape,
    TrainPlan,
    edit_flops,
    eval_sets_of,
    eval_work,
    example_tokens,
    gpu_seconds,
    plan_training,
    train_flops,
)
from components.server.limits import limit
from components.server.session import REGISTRY, ModelKey
from grom.data.prompts import encode_prompt
from grom.methods import get, get_method
from grom.methods.costs import held_while_training
from grom.methods.costs import shape_of as model_shape
from grom.methods.trained.sizes import run_size
from grom.methods.trained.training_loop import planned_steps
from grom.model.arch import decoder_layers, model_device
from grom.robustness.calibration import RELEARN_BATCH, RELEARN_STEPS
from grom.robustness.probes import PROBE_TYPES, transform
from grom.tasks.knowledge import knowledge_budget

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


def landscape_cell_s(key: ModelKey, forget, retain, config, reader, *_rest, **_kw) -> int:
    """One cell of the landscape: the edit of `config` and one teacher-forced pass of the
    reader's prompts and answers (`grom.landscape.AnswerReader.tokens`)."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    edit = edit_flops(shape, example_tokens(forget) + example_tokens(retain),
                      len(config.layers) if config.layers else config.k, False)
    return gpu_seconds(edit + 2.0 * reader.tokens * shape.layers * shape.layer_params)


def train_plan(key: ModelKey, bench, method: str, epochs) -> TrainPlan | None:
    """A trained method's run on `bench` (its recipe, `epochs`) priced per optimizer step
    and split into calls (None where the model is not loaded). A step costs `train_flops`
    of its sequences (forward and backward, and as much again for the retain or reference
    pass); between calls its state is the trained weights in their dtype and AdamW's two
    float32 moments."""
    handle, shape = REGISTRY.get(key), shape_of(key)
    if handle is None or shape is None or not bench.forget:
        return None
    size = run_size(handle.model, bench, method, epochs)
    total, _ = planned_steps(size.settings, size.sequences)
    step_flops = train_flops(shape, size.tokens_per_step, 1.0)
    state = sum(p.numel() * (p.element_size() + 8) for p in size.trained)
    return plan_training(step_flops, total, state)


def baseline_memory(key: ModelKey, bench, method: str, epochs) -> int:
    """What a method's run holds between its turns, as its registry row counts it
    (`MethodEntry.holds`: a trained method's weights, gradients, AdamW's moments and a
    step's activations; nothing for an editor's value optimisation or LUNAR's fit of one
    matrix, small next to the model); 0 for a model not loaded."""
    handle = REGISTRY.get(key)
    if handle is None or not bench.forget:
        return 0
    row = get(method)
    return int(row.holds(handle.model, bench, {row.boxes(None)[0].name: epochs}))


def relearning_memory(key: ModelKey) -> int:
    """What the relearning attack holds between its turns: it trains every weight of the
    model (`grom.robustness.relearn`) on batches of RELEARN_BATCH probe answers."""
    handle = REGISTRY.get(key)
    if handle is None:
        return 0
    return held_while_training(list(handle.model.parameters()), RELEARN_BATCH * 64, model_shape(handle.model))


def attack_memory(key: ModelKey, bench, names, baseline: tuple | None) -> int:
    """What the attack suite holds between its turns at most: the relearning attack's
    training, the 4- and 8-bit attacks' quantized weights kept beside the originals (two
    copies of the model's weights), and a baseline attacked beside GROM: its training, then
    its patch of every weight it trained, kept while it is attacked."""
    handle = REGISTRY.get(key)
    if handle is None:
        return 0
    weights = sum(p.numel() * p.element_size() for p in handle.model.parameters())
    held = relearning_memory(key) if "relearn" in names else 0
    if any(n in names for n in ("quant4", "quant8")):
        held = max(held, 2 * weights)
    if baseline is not None:
        method, epochs, _ = baseline
        held = max(held, baseline_memory(key, bench, method, epochs)) + weights
    return held


def train_call_s(key: ModelKey, bench, method, epochs, rate=None, band=None, part=None, *_rest, **_kw) -> int:
    """`train_call(key, bench, method, epochs, lr, band, part)`'s: a run in one call priced at
    its row's FLOPs (`MethodEntry.flops`: an editor's value optimisation, LUNAR's passes and
    fit); a stepwise run's whole (`part` None) or one part of the plan's steps per call, with
    its checkpoint."""
    row, handle = get(method), REGISTRY.get(key)
    if handle is None:
        return DEFAULT_S
    if not row.stepwise:
        first, second = row.boxes(None)[:2]
        return gpu_seconds(row.flops(handle.model, bench, {first.name: epochs, second.name: rate or second.default}))
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


def write_s(key: ModelKey, subject, config, *_rest, **_kw) -> int:
    """`write_rows`'s (components.studio.name_only): the passages, the question tries and the
    answers about the subject and its neighbours, each a generation of its budget after a
    prompt of about 60 tokens, in batches of `config.batch_size`."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    flops = steps = 0.0
    for p, q in [(config.passages, config.questions)] + \
            [(config.neighbour_passages, config.neighbour_questions)] * config.neighbours:
        for n, budget in ((p, config.passage_tokens), (2 * q, config.question_tokens), (q, config.answer_tokens)):
            if n:
                f, s = eval_work(shape, 60.0 * n, n, budget, 1, config.batch_size)
                flops, steps = flops + f, steps + s
    return gpu_seconds(flops, steps)


def generate_s(key: ModelKey, prompt, edit, *_rest, **_kw) -> int:
    """A typed question answered before and after."""
    shape = shape_of(key)
    if shape is None:
        return DEFAULT_S
    flops, steps = eval_work(shape, len(prompt) / 3.0, 1, limit("GROM_MAX_NEW_TOKENS"), 2)
    return gpu_seconds(flops, steps)


# ---------------------------------------------------------------- the attacks' wall time
#
# `attack_s` above is what ZeroGPU is asked for (a generous margin: a call that runs past it
# is aborted). The attack panel shows something else before a run: the seconds each attack
# will take on the loaded model's device (`components.attack_panel.attack_estimates`). Each
# attack's work is counted as the suite does it (grom.robustness: greedy answers to its
# probes from the base model and the edited one, relearning's fine-tuning steps and scores,
# quantization's sweeps over the weights, teacher-forced passes for the logit lens and the
# membership attacks) and priced at a `WallRate`: the one `components.server.pace` measures on
# this host (a calibration of the loaded model, each kind's measured pace, the load now), or
# before it has, the constants below. The CPU's were measured on the 2-core AMD EPYC the
# studio was first developed on (an Intel Xeon here took 3-4x as long: why the host is now
# measured; bench/bench_estimates.py, BENCHMARKS.md); the GPU's are `gpu_time.RATE`'s
# deliberately low guesses.

@dataclass(frozen=True)
class WallRate:
    """What a second of wall time buys where the attacks run."""
    flops_per_s: float
    """Dense matmul throughput of a batch of tokens (prefill, teacher forcing, training)."""
    weight_bytes_per_s: float
    """Every forward or backward pass reads every weight once: with a few rows (greedy
    decoding) that read, not the arithmetic, is the pass's cost on a CPU."""
    layer_s: float
    """Seconds per decoder layer per pass: the framework's fixed cost of a layer call."""
    token_s: float
    """Seconds per generated token in Python: decoded and checked for its fact each step."""
    param_op_s: float
    """Seconds per parameter per elementwise sweep (a copy, an AdamW update, quantization)."""
    start_s: float
    """Seconds per attack whatever it does (on ZeroGPU: a GPU call's start)."""
    collect_s: float = 0.0
    """Seconds of a garbage collection of this process (`release_memory`, after every
    training and relearning run): the Python heap's size, not the model's, sets it; 0 until
    measured (`components.server.pace.calibrate`)."""


CPU_WALL = WallRate(flops_per_s=5e10, weight_bytes_per_s=1e10, layer_s=8e-4, token_s=5e-5, param_op_s=2.7e-9,
                    start_s=0.05)
"""Measured on this 2-core x86_64 CPU, one torch thread, as the process's CPU seconds (a
quiet machine's wall time): SmolLM2-135M's layers at 50-70 GFLOP/s in batches of tokens
(flops_per_s is per thread, times torch.get_num_threads()), a one-token pass 63 ms (its
538 MB of weights read, ~10 GB/s, and its 30 layers' calls), a decoding step of the demo's
6 layers ~5 ms, a copy of the weights 2.7 ns a parameter (an AdamW step: 0.8 s, 2.5 copies;
a 4-bit quantization and its restore: 1.1 s, 4 copies of the linear weights). A machine
that other work shares is slower: 1-2x at a load of 3-5 (bench/attack_times.py)."""
GPU_WALL = WallRate(flops_per_s=RATE.flops_per_s, weight_bytes_per_s=1e12, layer_s=RATE.step_s, token_s=5e-5,
                    param_op_s=1e-11, start_s=0.5)
"""A data-centre GPU: `gpu_time.RATE`'s low guesses for the arithmetic and a layer's call,
~1 TB/s for the weights (not measured: no GPU was at hand)."""
ZEROGPU_START_S = RATE.overhead_s  # each attack is a GPU call of its own there

GEN_BATCH = 128  # grom.tasks.knowledge.KNOWLEDGE_GEN_BATCH: one decoding loop per 128 probes
DECODE_STEPS = 0.8
"""Decoding steps of a batch, as a share of the answer budget: the batch runs until its
slowest row ends, and an answer that never states its fact (the edited model's, by
design) runs to EOS or the budget."""
LIVE_ROWS = 0.5
"""Rows still decoding, on average over those steps (answers that stated their fact, or
ended, leave the batch)."""
LENS_BATCH, MIA_BATCH, DEPTH_BATCH = 16, 32, 16  # weights.lens, eval.runner.score_answers, depth.BATCH
TRAIN_PASSES = 3  # a training step: the forward and a backward of about twice its cost
ADAMW_OPS = 2.5  # an AdamW step (torch's fused foreach kernels: clip, two moments, update) in weight copies
QUANT_OPS = 4  # sweeps per quantization of the linear weights: group min/max, round, dequantize, restore
QUANTIZATIONS = 4  # base, edited, and the patch-kept check's two (grom.robustness.weights)
MOMENT_OPS = 8  # per vocabulary entry of each scored token: the membership attacks' log-softmax moments
SAMPLE = 48  # probes tokenized to measure a set's prompt lengths


@dataclass(frozen=True)
class Work:
    """What an attack computes, in the units `wall_seconds` prices."""
    flops: float = 0.0
    passes: float = 0.0
    """Forward (or backward) passes of the whole model."""
    tokens: float = 0.0
    """Generated tokens."""
    param_ops: float = 0.0
    """Parameters touched by whole-model sweeps, summed over the sweeps."""
    collects: float = 0.0
    """Garbage collections of the process (a run's memory given back)."""

    def __add__(self, other: "Work") -> "Work":
        return Work(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def __mul__(self, k: float) -> "Work":
        return Work(*(a * k for a in self.astuple()))

    __rmul__ = __mul__

    def astuple(self) -> tuple[float, float, float, float, float]:
        return self.flops, self.passes, self.tokens, self.param_ops, self.collects


@dataclass(frozen=True)
class Size:
    """What an attack's cost depends on, read from the loaded model."""
    layers: int
    body: int
    """Parameters of all the decoder layers (2 x this FLOPs per token forward)."""
    head: int
    """Parameters of the output embedding (2 x this FLOPs per token whose logits are read)."""
    params: int
    """Every parameter (relearning trains them all)."""
    weight_bytes: int
    vocab: int


def size_of(model) -> Size:
    """The loaded model's `Size` (a few microseconds: parameter counts only)."""
    layers = decoder_layers(model)
    body = sum(p.numel() for layer in layers for p in layer.parameters())
    head = model.get_output_embeddings()
    head_n = head.weight.numel() if head is not None else 0
    params = list(model.parameters())
    vocab = int(head.weight.shape[0]) if head is not None else int(getattr(model.config, "vocab_size", 0))
    return Size(len(layers), body, head_n, sum(p.numel() for p in params),
                sum(p.numel() * p.element_size() for p in params), vocab)


@dataclass(frozen=True)
class Lengths:
    """Token counts of a set of rows: how many, their mean and longest length."""
    n: int
    mean: float
    longest: float


def lengths(encode, texts) -> Lengths:
    """`Lengths` of `encode(text)` (token ids) over `texts`, from at most SAMPLE of them spread
    over the set (the mean and longest of the sample stand for the set's)."""
    texts = list(texts)
    if not texts:
        return Lengths(0, 0.0, 0.0)
    step = max(1, len(texts) // SAMPLE)
    counts = [len(encode(t)) for t in texts[::step][:SAMPLE]]
    return Lengths(len(texts), sum(counts) / len(counts), float(max(counts)))


def generation_work(size: Size, prompts: Lengths, budget: int) -> Work:
    """Greedy answers to `prompts` (`grom.robustness.probe_recall`): batches of GEN_BATCH, each
    a prompt pass (left-padded, only the last position's logits) and up to `budget`
    decoding steps of the rows still running (`grom.eval.runner.greedy_until`)."""
    if not prompts.n:
        return Work()
    batches = math.ceil(prompts.n / GEN_BATCH)
    steps = budget * DECODE_STEPS
    generated = prompts.n * LIVE_ROWS * steps
    prefill = prompts.n * (prompts.mean + prompts.longest) / 2  # the longest first: padding
    flops = 2.0 * (size.body * prefill + size.head * prompts.n) + 2.0 * (size.body + size.head) * generated
    return Work(flops, batches * (1 + steps), generated)


def forced_work(size: Size, rows: Lengths, batch: int, logits: float) -> Work:
    """Teacher-forced passes over `rows` in batches of `batch`, with `logits` vocabulary-wide
    FLOPs per token beyond the body (the head's, the membership moments')."""
    if not rows.n:
        return Work()
    tokens = rows.n * (rows.mean + rows.longest) / 2
    return Work(tokens * (2.0 * size.body + logits), math.ceil(rows.n / batch))


@dataclass(frozen=True)
class AttackInputs:
    """What the attacks read, measured once per model and benchmark (`attack_inputs`)."""
    size: Size
    probes: Lengths
    """The held-out probes as prompts in the benchmark's format."""
    budget: int
    """New tokens an answer may take (`grom.tasks.knowledge.knowledge_budget`)."""
    asked: dict
    """Probe type -> the `Lengths` of its transformed probes (n = how many it could make)."""
    lens: Lengths
    """The logit lens's rows: question, then the answer up to its fact."""
    fitted: Lengths
    """The fitted questions with their answers (relearning trains on them)."""
    scored: Lengths
    """The membership attacks' rows: fitted, probes and holdout, each question and answer."""
    mia_sides: bool
    """Whether the membership attacks run (two rows or more on each side)."""
    depth: Lengths = Lengths(0, 0.0, 0.0)
    """The depth score's rows: the probes and the fitted questions with a fact, each question
    and answer (`grom.robustness.depth`)."""


def attack_inputs(model, tokenizer, probes, fitted, holdout, fmt) -> AttackInputs:
    """Tokenize a sample of what the attacks read (a fraction of a second; the panel keeps
    the result per model and benchmark)."""
    prompt = lambda f: (lambda q: encode_prompt(tokenizer, q, f))  # noqa: E731
    pair = lambda row: row.question + " " + row.answer  # noqa: E731
    words = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    asked = {}
    for name, kind in PROBE_TYPES.items():
        made = transform(probes, name)
        asked[name] = lengths(prompt(kind.fmt or fmt), [p.question for p in made])
    held = asked.get("heldout") or lengths(prompt(fmt), [p.question for p in probes])
    answers = [p.answer for p in probes]
    budget = knowledge_budget(tokenizer, answers[::max(1, len(answers) // SAMPLE)])
    overhead = max(0.0, held.mean - lengths(words, [p.question for p in probes]).mean)  # the template's tokens
    answer = lengths(words, answers)
    lens = Lengths(held.n, held.mean + answer.mean / 2, held.longest + answer.longest / 2)
    with_answer = lambda rows: Lengths(rows.n, rows.mean + overhead + 1, rows.longest + overhead + 1)  # noqa: E731
    fit = with_answer(lengths(words, [pair(r) for r in fitted]))
    mia_rows = list(fitted) + list(probes) + list(holdout)
    scored = with_answer(lengths(words, [pair(r) for r in mia_rows]))
    depth = with_answer(lengths(words, [pair(r) for r in list(probes) + [f for f in fitted if f.fact]]))
    return AttackInputs(size_of(model), held, budget, asked, lens, fit, scored,
                        len(fitted) >= 2 and len(holdout) >= 2, depth)


def attack_work(inputs: AttackInputs, name: str, first: int = 0, kept: bool = False) -> Work:
    """The work of attack `name` (grom.robustness.suite) on one edit whose first changed
    layer is `first` (`grom.eval.prefix.first_changed_layer`; 0: every layer, the most), in
    `Work` units. kept: the unedited model's side of the attack is on disk
    (`grom.robustness.kept`: a probe attack's unedited answers, relearning's control), so
    only the edited side is computed."""
    size = inputs.size
    sides = 1 if kept else 2
    if name in inputs.asked:  # a probe type: the base model's answers and the edited one's
        return sides * generation_work(size, inputs.asked[name], inputs.budget)
    score = generation_work(size, inputs.probes, inputs.budget)
    if name == "relearn":  # the edit and the control, each scored at every step count and trained between
        f = inputs.fitted
        batch = min(RELEARN_BATCH, max(1, f.n))
        rows = Lengths(batch, f.mean, f.longest)
        step = TRAIN_PASSES * forced_work(size, rows, batch, 2.0 * size.head) + Work(param_ops=ADAMW_OPS * size.params)
        copies = Work(param_ops=2 * size.params, collects=1)  # the weights kept, then put back; memory given back
        return sides * (len(RELEARN_STEPS) * score + max(RELEARN_STEPS) * step + copies)
    if name in ("quant4", "quant8"):
        return 2 * score + Work(param_ops=QUANTIZATIONS * QUANT_OPS * size.body)
    if name == "logit_lens":  # every layer read through the head, at one position a probe
        readout = size.layers * inputs.lens.n * (2.0 * size.head + 4.0 * size.vocab)
        return 2 * (forced_work(size, inputs.lens, LENS_BATCH, 0.0) + Work(flops=readout))
    if name == "depth":  # the unedited pass; the edited one from `first` up; a pass patched at each changed
        # layer l, which runs only the layers above l (those below replayed from the unedited pass)
        layers = max(1, size.layers)
        above = max(1, layers - min(max(first, 0), layers))
        return forced_work(size, inputs.depth, DEPTH_BATCH, 0.0) * (1 + above / layers
                                                                    + above * (above - 1) / (2 * layers))
    if name == "mia":
        if not inputs.mia_sides:
            return Work()
        return 2 * forced_work(size, inputs.scored, MIA_BATCH, 2.0 * size.head + MOMENT_OPS * size.vocab)
    raise ValueError(f"no estimate for the attack {name!r}")


def training_work(handle, bench, method: str, epochs) -> Work:
    """A trained method's run on `bench` for `epochs`, in `Work` units (`run_size`'s count):
    each optimizer step the forward and backward (TRAIN_PASSES) of its sequences, as much
    again where the loss reads a retain, reference or hidden-state pass, and AdamW's sweep of
    the trained weights; before them the reference log-probabilities of the
    forget answers where the method compares with the unedited model (one forward), and
    after them the patch (a copy and a difference of the trained weights)."""
    s, trained, n, per_sequence = run_size(handle.model, bench, method, epochs)
    row, size = get_method(s.method), size_of(handle.model)
    numel = sum(p.numel() for p in trained)
    total, _ = planned_steps(s, n)
    head = 2.0 * size.head
    batch = Lengths(min(n, s.batch_size * s.grad_accum), per_sequence, per_sequence)
    twice = row.needs_retain or row.needs_reference_logits or row.needs_hidden
    step = (2 if twice else 1) * TRAIN_PASSES * forced_work(size, batch, s.batch_size, head)
    fixed = Work(param_ops=2 * numel, collects=1)  # the patch; the run's memory given back
    if row.needs_reference:
        fixed = fixed + forced_work(size, Lengths(n, per_sequence, per_sequence), s.batch_size, head)
    return fixed + total * (step + Work(param_ops=ADAMW_OPS * numel))


def wall_rate(model) -> WallRate:
    """The `WallRate` of the device `model` computes on: a GPU (on ZeroGPU each attack also
    pays a GPU call's start), else the CPU at torch's thread count."""
    if ON_ZEROGPU:
        return replace(GPU_WALL, start_s=ZEROGPU_START_S)
    if model_device(model).type != "cpu":
        return GPU_WALL
    return replace(CPU_WALL, flops_per_s=CPU_WALL.flops_per_s * max(1, torch.get_num_threads()))


def wall_seconds(work: Work, size: Size, rate: WallRate) -> float:
    """Seconds of `work` on a model of `size` at `rate` (a sum of the costs, not a roofline:
    each term dominates somewhere, the body's FLOPs in a prompt pass, the weights' read in a
    decoding step of a few rows, the layers' fixed cost on a tiny model)."""
    per_pass = size.weight_bytes / rate.weight_bytes_per_s + size.layers * rate.layer_s
    return (rate.start_s + work.flops / rate.flops_per_s + work.passes * per_pass + work.tokens * rate.token_s
            + work.param_ops * rate.param_op_s + work.collects * rate.collect_s)


def attack_seconds(inputs: AttackInputs, names, rate: WallRate) -> dict[str, float]:
    """{name: estimated wall seconds} of each attack in `names` on one edit."""
    return {name: wall_seconds(attack_work(inputs, name), inputs.size, rate) for name in names}
