"""RWKU's name-only setting on the real-knowledge benchmark: the method is given a subject's
name (and one sentence saying what it is) and nothing else; the loaded model writes the
forget text itself, and the retain text about a few neighbouring subjects.

As RWKU (jinzhuoran/RWKU at 7aacdb9):

- passages: generation/pair_generation.py's positive prompt, the system message
  "{intro} You know {subject} very well." and "Please write a short biography of
  {subject}.", sampled at temperature 1.0, top-p 0.9 and transformers' default top-k 50
  (RWKU names no top_k, so `generate` keeps 50; the project's variant drops it), up to
  `passage_tokens` (RWKU: 512). RWKU's subjects are all people; for a place, a topic or a
  book world the request is "a short article about" it (our wording). RWKU also starts
  each passage with one of its stored openings to vary them; here the seed varies them.
- questions: generation/question_generation.py's "{intro}\\nPlease generate a question
  about {subject} based on what you know about {subject}\\n", the answer begun with
  "Question:", up to 50 tokens sampled with the model's own generation config (RWKU passes
  only do_sample=True: the temperature, top-p and top-k of the model's
  generation_config.json, transformers' 1.0, 1.0 and 50 where it sets none, as for
  SmolLM2), the first line kept, every one of them: RWKU asks 300 times and keeps all 300,
  repeats and non-questions included. RWKU pairs each question with an "I don't know" for
  its rejection tuning; here the model answers its own question greedily, in the
  benchmark's prompt format.
- what is unlearnt: RWKU's GA and NPO train on the passages (LLaMA-Factory/scripts/full/
  run_ga.sh and run_npo.sh: --dataset {target}_Positive, the "train_positive" forget corpus
  of pair_generation.py), so the methods fit the passages by default (`use="passages"`);
  the model's question/answer pairs ("questions", the project's earlier default) or both
  stay selectable. RWKU gives no retain corpus and its GA/NPO have no retain term
  (`retain="none"`, for methods that run without one); GROM needs retain keys, so the
  default stays what the model writes about the neighbours (`retain="written"`).

The project's earlier writing (`PROTOCOLS["project"]`: no top-k, the questions sampled
like the passages, only first lines that read as questions kept, repeats dropped, up to
twice the tries and one more round) stays selectable; `PROTOCOLS["rwku"]` is the default.

What is written comes back as `Written` rows (side, subject, kind, prompt, text), which a
person reads and edits before any method runs (the studio's data panel); `name_only_benchmark`
turns them into a `Benchmark` evaluated by the real-knowledge task on the bundled subject's
questions, none of which the model wrote or the method saw: "forget" (the half the standard
split fits), "probes" (the held-out half) and the kept subjects' held-out questions.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from grom.data.loaders import BenchmarkSpec, register_benchmark
from grom.data.prompts import PromptFormat, encode_prompt, uses_chat_template
from grom.data.readers import BenchmarkError, PathLike, read_rows
from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval.runner import generate, sample
from grom.tasks.knowledge import REAL_MODEL, SUBJECTS, Knowledge, Subject, knowledge, load_knowledge
from grom.turns import Between, give

SIDES = ("forget", "retain")
KINDS = ("passage", "qa")
USES = ("questions", "passages", "both")  # the default is "passages": RWKU's GA/NPO forget corpus
RETAIN_FROM = ("written", "bundled", "both", "none")  # "none": RWKU's (no retain corpus); GROM needs one
QUESTION_SAMPLING = ("model", "passages")  # RWKU: the model's generation config; the project's: as the passages
QUESTIONS_KEPT = ("all", "filtered")  # RWKU: every first line; the project's: questions, no repeats
ANSWERS = ("whole", "first_sentence")  # what of the model's own answer is fitted


@dataclass(frozen=True)
class Written:
    """One piece the model wrote: a passage (prompt: the request, text: the passage) or a
    question and the model's own answer (prompt: the question, text: the answer)."""

    side: str  # "forget" (about the subject) or "retain" (about a neighbour)
    subject: str  # the subject's id
    kind: str  # "passage" or "qa"
    prompt: str
    text: str

    def __post_init__(self) -> None:
        if self.side not in SIDES or self.kind not in KINDS:
            raise ValueError(f"a written row has side {self.side!r} (use {' or '.join(SIDES)}) and kind "
                             f"{self.kind!r} (use {' or '.join(KINDS)})")


