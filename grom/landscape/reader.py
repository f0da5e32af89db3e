"""What an edit's greedy answers say, read in one teacher-forced pass, without decoding.

Each question comes with the unedited model's greedy answer to it (its draft) and, on
real knowledge, the fact that answer stated. The edited model reads every draft in one
pass (`grom.eval.runner.answers_until` with drafts and no decoding): the argmax after the
prompt and the draft's first j tokens is the edited model's greedy token j exactly when
the first j agreed. So:

- a fact is **still stated** when the edited greedy tokens agree with the draft up to the
  point where the draft's fact is settled (`grom.eval.runner.phrase_settled`): exact, the
  card's "still" for that fact;
- otherwise the answer departs before its fact. It may state the fact later in other
  words, or turn degenerate: the card, which decodes the rest, tells "forgot" from "broke"
  and from a fact stated after all. Read here, it counts as no longer stated;
- without a fact (a task that has none) the whole draft is read: an answer is the same
  exactly when every greedy token agrees, and its end where the unedited one ended (a
  kept answer unchanged);
- a cloze reading on the side (`Reading.top`): whether the fact's own tokens are still
  the edited model's top choice where the unedited answer put them, given its words
  before them. It counts a fact an answer reaches in other words, which the exact
  reading cannot see, and cannot tell forgetting from breaking.

Drafts are cut where their fact settles, so the pass reads only what decides it. The
first reading records the layers below the band in a `grom.eval.prefix.PrefixCache` (they
are the unedited model's whatever the edit); every later edit of that band then runs only
the band and above.
(Our design, on the drafted pass the card's first verdict reads.)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from grom.data.encoding import pad_id
from grom.data.prompts import encode_prompt
from grom.eval.prefix import PrefixCache, first_changed_layer
from grom.eval.report import eval_sets
from grom.eval.results import BASE, Report, subset
from grom.eval.runner import argmax_at, draft_ids, eos_ids, left_padded, phrase_settled
from grom.eval.verdicts import KEPT_SETS
from grom.landscape.grid import FITTED, HELD_OUT
from grom.model.arch import model_device
from grom.text import contains_phrase
from grom.turns import Between, Held, evaluating, give, inside

READ_SETS = (FITTED, HELD_OUT, *KEPT_SETS)
MAX_PER_SET = 64  # questions read per set at most, spread evenly over it (the card reads them all)


@dataclass(frozen=True)
class Question:
    """One question read: the unedited model's answer (the draft) and its fact (None: the
    whole answer is compared)."""

    prompt: str
    draft: str
    fact: str | None = None
    ended: bool = False
    """Without a fact: whether the unedited answer ended there (its EOS), so that the
    edited one must end there too; False: its tokens alone are compared (an answer cut
    by its budget, or one whose end is not known)."""


@dataclass(frozen=True)
class Reading:
    """One set's questions as an edited model read them.

    stated: per question, whether its greedy answer still states the fact along the
    unedited words (exact: the card's "still" for that fact; where it departs first, the
    card may still find the fact later in other words). top: whether the fact's tokens are
    still the model's top choice where the unedited answer put them, given its words before
    them (a cloze reading: it also holds a fact an answer reaches in other words; it never
    tells forgetting from breaking). stated implies top. words: of the unedited answer's
    tokens read outside the fact, how many are still the edited model's top choice (low:
    the model no longer follows its own wording, a sign of broken text), and how many were
    read."""

    stated: tuple[bool, ...]
    top: tuple[bool, ...]
    words: tuple[int, int] = (0, 0)

    @property
    def read(self) -> int:
        return len(self.stated)

    def counts(self) -> tuple[int, int, int]:
        """(read, stated, top)."""
        return (self.read, sum(self.stated), sum(self.top))


def _span(tokenizer, ids: list[int], fact: str) -> tuple[int, int, int] | None:
    """(a, b, s) for a draft's tokens `ids`: ids[a:b] the fewest tokens whose text holds
    the fact, s the fewest from the start after which it is settled (b <= s); None where
    the draft never states it."""
    text = lambda i, j: tokenizer.decode(ids[i:j], skip_special_tokens=True)  # noqa: E731
    b = next((j for j in range(1, len(ids) + 1) if contains_phrase(text(0, j), fact)), None)
    if b is None:
        return None
    a = next(i for i in range(b - 1, -1, -1) if contains_phrase(text(i, b), fact))
    s = next((j for j in range(b, len(ids) + 1) if phrase_settled(text(0, j), fact)), len(ids) + 1)
    return a, b, s


@dataclass(frozen=True)
class _Item:
    name: str
    prompt: list[int]
    draft: list[int]  # the draft's tokens read (up to where the fact settles; with no fact, all)
    fact: tuple[int, int] | None  # the fact's tokens, draft[a:b]; None: the whole answer
    ended: bool = False  # with no fact: its end (EOS) read too
    index: int = 0  # its place in its set


class AnswerReader:
    """Reads per set how many questions' facts an edited model still states (module
    docstring). `sets`: name -> questions; every question is counted (a draft that never
    states its fact is compared whole)."""

    def __init__(self, tokenizer, sets: Mapping[str, Sequence[Question]], prompt_format=None, batch_size: int = 32):
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.sets = {name: tuple(qs) for name, qs in sets.items() if qs}
        if not self.sets:
            raise ValueError("there is nothing to read: no set has a question the unedited model answered")
        items = [self._item(name, i, q, prompt_format) for name, qs in self.sets.items() for i, q in enumerate(qs)]
        self._items = sorted(items, key=lambda it: len(it.prompt) + len(it.draft))  # batches of like length

    def _item(self, name: str, index: int, q: Question, fmt) -> _Item:
        ids = draft_ids(self.tokenizer, q.draft)
        span = _span(self.tokenizer, ids, q.fact) if q.fact else None
        prompt = encode_prompt(self.tokenizer, q.prompt, fmt)
        if span is None:
            return _Item(name, prompt, ids, None, q.ended, index)
        a, b, s = span
        return _Item(name, prompt, ids[:s], (a, b), False, index)

    @classmethod
    def from_report(cls, tokenizer, benchmark, base: Report, *, max_examples: int | None = None,
                    names: Sequence[str] = READ_SETS, max_per_set: int | None = MAX_PER_SET,
                    batch_size: int = 32) -> "AnswerReader":
        """The questions of `benchmark`'s sets `names` that `base`'s Base row answered
        (`base` evaluated with `max_examples`, as `grom.eval.evaluate` takes it): on real
        knowledge those whose fact it stated (the facts the card counts), elsewhere every
        one, compared whole. At most `max_per_set` a set, spread evenly."""
        if BASE not in base.rows:
            raise ValueError("the report has no Base row: evaluate the unedited model first")
        sets = eval_sets(benchmark, max_examples)
        out: dict[str, list[Question]] = {}
        for name in names:
            df = base.rows[BASE].examples.get(name)
            if name not in sets or df is None or "generation" not in df or len(df) != len(sets[name]):
                continue
            facts = "fact_recall" in df
            known = df["fact_recall"].to_numpy() == 1.0 if facts else [True] * len(df)
            qs = [Question(ex.question, str(gen), getattr(ex, "fact", None) if facts else None)
                  for ex, gen, k in zip(sets[name], df["generation"], known) if k and hasattr(ex, "question")]
            out[name] = list(subset(qs, max_per_set))
        return cls(tokenizer, out, benchmark.prompt_format, batch_size)

    @property
    def tokens(self) -> int:
        """Tokens one reading passes through the model (prompts and the drafts read)."""
        return sum(len(it.prompt) + len(it.draft) for it in self._items)

    @property
    def sizes(self) -> dict[str, int]:
        return {name: len(qs) for name, qs in self.sets.items()}

    @torch.no_grad()
    def _pass(self, model, between: Between | None) -> list[list[int]]:
        """Per item, the model's argmax after the prompt and each of the draft's tokens read
        (one more than the draft's tokens), in batches of `batch_size`."""
        device, pad, out = model_device(model), pad_id(self.tokenizer), []
        for b in range(0, len(self._items), self.batch_size):
            if b:
                give(between)
            batch = self._items[b:b + self.batch_size]
            ids, mask = left_padded([it.prompt for it in batch], pad)
            width, longest = ids.shape[1], max(len(it.draft) for it in batch)
            tail = torch.full((len(batch), longest), pad, dtype=torch.long)
            tail_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for r, it in enumerate(batch):
                tail[r, :len(it.draft)] = torch.tensor(it.draft, dtype=torch.long)
                tail_mask[r, :len(it.draft)] = 1
            ids, mask = torch.cat([ids, tail], 1).to(device), torch.cat([mask, tail_mask], 1).to(device)
            pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)[0]
            rows = [r for r, it in enumerate(batch) for _ in range(len(it.draft) + 1)]
            cols = [width - 1 + j for it in batch for j in range(len(it.draft) + 1)]
            read = iter(argmax_at(model, hidden, rows, cols))
            out += [[next(read) for _ in range(len(it.draft) + 1)] for it in batch]
        return out

    def _count(self, model, argmax: list[list[int]]) -> dict[str, Reading]:
        eos = set(eos_ids(model, self.tokenizer))
        flags = {name: ([False] * len(qs), [False] * len(qs), [0, 0]) for name, qs in self.sets.items()}
        for it, got in zip(self._items, argmax):
            stated, top, words = flags[it.name]
            n = len(it.draft)
            if it.fact is None:  # the whole answer (and its end, where it ended)
                same = got[:n] == it.draft and (not it.ended or got[n] in eos)
                stated[it.index] = top[it.index] = same
                outside = range(n)
            else:
                a, b = it.fact
                stated[it.index] = got[:n] == it.draft
                top[it.index] = stated[it.index] or got[a:b] == it.draft[a:b]
                outside = [j for j in range(n) if not a <= j < b]
            words[0] += sum(got[j] == it.draft[j] for j in outside)
            words[1] += len(outside)
        return {name: Reading(tuple(s), tuple(t), tuple(w)) for name, (s, t, w) in flags.items()}

    def record(self, model, first: int, prefix: PrefixCache | None, between: Between | None = None
               ) -> dict[str, Reading]:
        """The unedited model's reading (every fact stated, up to a batch's float rounding: a
        check), recording in `prefix` the layers below `first`, which every edit of a band
        starting there reuses (an edited reading records them too where nothing is recorded
        yet: the layers below its band are the unedited model's)."""
        held = Held(lambda: evaluating(model),
                    (lambda: prefix.reusing(model, None, capture=(first,))) if prefix is not None else None)
        with held:
            out = self._pass(model, inside(between, held.left))
        return self._count(model, out)

    def read(self, model, edit=None, prefix: PrefixCache | None = None, between: Between | None = None
             ) -> dict[str, Reading]:
        """Per set, what `model` with `edit` applied does with the unedited answers'
        facts (`Reading`). The model is left as found."""
        first = first_changed_layer(model, edit) if edit is not None else None
        held = Held(lambda: evaluating(model), (lambda: edit.applied(model)) if edit is not None else None,
                    (lambda: prefix.reusing(model, first)) if prefix is not None and first else None)
        with held:
            out = self._pass(model, inside(between, held.left))
        return self._count(model, out)
