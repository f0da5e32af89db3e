"""What every attack measures: fact recall over probe questions, for the base model and
the edited one (`AttackResult`). Recall counts the fact as whole words in a greedy chat
answer that stops once it states the fact, as the real-knowledge comparison does
(`grom.tasks.knowledge._knowledge_row`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from torch import nn

from grom.data.prompts import PromptFormat
from grom.eval import metrics as M
from grom.eval.prefix import PrefixCache, first_changed_layer
from grom.eval.runner import generate
from grom.model.arch import num_layers
from grom.tasks.knowledge import KNOWLEDGE_GEN_BATCH, knowledge_budget
from grom.turns import Between


@dataclass(frozen=True)
class Probe:
    """One question asked of the model, and the fact a right answer states."""

    question: str
    answer: str
    fact: str
    id: str | None = None
    kind: str = "heldout"
    """Which probe type made the question ("heldout": as given; "paraphrase", "cloze" ...)."""
    subject: str | None = None
    """What the question is about ("the solar system"), for the probe types that need it
    (the reverse query, role play); None where unknown."""
    paraphrase: str | None = None
    """The same question in other words, where the data gives one (the paraphrase probe)."""
    reaches: str | None = None
    """A written probe's (multi_hop, alias: `grom.robustness.written`): the id of the QA pair
    whose fact it reaches; None where it is linked to none, and for every other probe."""


@dataclass(frozen=True)
class Recall:
    """Fact recall over probes: `value` = mean of `hits` (0 for no probe)."""

    value: float
    answers: tuple[str, ...]
    hits: tuple[float, ...]


def probe_recall(model: nn.Module, tokenizer, probes: Sequence[Probe], *, fmt: PromptFormat | None = None,
                 max_new_tokens: int | None = None, batch_size: int = KNOWLEDGE_GEN_BATCH,
                 between: Between | None = None) -> Recall:
    """Greedy answers to the probes' questions (formatted by `fmt`, the chat template by
    default), each stopped once it states its fact, and their fact recall. The budget is
    the real-knowledge comparison's (`knowledge_budget`) unless given. between: the step
    boundary of the generation's batches and decoding steps (`grom.eval.runner.generate`)."""
    return probe_recalls(model, tokenizer, [probes], fmt=fmt, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         between=between)[0]


def probe_recalls(model: nn.Module, tokenizer, groups: Sequence[Sequence[Probe]], *, fmt: PromptFormat | None = None,
                  max_new_tokens: int | None = None, batch_size: int = KNOWLEDGE_GEN_BATCH,
                  between: Between | None = None, on_step: Callable[[int, int], None] | None = None) -> list[Recall]:
    """`probe_recall` of each group of probes, every group's questions answered in one
    decoding run: on a GPU a step costs about the same for 250 rows as for 25 (on a CPU,
    where prompt passes and steps are bound by arithmetic, it saves less: BENCHMARKS.md,
    "Is it gone? The attack suite"). Each group keeps its own budget (`knowledge_budget`
    of its answers, unless given), so each answer is the one `probe_recall` of its group
    alone gives (up to the float rounding of another batch). on_step: (answers finished,
    all answers) after each step."""
    groups = [tuple(g) for g in groups]
    asked = [p for g in groups for p in g]
    if not asked:
        return [Recall(0.0, (), ()) for _ in groups]
    budgets = [b for g in groups
               for b in [max_new_tokens or knowledge_budget(tokenizer, [p.answer for p in g])] * len(g)]
    answers = generate(model, tokenizer, [p.question for p in asked], prompt_format=fmt, max_new_tokens=budgets,
                       batch_size=batch_size, stop_at=[p.fact for p in asked], between=between, on_step=on_step)
    out, at = [], 0
    for g in groups:
        said, at = answers[at:at + len(g)], at + len(g)
        hits = tuple(M.fact_recall(p.fact, a) for p, a in zip(g, said))
        out.append(Recall(sum(hits) / len(hits), tuple(said), hits) if g else Recall(0.0, (), ()))
    return out


ScoreFn = Callable[..., Recall]
"""Scores the model as it is now (an attack calls it on the base model, the edited one,
and whatever it derives from them): ``score(model)``, or where the attack gives turns
``score(model, between=...)`` (`scored`), the step boundary of its batches, whose as_found
undoes what the attack holds the model in."""


def scored(score: ScoreFn, model: nn.Module, between: Between | None) -> Recall:
    """`score(model)`, given `between` only where there is one (a caller's own ScoreFn need
    not take it when no turns are asked for)."""
    return score(model) if between is None else score(model, between=between)


class BelowTheEdit:
    """The layers below the edit's first changed one (`first_changed_layer`), run once for
    the unedited and the edited model: an attack scores the unedited model `recording`
    them (`grom.eval.prefix.PrefixCache`) and the edited one `replaying` them on the same
    input batches, so the edited model's prompt passes and teacher-forced passes run only
    the layers the edit changed (SmolLM2's default band: 5 of 30). The same numbers bit for
    bit: what is replayed is what those unchanged layers compute. Valid while the weights
    below `first` are the same in both passes (also both quantized the same way); each
    attack takes a fresh one. ``Held(below.recording)``, ``Held(edit_applied,
    below.replaying)``: a turn (`grom.turns`) leaves the hooks off."""

    def __init__(self, model: nn.Module, edit, *, upward_from: int | None = None):
        """upward_from: the unedited passes also record every layer from this one up, for
        passes that run the unedited model again from a higher layer (`replaying_from`)."""
        self.model, self.first, self.cache = model, first_changed_layer(model, edit), PrefixCache()
        above = range(max(upward_from, 1), num_layers(model) + 1) if upward_from is not None else ()
        self.capture = tuple(sorted({self.first, *above}))

    def recording(self):
        return self.cache.reusing(self.model, None, capture=self.capture)

    def replaying(self):
        return self.cache.reusing(self.model, self.first)

    def replaying_from(self, layer: int):
        """The unedited model's layers 0..layer-1 replayed on a batch `recording` saw
        (`upward_from`): a pass that changes nothing below `layer` (a hook on layer-1's output
        applies to the replayed output)."""
        return self.cache.reusing(self.model, layer)


@dataclass(frozen=True)
class AttackResult:
    """One attack's outcome: recall of the base model and of the edited model under the
    attack (`base`, `edited` in [0, 1]), the time it took, and the answers behind them.
    `details` holds what is particular to the attack (JSON-able: numbers, lists, strings),
    e.g. recall per relearning step."""

    name: str
    base: float
    edited: float
    seconds: float
    n: int
    base_answers: tuple[str, ...] = ()
    edited_answers: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON entry of `python -m grom attack` (answers left out)."""
        return {"base": self.base, "edited": self.edited, "seconds": round(self.seconds, 3), "n": self.n,
                **self.details}
