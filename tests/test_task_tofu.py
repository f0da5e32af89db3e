"""TOFU from a local folder in the Hub's file layout, and from the Hub with no network."""
from __future__ import annotations

import time

import pytest

from grom.data import LLAMA2_INST, TOFU_CHAT, BenchmarkError, QAExample, load_benchmark
from tests.data_fixtures import tofu_folder, tofu_pair, write_jsonl


def test_forget10_maps_every_file(tmp_path):
    bench = load_benchmark("tofu", "forget10", source=tofu_folder(tmp_path))
    assert (bench.name, bench.split, bench.task) == ("tofu", "forget10", "tofu")
    assert len(bench.forget) == 4 and len(bench.retain) == 6
    assert all(isinstance(ex, QAExample) for ex in bench.forget + bench.retain)
    assert bench.forget[0].question == "What is fact 0 about Basil?"
    assert bench.forget[0].answer == "Basil's fact 0 is true."
    assert bench.retain[0].answer == "Odo's fact 0 is true."
    assert set(bench.eval_sets) == {"forget", "retain", "real_authors", "world_facts", "holdout"}
    assert bench.prompt_format == TOFU_CHAT and TOFU_CHAT.date_string == "10 Apr 2025"


def test_forget_pairs_take_the_perturbed_files_fields(tmp_path):
    bench = load_benchmark("tofu", "forget10", source=tofu_folder(tmp_path))
    first, last = bench.forget[0], bench.forget[3]
    assert first.paraphrased_answer == "In other words, Basil's fact 0 is true."
    assert first.paraphrased_question == "Paraphrased: What is fact 0 about Basil?"
    assert first.perturbed_answers == tuple(f"Wrong answer {j}." for j in range(5))
    assert last.paraphrased_answer is None and last.perturbed_answers == ()  # no perturbed row
    ra = bench.eval_sets["real_authors"][0]
    assert (ra.answer, ra.perturbed_answers) == ("William Shakespeare", ("Jane Austen", "Mark Twain"))
    assert len(bench.eval_sets["retain"]) == 2 and len(bench.eval_sets["holdout"]) == 1


def test_the_caller_chooses_the_prompt_format(tmp_path):
    bench = load_benchmark("tofu", "forget01", source=tofu_folder(tmp_path, "01"), prompt_format=LLAMA2_INST)
    assert bench.prompt_format is LLAMA2_INST and len(bench.retain) == 6


def test_missing_eval_files_are_skipped_and_forget_is_its_own_eval_set(tmp_path):
    root = tofu_folder(tmp_path, "05")
    for name in ("forget05_perturbed.json", "holdout05.json", "world_facts_perturbed.json"):
        (root / name).unlink()
    bench = load_benchmark("tofu", "forget05", source=root)
    assert set(bench.eval_sets) == {"forget", "retain", "real_authors"}
    assert bench.eval_sets["forget"] == bench.forget


def test_a_missing_retain_file_is_named(tmp_path):
    root = tofu_folder(tmp_path)
    (root / "retain90.json").unlink()
    with pytest.raises(BenchmarkError, match=r"no TOFU retain90 file; expected one of: retain90"):
        load_benchmark("tofu", "forget10", source=root)


def test_a_missing_field_names_file_and_line(tmp_path):
    root = tofu_folder(tmp_path)
    write_jsonl(root / "forget10.json", [{"question": "Q?", "answer": "A"}, {"question": "Q2?"}])
    with pytest.raises(BenchmarkError,
                       match=r"forget10.json line 2: expected a non-empty text field 'answer'; found fields: question"):
        load_benchmark("tofu", "forget10", source=root)


def test_an_empty_forget_file_is_refused(tmp_path):
    root = tofu_folder(tmp_path)
    (root / "forget10.json").write_text("")
    with pytest.raises(BenchmarkError, match=r"TOFU forget10 is empty"):
        load_benchmark("tofu", "forget10", source=root)


