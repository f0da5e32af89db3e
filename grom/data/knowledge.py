"""The real-knowledge benchmark: facts a small pretrained chat model already knows,
grouped by target (a book world, a person, a place, a science topic), bundled here.

Forget one target (or three, split "forget3"); keep the others and general knowledge.
The files live in `grom/data/knowledge/` (see its README.md); a `source` folder with the
same layout loads the same way:

    <target>.json   {"id", "title", "kind", "qa": [{"question", "answer", "fact",
                     "paraphrased_question", "wrong_answers": [3 texts], "id"?}, ...]}
    general.json    the same format: general knowledge (utility)
    fluency.json    {"texts": [{"id"?, "text"}, ...]}: neutral paragraphs (perplexity)
    known.json      optional, written by bench/probe_knowledge.py: which questions the
                    probed model answers with the fact ({"known": {id: [question, paraphrase]}})

Every other target, and general knowledge, is split once and for all into a retain part
(the edit's keys, about 60%) and a held-out part (evaluation), by a stable hash of each
pair's id, so evaluation never measures what the edit was fitted on. The forget target's
own pairs are split the same way into the questions the edit is fitted on (`forget`, half)
and held-out probe questions it never sees (`eval_sets["probes"]`, the other half): does
the forgetting carry beyond the wording it was fitted to? (`grom.robustness`)
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from grom.data.prompts import PromptFormat
from grom.data.readers import BenchmarkError, PathLike, Record, check_size, resolve_source
from grom.data.schema import Benchmark, QAExample, TextExample
from grom.text import contains_phrase, normalise_text

BUNDLED = Path(__file__).with_name("knowledge")
# The splits: one per bundled target, then "forget3". The default, first, is the target
# SmolLM2-135M-Instruct knows best (README.md: it knows little of the book worlds). A
# source folder may hold other targets: load_knowledge takes them.
TARGETS = (
    "the-solar-system", "harry-potter", "the-lord-of-the-rings", "sherlock-holmes", "star-wars",
    "albert-einstein", "marie-curie", "william-shakespeare", "the-beatles", "ancient-egypt",
    "france", "japan", "the-human-body", "world-war-ii",
)
FORGET3 = ("the-solar-system", "world-war-ii", "the-human-body")  # the three best known
SPLITS = (*TARGETS, "forget3")
GENERAL, FLUENCY, KNOWN = "general", "fluency", "known"  # the files that are no target
RETAIN_FRACTION = 0.6  # of each kept target and of general: edit keys; the rest is evaluated
FIT_FRACTION = 0.5  # of each forget target: the edit's forget set; the rest are held-out probes
N_WRONG = 3


@dataclass(frozen=True)
class Target:
    """One target's QA pairs (general knowledge uses the same type)."""

    id: str
    title: str
    kind: str
    qa: tuple[QAExample, ...]


@dataclass(frozen=True)
class Knowledge:
    """Everything in a knowledge folder, validated."""

    targets: Mapping[str, Target]
    general: Target
    fluency: tuple[TextExample, ...]
    known: Mapping[str, tuple[bool, bool]] | None  # id -> (question known, paraphrase known)


