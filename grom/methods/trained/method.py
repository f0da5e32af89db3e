"""The trained methods' row (`Method`: a loss function and what it needs), their family of
the method registry (`METHODS`, `register_method`), what a trained method can run on
(`trainable_reason`) and the retain term they share (`with_retain`) (was
grom/baselines/methods.py). Each built-in method is a file of grom/methods/trained/ that
registers its row.

A row (`Method`) names the method, says what its loss needs (a retain batch, the unedited
model's log-probabilities of the forget answers, an alternate answer set) and gives its
hyperparameters with OpenUnlearning's defaults (``configs/trainer/<Method>.yaml``,
``method_args``). The trainer (grom.methods.trained.trained_edit) reads only the row: it computes what
the row needs, hands it to the row's loss as a `LossInputs`, and never asks which method it
runs. Adding a method is writing its loss and calling `register_method` with its row:

    def my_loss(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        forget = ga_loss(x.forget_nll, x.forget_counts)
        return forget, {"forget": forget}

    register_method(Method("mine", "Mine", my_loss, "Gradient ascent, renamed."))

The losses themselves are the pure functions of grom.methods.trained.losses; `with_retain` adds
the shared retain term to a method's forget loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import torch

from grom import registry
from grom.data.schema import ChoiceExample, FactRecord, QAExample, TextExample
from grom.methods.trained.losses import mean_nll
from grom.model.arch import num_layers
from grom.registry import FamilyView, MethodEntry, Reason, UnknownMethod, where  # noqa: F401 (UnknownMethod: get_method raises it)


@dataclass(frozen=True)
class LossInputs:
    """What a method's loss sees of one micro-batch (B sequences), all from the model being
    trained unless said otherwise; tensors carry the autograd graph.

    forget_nll, forget_counts: (B,) the summed NLL of each forget sequence's answer tokens
    and their number (`grom.methods.trained.losses.sequence_nll`). retain_nll, retain_counts: the
    same for B retain sequences drawn at random, None when the run has no retain term
    (`Method.uses_retain`). reference_nll: (B,) the forget NLL under the model as it was
    before training (no graph), None unless the method `needs_reference`. args: the
    method's hyperparameters, resolved (its row's defaults, overridden by the caller's).
    retain_kl: () the KL retain term (`grom.methods.trained.losses.kl_to_reference`) when the
    run asks for it (``retain_loss="kl"``), else None; a method's retain term is then this
    instead of the retain NLL.

    forget_logits (B, T, V), forget_labels (B, T): the forget batch's logits (with graph)
    and its HF-style labels (-100 where there is no loss), for token-level losses.
    reference_logits (B, T, V): the unedited model's logits on the same batch (no graph),
    None unless the method `needs_reference_logits`. alternate_nll, alternate_counts (B,):
    the summed NLL of each forget question's alternate answer (an "I don't know") and its
    token count, None unless the method `needs_answers`; reference_alternate_nll (B,): the
    same under the unedited model, when it also `needs_reference`. state: a dict that lives
    for the whole run (the same object at every micro-batch), for a method that carries a
    value from step to step (PDU's dual variable). epoch: the passes over the forget set
    completed before this micro-batch. forget_hidden, retain_hidden (B, T, d): the output
    of decoder layer ``args["layer"]`` on the forget / retain batch (with graph), and
    reference_retain_hidden the unedited model's (no graph), when the method
    `needs_hidden`; retain_labels (B, T) the retain batch's labels.
    """

    forget_nll: torch.Tensor
    forget_counts: torch.Tensor
    retain_nll: torch.Tensor | None
    retain_counts: torch.Tensor | None
    reference_nll: torch.Tensor | None
    args: Mapping[str, float]
    retain_kl: torch.Tensor | None = None
    forget_logits: torch.Tensor | None = None
    forget_labels: torch.Tensor | None = None
    reference_logits: torch.Tensor | None = None
    alternate_nll: torch.Tensor | None = None
    alternate_counts: torch.Tensor | None = None
    reference_alternate_nll: torch.Tensor | None = None
    state: dict | None = None
    epoch: int = 0
    forget_hidden: torch.Tensor | None = None
    retain_hidden: torch.Tensor | None = None
    reference_retain_hidden: torch.Tensor | None = None
    retain_labels: torch.Tensor | None = None


# (the scalar to minimise, the named terms to log, e.g. {"forget": ..., "retain": ...})
LossFn = Callable[[LossInputs], tuple[torch.Tensor, dict[str, torch.Tensor]]]
# (the trained weight change by parameter name, the run's args) -> the Edit's patches
Finish = Callable[[dict, Mapping[str, float]], dict]
# (model, tokenizer, forget examples, the run's Settings, progress) -> each example's
# alternate answers, one or more per example (AltPO's, generated by the model itself)
MakeAlternates = Callable[..., Sequence[Sequence[str]]]


@dataclass(frozen=True)
class Method:
    """One unlearning method.

    name: the registry key, lower case ("npo"). label: how people write it ("NPO").
    loss: the loss of one micro-batch (`LossFn`). description: one sentence on what it does
    and what it needs, for a UI. needs_retain: the loss has a retain term (a retain set is
    required unless `alpha` is 0). needs_reference: the loss compares with the unedited
    model's forget NLL (computed once, before training, one number per sequence; also the
    alternate answers' when it `needs_answers`). needs_answers: the loss trains toward an
    alternate answer per forget question: `run_baseline` pairs each with a seeded "I don't
    know" (grom.methods.trained.idk), or takes the caller's `alternates`; the forget set must then
    be question/answer examples. needs_reference_logits: the loss reads the unedited
    model's logits on each forget batch (run with a copy of the trained weights only, no
    second model). needs_hidden: the loss reads the activations of decoder layer
    ``args["layer"]`` (its defaults must hold "layer"), the retain batch's also under the
    unedited weights. defaults: every hyperparameter the loss reads (`LossInputs.args`), with
    its default; the caller may override them (a value for any other is ignored, with a
    warning). positive: the hyperparameters that must be > 0 (every one must be finite).
    finish: None, or a function (weight change of the trained run, args) -> the Edit's
    patches, for a method whose edit is not the trained change itself (TaskVector
    negates and scales it). recipe: training settings this method runs with unless the
    caller gives them (e.g. RMU's constant schedule), over the benchmark's recipe.
    make_alternates: None, or for a method that `needs_answers` the function that makes the
    alternate answers when the caller gives none (`MakeAlternates`; AltPO generates them
    with the model), instead of a seeded "I don't know". check: None, or a function of the
    resolved args that raises ValueError on a combination out of range (run before any
    work, after the finite / positive checks). fit: None, or a function (the row, the
    model's number of decoder layers) -> the row with its defaults and recipe fitted to such
    a model (RMU's steering layer and trained layers); `fitted(model)` applies it.
    """

    name: str
    label: str
    loss: LossFn
    description: str
    needs_retain: bool = False
    needs_reference: bool = False
    needs_answers: bool = False
    defaults: Mapping[str, float] = field(default_factory=dict)
    needs_reference_logits: bool = False
    needs_hidden: bool = False
    positive: tuple[str, ...] = ()
    finish: Finish | None = None
    recipe: Mapping[str, object] = field(default_factory=dict)
    make_alternates: MakeAlternates | None = None
    check: Callable[[Mapping[str, float]], None] | None = None
    fit: Callable[["Method", int], "Method"] | None = None

    def __post_init__(self):
        if not self.name or self.name != self.name.strip().lower():
            raise ValueError(f"method name {self.name!r}: use a non-empty lower-case name")
        object.__setattr__(self, "defaults", MappingProxyType({k: float(v) for k, v in self.defaults.items()}))
        object.__setattr__(self, "recipe", MappingProxyType(dict(self.recipe)))
        if self.needs_hidden and "layer" not in self.defaults:
            raise ValueError(f"method {self.name}: needs_hidden reads args['layer']; give it a default")
        unknown = sorted(set(self.positive) - set(self.defaults))
        if unknown:
            raise ValueError(f"method {self.name}: positive names {unknown}, which are not in its defaults")
        if self.make_alternates is not None and not self.needs_answers:
            raise ValueError(f"method {self.name}: make_alternates is for a method that needs_answers")

    def fitted(self, model) -> "Method":
        """This row with its defaults and recipe fitted to `model` (itself where the method
        has no `fit` or there is no model)."""
        if self.fit is None or model is None:
            return self
        return self.fit(self, num_layers(model))

    def defaults_for(self, model=None) -> dict:
        """The run's defaults on `model`: the row's own training settings (its `recipe`) and
        its hyperparameters as ``method_args``, fitted to the model."""
        row = self.fitted(model)
        return {**dict(row.recipe), "method_args": dict(row.defaults)}

    def check_args(self, args: Mapping[str, float]) -> None:
        """Refuse hyperparameters out of range, naming the first one: every one finite,
        those in `positive` > 0, then the row's own `check`."""
        for k, v in args.items():
            if not math.isfinite(v) or (k in self.positive and not v > 0):
                need = " > 0" if k in self.positive else ""
                raise ValueError(f"{self.label}: {k} = {v}; it must be a finite number{need}")
        if self.check is not None:
            self.check(args)

    def uses_retain(self, args: Mapping[str, float]) -> bool:
        """Whether a run with these hyperparameters has a retain term: the method has one
        and its weight `alpha` (OpenUnlearning's name for it in every method) is not 0."""
        return self.needs_retain and args.get("alpha", 1.0) != 0


METHODS: Mapping[str, Method] = FamilyView("trained")
"""Every registered trained method, in registration order: the trained family of the one
registry (grom.registry), read-only (change it with register_method /
unregister_method)."""


def get_method(name: str) -> Method:
    """The registered trained method `name` (case and surrounding spaces ignored)."""
    return registry.get(name, "trained").detail


USABLE = (QAExample, TextExample, ChoiceExample, FactRecord)  # the example types the trainer encodes


def trainable_reason(row: Method, model, data) -> Reason | None:
    """What the trained method `row` lacks on `data` at its defaults (None: nothing): the
    trainer trains on question/answer, text, multiple-choice or fact examples; a method
    with a retain term needs a retain set, one that trains toward alternate answers needs
    questions; one that reads a decoder layer's activations a model with two layers or more."""
    at = where(data)
    label = row.label
    forget, retain = getattr(data, "forget", ()) or (), getattr(data, "retain", ()) or ()
    if not any(isinstance(ex, USABLE) for ex in forget):
        return Reason("no usable rows", f"{label} cannot train on {at}: its forget set has no question/answer "
                      "or text examples. Load a benchmark (or your own file) with question/answer or text rows.")
    if row.uses_retain(row.defaults) and not any(isinstance(ex, USABLE) for ex in retain):
        free = [r.label for r in METHODS.values() if not r.needs_retain]
        return Reason("no retain set", f"{label} keeps the retain answers likely, and {at} has no retain "
                      f"examples: choose {' or '.join(free) or 'another method'}, or load a benchmark with a "
                      "retain set.")
    if row.needs_answers and not all(isinstance(ex, (QAExample, FactRecord)) for ex in forget):
        said = ("with an alternate answer the model writes" if row.make_alternates is not None
                else "with \"I don't know\"")
        return Reason("needs questions", f"{label} trains each forget question toward an answer {said}, and "
                      f"{at} has forget rows that are not questions: choose another method.")
    if model is not None and row.needs_hidden and num_layers(model) < 2:
        return Reason("too few layers", f"{label} steers one decoder layer's activations below the last, and "
                      "this model has one layer: choose another method.")
    return None


def with_retain(forget: torch.Tensor, x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gamma * forget + alpha * retain``, the combination GradDiff, NPO and SimNPO share:
    retain is NLL(retain), or the KL to the unedited model when the run computes it
    (upstream's ``compute_retain_loss``); no retain term when the run has none."""
    terms = {"forget": forget}
    loss = x.args["gamma"] * forget
    if x.retain_nll is not None:
        nll = mean_nll(x.retain_nll, x.retain_counts)
        terms["retain"] = nll if x.retain_kl is None else x.retain_kl
        if x.retain_kl is not None:
            terms["retain_nll"] = nll.detach()
        loss = loss + x.args["alpha"] * terms["retain"]
    return loss, terms
