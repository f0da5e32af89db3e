"""zsRE from a zsre_mend_eval.json file in the ROME/MEMIT format."""
from __future__ import annotations

import logging

import pytest

from grom.data import RAW_TEXT, BenchmarkError, FactRecord, QAExample, load_benchmark
from tests.data_fixtures import write_json, zsre_record


def test_records_map_to_fact_records(tmp_path):
    path = write_json(tmp_path / "zsre_mend_eval.json", [zsre_record(0), zsre_record(1)])
    bench = load_benchmark("zsre", "eval", source=path)
    assert (bench.name, bench.split, bench.task) == ("zsre", "eval", "zsre")
    fact = bench.forget[1]
    assert fact == FactRecord(
        subject="Watts Humphrey 1",
        prompt="What university did Watts Humphrey 1 attend?",
        answer="Illinois Institute of Technology",
        rephrase="What university did Watts Humphrey 1 take part in?",
        neighborhood_prompt="nq question: who played desmond doss father in hacksaw ridge?",
        neighborhood_answer="Hugo Weaving",
        id="zsre/1",
    )
    assert bench.prompt_format is RAW_TEXT
    assert "neighbourhood" in bench.description


def test_retain_is_the_neighbourhood_prompts(tmp_path):
    write_json(tmp_path / "zsre_mend_eval.json", [zsre_record(0)])
    bench = load_benchmark("zsre", source=tmp_path)  # a folder holding the file
    assert bench.retain == (QAExample(
        question="nq question: who played desmond doss father in hacksaw ridge?",
        answer=" Hugo Weaving", id="zsre/0/loc"),)
    assert bench.eval_sets["neighborhood"] == bench.retain and bench.eval_sets["forget"] == bench.forget


def test_without_a_source_the_file_to_provide_is_named():
    with pytest.raises(BenchmarkError, match=r"give source= the path of zsre_mend_eval.json"):
        load_benchmark("zsre")


def test_a_folder_without_the_file_is_refused(tmp_path):
    with pytest.raises(BenchmarkError, match=r"holds no zsre_mend_eval.json"):
        load_benchmark("zsre", source=tmp_path)


def test_a_record_without_answers_is_named(tmp_path):
    bad = {k: v for k, v in zsre_record(0).items() if k != "answers"}
    path = write_json(tmp_path / "z.json", [zsre_record(1), bad])
    with pytest.raises(BenchmarkError, match=r"z.json item 2: expected a list-of-texts field 'answers'"):
        load_benchmark("zsre", source=path)


def test_a_subject_missing_from_its_prompt_is_skipped(tmp_path, caplog):
    odd = {**zsre_record(0), "subject": "Somebody Else"}
    path = write_json(tmp_path / "z.json", [odd, zsre_record(1)])
    with caplog.at_level(logging.WARNING, logger="grom.data.zsre"):
        bench = load_benchmark("zsre", source=path)
    assert [f.subject for f in bench.forget] == ["Watts Humphrey 1"]
    assert "does not occur in src" in caplog.text


def test_an_empty_file_is_refused(tmp_path):
    path = write_json(tmp_path / "z.json", [])
    with pytest.raises(BenchmarkError, match=r"zsre .*z.json\) is empty"):
        load_benchmark("zsre", source=path)
