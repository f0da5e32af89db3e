"""Text normalisation and whole-word matching, below both the data loaders and the metrics:
the real-knowledge loader refuses a fact its answer does not contain, and fact recall looks
for that fact in a generation, so both must read text the same way."""
from __future__ import annotations

import re

_NON_WORD = re.compile(r"[^\w\s]|_", re.UNICODE)
_SPACES = re.compile(r"\s+", re.UNICODE)


def normalise_text(text: str) -> str:
    """Lower-case, punctuation -> space, whitespace collapsed and stripped."""
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    return _SPACES.sub(" ", _NON_WORD.sub(" ", text.lower())).strip()


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether `phrase` is in `text` as whole words, after `normalise_text` on both: ``" " +
    phrase + " "`` in ``" " + text + " "``. So "Ivo Marr, a poet." contains "ivo marr",
    while "19870" does not contain "1987". An empty phrase is in no text."""
    p = normalise_text(phrase)
    return bool(p) and f" {p} " in f" {normalise_text(text)} "
