"""The unlearning methods `run_baseline` trains with, as one registry: a method is a loss
function and a row.

A row (`Method`) names the method, says what its loss needs (a retain batch, the unedited
model's log-probabilities of the forget answers, an alternate answer set) and gives its
hyperparameters with OpenUnlearning's defaults (``configs/trainer/<Method>.yaml``,
``method_args``). The trainer (grom.baselines.train) reads only the row: it computes what
the row needs, hands it to the row's loss as a `LossInputs`, and never asks which method it
runs. Adding a method is writing its loss and calling `register_method` with its row:

    def my_loss(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        forget = ga_loss(x.forget_nll, x.forget_counts)
        return forget, {"forget": forget}

    register_method(Method("mine", "Mine", my_loss, "Gradient ascent, renamed."))

The losses themselves are the pure functions of grom.baselines.losses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import torch

from grom.baselines.losses import ga_loss, mean_nll, npo_loss, simnpo_loss


@dataclass(frozen=True)
class LossInputs:
    """What a method's loss sees of one micro-batch (B sequences), all from the model being
    trained unless said otherwise; tensors carry the autograd graph.

    forget_nll, forget_counts: (B,) the summed NLL of each forget sequence's answer tokens
    and their number (`grom.baselines.losses.sequence_nll`). retain_nll, retain_counts: the
    same for B retain sequences drawn at random, None when the run has no retain term
    (`Method.uses_retain`). reference_nll: (B,) the forget NLL under the model as it was
    before training (no graph), None unless the method `needs_reference`. args: the
    method's hyperparameters, resolved (its row's defaults, overridden by the caller's).
    retain_kl: () the KL retain term (`grom.baselines.losses.kl_to_reference`) when the
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
    know" (grom.baselines.idk), or takes the caller's `alternates`; the forget set must then
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

    def check_args(self, args: Mapping[str, float]) -> None:
        """Refuse hyperparameters out of range, naming the first one: every one finite,
        those in `positive` > 0."""
        for k, v in args.items():
            if not math.isfinite(v) or (k in self.positive and not v > 0):
                need = " > 0" if k in self.positive else ""
                raise ValueError(f"{self.label}: {k} = {v}; it must be a finite number{need}")

    def uses_retain(self, args: Mapping[str, float]) -> bool:
        """Whether a run with these hyperparameters has a retain term: the method has one
        and its weight `alpha` (OpenUnlearning's name for it in every method) is not 0."""
        return self.needs_retain and args.get("alpha", 1.0) != 0


class UnknownMethod(ValueError):
    """No method of that name is registered in `METHODS`."""


_REGISTRY: dict[str, Method] = {}
# Every registered method, in registration order (a UI lists them so); read-only: change it
# with register_method / unregister_method.
METHODS: Mapping[str, Method] = MappingProxyType(_REGISTRY)


def get_method(name: str) -> Method:
    """The registered method `name` (case and surrounding spaces ignored)."""
    row = METHODS.get(str(name).strip().lower())
    if row is None:
        raise UnknownMethod(f"unknown unlearning method {name!r}; use one of {', '.join(METHODS)}")
    return row


def register_method(row: Method) -> Method:
    """Add `row` to `METHODS`; a name already registered is refused (unregister it first)."""
    if row.name in _REGISTRY:
        raise ValueError(f"a method named {row.name!r} ({_REGISTRY[row.name].label}) is already "
                         "registered; unregister_method it first or choose another name")
    _REGISTRY[row.name] = row
    return row


def unregister_method(name: str) -> Method:
    """Remove the method `name` from `METHODS` and return its row."""
    return _REGISTRY.pop(get_method(name).name)


# ---------------------------------------------------------------------------------------
# the built-in methods (BUILT_IN, registered at import): OpenUnlearning's src/trainer/unlearn/{grad_ascent,grad_diff,npo,simnpo}.py

def _with_retain(forget: torch.Tensor, x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


def ga(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    forget = ga_loss(x.forget_nll, x.forget_counts)
    return forget, {"forget": forget}


def graddiff(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _with_retain(ga_loss(x.forget_nll, x.forget_counts), x)


def npo(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _with_retain(npo_loss(x.forget_nll, x.reference_nll, x.args["beta"]), x)


def simnpo(x: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _with_retain(simnpo_loss(x.forget_nll, x.forget_counts, x.args["beta"], x.args["delta"]), x)


BUILT_IN = (
    Method("ga", "GA", ga, "Gradient ascent: makes the forget answers unlikely, with nothing to "
           "hold the rest in place; needs only the forget set."),
    Method("graddiff", "GradDiff", graddiff, "Gradient difference: gradient ascent on the forget "
           "answers plus ordinary training on the retain answers; needs a retain set.",
           needs_retain=True, defaults={"gamma": 1.0, "alpha": 1.0}),
    Method("npo", "NPO", npo, "Negative preference optimisation: pushes each forget answer below the "
           "unedited model's likelihood of it, with a bounded loss, plus a retain term; needs a "
           "retain set and one reference pass.",
           needs_retain=True, needs_reference=True, defaults={"beta": 0.1, "gamma": 1.0, "alpha": 1.0},
           positive=("beta",)),
    Method("simnpo", "SimNPO", simnpo, "Simple NPO: NPO's bounded loss on the length-normalised forget "
           "likelihood, with no reference model, plus a retain term; needs a retain set.",
           needs_retain=True, defaults={"beta": 4.5, "delta": 0.0, "gamma": 0.125, "alpha": 1.0},
           positive=("beta",)),
)
for _row in BUILT_IN:
    register_method(_row)
