"""One schema for every benchmark: the example types and the `Benchmark` that holds them.

Examples are frozen dataclasses, so a benchmark can be passed around as a plain value.
Which kind of key an example yields follows from its type (see `grom.data.encoding`):

- `QAExample`: the positions that predict each answer token after the formatted prompt;
- `TextExample`: every position of the text (corpus mode);
- `ChoiceExample`: like a QA pair whose answer is the correct option's text;
- `FactRecord`: the last token of the subject in the prompt (``subject_last``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from grom.data.prompts import PromptFormat


@dataclass(frozen=True)
class QAExample:
    """A question/answer pair, with the variants TOFU-style metrics need."""

    question: str
    answer: str
    paraphrased_question: str | None = None
    paraphrased_answer: str | None = None
    perturbed_answers: tuple[str, ...] = ()
    fact: str | None = None  # the short fact string inside `answer`, for fact recall
    subject: str | None = None  # e.g. the author the pair is about
    id: str | None = None


@dataclass(frozen=True)
class TextExample:
    """A document (or window of one); every position is a key in corpus mode."""

    text: str
    id: str | None = None


@dataclass(frozen=True)
class ChoiceExample:
    """A multiple-choice question (WMDP / MMLU style)."""

    question: str
    choices: tuple[str, ...]
    answer_index: int
    subject: str | None = None
    id: str | None = None

    @property
    def answer(self) -> str:
        return self.choices[self.answer_index]


@dataclass(frozen=True)
class FactRecord:
    """A ZsRE-style fact: `prompt` mentions `subject`; `answer` completes it."""

    subject: str
    prompt: str
    answer: str
    rephrase: str | None = None
    neighborhood_prompt: str | None = None
    neighborhood_answer: str | None = None
    id: str | None = None


Example = Union[QAExample, TextExample, ChoiceExample, FactRecord]


@dataclass(frozen=True)
class Benchmark:
    """A benchmark split: what to forget, what to keep, and what to evaluate on.

    `eval_sets` holds the named evaluation sets (for TOFU: "forget", "retain",
    "real_authors", "world_facts", "holdout"; for MUSE: "verbmem_forget", ...), each a
    tuple of examples. `task` names the task that evaluates it (`tofu`, `muse`, `wmdp`, `zsre`,
    `custom`, `knowledge`: a `grom.tasks.Task`), so evaluation knows which metrics apply.
    """

    name: str
    split: str
    forget: tuple[Example, ...]
    retain: tuple[Example, ...]
    eval_sets: Mapping[str, tuple[Example, ...]] = field(default_factory=dict)
    prompt_format: PromptFormat | None = None
    task: str = "tofu"
    description: str = ""

    def __post_init__(self) -> None:
        if not self.forget:
            raise ValueError(f"benchmark {self.name}/{self.split}: the forget set is empty")


def as_examples(items: Sequence[Example]) -> tuple[Example, ...]:
    """Validate that `items` are schema examples and return them as a tuple."""
    allowed = (QAExample, TextExample, ChoiceExample, FactRecord)
    out = tuple(items)
    for i, ex in enumerate(out):
        if not isinstance(ex, allowed):
            raise TypeError(
                f"item {i} is a {type(ex).__name__}; expected one of "
                f"{', '.join(t.__name__ for t in allowed)} (see grom.data.schema)"
            )
    return out
