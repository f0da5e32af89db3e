"""Every method the studio can run beside GROM, by one name: the trained methods of
`grom.methods.METHODS` (GA, GradDiff, NPO, SimNPO, IDK-NLL, ...) and the closed-form
locate-then-edit editors of `grom.methods.EDITORS` (ROME, MEMIT, AlphaEdit,
ZeroUnlearn), and LUNAR (the "redirection" family, grom.methods.lunar: one down_proj refitted
so that the forget activations move along a refusal direction). The Compare tab's baseline
and the "Is it gone?" tab both train through `run_comparator`, so each lists, checks and runs the same methods.

The two kinds share the panel's two number boxes: a trained method reads them as epochs
and learning rate; an editor as the steps and learning rate of its per-fact value
optimisation (`grom.methods.editors.value_optimisation.ValueSettings`), the only backpropagation it needs;
LUNAR as the epochs and learning rate of its AdamW fit of one down_proj (upstream's 20 and 0.01),
at its own layer (upstream's relative depth, `lunar_layer`), in one call like an editor.
An editor edits GROM's band of the session's edit where there is one (the paper's terms:
the same keys and retain covariance, only the update rule differs), unless that band ends
at the model's last layer (`editor_band`): there a value vector at the subject's token
reaches no answer token (nothing mixes positions after the last layer), so ROME, MEMIT and
AlphaEdit would change nothing (SmolLM2's default band, 25-29 of 30); the editors then
take the upstream editors' band instead, and the summary says so.

`unavailable(name, bench)` says why a method cannot run on a split (an editor without
facts that carry a subject, a retain-term method without a retain set) in the words its
run is refused with (`gap`: also a few words for the box), as the method registry's row
says it (`grom.methods.can_run`); the method box greys such methods out
(`comparator_choices` with the split), and `glossary` gives each method's line: what it
does, what it needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from components.core.device import DEVICE_LOCK, ON_ZEROGPU, device_progress, give_turn, on_device
from components.core.durations import train_call_s, train_plan
from components.core.errors import UserError, shorten
from components.core.gpu_time import refuse_over
from components.core.limits import limit, over
from components.core.session import ModelKey, resident
from components.core.train_parts import train_in_calls
from grom.methods import (
    EDITORS,
    METHODS,
    EditorConfig,
    LunarConfig,
    Method,
    Reason,
    RunSettings,
    can_run,
    editor_band,
    family_of,
    get,
    names,
    recipe_for_task,
    trainable_reason,
)
from grom.methods.editors.value_optimisation import ValueSettings
from grom.methods.trained.checkpoint import Part
from grom.model.arch import num_layers

MAX_VALUE_STEPS = 100  # a value optimisation's steps: ROME's 20-25, upstream's longest 50


@dataclass(frozen=True)
class Boxes:
    """What the panel's two number boxes mean for a method, and their starting values."""

    count_label: str
    rate_label: str
    count: float
    rate: float


def is_editor(name: str) -> bool:
    return family_of(name) == "editor"


def is_redirection(name: str) -> bool:
    """LUNAR's family: one matrix refitted on forward-pass activations (grom.methods.lunar)."""
    return family_of(name) == "redirection"


def is_trained(name: str) -> bool:
    """A trained method (fine-tuning with a loss), which ZeroGPU splits into calls; the
    editors and LUNAR run in one."""
    return family_of(name) == "trained"


