"""WMDP from a local folder: questions, corpora, WikiText retain and the MMLU utility set."""
from __future__ import annotations

import pytest

from grom.data import BenchmarkError, ChoiceExample, TextExample, load_benchmark
from tests.data_fixtures import LONG, wmdp_folder, write_csv, write_jsonl


def test_wmdp_bio_maps_questions_and_corpora(tmp_path):
    bench = load_benchmark("wmdp-bio", source=wmdp_folder(tmp_path))
    assert (bench.name, bench.split, bench.task) == ("wmdp-bio", "forget", "wmdp")
    mc = bench.eval_sets["forget_mc"]
    assert len(mc) == 3 and all(isinstance(ex, ChoiceExample) for ex in mc)
    assert mc[2].question == "Hazard question 2?" and mc[2].answer_index == 2 and mc[2].answer == "C2"
    assert [ex.text for ex in bench.forget] == [LONG + "0", LONG + "1"]  # the short text is dropped
    assert bench.retain == (TextExample(text=LONG, id=bench.retain[0].id),)  # WikiText, blanks dropped
    utility = bench.eval_sets["utility_mc"][0]
    assert (utility.answer, utility.subject) == ("4", "math")


def test_retain_corpus_and_no_utility(tmp_path):
    root = wmdp_folder(tmp_path, "cyber")
    write_csv(root / "retain.csv", [{"text": LONG + "retain"}])
    bench = load_benchmark("wmdp-cyber", "test", source=root, retain="corpus", utility=False)
    assert [ex.text for ex in bench.retain] == [LONG + "retain"]
    assert set(bench.eval_sets) == {"forget_mc"}


def test_the_chosen_retain_file_must_exist(tmp_path):
    with pytest.raises(BenchmarkError, match=r"no WMDP-bio retain corpus file; expected one of: retain"):
        load_benchmark("wmdp-bio", source=wmdp_folder(tmp_path), retain="corpus")
    with pytest.raises(BenchmarkError, match=r"retain='books' is unknown; use one of wikitext, corpus"):
        load_benchmark("wmdp-bio", source=tmp_path, retain="books")


def test_required_utility_without_a_file_is_refused(tmp_path):
    root = wmdp_folder(tmp_path)
    (root / "mmlu.jsonl").unlink()
    with pytest.raises(BenchmarkError, match=r"no MMLU utility questions file"):
        load_benchmark("wmdp-bio", source=root, utility=True)


def test_a_bad_answer_index_is_named(tmp_path):
    root = wmdp_folder(tmp_path, "chem")
    write_jsonl(root / "wmdp-chem.jsonl", [{"question": "Q?", "choices": ["a", "b"], "answer": 5}])
    write_jsonl(root / "forget.jsonl", [{"text": LONG}])
    with pytest.raises(BenchmarkError, match=r"wmdp-chem.jsonl line 1: field 'answer' should be an answer index 0..1"):
        load_benchmark("wmdp-chem", source=root)


def test_only_short_texts_leave_the_forget_set_empty(tmp_path):
    root = wmdp_folder(tmp_path)
    write_jsonl(root / "bio-forget-corpus.jsonl", [{"text": "short"}])
    with pytest.raises(BenchmarkError, match=r"wmdp-bio-forget \(texts over 50 characters\) is empty"):
        load_benchmark("wmdp-bio", source=root)


def test_chemistry_has_no_hub_corpus(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BenchmarkError, match=r"WMDP publishes no chem corpus; give source="):
        load_benchmark("wmdp-chem")
