"""The real-knowledge benchmark: the bundled files are valid and big enough, splits keep
forget, retain and evaluation apart, and bad files fail with the file and item named."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grom.data import BENCHMARKS, BenchmarkError, QAExample, TextExample, load_benchmark
from grom.eval.metrics import fact_recall
from grom.tasks.knowledge import (
    BUNDLED,
    FIT_FRACTION,
    FORGET3,
    RETAIN_FRACTION,
    SPLITS,
    SUBJECTS,
    knowledge,
    load_knowledge,
    read_knowledge,
    split_probes,
    split_retain,
)
from grom.text import contains_phrase, normalise_text

ROOT = Path(__file__).resolve().parents[1]


def _questions(examples) -> set[str]:
    return {ex.question for ex in examples}


def test_the_bundled_files_are_big_enough():
    know = knowledge()
    assert len(know.subjects) >= 12
    assert tuple(know.subjects) == tuple(sorted(SUBJECTS))  # every bundled file is a registered split
    assert {t: len(k.qa) for t, k in know.subjects.items() if len(k.qa) < 25} == {}
    assert len(know.general.qa) >= 60
    assert len(know.fluency) >= 20 and all(isinstance(t, TextExample) for t in know.fluency)


def test_every_bundled_pair_is_valid():
    know = knowledge()
    for group in [*know.subjects.values(), know.general]:
        for ex in group.qa:
            assert ex.subject == group.id and ex.id.startswith(f"{group.id}/")
            assert fact_recall(ex.fact, ex.answer) == 1.0, ex
            assert 1 <= len(ex.fact.split()) <= 3, ex
            assert ex.paraphrased_question and ex.paraphrased_question != ex.question, ex
            wrong = ex.perturbed_answers
            assert len(wrong) == 3 and len(set(wrong)) == 3 and ex.answer not in wrong, ex
            assert all(fact_recall(ex.fact, w) == 0.0 for w in wrong), ex


def test_fluency_and_general_mention_no_target():
    know = knowledge()
    titles = [normalise_text(t.title) for t in know.subjects.values()]
    texts = [ex.text for ex in know.fluency]
    texts += [s for ex in know.general.qa for s in (ex.question, ex.answer)]
    hits = [(t, x) for x in texts for t in titles if contains_phrase(x, t)]
    assert hits == []


@pytest.mark.parametrize("text, phrase, inside", [
    ("Ivo Marr, a poet.", "ivo marr", True), ("It was 19870.", "1987", False),
    ("The  Solar_System!", "solar system", True), ("Anything", " ,; ", False),
])
def test_the_loader_reads_facts_as_fact_recall_does(text, phrase, inside):
    assert contains_phrase(text, phrase) is inside
    if normalise_text(phrase):
        assert fact_recall(phrase, text) == float(inside)


@pytest.mark.parametrize("split", [SUBJECTS[0], "forget3"])
def test_a_split_keeps_forget_retain_and_evaluation_apart(split):
    bench = load_knowledge(split)
    names = set(FORGET3 if split == "forget3" else [split])
    assert bench.task == "knowledge" and bench.name == "real-knowledge" and bench.split == split
    assert bench.prompt_format is None  # the tokenizer's chat template
    assert {ex.subject for ex in bench.forget} == names
    assert bench.eval_sets["forget"] == bench.forget
    probes = bench.eval_sets["probes"]
    assert {ex.subject for ex in probes} == names and not _questions(probes) & _questions(bench.forget)
    know = knowledge()
    assert set(bench.forget) | set(probes) == {ex for n in names for ex in know.subjects[n].qa}
    neighbours, general = bench.eval_sets["neighbours"], bench.eval_sets["general"]
    for part in (bench.retain, neighbours, general):
        assert part and all(isinstance(ex, QAExample) and ex.subject not in names for ex in part)
    assert not _questions(bench.retain) & _questions(neighbours)
    assert not _questions(bench.retain) & _questions(general)
    kept = _questions(bench.retain) | _questions(neighbours) | _questions(general)
    assert not (_questions(bench.forget) | _questions(probes)) & kept
    assert {ex.subject for ex in neighbours} == set(SUBJECTS) - names
    assert {ex.subject for ex in general} == {"general"}
    assert all(isinstance(t, TextExample) for t in bench.eval_sets["fluency"])


def test_the_retain_part_is_sixty_percent_of_every_kept_group_and_fixed():
    know = knowledge()
    for group in [*know.subjects.values(), know.general]:
        retain, held_out = split_retain(group.qa)
        assert len(retain) == round(RETAIN_FRACTION * len(group.qa))
        assert set(retain) | set(held_out) == set(group.qa) and not set(retain) & set(held_out)
        # dropping a pair moves no other pair to the other side
        r2, _ = split_retain(group.qa[1:])
        assert set(r2) <= set(retain) or len(set(r2) - set(retain)) == 1


def test_the_forget_subjects_split_into_fitted_and_probe_halves_fixed_by_id():
    """Each FORGET3 subject: at least 25 fitted and 25 probe questions, disjoint, the split a
    function of the ids alone (reordering the file or dropping a pair moves nothing else)."""
    know = knowledge()
    for tid in FORGET3:
        qa = know.subjects[tid].qa
        fitted, probes = split_probes(qa)
        assert len(fitted) == round(FIT_FRACTION * len(qa)) >= 25 and len(probes) >= 25
        assert set(fitted) | set(probes) == set(qa) and not set(fitted) & set(probes)
        assert set(split_probes(qa[::-1])[0]) == set(fitted)  # the order of the file does not matter
        f2, _ = split_probes(qa[1:])
        assert len(set(f2) - set(fitted)) <= 1
        # the hash order is the retain split's: a kept subject's retained pairs hold its fitted ones
        assert set(fitted) <= set(split_retain(qa)[0])
    # hand check of the rule on made-up ids: the first half in the order of sha256(id)
    import hashlib
    made = tuple(QAExample(f"q{i}?", f"a {i}", fact=str(i), id=f"x/{i}") for i in range(6))
    by_hash = sorted(made, key=lambda ex: hashlib.sha256(ex.id.encode()).hexdigest())
    assert split_probes(made)[0] == tuple(ex for ex in made if ex in by_hash[:3])


def test_loading_is_deterministic():
    assert load_knowledge("forget3") == load_knowledge("forget3")
    assert read_knowledge(BUNDLED) == knowledge()  # a fresh read equals the cached one
    a, b = load_knowledge("japan"), load_knowledge("france")
    japan_in_france = [ex for ex in b.retain if ex.subject == "japan"]
    assert japan_in_france == [ex for ex in load_knowledge("harry-potter").retain if ex.subject == "japan"]
    assert not _questions(japan_in_france) & _questions(a.retain)


def test_registered_with_every_target_and_forget3():
    spec = BENCHMARKS["real-knowledge"]
    assert spec.splits == SPLITS and spec.splits[0] == "the-solar-system" and spec.splits[-1] == "forget3"
    assert len(SPLITS) == len(set(SPLITS)) == len(SUBJECTS) + 1 and set(FORGET3) < set(SUBJECTS)
    assert set(spec.options) == {"prompt_format", "known_only"}
    assert load_benchmark("real-knowledge") == load_knowledge("the-solar-system")
    assert load_benchmark("real-knowledge", "forget3").forget == load_knowledge("forget3").forget
    with pytest.raises(BenchmarkError, match="unknown split 'narnia'; valid splits: the-solar-system"):
        load_benchmark("real-knowledge", "narnia")


def test_importing_reads_no_file():
    code = ("import grom.data, grom.tasks.knowledge as k; "
            "assert k._bundled.cache_info().currsize == 0, 'read at import'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ----------------------------------------------------------------------------- folder sources


@pytest.fixture
def folder(tmp_path) -> Path:
    dest = tmp_path / "knowledge"
    shutil.copytree(BUNDLED, dest, ignore=shutil.ignore_patterns("*.md", "known.json"))
    return dest


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_folder_source_loads_like_the_bundled_files(folder):
    assert load_knowledge("forget3", folder) == load_knowledge("forget3")
    japan = load_benchmark("real-knowledge", "japan", source=str(folder))
    assert japan.forget == load_knowledge("japan").forget


def _set(i, key, value):
    def change(doc):
        doc["qa"][i][key] = value
    return change


def _drop(i, key):
    def change(doc):
        del doc["qa"][i][key]
    return change


@pytest.mark.parametrize("change, message", [
    (_set(2, "fact", "Neville"), r"item 3: the fact 'Neville' is not a whole-word part"),
    (_set(0, "wrong_answers", ["A.", "A.", "B."]), r"item 1: expected 3 distinct wrong answers"),
    (_set(0, "wrong_answers", ["A.", "B."]), r"item 1: expected 3 distinct wrong answers"),
    (_drop(4, "paraphrased_question"), r"item 5: expected a non-empty text field 'paraphrased_question'"),
    (_drop(1, "answer"), r"item 2: expected a non-empty text field 'answer'"),
    (_set(0, "wrong_answers", ["It was Vader.", "B.", "C."]),  # item 1's fact is "Vader"
     r"item 1: the wrong answer 'It was Vader.' contains the fact 'Vader'"),
])
def test_a_broken_pair_names_the_file_and_item(folder, change, message):
    _edit(folder / "star-wars.json", change)
    with pytest.raises(BenchmarkError, match=r"star-wars\.json qa " + message):
        load_knowledge("japan", folder)


def test_a_duplicate_question_or_malformed_file_is_an_error(folder):
    question = json.loads((folder / "japan.json").read_text())["qa"][0]["question"]
    _edit(folder / "france.json", _set(5, "question", question))
    with pytest.raises(BenchmarkError, match=r"question 'What is the capital of Japan\?' is already in"):
        load_knowledge("japan", folder)
    (folder / "france.json").write_text('{"id": "france", "qa": [')
    with pytest.raises(BenchmarkError, match=r"france.json line 1, column \d+: malformed JSON"):
        load_knowledge("japan", folder)
    (folder / "france.json").write_text('{"id": "france", "qa": []}')
    with pytest.raises(BenchmarkError, match=r"france.json: expected an object with a non-empty list \"qa\""):
        load_knowledge("japan", folder)


def test_a_missing_target_or_general_file_is_an_error(folder):
    (folder / f"{FORGET3[1]}.json").unlink()
    with pytest.raises(BenchmarkError, match=f"no subject '{FORGET3[1]}'; valid splits: "):
        load_knowledge("forget3", folder)
    (folder / "general.json").unlink()
    with pytest.raises(BenchmarkError, match=r"general.json: no such file"):
        load_knowledge("japan", folder)


def test_known_only_keeps_the_probed_facts(folder):
    with pytest.raises(BenchmarkError, match="known_only needs known.json"):
        load_knowledge("japan", folder, known_only=True)
    every = [ex for g in [*knowledge().subjects.values(), knowledge().general] for ex in g.qa]
    known = {ex.id: [int(i % 3 == 0), 0] for i, ex in enumerate(every)}
    (folder / "known.json").write_text(json.dumps({"model": "test", "known": known}))
    full, only = load_knowledge("japan", folder), load_knowledge("japan", folder, known_only=True)
    assert only.retain == full.retain
    for name in ("forget", "probes", "neighbours", "general"):
        assert only.eval_sets[name] == tuple(ex for ex in full.eval_sets[name] if known[ex.id][0])
    assert only.forget == only.eval_sets["forget"]
    (folder / "known.json").write_text(json.dumps({"known": {"narnia/01": [1, 1]}}))
    with pytest.raises(BenchmarkError, match="unknown pair id 'narnia/01'"):
        load_knowledge("japan", folder)
    (folder / "known.json").write_text(json.dumps({"known": {"japan/01": 1}}))
    with pytest.raises(BenchmarkError, match=r"'japan/01' should map to \[question known"):
        load_knowledge("japan", folder)


def test_the_bundled_probe_result_is_current():
    """known.json (bench/probe_knowledge.py --write-known) covers exactly the bundled pairs,
    and the default subject has facts the probed model knows."""
    know = knowledge()
    if know.known is None:
        pytest.skip("no known.json bundled")
    ids = {ex.id for g in [*know.subjects.values(), know.general] for ex in g.qa}
    assert set(know.known) == ids
    assert len(load_knowledge(SUBJECTS[0], known_only=True).forget) >= 10


def test_the_probe_writes_what_the_loader_reads(folder):
    """bench/probe_knowledge.py's table and known.json, without a model."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from probe_knowledge import merge_known, table, write_known
    finally:
        sys.path.remove(str(ROOT / "bench"))
    every = [ex for g in [*knowledge().subjects.values(), knowledge().general] for ex in g.qa]
    rows = [{"id": ex.id, "known": int(ex.subject == "japan"), "paraphrase_known": 0} for ex in every]
    write_known(folder / "known.json", "tiny", 32, rows)
    assert load_knowledge("japan", folder, known_only=True).forget == load_knowledge("japan").forget
    # probing one subject again replaces its entries and keeps the others'
    again = [dict(r, known=1, paraphrase_known=1) for r in rows if r["id"].startswith("france/")]
    merged = merge_known(folder / "known.json", again, [r["id"] for r in rows])
    assert [r["id"] for r in merged] == [r["id"] for r in rows]
    assert {r["id"]: r["known"] for r in merged} == {r["id"]: int(r["id"].startswith(("japan/", "france/")))
                                                     for r in rows}
    with pytest.raises(SystemExit, match="no entry for 'new/01'"):
        merge_known(folder / "known.json", again, ["new/01"])
    md = table({"japan": ("place", rows[:3])}).splitlines()
    assert md[2] == "| japan | place | 3 | 0 | 0 | 0 |" and md[-1].startswith("| **all** | | **3** |")
