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
reader keeps the states entering the band's first layer from its first reading (a
`grom.closed_form.collect.LayerStream`'s start: the layers below the band are the unedited
model's whatever the edit), so every later edit of that band runs only the band and above;
the chat template's opening that every question shares runs once, as a row of its own
(`grom.model.shared_prefix`).
(Our design, on the drafted pass the card's first verdict reads.)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from grom.closed_form.collect import LayerStream
from grom.data.encoding import Batch, Encoded, make_batches, pad_id
from grom.data.prompts import encode_prompt
from grom.eval.prefix import first_changed_layer
from grom.eval.report import eval_sets
from grom.eval.results import BASE, Report, subset
from grom.eval.runner import draft_ids, eos_ids, phrase_settled
from grom.eval.verdicts import KEPT_SETS
from grom.landscape.grid import FITTED, HELD_OUT
from grom.model.arch import decoder_layers, edited_matrix, final_norm, layer_kinds, num_layers, residual_gain
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
        self._made: list[Batch] | None = None
        self._starts: dict[tuple[int, int], tuple] = {}  # (id(model), layer) -> the states entering it

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

    def __getstate__(self) -> dict:
        """Without the kept states (tensors of one process's model, remade where needed)."""
        return {**self.__dict__, "_starts": {}}

    @property
    def tokens(self) -> int:
        """Tokens one reading passes through the model (prompts and the drafts read)."""
        return sum(len(it.prompt) + len(it.draft) for it in self._items)

    @property
    def sizes(self) -> dict[str, int]:
        return {name: len(qs) for name, qs in self.sets.items()}

    def _batches(self) -> list[Batch]:
        """Each item's prompt and draft, right-padded in batches of `batch_size`; its read
        positions (the prompt's last token and each of the draft's) as the batch's keys."""
        if self._made is None:
            enc = [Encoded(tuple(it.prompt + it.draft),
                           tuple(range(len(it.prompt) - 1, len(it.prompt) + len(it.draft))),
                           (0,) * (len(it.draft) + 1), k) for k, it in enumerate(self._items)]
            self._made = make_batches(enc, self.batch_size, pad_id(self.tokenizer))
        return self._made

    def _stream(self, model, first: int, between: Between | None) -> LayerStream:
        """The reading's batches entering layer `first`: resumed where this model's were
        kept there, else by a pass up to it (kept: the layers below an edit's first are the
        unedited model's whether or not it is applied)."""
        layers, key = decoder_layers(model), (id(model), first)
        if key in self._starts:
            return LayerStream.resume(model, layers, self._batches(), self._starts[key])
        stream = LayerStream(model, layers, first, self._batches(), last=len(layers) - 1,
                             kinds=layer_kinds(model), between=between, share_prefix=True, remember_first=first > 0)
        if first:
            self._starts = {k: v for k, v in self._starts.items() if k[0] == id(model)}  # one model's at a time
            self._starts[key] = stream.start()
        return stream

    @torch.no_grad()
    def _pass(self, model, first: int, between: Between | None, linear: tuple | None = None) -> list[list[int]]:
        """Per item, the model's argmax after the prompt and each of the draft's tokens read
        (one more than the draft's tokens): the layers from `first` up run on the states
        entering it (`_stream`), a step boundary between two layers and two batches.
        linear: (matrix, P, gain) where the edit's only change at `first` is P on a matrix
        whose output reaches the residual stream linearly, and the layer's unedited pass is
        remembered (`_remember`): that layer is then the remembered output plus gain P x."""
        stream = self._stream(model, first, between)
        start = first
        if linear is not None and stream.remembers(linear[0]):
            matrix, P, gain = linear
            for _ in stream.key_batches(matrix, keep_inputs=True):
                pass
            stream.advance_linear(P, gain)
            start += 1
        for _ in range(start, len(stream.layers)):
            give(between)
            stream.advance(between)
        norm, head = final_norm(model), model.get_output_embeddings()
        out: list[list[int]] = [[] for _ in self._items]
        for batch, hidden in zip(stream.batches, stream.hidden):
            x = batch.select(hidden)
            got: list[int] = []
            for c in range(0, x.shape[0], 512):
                got += head(norm(x[c:c + 512]).to(head.weight.device)).float().argmax(-1).tolist()
            for k, g in zip(batch.example.tolist(), got):
                out[k].append(g)
        return out

    @staticmethod
    def _linear(model, edit, first: int) -> tuple | None:
        """(matrix, P in the math layout, gain) where `edit` changes layer `first` by one
        patch of a matrix whose output reaches the residual stream linearly; else None."""
        if edit is None or first <= 0 or first >= num_layers(model):
            return None
        gain = residual_gain(model, "down_proj")
        t = edited_matrix(model, "down_proj", first)
        names = {name for name, p in model.named_parameters()
                 if any(p is q for q in decoder_layers(model)[first].parameters())}
        here = [name for name in edit.patches if name in names]
        if gain is None or here != [t.param_name]:
            return None
        return model.get_submodule(t.module_name), t.from_param(edit.patch(t.param_name)).float(), gain

    def _remember(self, model, first: int, matrix, between: Between | None) -> None:
        """The unedited layer `first`'s pass over the reading, remembered with the states
        kept there (`grom.closed_form.collect.LayerStream.key_batches`)."""
        stream = self._stream(model, first, between)
        if not stream.remembers(matrix):
            with torch.no_grad():
                for _ in stream.key_batches(matrix, keep_inputs=True):
                    pass

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

    def record(self, model, first: int, between: Between | None = None) -> dict[str, Reading]:
        """The unedited model's reading (every fact stated, up to a batch's float rounding: a
        check), keeping the states entering layer `first`, from which every reading of an
        edit of a band starting there runs (an edited reading keeps its own where none is
        kept yet: the layers below its band are the unedited model's)."""
        with Held(lambda: evaluating(model)) as held:
            out = self._pass(model, first, inside(between, held.left))
        return self._count(model, out)

    def read(self, model, edit=None, between: Between | None = None) -> dict[str, Reading]:
        """Per set, what `model` with `edit` applied does with the unedited answers'
        facts (`Reading`). The model is left as found."""
        first = min(first_changed_layer(model, edit) if edit is not None else num_layers(model), num_layers(model) - 1)
        kept = [f for (m, f) in self._starts if m == id(model) and f <= first]
        first = max(kept) if kept else first
        linear = self._linear(model, edit, first)
        if linear is not None:  # the band's first layer, unedited, once
            with Held(lambda: evaluating(model)) as held:
                self._remember(model, first, linear[0], inside(between, held.left))
        held = Held(lambda: evaluating(model), (lambda: edit.applied(model)) if edit is not None else None)
        with held:
            out = self._pass(model, first, inside(between, held.left), linear)
        return self._count(model, out)
