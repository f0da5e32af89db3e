"""The checks and encodings of a baseline run, done before any work (`prepare_run`): the
settings resolved (grom.baselines.settings), the forget and retain examples checked and
encoded (chunked first under MUSE's and WMDP's recipes), and for a method that trains
toward an alternate answer (IDK-NLL, IDK-DPO) the alternate of each forget question."""
from __future__ import annotations

from typing import NamedTuple

from grom.baselines.idk import idk_alternates, question_of
from grom.baselines.methods import METHODS, Method, get_method
from grom.baselines.recipes import chunk_corpus
from grom.baselines.sequences import encode_sequences
from grom.baselines.settings import Settings, resolve_settings
from grom.data.schema import FactRecord, QAExample, as_examples
from grom.keys import Encoded


class Encodings(NamedTuple):
    """A run's encoded sequences: alternates[i] (None unless the method needs_answers) is
    forget[i]'s question with its alternate answer."""

    forget: list[Encoded]
    retain: list[Encoded]
    alternates: list[Encoded] | None = None


def _check_questions(s: Settings, forget) -> None:
    if s.chunk_corpus or any(not isinstance(ex, (QAExample, FactRecord)) for ex in forget):
        raise ValueError("an alternate answer replaces the answer to a question: this method needs "
                         "question/answer (or fact) forget examples, not text or multiple choice "
                         "(nor a recipe that chunks a corpus)")


def _alternate_encodings(tokenizer, s: Settings, forget, alternates, enc_f) -> list[Encoded]:
    """The alternate answer of each forget sequence, encoded: the caller's `alternates`
    (answers, one per forget example) or a seeded "I don't know" per question."""
    if alternates is None:
        alt = idk_alternates(forget, s.seed)
    else:
        answers = [str(a) for a in alternates]
        if len(answers) != len(forget) or not all(a.strip() for a in answers):
            raise ValueError(f"alternates: give one non-empty answer per forget example ({len(forget)}), "
                             f"not {len(answers)}")
        alt = tuple(QAExample(question_of(ex), a) for ex, a in zip(forget, answers))
    enc_a = encode_sequences(tokenizer, alt, s.prompt_format, s.max_length)
    by_example = {e.example: e for e in enc_a}
    missing = [e.example for e in enc_f if e.example not in by_example]
    if missing:
        raise ValueError(f"the alternate answer of forget example {missing[0]} produced no tokens "
                         "(a prompt longer than max_length?)")
    return [by_example[e.example] for e in enc_f]


def prepare_run(method, tokenizer, forget, retain, kw: dict) -> tuple[Settings, Method, Encodings]:
    """Validate everything and encode the sequences, before any work: (settings, the
    method's row, the encoded forget / retain / alternate sequences). `kw` are
    run_baseline's keyword arguments (`alternates` among them)."""
    kw = dict(kw)
    alternates = kw.pop("alternates", None)
    s = resolve_settings(method, **kw)
    row = get_method(s.method)
    if alternates is not None and not row.needs_answers:
        raise ValueError(f"{row.label} trains toward no alternate answer; alternates apply to the "
                         f"methods that do ({', '.join(r.label for r in METHODS.values() if r.needs_answers)})")
    forget, retain = as_examples(forget), as_examples(retain or ())
    if not forget:
        raise ValueError("the forget set is empty: give at least one example to forget")
    if row.uses_retain(s.method_args) and not retain:
        raise ValueError(f"{row.label} needs retain examples for its retain loss (or alpha=0)")
    if row.needs_answers:
        _check_questions(s, forget)
    if s.chunk_corpus:  # the recipe's chunks of each joined corpus (MUSE 2048 tokens, WMDP 512)
        forget, retain = chunk_corpus(tokenizer, forget, s.max_length), chunk_corpus(tokenizer, retain, s.max_length)
    enc_f = encode_sequences(tokenizer, forget, s.prompt_format, s.max_length, chunked=s.chunk_corpus)
    enc_r = (encode_sequences(tokenizer, retain, s.prompt_format, s.max_length, chunked=s.chunk_corpus)
             if retain else [])
    if not enc_f:
        raise ValueError("the forget examples produced no answer tokens (empty answers or texts?)")
    if row.uses_retain(s.method_args) and not enc_r:
        raise ValueError("the retain examples produced no answer tokens (empty answers or texts?)")
    enc_a = _alternate_encodings(tokenizer, s, forget, alternates, enc_f) if row.needs_answers else None
    return s, row, Encodings(enc_f, enc_r, enc_a)
