"""A user's own files: CSV / JSON / JSON lines, uploads as bytes, and the retain rule."""
from __future__ import annotations

import json

import pytest

from grom.data import BenchmarkError, QAExample, TextExample, load_benchmark
from grom.tasks import load_custom_file
from tests.data_fixtures import write_csv, write_json, write_jsonl

PAIRS = [
    {"split": "forget", "question": "Where was Zorvath born?", "answer": "In Pellmoor.",
     "paraphrased_answer": "Pellmoor.", "perturbed_answers": json.dumps(["In Quenford.", "In Oskar Bay."]),
     "fact": "Pellmoor"},
    {"split": "retain", "question": "Where was Odo born?", "answer": "In Quenford."},
    {"split": "Retain ", "text": "Odo Brask wrote Lanterns of Ash."},
]


def test_one_csv_with_a_split_column(tmp_path):
    bench = load_benchmark("custom", source=write_csv(tmp_path / "mine.csv", PAIRS))
    assert (bench.name, bench.split, bench.task) == ("custom", "forget", "custom")
    (forget,) = bench.forget
    assert forget == QAExample(
        question="Where was Zorvath born?", answer="In Pellmoor.", paraphrased_answer="Pellmoor.",
        perturbed_answers=("In Quenford.", "In Oskar Bay."), fact="Pellmoor", id="mine/0",
    )
    assert bench.retain == (QAExample("Where was Odo born?", "In Quenford.", id="mine/1"),
                            TextExample("Odo Brask wrote Lanterns of Ash.", id="mine/2"))
    assert bench.eval_sets == {"forget": bench.forget, "retain": bench.retain}


def test_separate_forget_and_retain_files(tmp_path):
    forget = write_jsonl(tmp_path / "f.jsonl", [{"id": 7, "question": "Q?", "answer": "A", "perturbed_answer": "B"}])
    retain = write_json(tmp_path / "r.json", [{"text": "Some retained text."}])
    bench = load_benchmark("custom", source={"forget": forget, "retain": retain})
    assert bench.forget[0].perturbed_answers == ("B",) and bench.forget[0].id == "7"
    assert bench.retain == (TextExample("Some retained text.", id="r/0"),)


def test_an_upload_as_bytes():
    data = "question,answer\nQ1?,A1\nQ2?,A2\n".encode("utf-8")
    examples = load_custom_file(data, name="upload.csv")
    assert [ex.answer for ex in examples] == ["A1", "A2"]
    with pytest.raises(BenchmarkError, match="needs its name"):
        load_custom_file(data)
    with pytest.raises(BenchmarkError, match=r"upload.parquet: unknown file type"):
        load_custom_file(data, name="upload.parquet")
    with pytest.raises(BenchmarkError, match="not UTF-8"):
        load_custom_file("question,answer\nÇa?,Oui\n".encode("cp1252"), name="upload.csv")


def test_load_custom_file_filters_by_split(tmp_path):
    path = write_csv(tmp_path / "mine.csv", PAIRS)
    assert len(load_custom_file(path)) == 3
    assert len(load_custom_file(path, split="retain")) == 2


def test_without_a_retain_set_it_says_one_is_needed(tmp_path):
    forget = write_csv(tmp_path / "f.csv", [{"question": "Q?", "answer": "A"}])
    with pytest.raises(BenchmarkError, match=r"a retain set is needed \(GROM takes retain keys"):
        load_benchmark("custom", source={"forget": forget})
    only_forget = write_csv(tmp_path / "s.csv", [{"split": "forget", "question": "Q?", "answer": "A"}])
    with pytest.raises(BenchmarkError, match="a retain set is needed"):
        load_benchmark("custom", source=only_forget)
    with pytest.raises(BenchmarkError, match=r"has no 'split' column"):
        load_benchmark("custom", source=forget)
    with pytest.raises(BenchmarkError, match=r"give source="):
        load_benchmark("custom")


def test_bad_rows_are_named(tmp_path):
    neither = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "?"}])
    with pytest.raises(BenchmarkError, match=r"n.jsonl line 1: expected 'question' and 'answer' fields, "
                                             r"or a 'text' field; found: prompt"):
        load_custom_file(neither)
    no_answer = write_csv(tmp_path / "a.csv", [{"question": "Q?", "answer": "A"}, {"question": "Q2?"}])
    with pytest.raises(BenchmarkError, match=r"a.csv line 3: expected a non-empty text field 'answer'"):
        load_custom_file(no_answer)
    bad_split = write_csv(tmp_path / "b.csv", [{"split": "keep", "text": "t"}])
    with pytest.raises(BenchmarkError, match=r"b.csv line 2: split 'keep' is unknown"):
        load_custom_file(bad_split, split="forget")
    missing_split = write_csv(tmp_path / "m.csv", [{"split": "forget", "text": "t"}, {"text": "u"}])
    with pytest.raises(BenchmarkError, match=r"m.csv line 3: no split value"):
        load_benchmark("custom", source=missing_split)


def test_empty_files_and_bad_source_keys(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(BenchmarkError, match=r"e.jsonl is empty"):
        load_custom_file(empty)
    with pytest.raises(BenchmarkError, match=r"source keys \['eval', 'forget'\]"):
        load_benchmark("custom", source={"forget": empty, "eval": empty})
