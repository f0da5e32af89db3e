"""The refusal target's forget keys: each forget question followed by a refusal.

The refusal target (`EditConfig.target == "refusal"`) teaches the edited layers to answer a
forget question with a refusal instead of the fact. Its forget keys are teacher-forced:
the question's prompt followed by a refusal answer (`refusal_examples`), with a key at
every position that predicts a refusal token (the last prompt token predicts the first
one) and, where the tokenizer has one, the end-of-sequence token after the refusal, so the
edited model stops once it has declined instead of going on to the fact. The gold token of
each key is then the refusal's next token, and `grom.closed_form.directions.promotion_directions` moves the
key's output toward it.

The refusals are our own wording: a small fixed set (`REFUSALS`), one chosen per question
with a seeded generator (`choose_refusals`), or one refusal given in the config.

(Was `grom/refusal.py`.)
"""
from __future__ import annotations

from typing import Sequence

import torch

from grom.data.encoding import Encoded, encode_examples, question_of
from grom.data.prompts import PromptFormat
from grom.data.schema import QAExample, TextExample, as_examples

# Short, first-person refusals: `grom.eval.metrics.answer_class` reads each one as a
# refusal (not as degenerate: "I'm afraid I don't know" has too many one-letter words for
# it), and none names a fact.
REFUSALS: tuple[str, ...] = (
    "I don't know.",
    "I'm not sure.",
    "I don't know the answer to that.",
    "I'm not sure about that.",
    "I don't have any information about that.",
    "I can't answer that.",
    "I do not know.",
    "Sorry, I don't know that.",
    "I have no idea.",
)
MAX_REFUSAL_CHARS = 500


def refusal_problem(text) -> str | None:
    """Why `text` cannot be the configured refusal (None: it can)."""
    if not isinstance(text, str):
        return f"refusal must be a text (got {type(text).__name__})"
    if not text.strip():
        return "refusal must not be empty: write the answer the edited model should give, or leave it unset"
    if len(text) > MAX_REFUSAL_CHARS:
        return f"refusal is {len(text)} characters long: keep it under {MAX_REFUSAL_CHARS}"
    return None


def choose_refusals(n: int, seed: int, refusal: str | None = None) -> list[str]:
    """The refusal of each of `n` questions: `refusal` for all, or one of `REFUSALS` per
    question drawn uniformly with a generator seeded by `seed` (the same list every time)."""
    if refusal is not None:
        return [refusal] * n
    g = torch.Generator().manual_seed(seed)
    return [REFUSALS[i] for i in torch.randint(len(REFUSALS), (n,), generator=g).tolist()]


def _question(example) -> str:
    question = question_of(example)
    if question is not None:
        return question
    if isinstance(example, TextExample):
        raise ValueError("the refusal target needs questions to refuse (QA, fact or multiple-choice "
                         "examples); a text corpus has none: use the suppression target for it")
    raise TypeError(f"cannot take refusal keys from a {type(example).__name__}")


def refusal_examples(examples: Sequence, seed: int, refusal: str | None = None) -> list[QAExample]:
    """Each example's question (its formatted prompt, as QA keys read it) with a refusal
    as the answer (`choose_refusals`)."""
    examples = as_examples(examples)
    answers = choose_refusals(len(examples), seed, refusal)
    return [QAExample(_question(ex), a, subject=getattr(ex, "subject", None)) for ex, a in zip(examples, answers)]


def encode_refusals(tokenizer, examples: Sequence, *, seed: int, refusal: str | None = None,
                    fmt: PromptFormat | None = None, max_length: int = 512, mode: str = "qa") -> list[Encoded]:
    """The teacher-forced refusal keys of `examples`: prompt + refusal, a key at each
    position that predicts a refusal token, then one more (the refusal's last token)
    predicting EOS when the tokenizer has one and the refusal was not cut by `max_length`.
    With a prompt key mode (`grom.data.encoding.PROMPT_MODES`) the keys are the prompt's
    positions of that mode instead, each toward the refusal's first token (and, for
    prompt_qa, the refusal's positions and its EOS as well). Example numbers are kept, so
    keys stay grouped by forget example for the influence audit."""
    qa = refusal_examples(examples, seed, refusal)
    mode = "qa" if mode == "auto" else mode
    encoded = encode_examples(tokenizer, qa, mode=mode, fmt=fmt, max_length=max_length)
    eos = tokenizer.eos_token_id
    if eos is None or mode not in ("qa", "prompt_qa"):
        return encoded
    return [Encoded(e.input_ids, e.positions + (len(e.input_ids) - 1,), e.gold + (int(eos),), e.example)
            if len(e.input_ids) < max_length else e for e in encoded]  # else: the refusal may be cut
