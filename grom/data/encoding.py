"""The tokenising layer every method shares: from examples to token ids and the positions
whose NEXT token is a target ("key positions"), and from those to padded batches.

An example is tokenized into ids plus its key positions and their gold tokens:

- QA (`QAExample`, `ChoiceExample`): the positions that predict each answer token after
  the formatted prompt;
- corpus (`TextExample`): every position of each window of the text;
- subject_last (`FactRecord`): the last token of the subject in the prompt, with the
  answer's first token as gold.

GROM reads its keys at these positions (`grom.closed_form.keys` subsamples them to a
budget), the trained methods score their answer tokens at them, the editors take a fact's
key at its subject, LUNAR reads every prompt token, and the evaluation asks the same
questions (`question_of`, `choice_question`, `answer_letter`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from grom.data.prompts import PromptFormat, encode_qa, uses_chat_template
from grom.data.schema import ChoiceExample, FactRecord, QAExample, TextExample

KEY_MODES = ("auto", "qa", "corpus", "subject_last")


@dataclass(frozen=True)
class Encoded:
    """One tokenized sequence: ids, key positions and the gold token at each."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    gold: tuple[int, ...]
    example: int


@dataclass
class Batch:
    """A padded batch with its key positions flattened: row `rows[j]`, column `cols[j]`."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    rows: torch.Tensor  # (k,)
    cols: torch.Tensor  # (k,)
    gold: torch.Tensor  # (k,)
    example: torch.Tensor  # (k,)

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """The key rows of a (B, T, n) activation, (k, n)."""
        return x[self.rows.to(x.device), self.cols.to(x.device)]


LETTERS = "ABCDEFGHIJ"


def choice_question(ex: ChoiceExample) -> str:
    """The standard multiple-choice prompt body (question, lettered options, 'Answer:')."""
    opts = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(ex.choices))
    return f"{ex.question}\n{opts}\nAnswer:"


def question_of(example) -> str | None:
    """The question an example asks a model: a QA question, a fact's prompt, a multiple-choice
    question with its lettered options (`choice_question`); None for a text, which asks none."""
    if isinstance(example, QAExample):
        return example.question
    if isinstance(example, FactRecord):
        return example.prompt
    if isinstance(example, ChoiceExample):
        return choice_question(example)
    return None


def answer_letter(tokenizer, fmt: PromptFormat | None, index: int) -> str:
    """The answer text of option `index` after `choice_question`: " A" after a plain prompt
    ending in "Answer:" (as the lm-evaluation-harness scores it), the bare "A" after a chat
    template, where the assistant turn starts. Keys, baselines and the accuracy metric all
    use this one answer."""
    return LETTERS[index] if uses_chat_template(tokenizer, fmt) else " " + LETTERS[index]


def _answer_ids(tokenizer, answer: str) -> list[int]:
    return list(tokenizer(answer, add_special_tokens=False)["input_ids"])


def _encode_qa(tokenizer, question, answer, fmt, max_length, i) -> list[Encoded]:
    """The answer's tokens as read after the prompt: prompt + answer tokenised as one string
    (`grom.data.prompts.encode_qa`, as OpenUnlearning builds its labels)."""
    ids, start = encode_qa(tokenizer, question, answer, fmt)
    prompt = ids[:start][-(max_length - 1):]
    ans = ids[start:][: max(0, max_length - len(prompt))]
    if not ans:
        return []
    ids = prompt + ans
    positions = tuple(range(len(prompt) - 1, len(ids) - 1))
    return [Encoded(tuple(ids), positions, tuple(ans), i)]


def _encode_text(tokenizer, text, max_length, i) -> list[Encoded]:
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    out = []
    for start in range(0, max(1, len(ids) - 1), max_length - 1):
        window = ids[start:start + max_length]
        if len(window) >= 2:
            out.append(Encoded(tuple(window), tuple(range(len(window) - 1)), tuple(window[1:]), i))
    return out


def _subject_last(tokenizer, prompt: str, subject: str, answer: str, max_length, i) -> list[Encoded]:
    start = prompt.rfind(subject)
    if start < 0:
        raise ValueError(f"subject {subject!r} does not occur in the prompt {prompt!r}")
    enc = tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
    end = start + len(subject)
    last = max(j for j, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start and b > a)
    gold = _answer_ids(tokenizer, answer if prompt[-1:].isspace() else " " + answer)
    ids = list(enc["input_ids"])[:max_length]
    if not gold or last >= len(ids):
        return []
    return [Encoded(tuple(ids), (last,), (gold[0],), i)]


def resolve_mode(example, mode: str) -> str:
    if mode not in KEY_MODES:
        raise ValueError(f"key mode {mode!r} is unknown; use one of {', '.join(KEY_MODES)}")
    if mode != "auto":
        return mode
    return {TextExample: "corpus", FactRecord: "subject_last"}.get(type(example), "qa")


def encode_example(tokenizer, example, i: int, *, mode: str = "auto",
                   fmt: PromptFormat | None = None, max_length: int = 512) -> list[Encoded]:
    """Tokenize example number `i` into one or more `Encoded` sequences."""
    mode = resolve_mode(example, mode)
    if isinstance(example, TextExample):
        if mode != "corpus":
            raise ValueError(f"a text example only has corpus keys, not {mode!r}")
        return _encode_text(tokenizer, example.text, max_length, i)
    if isinstance(example, FactRecord):
        if mode == "subject_last":
            return _subject_last(tokenizer, example.prompt, example.subject, example.answer, max_length, i)
        q, a = example.prompt, example.answer
    elif isinstance(example, ChoiceExample):
        q, a = choice_question(example), answer_letter(tokenizer, fmt, example.answer_index)
    elif isinstance(example, QAExample):
        q, a = example.question, example.answer
        if mode == "subject_last":
            if not example.subject:
                raise ValueError("subject_last keys need examples with a subject")
            return _subject_last(tokenizer, q, example.subject, a, max_length, i)
    else:
        raise TypeError(f"cannot take keys from a {type(example).__name__}")
    if mode == "corpus":
        return _encode_text(tokenizer, f"{q} {a}", max_length, i)
    return _encode_qa(tokenizer, q, a, fmt, max_length, i)


def encode_examples(tokenizer, examples: Sequence, **kw) -> list[Encoded]:
    out = []
    for i, ex in enumerate(examples):
        out.extend(encode_example(tokenizer, ex, i, **kw))
    if not out:
        raise ValueError("the examples produced no key positions (empty answers or texts?)")
    return out






def make_batches(encoded: Sequence[Encoded], batch_size: int, pad_id: int) -> list[Batch]:
    """Right-padded batches (positions keep their meaning), in the given order."""
    batches = []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        T = max(len(e.input_ids) for e in chunk)
        ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        rows, cols, gold, example = [], [], [], []
        for b, e in enumerate(chunk):
            ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
            mask[b, : len(e.input_ids)] = 1
            rows += [b] * len(e.positions)
            cols += e.positions
            gold += e.gold
            example += [e.example] * len(e.positions)
        t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        batches.append(Batch(ids, mask, t(rows), t(cols), t(gold), t(example)))
    return batches


def pad_id(tokenizer) -> int:
    for tok_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tok_id is not None:
            return int(tok_id)
    return 0