# ----------------------------------------------------------------------------- reading


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise BenchmarkError(f"real-knowledge: {path}: no such file")
    check_size(path.stat().st_size, str(path))
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise BenchmarkError(f"{path}: not UTF-8 text; save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"{path} line {e.lineno}, column {e.colno}: malformed JSON ({e.msg})") from None


def _qa(rec: Record, subject: str, default_id: str) -> QAExample:
    """One validated pair: every field present, the fact inside the answer (as fact recall
    matches it), three distinct wrong answers that differ from the answer and lack the fact."""
    answer, fact = rec.text("answer"), rec.text("fact")
    wrong = rec.texts("wrong_answers")
    if not contains_phrase(answer, fact):
        raise BenchmarkError(f"{rec.where}: the fact {fact!r} is not a whole-word part of the answer "
                             f"{answer!r}")
    if len(wrong) != N_WRONG or len(set(wrong)) != N_WRONG or answer in wrong:
        raise BenchmarkError(f"{rec.where}: expected {N_WRONG} distinct wrong answers, each unlike the "
                             f"answer; found {list(wrong)}")
    leaking = [w for w in wrong if contains_phrase(w, fact)]
    if leaking:
        raise BenchmarkError(f"{rec.where}: the wrong answer {leaking[0]!r} contains the fact {fact!r}")
    return QAExample(question=rec.text("question"), answer=answer,
                     paraphrased_question=rec.text("paraphrased_question"),
                     perturbed_answers=wrong, fact=fact, subject=subject,
                     id=rec.text("id", optional=True) or default_id)


def read_target(path: PathLike) -> Target:
    """A target file (or general.json), validated; errors name the file and the item."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("qa"), list) or not doc["qa"]:
        raise BenchmarkError(f"{path}: expected an object with a non-empty list \"qa\" of question/answer "
                             "pairs")
    head, tid = Record(str(path), doc), path.stem
    if head.text("id", optional=True) not in (None, tid):
        raise BenchmarkError(f"{path}: its id {doc['id']!r} should be its file name, {tid!r}")
    qa = tuple(_qa(Record(f"{path} qa item {i + 1}", item if isinstance(item, dict) else {}),
                   tid, f"{tid}/{i + 1:02d}")
               for i, item in enumerate(doc["qa"]))
    return Target(tid, head.text("title", optional=True) or tid, head.text("kind", optional=True) or "", qa)


def read_fluency(path: PathLike) -> tuple[TextExample, ...]:
    path = Path(path)
    doc = _read_json(path)
    items = doc.get("texts") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise BenchmarkError(f"{path}: expected an object with a non-empty list \"texts\"")
    out = []
    for i, item in enumerate(items):
        rec = Record(f"{path} text {i + 1}", item if isinstance(item, dict) else {"text": item})
        out.append(TextExample(rec.text("text"), id=rec.text("id", optional=True) or f"fluency/{i + 1:02d}"))
    return tuple(out)


def _read_known(path: Path, ids: set[str]) -> Mapping[str, tuple[bool, bool]] | None:
    if not path.is_file():
        return None
    doc = _read_json(path)
    known = doc.get("known") if isinstance(doc, dict) else None
    if not isinstance(known, dict):
        raise BenchmarkError(f"{path}: expected an object with a mapping \"known\" of pair id -> "
                             "[question known, paraphrase known]")
    stray = sorted(set(known) - ids)
    if stray:
        raise BenchmarkError(f"{path}: unknown pair id {stray[0]!r}; re-run bench/probe_knowledge.py")
    bad = [k for k, v in known.items() if not (isinstance(v, list) and len(v) == 2)]
    if bad:
        raise BenchmarkError(f"{path}: {bad[0]!r} should map to [question known, paraphrase known] (0 or 1)")
    return {k: (bool(v[0]), bool(v[1])) for k, v in known.items()}


def _check_unique(groups: list[Target]) -> None:
    """No question and no id twice in the whole folder (retain and evaluation stay disjoint)."""
    seen_q: dict[str, str] = {}
    seen_id: set[str] = set()
    for group in groups:
        for ex in group.qa:
            q = normalise_text(ex.question)
            if q in seen_q:
                raise BenchmarkError(f"real-knowledge: {group.id}: the question {ex.question!r} "
                                     f"is already in {seen_q[q]}")
            if ex.id in seen_id:
                raise BenchmarkError(f"real-knowledge: {group.id}: the id {ex.id!r} is used twice")
            seen_q[q] = group.id
            seen_id.add(ex.id)


def read_knowledge(folder: PathLike) -> Knowledge:
    """Every file of a knowledge folder, validated (bundled: cached, see `knowledge`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BenchmarkError(f"real-knowledge: {folder}: expected a folder of target files")
    special = {GENERAL, FLUENCY, KNOWN}
    files = [p for p in sorted(folder.glob("*.json")) if p.stem not in special]
    targets = {t.id: t for t in map(read_target, files)}
    if not targets:
        raise BenchmarkError(f"real-knowledge: {folder}: no target files (<target>.json)")
    general = read_target(folder / f"{GENERAL}.json")
    _check_unique([*targets.values(), general])
    ids = {ex.id for group in [*targets.values(), general] for ex in group.qa}
    return Knowledge(targets, general, read_fluency(folder / f"{FLUENCY}.json"),
                     _read_known(folder / f"{KNOWN}.json", ids))


@functools.lru_cache(maxsize=1)
def _bundled() -> Knowledge:
    return read_knowledge(BUNDLED)


def knowledge(source: PathLike | None = None) -> Knowledge:
    """The bundled knowledge (read once) or that of a `source` folder (read every call)."""
    folder = resolve_source(source, "real-knowledge")
    return _bundled() if folder is None else read_knowledge(folder)


# ----------------------------------------------------------------------------- splitting


def _rank(ex: QAExample) -> str:
    return hashlib.sha256(ex.id.encode("utf-8")).hexdigest()


def _split(qa: tuple[QAExample, ...], fraction: float) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(first part, rest): the first `fraction` of the pairs in the order of the SHA-256 of
    their ids, each part in file order. A pair is on the same side whatever the split;
    rewording a pair moves none, adding pairs moves only pairs next to the cut."""
    n = round(fraction * len(qa))
    keep = {ex.id for ex in sorted(qa, key=_rank)[:n]}
    return tuple(ex for ex in qa if ex.id in keep), tuple(ex for ex in qa if ex.id not in keep)


def split_retain(qa: tuple[QAExample, ...]) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(retain part, held-out part) of a kept target: `RETAIN_FRACTION` of it retained."""
    return _split(qa, RETAIN_FRACTION)


def split_probes(qa: tuple[QAExample, ...]) -> tuple[tuple[QAExample, ...], tuple[QAExample, ...]]:
    """(fitted part, probe part) of a forget target: `FIT_FRACTION` of it for the edit, the
    rest held out as probes the edit never sees (the same hash order as `split_retain`, so
    a target's fitted pairs are among its retained ones when it is kept)."""
    return _split(qa, FIT_FRACTION)


def forget_targets(split: str, know: Knowledge) -> tuple[str, ...]:
    """The target ids `split` forgets; an unknown one lists what exists."""
    names = FORGET3 if split == "forget3" else (split,)
    missing = [n for n in names if n not in know.targets]
    if missing:
        valid = ", ".join([*know.targets, *(["forget3"] if set(FORGET3) <= set(know.targets) else [])])
        raise BenchmarkError(f"real-knowledge: no target {missing[0]!r}; valid splits: {valid}")
    return names


def _sets(know: Knowledge, names: tuple[str, ...]) -> dict[str, tuple[QAExample, ...]]:
    """forget (the fitted part of the targets `names`), probes (their held-out part), retain,
    neighbours and general (held out) for forgetting the targets `names`."""
    kept = [split_retain(t.qa) for tid, t in know.targets.items() if tid not in names]
    general_retain, general_eval = split_retain(know.general.qa)
    forgotten = [split_probes(know.targets[n].qa) for n in names]
    return {"forget": tuple(ex for fitted, _ in forgotten for ex in fitted),
            "probes": tuple(ex for _, probes in forgotten for ex in probes),
            "retain": tuple(ex for part, _ in kept for ex in part) + general_retain,
            "neighbours": tuple(ex for _, part in kept for ex in part),
            "general": general_eval}


def _only_known(sets: dict[str, tuple[QAExample, ...]], known: Mapping[str, tuple[bool, bool]] | None,
                split: str) -> dict[str, tuple[QAExample, ...]]:
    """`sets` with only the pairs whose question the probed model answered; retain whole."""
    if known is None:
        raise BenchmarkError("real-knowledge: known_only needs known.json; run "
                             "bench/probe_knowledge.py --write-known")
    out = {k: v if k == "retain" else tuple(ex for ex in v if known.get(ex.id, (False,))[0])
           for k, v in sets.items()}
    if not out["forget"]:
        raise BenchmarkError(f"real-knowledge {split}: the probed model knows none of its facts")
    return out


# ----------------------------------------------------------------------------- benchmark


def load_knowledge(split: str = TARGETS[0], source: PathLike | None = None, *,
                   prompt_format: PromptFormat | None = None, known_only: bool = False) -> Benchmark:
    """The real-knowledge benchmark: forget the target(s) of `split`, keep the rest.

    forget: the fitted half of the forget target(s)' pairs (`split_probes`); retain: the
    retain parts of the other targets and of general knowledge. eval_sets: "forget" (the
    fitted pairs), "probes" (the forget targets' other half, never fitted: held-out
    probes), "neighbours" (held-out pairs of the other targets), "general" (held-out
    general pairs), "fluency" (texts).
    prompt_format: None, the tokenizer's chat template (what the chat model answers best).
    known_only: keep only the pairs the probed model answered with the fact (known.json,
    bench/probe_knowledge.py) in forget and in the QA evaluation sets; retain is unchanged.
    """
    know = knowledge(source)
    names = forget_targets(split, know)
    sets = _sets(know, names)
    if known_only:
        sets = _only_known(sets, know.known, split)
    n_eval = len(sets["neighbours"]) + len(sets["general"])
    return Benchmark(
        name="real-knowledge", split=split, forget=sets["forget"], retain=sets["retain"],
        eval_sets={"forget": sets["forget"], "probes": sets["probes"], "neighbours": sets["neighbours"],
                   "general": sets["general"], "fluency": know.fluency},
        prompt_format=prompt_format, task="knowledge",
        description=(f"Real knowledge: forget {', '.join(know.targets[n].title for n in names)} "
                     f"({len(sets['forget'])} {'known ' if known_only else ''}facts fitted, "
                     f"{len(sets['probes'])} held out as probes); keep "
                     f"{len(know.targets) - len(names)} other targets and general knowledge "
                     f"({len(sets['retain'])} retain pairs, {n_eval} held out)."),
    )