def test_a_bad_source_path_or_a_file_is_refused(tmp_path):
    with pytest.raises(BenchmarkError, match=r"no local file or folder"):
        load_benchmark("tofu", "forget10", source=tmp_path / "nowhere")
    a_file = write_jsonl(tmp_path / "forget10.json", [{"question": "Q?", "answer": "A"}])
    with pytest.raises(BenchmarkError, match=r"expected a folder"):
        load_benchmark("tofu", "forget10", source=a_file)


def test_the_hub_without_network_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(BenchmarkError, match=r"could not reach the Hugging Face Hub.*locuslab/TOFU.*local folder"):
        load_benchmark("tofu", "forget10")
    assert time.monotonic() - start < 30


# TOFU's shape for the editors' subjects: 20 questions per author, in order; the first asks
# for the name without writing it, a few write only part of it, the answers name places and
# books as well (the texts are made up here in TOFU's style, not TOFU's rows)
def _author_rows(name: str, surname: str, city: str, book: str) -> list[dict]:
    rows = [{"question": f"What is the full name of the author born in {city} on 08/09/1956?",
             "answer": f"The author born in {city} on the 8th of September, 1956 is {name}."}]
    for k in range(15):
        rows.append({"question": f"What is fact {k} about {name}'s work?",
                     "answer": f"{name}'s fact {k}, seen in {book}, is true."})
    rows += [{"question": f"How does {surname} draw on {city} in {book}?", "answer": "Through its streets."},
             {"question": f"Was {surname} ever a teacher?", "answer": "No, never."},
             {"question": "Which award did the author win in 1999?", "answer": f"{name} won the Prix Goncourt."},
             {"question": f"Is {book} set in {city}?", "answer": f"Yes, {book} is set in {city}."}]
    return rows


def _two_authors(tmp_path):
    forget = _author_rows("Basil Mahfouz Al-Kuwaiti", "Al-Kuwaiti", "Kuwait City", "Promise by the Seine") \
        + _author_rows("Jean de la Fontaine", "Fontaine", "Reims", "Le Petit Sultan")
    write_jsonl(tmp_path / "forget01.json", forget)
    write_jsonl(tmp_path / "retain99.json", [tofu_pair("Odo", k) for k in range(3)])
    return tmp_path


def test_real_tofu_rows_get_their_author_as_subject(tmp_path):
    from grom.methods.editors.value_optimisation import missing_facts

    bench = load_benchmark("tofu", "forget01", source=_two_authors(tmp_path))
    subjects = [ex.subject for ex in bench.forget]
    assert len(subjects) == 40 and missing_facts(bench.forget) is None  # the editors can run
    basil, jean = subjects[:20], subjects[20:]
    assert basil[0] == "Basil Mahfouz Al-Kuwaiti"  # the question names no one: the whole name
    assert basil[1:16] == ["Basil Mahfouz Al-Kuwaiti"] * 15
    assert basil[16:18] == ["Al-Kuwaiti", "Al-Kuwaiti"]  # the part the question writes
    assert jean[1] == "Jean de la Fontaine" and jean[16] == "Fontaine"
    assert [ex.subject for ex in bench.eval_sets["forget"]] == subjects  # its own evaluation set


def test_a_row_keys_on_its_subject_where_the_question_writes_it(tmp_path, tokenizer):
    from grom.methods.editors.value_optimisation import encode_fact

    bench = load_benchmark("tofu", "forget01", source=_two_authors(tmp_path))
    tok = tokenizer
    named, unnamed = encode_fact(tok, bench.forget[1], None, 256), encode_fact(tok, bench.forget[0], None, 256)
    assert named.subject_last and not unnamed.subject_last  # the latter keys on the question's last token


def test_no_subject_where_the_rows_are_not_whole_authors_or_no_name_recurs(tmp_path):
    from grom.tasks.tofu import author_of_block, with_authors

    bench = load_benchmark("tofu", "forget10", source=tofu_folder(tmp_path))  # 4 rows: not a block of 20
    assert all(ex.subject is None for ex in bench.forget)
    rows = [QAExample(f"Question {k} about nothing in particular?", f"answer {k}.") for k in range(20)]
    assert author_of_block(rows) is None and with_authors(rows) == tuple(rows)
