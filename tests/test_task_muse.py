"""MUSE from a local folder in the Hub layout (parquet shards, JSON lines, old split names)."""
from __future__ import annotations

import pytest

from grom.data import PLAIN_QA, BenchmarkError, QAExample, TextExample, load_benchmark
from tests.data_fixtures import muse_folder, write_jsonl


def test_muse_news_maps_every_config(tmp_path):
    bench = load_benchmark("muse-news", source=muse_folder(tmp_path))
    assert (bench.name, bench.split, bench.task) == ("muse-news", "forget", "muse")
    assert [ex.text for ex in bench.forget] == ["Forget article one.", "Forget article two."]
    assert all(isinstance(ex, TextExample) for ex in bench.forget + bench.retain)
    assert bench.retain[0].text == "Retain article."
    assert set(bench.eval_sets) == {
        "verbmem_forget", "knowmem_forget", "knowmem_retain", "knowmem_forget_icl",
        "privleak_forget", "privleak_retain", "privleak_holdout",
    }
    assert bench.prompt_format is PLAIN_QA


def test_verbmem_and_knowmem_fields(tmp_path):
    bench = load_benchmark("muse-books", "raw", source=muse_folder(tmp_path))
    assert bench.name == "muse-books" and bench.split == "forget"  # "raw" is an alias
    verbmem = bench.eval_sets["verbmem_forget"][0]
    assert verbmem == QAExample(question="Once upon", answer=" a time there was", id=verbmem.id)
    assert verbmem.question + verbmem.answer == "Once upon a time there was"
    assert bench.eval_sets["knowmem_retain"][0].answer == "Bob"  # read from retain2_qa
    assert bench.eval_sets["privleak_holdout"][0].text == "holdout privacy text"


def test_missing_retain_texts_are_named(tmp_path):
    root = muse_folder(tmp_path)
    (root / "raw" / "retain1.jsonl").unlink()
    with pytest.raises(BenchmarkError, match=r"no MUSE-news raw/retain1 file; expected one of: raw/retain1"):
        load_benchmark("muse-news", source=root)


def test_a_text_row_without_text_is_refused(tmp_path):
    root = muse_folder(tmp_path)
    write_jsonl(root / "raw" / "retain1.jsonl", [{"body": "no text field"}])
    with pytest.raises(BenchmarkError,
                       match=r"retain1.jsonl line 1: expected a non-empty text field 'text'; found fields: body"):
        load_benchmark("muse-news", source=root)


def test_an_unknown_split_lists_the_valid_ones(tmp_path):
    with pytest.raises(BenchmarkError, match=r"unknown split 'retain'; valid splits: forget, raw"):
        load_benchmark("muse-news", "retain", source=muse_folder(tmp_path))
