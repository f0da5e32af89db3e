"""The checks and encodings of a baseline run, done before any work (`prepare_run`): the
settings resolved (grom.methods.trained.settings), the forget and retain examples checked and
encoded (chunked first under MUSE's and WMDP's recipes), and for a method that trains
toward an alternate answer (IDK-NLL, IDK-DPO, AltPO) the alternates of each forget question:
the caller's, a seeded "I don't know", or (AltPO) answers the model writes itself."""
from __future__ import annotations

from typing import NamedTuple

from grom.data.encoding import Encoded
from grom.data.schema import FactRecord, QAExample, as_examples
from grom.methods.trained.idk import idk_alternates, idk_question
from grom.methods.trained.method import METHODS, Method, get_method
from grom.methods.trained.recipes import chunk_corpus
from grom.methods.trained.sequences import encode_sequences
from grom.methods.trained.settings import RunSettings, Settings, resolve_settings


class Encodings(NamedTuple):
    """A run's encoded sequences. For a method that needs_answers, forget[j] and
    alternates[j] are one pair: a forget sequence and its question with one alternate
    answer (a forget example with k alternates appears k times in forget, as upstream's
    alternates file holds k rows per question); alternate_texts are each forget example's
    alternate answers, (n_examples, k_i). Both None otherwise."""

    forget: list[Encoded]
    retain: list[Encoded]
    alternates: list[Encoded] | None = None
    alternate_texts: tuple[tuple[str, ...], ...] | None = None


def _check_questions(s: Settings, forget) -> None:
    if s.chunk_corpus or any(not isinstance(ex, (QAExample, FactRecord)) for ex in forget):
        raise ValueError("an alternate answer replaces the answer to a question: this method needs "
                         "question/answer (or fact) forget examples, not text or multiple choice "
                         "(nor a recipe that chunks a corpus)")


def answer_sets(alternates, n_forget: int) -> tuple[tuple[str, ...], ...]:
    """The caller's `alternates` as each forget example's answers: an entry is one answer
    (a string) or several (a sequence of strings)."""
    sets = tuple((a,) if isinstance(a, str) else tuple(a) for a in alternates)
    sets = tuple(tuple(str(x) for x in group) for group in sets)
    if len(sets) != n_forget or not all(g and all(x.strip() for x in g) for g in sets):
        raise ValueError(f"alternates: give one non-empty answer per forget example ({n_forget}), or a "
                         f"list of them each, not {len(sets)}")
    return sets


def _alternate_encodings(tokenizer, s: Settings, forget, sets, enc_f) -> tuple[list[Encoded], list[Encoded]]:
    """(forget, alternates): each forget sequence repeated once per alternate answer of its
    example, beside that answer encoded with the example's question."""
    pairs = [(i, a) for i, group in enumerate(sets) for a in group]
    alt = tuple(QAExample(idk_question(forget[i]), a) for i, a in pairs)
    by_pair = {e.example: e for e in encode_sequences(tokenizer, alt, s.prompt_format, s.max_length)}
    by_example = {e.example: e for e in enc_f}
    f_out, a_out = [], []
    for k, (i, _) in enumerate(pairs):
        if i not in by_example:  # the forget example itself produced no tokens: it is not trained on
            continue
        if k not in by_pair:
            raise ValueError(f"the alternate answer of forget example {i} produced no tokens "
                             "(a prompt longer than max_length?)")
        f_out.append(by_example[i])
        a_out.append(by_pair[k])
    return f_out, a_out


def _alternates(row: Method, model, tokenizer, forget, s: Settings, given, progress):
    """Each forget example's alternate answers: the caller's, else the row's own
    (`Method.make_alternates`, e.g. written by the model), else a seeded "I don't know"."""
    if given is not None:
        return given
    if row.make_alternates is not None:
        if model is None:
            raise ValueError(f"{row.label} writes its alternate answers with the model: give the model")
        return tuple(tuple(g) for g in row.make_alternates(model, tokenizer, forget, s, progress))
    return tuple((a.answer,) for a in idk_alternates(forget, s.seed))


def prepare_run(method, tokenizer, forget, retain, given: RunSettings, model=None,
                progress=None) -> tuple[Settings, Method, Encodings]:
    """Validate everything and encode the sequences, before any work: (settings, the
    method's row, the encoded forget / retain / alternate sequences). `given`: the
    caller's settings (`alternates` among them); the method's row and defaults are fitted
    to `model` where given. Then, for a method that
    writes its alternate answers with the model (AltPO), the one piece of work done here:
    `model` writes them (`progress(fraction, message)` as it goes)."""
    alternates = given.alternates
    s = resolve_settings(method, given, model=model)
    row = get_method(s.method).fitted(model)
    if alternates is not None and not row.needs_answers:
        raise ValueError(f"{row.label} trains toward no alternate answer; alternates apply to the "
                         f"methods that do ({', '.join(r.label for r in METHODS.values() if r.needs_answers)})")
    forget, retain = as_examples(forget), as_examples(retain or ())
    if not forget:
        raise ValueError("the forget set is empty: give at least one example to forget")
    if row.uses_retain(s.method_args) and not retain:
        raise ValueError(f"{row.label} needs retain examples for its retain loss (or alpha=0)")
    given = None
    if row.needs_answers:
        _check_questions(s, forget)
        given = None if alternates is None else answer_sets(alternates, len(forget))
    if s.chunk_corpus:  # the recipe's chunks of each joined corpus (MUSE 2048 tokens, WMDP 512)
        forget, retain = chunk_corpus(tokenizer, forget, s.max_length), chunk_corpus(tokenizer, retain, s.max_length)
    enc_f = encode_sequences(tokenizer, forget, s.prompt_format, s.max_length, chunked=s.chunk_corpus)
    enc_r = (encode_sequences(tokenizer, retain, s.prompt_format, s.max_length, chunked=s.chunk_corpus)
             if retain else [])
    if not enc_f:
        raise ValueError("the forget examples produced no answer tokens (empty answers or texts?)")
    if row.uses_retain(s.method_args) and not enc_r:
        raise ValueError("the retain examples produced no answer tokens (empty answers or texts?)")
    if not row.needs_answers:
        return s, row, Encodings(enc_f, enc_r)
    sets = _alternates(row, model, tokenizer, forget, s, given, progress or (lambda *_: None))
    enc_f, enc_a = _alternate_encodings(tokenizer, s, forget, sets, enc_f)
    return s, row, Encodings(enc_f, enc_r, enc_a, sets)
