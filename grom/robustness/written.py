"""Hand-written probes: questions that reach a subject's fact through another entity
(`multi_hop`: "Which planet has the moon Titan?" -> Saturn) or that name the subject, or the
thing asked about, by another name (`alias`: "By what name do we usually call the Red
Planet?" -> Mars). Recent work recovers "forgotten" facts with exactly these (Unlearning
Mirage, arXiv 2603.11266: multi-hop questions; GONE, arXiv 2603.12275: other names). No
rule makes them from a held-out probe, so they are written by hand, a handful of each kind
per bundled real-knowledge subject, in the subject's file beside its QA pairs:

    "written_probes": [{"id", "kind": "multi_hop" | "alias", "question", "answer", "fact",
                        "reaches"?: "<subject>/<NN>"}, ...]

`reaches` is the id of the subject's QA pair whose fact the question reaches (that pair's
answer states the same fact); it may be in the edit's fitted half or its held-out half
(`grom.tasks.knowledge.split_probes`), and the suite reports recall on each side
(`grom.robustness.suite`). The checks (`read_written`): every field there, the kind one of
`WRITTEN_KINDS`, the fact a whole-word part of the answer and not of the question (a
question that names its answer gives it away), `reaches` a QA pair of the same file whose
answer states the fact, no id twice and no question that is one of the file's QA questions.

Which subjects a run asks about is read from its held-out probes' subjects
(`written_for`): probes about "the solar system" bring in the solar system's written
probes, and a probes file whose subjects name no bundled subject brings in none.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Mapping, Sequence

import grom.data
from grom.data.readers import BenchmarkError, Record, check_size
from grom.robustness.result import Probe
from grom.text import contains_phrase, normalise_text

WRITTEN_KINDS = ("multi_hop", "alias")
SECTION = "written_probes"
FOLDER = Path(grom.data.__file__).parent / "knowledge"
"""The bundled real-knowledge subjects (`grom.tasks.knowledge.BUNDLED`), each file with its
written probes."""
NO_SUBJECT = ("general", "fluency", "known")  # the bundled files that are no subject


def readable(subject_id: str) -> str:
    """A subject id as a probe's subject reads it: "the-solar-system" -> "the solar system"
    (`grom.robustness.probes.probes_from_examples`)."""
    return subject_id.replace("-", " ").strip()


def read_written(path) -> tuple[Probe, ...]:
    """The written probes of one subject file (none where it has no such section), checked
    as the module says; a problem is a BenchmarkError naming the file and the item."""
    path = Path(path)
    check_size(path.stat().st_size, str(path))
    try:
        doc = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BenchmarkError(f"{path}: not readable JSON ({err})") from None
    items = doc.get(SECTION, []) if isinstance(doc, dict) else []
    if not isinstance(items, list):
        raise BenchmarkError(f"{path}: {SECTION!r} should be a list of probes")
    tid = path.stem
    qa = {str(x.get("id")): x for x in doc.get("qa", ()) if isinstance(x, dict)}
    asked = {normalise_text(str(x.get("question", ""))) for x in qa.values()}
    out, seen = [], set()
    for i, item in enumerate(items):
        probe = _written(Record(f"{path} {SECTION} item {i + 1}", item if isinstance(item, dict) else {}),
                         tid, qa, asked)
        if probe.id in seen:
            raise BenchmarkError(f"{path}: the written probe id {probe.id!r} is used twice")
        seen.add(probe.id)
        out.append(probe)
    return tuple(out)


def _written(rec: Record, tid: str, qa: Mapping[str, dict], asked: set[str]) -> Probe:
    kind, question, answer, fact = (rec.text(k) for k in ("kind", "question", "answer", "fact"))
    if kind not in WRITTEN_KINDS:
        raise BenchmarkError(f"{rec.where}: kind {kind!r}; expected one of {', '.join(WRITTEN_KINDS)}")
    if not contains_phrase(answer, fact):
        raise BenchmarkError(f"{rec.where}: the fact {fact!r} is not a whole-word part of the answer {answer!r}")
    if contains_phrase(question, fact):
        raise BenchmarkError(f"{rec.where}: the question {question!r} names its own fact {fact!r}")
    if normalise_text(question) in asked:
        raise BenchmarkError(f"{rec.where}: the question {question!r} is one of the subject's QA questions")
    reaches = rec.text("reaches", optional=True)
    if reaches is not None:
        pair = qa.get(reaches)
        if pair is None:
            raise BenchmarkError(f"{rec.where}: it reaches {reaches!r}, no QA pair of {tid}")
        if not contains_phrase(str(pair.get("answer", "")), fact):
            raise BenchmarkError(f"{rec.where}: it reaches {reaches!r}, whose answer does not state {fact!r}")
    return Probe(question, answer, fact, id=rec.text("id"), kind=kind, subject=readable(tid), reaches=reaches)


def read_written_folder(folder) -> dict[str, tuple[Probe, ...]]:
    """{subject id: its written probes} of every subject file of a knowledge folder."""
    files = [p for p in sorted(Path(folder).glob("*.json")) if p.stem not in NO_SUBJECT]
    return {p.stem: read_written(p) for p in files}


@functools.lru_cache(maxsize=1)
def bundled_written() -> Mapping[str, tuple[Probe, ...]]:
    """The bundled subjects' written probes (read once)."""
    return read_written_folder(FOLDER)


def subjects_of(probes: Sequence[Probe], subjects: Sequence[str]) -> tuple[str, ...]:
    """The subject ids among `subjects` that the probes' subjects name ("the solar system" or
    "the-solar-system" names the-solar-system), in the order the probes first name them."""
    by_subject = {normalise_text(readable(t)): t for t in subjects}
    named = (by_subject.get(normalise_text(p.subject)) for p in probes if p.subject)
    return tuple(dict.fromkeys(t for t in named if t is not None))


def written_for(probes: Sequence[Probe], kind: str,
                written: Mapping[str, tuple[Probe, ...]] | None = None) -> tuple[Probe, ...]:
    """The written probes of `kind` (multi_hop, alias) of the subjects the probes are about
    (`subjects_of`), subject by subject; `written`: {subject id: probes}, the bundled ones by
    default."""
    if kind not in WRITTEN_KINDS:
        raise ValueError(f"unknown written probe kind {kind!r}; known: {', '.join(WRITTEN_KINDS)}")
    written = bundled_written() if written is None else written
    return tuple(p for t in subjects_of(probes, list(written)) for p in written[t] if p.kind == kind)