def comparator_choices(bench=None) -> list[tuple[str, str]]:
    """(label, name) of every method: "GA: what it does", then "ROME: ... (closed-form
    editor; needs facts with a subject)". With a benchmark, a method that cannot run on it
    is greyed out: "⊘ ROME: not on this split (...)", the reason in `unavailable`."""
    trained = [(f"{row.label}: {row.description.rstrip('.')}", name) for name, row in METHODS.items()]
    editors = [(f"{e.label}: {e.description.split(';')[0]} (closed-form editor; needs facts with a subject)", name)
               for name, e in EDITORS.items()]
    redirection = [(f"{get(name).label}: {get(name).description.split(':', 1)[-1].split(';')[0].strip()} "
                    "(activation redirection; needs questions and a retain set)", name)
                   for name in names("redirection")]
    if bench is None:
        return trained + editors + redirection
    everything = trained + editors + redirection
    gaps = {name: gap(name, bench) for _, name in everything}
    return [(label if gaps[name] is None else f"⊘ {comparator_label(name)}: not on this split ({gaps[name][0]})",
             name) for label, name in everything]


def glossary(name: str) -> str:
    """The method's glossary line: its label, its kind, what it does and what it needs (the
    registry row's description)."""
    name = str(name or "").strip().lower()
    if name in EDITORS:
        return f"**{EDITORS[name].label}** (closed-form editor on GROM's keys): {EDITORS[name].description}"
    if name in METHODS:
        return f"**{METHODS[name].label}** (trained method): {METHODS[name].description}"
    if is_redirection(name):
        return (f"**{get(name).label}** (activation redirection, one down_proj refitted; the boxes are its "
                f"epochs and learning rate): {get(name).description}")
    return ""


def comparator_label(name: str) -> str:
    name = str(name or "").strip().lower()
    if is_redirection(name):
        return get(name).label
    return EDITORS[name].label if name in EDITORS else METHODS[name].label


def redirection_boxes() -> Boxes:
    """LUNAR's boxes: its AdamW fit's epochs and learning rate (upstream's defaults)."""
    c = LunarConfig()
    return Boxes("Epochs (AdamW fit of one down_proj)", "Learning rate", c.epochs, c.lr)


REDIRECTION_MAX_EPOCHS = 100
"""LUNAR's epochs train one matrix on activations read once (a few seconds each on a CPU for
SmolLM2), not the model: GROM_MAX_EPOCHS (10, a trained method's bound) would refuse
upstream's own 20."""


def check_redirection(name: str, bench, epochs, lr) -> tuple[int, float]:
    """LUNAR's (epochs, lr), checked, and the split checked to hold what it needs (forget
    questions, a retain set); a `UserError` that names what is missing, before any work."""
    label = comparator_label(name)
    try:
        epochs_f, lr_f = float(epochs), float(lr)
    except (TypeError, ValueError):
        raise UserError(f"{label}'s epochs and learning rate must be numbers (got {shorten(epochs)}, "
                        f"{shorten(lr)}).") from None
    top = max(REDIRECTION_MAX_EPOCHS, limit("GROM_MAX_EPOCHS"))
    if not (math.isfinite(epochs_f) and 1 <= epochs_f <= top and epochs_f == int(epochs_f)):
        raise UserError(f"Epochs = {shorten(epochs)}: a whole number from 1 to {top} (upstream: 20).")
    if not (math.isfinite(lr_f) and 0 < lr_f < 1):
        raise UserError(f"Learning rate = {shorten(lr)}: a number above 0 and below 1 (upstream: 0.01).")
    missing = can_run(name, None, bench)
    if missing:
        raise UserError(missing[1])
    if len(bench.forget) > limit("GROM_MAX_EXAMPLES"):
        raise over(f"{label} reads every prompt token of the forget set, and {bench.name}/{bench.split} has {{n}}",
                   len(bench.forget), "GROM_MAX_EXAMPLES")
    return int(epochs_f), lr_f


def editor_boxes() -> Boxes:
    v = ValueSettings()
    return Boxes("Value steps (per-fact vector)", "Value learning rate", v.steps, v.lr)


