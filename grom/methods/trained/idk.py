"""The "I don't know" answers of IDK-NLL and IDK-DPO, and the alternate answer each forget
question trains toward.

`IDK_ANSWERS` is this project's own set of refusals (TOFU ships ``data/idontknow.jsonl`` and
OpenUnlearning ``data/idk.jsonl`` for the same purpose; neither is copied here): varied in
length and wording, none naming the question's subject, none inventing a fact.

`idk_alternates(examples, seed)` pairs each forget question with one refusal drawn with a
seeded generator, once per run. Deliberate difference from OpenUnlearning
(src/data/qa.py ``QAwithIdkDataset.item_with_idk`` at d3d7cf9e6b3c125d16687d4232680d8d83548f1a
draws a new refusal every time an item is read): a fixed pair lets IDK-DPO compute the
reference model's log-probability of each alternate once, before training, as NPO's is,
instead of keeping a second model.
"""
from __future__ import annotations

from typing import Sequence

import torch

from grom.data.schema import FactRecord, QAExample

IDK_ANSWERS: tuple[str, ...] = (
    "I don't know.",
    "I'm not sure about that.",
    "I don't have that information.",
    "I can't answer that question.",
    "That is something I don't know.",
    "I have no knowledge of that.",
    "I'm afraid I can't help with that one.",
    "Sorry, I don't know the answer.",
    "I'm unable to answer that.",
    "I don't have any details on that.",
    "That's beyond what I know.",
    "I couldn't tell you.",
    "I have no information about this.",
    "I'm not able to say.",
    "Unfortunately, I don't know.",
    "I don't recall anything about that.",
    "I'm not aware of the answer to that.",
    "That isn't something I can answer.",
    "I really have no idea.",
    "I can't say for certain, and I don't want to guess.",
    "I don't know enough to answer that.",
    "My knowledge doesn't cover that.",
    "I'm sorry, but I don't have an answer for you.",
    "I'd rather not guess; I don't know.",
    "That's not something I have information on.",
    "I can't provide an answer to that.",
    "No idea, I'm afraid.",
    "I lack the information to answer that.",
    "I'm not certain, so I won't say.",
    "I don't have a reliable answer to that question.",
    "Honestly, I don't know.",
    "I can't recall that.",
    "I'm not familiar with that.",
    "I have nothing I can tell you about that.",
    "That's unknown to me.",
    "I wish I could help, but I don't know.",
)


def idk_question(example) -> str:
    """The question a forget example asks (its prompt, for a fact record)."""
    if isinstance(example, QAExample):
        return example.question
    if isinstance(example, FactRecord):
        return example.prompt
    raise ValueError(f"an \"I don't know\" answer replaces the answer to a question, and a "
                     f"{type(example).__name__} has none: use question/answer forget examples")


def idk_alternates(examples: Sequence, seed: int,
                   refusals: Sequence[str] = IDK_ANSWERS) -> tuple[QAExample, ...]:
    """Each example's question with one refusal as its answer, chosen uniformly with a
    generator seeded by `seed` (the same run seed gives the same pairs). (len(examples),)"""
    if not refusals or any(not str(r).strip() for r in refusals):
        raise ValueError("the refusal set must hold at least one non-empty answer")
    g = torch.Generator().manual_seed(int(seed))
    pick = torch.randint(0, len(refusals), (len(examples),), generator=g).tolist()
    return tuple(QAExample(idk_question(ex), str(refusals[k]), id=getattr(ex, "id", None))
                 for ex, k in zip(examples, pick))