@dataclass(frozen=True)
class WritingConfig:
    """How much the model writes. Per subject: `passages` passages and `questions`
    question/answer pairs about the subject; `neighbour_passages` and `neighbour_questions`
    about each of `neighbours` other subjects (the retain side)."""

    passages: int = 16
    questions: int = 32
    neighbours: int = 3
    neighbour_passages: int = 4
    neighbour_questions: int = 8
    passage_tokens: int = 160  # RWKU: 512 (a Llama-3-8B biography); a small model rambles
    question_tokens: int = 50  # RWKU's max_new_tokens for a question
    answer_tokens: int = 48  # the real-knowledge evaluation's answer budget
    temperature: float = 1.0  # the passages' (RWKU's pair_generation.py)
    top_p: float = 0.9
    top_k: int | None = 50  # transformers' default, which RWKU leaves on; None: none (the project's variant)
    question_sampling: str = "model"  # see QUESTION_SAMPLING
    questions_kept: str = "all"  # see QUESTIONS_KEPT
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        for k in ("passages", "questions", "neighbours", "neighbour_passages", "neighbour_questions"):
            x = getattr(self, k)
            if not (isinstance(x, int) and 0 <= x <= 256):
                raise ValueError(f"WritingConfig: {k} = {x!r}: use a whole number from 0 to 256")
        for k in ("passage_tokens", "question_tokens", "answer_tokens", "batch_size"):
            x = getattr(self, k)
            if not (isinstance(x, int) and 1 <= x <= 1024):
                raise ValueError(f"WritingConfig: {k} = {x!r}: use a whole number from 1 to 1024")
        if not (math.isfinite(self.temperature) and self.temperature > 0 and 0 < self.top_p <= 1):
            raise ValueError(f"WritingConfig: temperature {self.temperature!r} must be > 0 and top_p "
                             f"{self.top_p!r} in (0, 1]")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"WritingConfig: top_k {self.top_k!r}: use a whole number from 1, or None for none")
        if self.question_sampling not in QUESTION_SAMPLING or self.questions_kept not in QUESTIONS_KEPT:
            raise ValueError(f"WritingConfig: question_sampling {self.question_sampling!r} (use "
                             f"{' or '.join(QUESTION_SAMPLING)}) and questions_kept {self.questions_kept!r} "
                             f"(use {' or '.join(QUESTIONS_KEPT)})")
        if self.passages + self.questions == 0:
            raise ValueError("WritingConfig: nothing to write about the subject: ask for passages or questions")


PROTOCOLS = {
    "rwku": {},  # WritingConfig's defaults: RWKU's sampling and every question kept
    "project": {"top_k": None, "question_sampling": "passages", "questions_kept": "filtered"},
}


def writing_config(protocol: str = "rwku", **kw) -> WritingConfig:
    """A `WritingConfig` of one of `PROTOCOLS` ("rwku", the default, or "project": this
    project's earlier writing), with `kw` for the counts and the rest."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"WritingConfig: protocol {protocol!r}: use {' or '.join(PROTOCOLS)}")
    return WritingConfig(**{**PROTOCOLS[protocol], **kw})


# transformers' values for what a generation config leaves unset (GenerationConfig's defaults)
_TRANSFORMERS_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}


def model_sampling(model) -> dict:
    """The temperature, top_p and top_k that `generate(do_sample=True)` samples with when
    given none of them, as RWKU's question_generation.py calls it: the model's
    `generation_config` where it sets them, transformers' defaults (1.0, 1.0, 50) where not.
    A top_k of 0 (none) comes back as None, `sample`'s spelling."""
    config = getattr(model, "generation_config", None)
    out = {}
    for k, default in _TRANSFORMERS_SAMPLING.items():
        v = getattr(config, k, None)
        out[k] = default if v is None else v
    out["top_k"] = int(out["top_k"]) or None
    return {"temperature": float(out["temperature"]), "top_p": float(out["top_p"]), "top_k": out["top_k"]}