def check_editor(name: str, bench, steps, lr) -> tuple[int, float]:
    """An editor's (value steps, value lr), checked, and the split checked to hold what an
    editor needs (facts with a subject, a retain set for its covariance); a `UserError`
    that names what is missing, before any work."""
    label = comparator_label(name)
    try:
        steps_f, lr_f = float(steps), float(lr)
    except (TypeError, ValueError):
        raise UserError(f"{label}'s value steps and learning rate must be numbers (got {shorten(steps)}, "
                        f"{shorten(lr)}).") from None
    if not (math.isfinite(steps_f) and steps_f >= 1 and steps_f == int(steps_f)):
        raise UserError(f"Value steps = {shorten(steps)}: a whole number from 1 (ROME takes 20 to 25).")
    if steps_f > MAX_VALUE_STEPS:
        raise UserError(f"Value steps = {steps_f:g}: at most {MAX_VALUE_STEPS} on this server.")
    if not (math.isfinite(lr_f) and 0 < lr_f <= 10):
        raise UserError(f"Value learning rate = {shorten(lr)}: a number above 0 and at most 10 (ROME: 0.1 to 0.5).")
    missing = can_run(name, None, bench)
    if missing:
        raise UserError(missing[1])
    if len(bench.forget) > limit("GROM_MAX_EXAMPLES"):
        raise over(f"{label} optimises a vector per fact, and {bench.name}/{bench.split} has {{n}}",
                   len(bench.forget), "GROM_MAX_EXAMPLES")
    return int(steps_f), lr_f


def parse_method(method) -> Method:
    """The registry row for the method box's value (its name or label, any case)."""
    name = str(method or "").strip().lower()
    for key, row in METHODS.items():
        if name in (key, row.label.lower()):
            return row
    raise UserError(f"Unknown baseline {shorten(method)!r}: choose one of "
                    f"{', '.join([row.label for row in METHODS.values()] + [e.label for e in EDITORS.values()])}.")


def check_trainable(bench, method: Method | str) -> None:
    """A `UserError` saying what the split lacks for the trained method, before any work."""
    missing = trainable_reason(method if isinstance(method, Method) else parse_method(method), None, bench)
    if missing:
        raise UserError(missing[1])


def gap(name: str, bench) -> Reason | None:
    """What the method `name` lacks on `bench` at its defaults (None: nothing, or no
    benchmark is loaded): the registry's `Reason` (a few words, the message its run would be
    refused with)."""
    if bench is None:
        return None
    return can_run(name if is_editor(name) or is_redirection(name) else parse_method(name).name, None, bench)


def unavailable(name: str, bench) -> str | None:
    """Why the method `name` cannot run on `bench` (None: it can), in its refusal's words."""
    missing = gap(name, bench)
    return None if missing is None else missing[1]


def band_note(edit_band, grom_band, n_layers: int) -> str:
    """Why the editors ran on `edit_band` (`editor_band`'s) rather than GROM's band
    (empty where it is GROM's, or there was none)."""
    if not grom_band or tuple(edit_band) == tuple(sorted(grom_band)):
        return ""
    return (f" GROM's band ({min(grom_band)}-{max(grom_band)}) ends at the model's last layer ({n_layers - 1}), "
            "where an editor's value vector at the subject's token reaches no answer token, so the editors "
            f"run on layers {min(edit_band)}-{max(edit_band)} (the upstream editors' band; ROME edits the "
            "last of them): their keys and retain covariance are those layers', not GROM's.")


def key_note(info) -> str:
    """How many of an editor's facts found their subject in the question (their key sits
    on its last token) and how many key on the question's last token instead (empty where
    every fact found it, or the run is not an editor's)."""
    n, on = (info or {}).get("facts"), (info or {}).get("subject_last_keys")
    if not n or on is None or on >= n:
        return ""
    return (f" {n - on} of the {n} facts' questions do not write their subject, so their key is the "
            "question's last token rather than the subject's (as the upstream editors do with no subject).")


