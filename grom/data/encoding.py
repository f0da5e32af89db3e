"""The tokenising layer every method shares: from examples to token ids and the positions
whose output a method reads ("key positions", each with its gold token: the answer token
the model should not give there), and from those to padded batches.

An example is tokenized into ids plus its key positions and their gold tokens (the key
modes, `KEY_MODES`):

- qa (`QAExample`, `ChoiceExample`; the paper's): the positions that predict each answer
  token after the formatted prompt, each with the token it predicts;
- corpus (`TextExample`): every position of each window of the text;
- subject_last (`FactRecord`): the last token of the subject in the prompt, with the
  answer's first token as gold;
- the prompt's positions of a question, each with the first token of the example's fact as
  gold (its answer's first token where it names no fact; `fact_start`): where the knowledge
  is recalled rather than where it is written out: subject (the tokens of
  the example's subject where its question names it, else the last prompt token),
  last_prompt (the prompt's last token: the one that predicts the answer's first), prompt
  (every prompt token, the chat template's included, as LUNAR reads them); and prompt_qa
  (every prompt token and every answer position: what a retain set keeps in place when the
  forget keys are in the prompt). `KEY_POSITIONS` names the forget / retain pairs a user
  picks from.

GROM reads its keys at these positions (`grom.closed_form.keys` subsamples them to a
budget), the trained methods score their answer tokens at them, the editors take a fact's
key at its subject, LUNAR reads every prompt token, and the evaluation asks the same
questions (`question_of`, `choice_question`, `answer_letter`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from grom.data.prompts import PromptFormat, encode_qa, format_prompt, uses_chat_template
from grom.data.schema import ChoiceExample, FactRecord, QAExample, TextExample

KEY_MODES = ("auto", "qa", "corpus", "subject_last", "subject", "last_prompt", "prompt", "prompt_qa")
PROMPT_MODES = ("subject", "last_prompt", "prompt", "prompt_qa")
"""The question modes whose keys are (also) in the prompt."""
KEY_POSITIONS = {
    "answer": ("auto", "auto"),
    "subject": ("subject", "prompt_qa"),
    "last_prompt": ("last_prompt", "prompt_qa"),
    "prompt": ("prompt", "prompt_qa"),
}
"""Where the forget keys are, as a user picks it, -> (forget key mode, retain key mode): the
answer tokens (the paper's), the subject's tokens, the last prompt token, every prompt
token; with every one in the prompt the retain keys are every prompt and answer position,
so that what is kept stays in place where the forget side is moved."""


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


def _encode_qa(tokenizer, question, answer, fmt, max_length, i, mode: str = "qa", subject: str | None = None,
               fact: str | None = None) -> list[Encoded]:
    """The answer's tokens as read after the prompt: prompt + answer tokenised as one string
    (`grom.data.prompts.encode_qa`, as OpenUnlearning builds its labels); the key positions
    of `mode` (qa, or one of `PROMPT_MODES`)."""
    ids, start = encode_qa(tokenizer, question, answer, fmt)
    cut = max(0, start - (max_length - 1))  # a prompt too long loses its start
    prompt = ids[cut:start]
    ans = ids[start:][: max(0, max_length - len(prompt))]
    if not ans:
        return []
    ids = prompt + ans
    last = len(prompt) - 1
    answer_keys = list(range(last, len(ids) - 1))
    if mode == "qa":
        positions = answer_keys
    elif mode == "last_prompt":
        positions = [last]
    elif mode == "subject":
        named = [j - cut for j in subject_positions(tokenizer, question, subject, fmt, start) if j >= cut]
        positions = named or [last]
    elif mode == "prompt":
        positions = list(range(len(prompt)))
    elif mode == "prompt_qa":
        positions = list(range(last)) + answer_keys
    else:
        raise ValueError(f"a question has no {mode!r} keys")
    at = fact_start(tokenizer, question, answer, fact, fmt, start) - cut if mode != "qa" else len(prompt)
    recalled = ids[at] if at < len(ids) else ans[0]  # a fact cut off by max_length: the answer's first token
    answered = last if mode in ("qa", "prompt_qa") else len(ids)  # from here on a key predicts its next token
    gold = [ids[j + 1] if j >= answered else recalled for j in positions]
    return [Encoded(tuple(ids), tuple(positions), tuple(gold), i)]


def fact_start(tokenizer, question: str, answer: str, fact: str | None, fmt: PromptFormat | None, start: int) -> int:
    """The index, in `encode_qa`'s ids, of the first token of `fact` inside the answer (the
    answer's first token, `start`, where the example names no fact or the answer does not
    spell it): what a prompt key's gold token is, the knowledge recalled there ("Jupiter",
    not the "The" its answer opens with)."""
    if not fact:
        return start
    text = format_prompt(tokenizer, question, fmt)
    chat = uses_chat_template(tokenizer, fmt)
    full = text + (answer.strip() if chat else answer)
    at = full.rfind(fact)
    if at < len(text):
        return start
    offsets = tokenizer(full, add_special_tokens=not chat, return_offsets_mapping=True)["offset_mapping"]
    return next((j for j in range(start, len(offsets)) if offsets[j][1] > offsets[j][0] and offsets[j][1] > at),
                start)


def _unarticled(text: str) -> str:
    words = text.replace("-", " ").split()
    return " ".join(words[1:] if words and words[0].lower() in ("the", "a", "an") else words)


def subject_positions(tokenizer, question: str, subject: str | None, fmt: PromptFormat | None,
                      start: int | None = None) -> list[int]:
    """The prompt tokens that spell `subject` where the question names it (its last mention,
    case and a leading article ignored: "the-solar-system" is named by "our solar system");
    [] where it does not, or the example has no subject."""
    if not subject or not _unarticled(subject):
        return []
    text = format_prompt(tokenizer, question, fmt)
    at = text.lower().rfind(_unarticled(subject).lower())
    if at < 0:
        return []
    end = at + len(_unarticled(subject))
    chat = uses_chat_template(tokenizer, fmt)
    enc = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    limit = len(enc["input_ids"]) if start is None else min(start, len(enc["input_ids"]))
    return [j for j, (a, b) in enumerate(enc["offset_mapping"][:limit]) if b > a and a < end and b > at]


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
    mode = "qa" if mode == "subject_last" else mode  # a multiple-choice question has no subject: its answer
    return _encode_qa(tokenizer, q, a, fmt, max_length, i, mode, getattr(example, "subject", None),
                      getattr(example, "fact", None))


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