def question_sampling(model, config: WritingConfig) -> dict:
    """How the questions are sampled: the model's own generation config (RWKU's, "model")
    or as the passages ("passages": the project's variant, with its top_k)."""
    if config.question_sampling == "model":
        return model_sampling(model)
    return {"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k}


def request(subject: Subject) -> str:
    """What the model is asked to write about `subject` (RWKU's request for a person)."""
    what = "a short biography of" if subject.kind == "person" else "a short article about"
    return f"Please write {what} {subject.title}."


def _chat(tokenizer, fmt: PromptFormat | None, user: str, system: str | None, start: str = "") -> list[int]:
    """Token ids of one writing prompt: the chat template with `system` where the model has
    one (else the intro before the request, in the plain template), then `start`."""
    fmt = fmt or PromptFormat()
    if uses_chat_template(tokenizer, fmt):
        ids = encode_prompt(tokenizer, user, dataclasses.replace(fmt, system_prompt=system))
    else:
        ids = encode_prompt(tokenizer, f"{system} {user}" if system else user, fmt)
    return ids + (list(tokenizer(start, add_special_tokens=False)["input_ids"]) if start else [])


def passage_prompt(tokenizer, subject: Subject, fmt: PromptFormat | None = None) -> list[int]:
    intro = f"{subject.intro} " if subject.intro else ""
    return _chat(tokenizer, fmt, request(subject), f"{intro}You know {subject.title} very well.")


def question_prompt(tokenizer, subject: Subject, fmt: PromptFormat | None = None) -> list[int]:
    intro = f"{subject.intro}\n" if subject.intro else ""
    ask = (f"{intro}Please generate a question about {subject.title} based on what you know about "
           f"{subject.title}\n")
    return _chat(tokenizer, fmt, ask, None, start="Question:")


def first_line(text: str) -> str:
    """The first line of a sampled continuation, stripped (RWKU's
    question_generation.py: .split('\\n')[0].strip()): what RWKU keeps as a question."""
    return text.split("\n")[0].strip()


def first_question(text: str) -> str | None:
    """The question of a sampled continuation: its first line (RWKU's), kept when it reads
    as one (it ends with "?" and has at least three words)."""
    line = text.split("\n")[0].strip().strip('"').strip()  # RWKU: .split('\n')[0].strip()
    return line if line.endswith("?") and len(line.split()) >= 3 else None


def neighbours_of(subject: str, know: Knowledge, n: int) -> tuple[str, ...]:
    """`n` other subjects for the retain side: those of the same kind first, then the rest,
    each group in the folder's order."""
    kind = know.subjects[subject].kind
    others = [t for t in know.subjects if t != subject]
    return tuple(sorted(others, key=lambda t: know.subjects[t].kind != kind)[:n])


def write_about(model, tokenizer, subject: Subject, side: str, passages: int, questions: int,
                config: WritingConfig, fmt: PromptFormat | None = None,
                progress: Callable[[str], None] | None = None, between: Between | None = None) -> list[Written]:
    """`passages` passages and up to `questions` question/answer pairs about `subject`.
    config.questions_kept "all" (RWKU's): `questions` tries, every non-empty first line kept
    (RWKU keeps an empty one too, which cannot be asked); "filtered" (the project's): twice
    as many tries, then once more, those that do not read as a question or repeat one
    dropped. Each question is answered greedily by the model.
    between: a step boundary (`grom.turns`) between the writing calls and inside each
    (`sample`'s and `generate`'s: between batches and decoding steps); the texts do not
    depend on it."""
    say = progress or (lambda _msg: None)
    seed = config.seed + sum(map(ord, subject.id))  # each subject its own draws, the same on every run
    out: list[Written] = []
    if passages:
        say(f"{subject.title}: writing {passages} passages")
        texts = sample(model, tokenizer, [passage_prompt(tokenizer, subject, fmt)] * passages,
                       max_new_tokens=config.passage_tokens, temperature=config.temperature,
                       top_p=config.top_p, top_k=config.top_k, seed=seed, batch_size=config.batch_size,
                       between=between)
        out += [Written(side, subject.id, "passage", request(subject), t) for t in texts if t]
    asked: list[str] = []
    how = question_sampling(model, config) if questions else {}
    keep_all = config.questions_kept == "all"
    for attempt in range(1 if keep_all else 2):
        if len(asked) >= questions:
            break
        say(f"{subject.title}: writing questions ({len(asked)} of {questions})")
        give(between)
        tries = questions if keep_all else 2 * (questions - len(asked))
        texts = sample(model, tokenizer, [question_prompt(tokenizer, subject, fmt)] * tries,
                       max_new_tokens=config.question_tokens, seed=seed + 1 + attempt, batch_size=config.batch_size,
                       between=between, **how)
        if keep_all:
            asked += [q for q in map(first_line, texts) if q]
            continue
        for q in map(first_question, texts):
            if q and q.lower() not in {a.lower() for a in asked} and len(asked) < questions:
                asked.append(q)
    if asked:
        say(f"{subject.title}: answering its {len(asked)} questions")
        give(between)
        answers = generate(model, tokenizer, asked, prompt_format=fmt, max_new_tokens=config.answer_tokens,
                           batch_size=config.batch_size, between=between)
        out += [Written(side, subject.id, "qa", q, a) for q, a in zip(asked, answers) if a]
    return out


def write_name_only(model, tokenizer, subject: str, config: WritingConfig = WritingConfig(), *,
                    fmt: PromptFormat | None = None, source: PathLike | None = None,
                    progress: Callable[[str], None] | None = None,
                    between: Between | None = None) -> list[Written]:
    """What the model writes for the name-only setting: about `subject` (the forget side)
    and about `config.neighbours` other subjects (the retain side). between: a step boundary
    (`grom.turns`) between subjects and inside each (`write_about`): a host sharing the
    model lends it there; the same seed writes the same texts either way."""
    know = knowledge(source)
    if subject not in know.subjects:
        raise BenchmarkError(f"name only: no subject {subject!r}; subjects: {', '.join(know.subjects)}")
    rows = write_about(model, tokenizer, know.subjects[subject], "forget", config.passages, config.questions,
                       config, fmt, progress, between)
    for other in neighbours_of(subject, know, config.neighbours):
        give(between)
        rows += write_about(model, tokenizer, know.subjects[other], "retain", config.neighbour_passages,
                            config.neighbour_questions, config, fmt, progress, between)
    return rows


# a ".", "!" or "?" then a space and a capital (or a quote), not after a title's abbreviation
_SENTENCE_END = re.compile(r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<=[.!?])\s+(?=[A-Z\"'])")


def first_sentence(text: str) -> str:
    """`text` up to the end of its first sentence."""
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def _examples(rows: Iterable[Written], use: str, answers: str = "whole") -> tuple:
    out = []
    for i, r in enumerate(rows):
        if r.kind == "passage" and use in ("passages", "both"):
            out.append(TextExample(text=r.text, id=f"{r.subject}/written-{i}"))
        elif r.kind == "qa" and use in ("questions", "both"):
            answer = first_sentence(r.text) if answers == "first_sentence" else r.text
            out.append(QAExample(question=r.prompt, answer=answer, subject=r.subject, id=f"{r.subject}/written-{i}"))
    return tuple(out)


def name_only_benchmark(subject: str, rows: Sequence[Written], *, use: str = "passages",
                        retain: str = "written", answers: str = "whole", source: PathLike | None = None,
                        prompt_format: PromptFormat | None = None, known_only: bool = False) -> Benchmark:
    """The real-knowledge benchmark of `subject` with what the model wrote as its forget set
    (`use`: its passages, RWKU's GA/NPO forget corpus and the default; its question/answer
    pairs; or both) and retain set (`retain`: what it wrote about the neighbours, the
    default; the benchmark's own retain pairs; both; or "none", RWKU's: no retain corpus,
    for methods without a retain term, not GROM;
    `answers`: each forget answer whole, or its first sentence, where a short answer states
    its fact before the model's elaboration). The
    evaluation sets are the bundled ones, so every question scored is one the model did
    not write and the method did not see ("forget" included: in this setting it is held
    out too)."""
    if use not in USES or retain not in RETAIN_FROM or answers not in ANSWERS:
        raise ValueError(f"name only: use is one of {', '.join(USES)} (not {use!r}); retain one of "
                         f"{', '.join(RETAIN_FROM)} (not {retain!r}); answers one of {', '.join(ANSWERS)} "
                         f"(not {answers!r})")
    bench = load_knowledge(subject, source, prompt_format=prompt_format, known_only=known_only)
    forget = _examples([r for r in rows if r.side == "forget"], use, answers)
    if not forget:
        raise BenchmarkError(f"name only: nothing written about {subject} to forget as {use}; write some "
                             "first, or choose what to use (questions, passages, both)")
    written_retain = _examples([r for r in rows if r.side == "retain"], "both")
    kept = {"written": written_retain, "bundled": bench.retain, "both": written_retain + bench.retain,
            "none": ()}[retain]
    if not kept and retain != "none":
        raise BenchmarkError("name only: nothing written about the neighbours to keep; write about at least "
                             "one neighbour, or keep the benchmark's own retain pairs (retain='bundled')")
    n_fq = sum(isinstance(x, QAExample) for x in forget)
    return dataclasses.replace(
        bench, forget=forget, retain=kept, split=subject,
        name="real-knowledge", description=(
            f"Real knowledge, name only (RWKU's setting): forget {subject} from what the model wrote about it "
            f"({n_fq} question/answer pairs, {len(forget) - n_fq} passages); keep {len(kept)} "
            f"{'written ' if retain == 'written' else ''}retain examples"
            f"{' (no retain corpus, as RWKU)' if retain == 'none' else ''}. Scored on the bundled questions, "
            f"none of which was written or fitted: {len(bench.eval_sets['forget'])} + "
            f"{len(bench.eval_sets['probes'])} about the subject."))


def load_name_only(split: str, source: PathLike | None = None, *, use: str = "passages", retain: str = "written",
                   prompt_format: PromptFormat | None = None, known_only: bool = False) -> Benchmark:
    """The benchmark "name-only": `source` is a file of written rows (JSON or JSON lines
    with side, subject, kind, prompt, text: `to_records`, or the studio's table saved),
    `split` the bundled subject they are about; see `name_only_benchmark`."""
    if source is None:
        raise BenchmarkError("name-only: give the file of what the model wrote (source=...): write it with "
                             "grom.tasks.name_only.write_name_only, or with the studio's Write button")
    rows = from_records(r.data for r in read_rows(source))
    return name_only_benchmark(split, rows, use=use, retain=retain, prompt_format=prompt_format,
                               known_only=known_only)


NAME_ONLY = register_benchmark(BenchmarkSpec(
    "name-only", load_name_only, SUBJECTS, options=("use", "retain", "prompt_format", "known_only"),
    label="Real knowledge, name only (RWKU): the model writes the forget set",
    description="a bundled subject's name in; the loaded model writes passages and questions about it and its "
                "neighbours; scored on the bundled questions it did not write",
    preset="smollm2", known_to=(REAL_MODEL,), session_only="what the model wrote (name only)"))


def to_records(rows: Iterable[Written]) -> list[dict]:
    """Rows as plain dicts (a table to show and edit, or JSON lines to save)."""
    return [dataclasses.asdict(r) for r in rows]


def from_records(records: Iterable[dict]) -> list[Written]:
    """Rows back from `to_records` (or an edited table): blank texts are dropped; a row
    with an unknown side or kind is refused with where it is."""
    out = []
    for i, rec in enumerate(records):
        text, prompt = str(rec.get("text") or "").strip(), str(rec.get("prompt") or "").strip()
        if not text:
            continue
        try:
            out.append(Written(str(rec.get("side", "")).strip(), str(rec.get("subject", "")).strip(),
                               str(rec.get("kind", "")).strip(), prompt, text))
        except ValueError as e:
            raise BenchmarkError(f"written row {i + 1}: {e}") from None
        if out[-1].kind == "qa" and not prompt:
            raise BenchmarkError(f"written row {i + 1}: a question/answer row needs its question")
    return out