def run_comparator(name: str, model, tokenizer, bench, count: float, rate: float, *, band=None, progress=None,
                   part: Part | None = None, between=None):
    """The method's edit of the session's data (an `Edit`; the model is given back as
    found): a trained method with the benchmark's recipe for `count` epochs at lr `rate`
    (with `part`: that part of its training, a `Paused` record where it stops before the
    end), an editor with `count` value steps at lr `rate` on `editor_band(band)` (GROM's
    band, `band`, where an editor can move facts there). `between` (`grom.turns`), given
    to every family's run: a trained method lends the model out between its optimizer
    steps, an editor between its value steps and layers, LUNAR between its activation
    batches and epochs."""
    method = get(name)
    if method.family == "editor":
        config = EditorConfig(layers=editor_band(band, num_layers(model)), prompt_format=bench.prompt_format,
                              values=ValueSettings(steps=int(count), lr=float(rate)))
        return method.run(model, tokenizer, bench.forget, bench.retain, config, progress=progress, between=between)
    if method.family == "redirection":
        config = LunarConfig(**{**method.defaults(model), "epochs": int(count), "lr": float(rate),
                                "prompt_format": bench.prompt_format})
        return method.run(model, tokenizer, bench.forget, bench.retain, config, progress=progress, between=between)
    settings = RunSettings(recipe=recipe_for_task(bench.task).name, epochs=count, lr=rate,
                           prompt_format=bench.prompt_format)
    return method.run(model, tokenizer, bench.forget, bench.retain, settings, progress=progress, part=part,
                      between=between)


@on_device(duration=train_call_s)
def train_call(key: ModelKey, bench, name: str, count: float, rate: float, band=None, part: Part | None = None,
               progress=None):
    """`run_comparator` on the resident model `key`, as one compute function: the method's
    Edit (CPU patches of every parameter it changed; the shared model given back as
    found), or with `part` (a trained method on ZeroGPU) that part of its training: a
    `Paused` record where it stops before the end. A split it cannot train on is a
    `UserError` that says so."""
    with DEVICE_LOCK:
        handle = resident(key, "baseline")
        try:
            return run_comparator(name, handle.model, handle.tokenizer, bench, count, rate, band=band,
                                  progress=progress, part=part, between=give_turn)
        except (ValueError, TypeError) as err:  # the data: nothing the baseline can train on
            raise UserError(f"{comparator_label(name)} cannot run on {bench.name}/{bench.split}: {err}.") from err


def train_comparator(key: ModelKey, bench, name: str, count: float, rate: float, band=None, progress=None):
    """The method's Edit on the session's data (`train_call`), `progress` a callback of this
    process. Off ZeroGPU: one call in this process, as it always ran. On ZeroGPU a trained
    method runs as GPU calls that each fit GROM_GPU_SECONDS (`train_plan`), its state
    carried between them in a checkpoint file (components.core.train_parts), its progress
    and Stop relayed from the worker; an editor is one call."""
    if not ON_ZEROGPU or not is_trained(name):
        return train_call(key, bench, name, count, rate, band, None, device_progress(progress))
    plan = train_plan(key, bench, name, count)
    if plan is None:  # not loaded: the call says so
        return train_call(key, bench, name, count, rate, band, None, None)
    return train_in_calls(lambda part, watch: train_call(key, bench, name, count, rate, band, part, watch),
                          plan, comparator_label(name), progress)


def check_gpu_time(key: ModelKey, bench, name: str, count: float) -> None:
    """On ZeroGPU: refuse, before any work, a training whose single optimizer step (with its
    checkpoint read and written) cannot fit one GPU call. A longer training is split into
    calls (`train_comparator`); its total is bounded by GROM_MAX_EPOCHS x GROM_MAX_EXAMPLES
    (the panel's checks, before this one)."""
    if not ON_ZEROGPU or not is_trained(name):
        return
    plan = train_plan(key, bench, name, count)
    if plan is not None:
        refuse_over(plan.call_s + plan.step_s, f"One optimizer step of {comparator_label(name)} on "
                    f"{len(bench.forget) + len(bench.retain):,} examples, with its checkpoint,",
                    "a smaller model")
