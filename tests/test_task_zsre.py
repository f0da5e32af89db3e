"""zsRE from a zsre_mend_eval.json file in the ROME/MEMIT format, split as the paper does:
50 facts to forget, 1,000 disjoint facts to retain, one seeded draw per split."""
from __future__ import annotations

import logging

import pytest

from grom.data import RAW_TEXT, BenchmarkError, FactRecord, QAExample, load_benchmark
from grom.tasks import zsre
from tests.data_fixtures import write_json, zsre_record

N = zsre.N_FORGET + zsre.N_RETAIN


def record(k: int) -> dict:
    """zsre_record(k) with its own neighbourhood question (the fixture shares one)."""
    return {**zsre_record(k), "loc": f"nq question: who wrote book number {k}", "loc_ans": f"Author {k}"}


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """A file with 1,200 hand-built records (enough for 50 + 1000 with room to choose)."""
    return write_json(tmp_path_factory.mktemp("zsre") / "zsre_mend_eval.json", [record(k) for k in range(1200)])


def fact(k: int, **changes) -> FactRecord:
    base = FactRecord(subject=f"S{k}", prompt=f"Where did S{k} study?", answer=f"U{k}",
                      rephrase=f"Which school did S{k} attend?", neighborhood_prompt=f"nq question: q{k}?",
                      neighborhood_answer=f"A{k}", id=f"f{k}")
    return FactRecord(**{**base.__dict__, **changes})


def test_records_map_to_fact_records(big_file):
    bench = load_benchmark("zsre", "forget50-seed0", source=big_file)
    assert (bench.name, bench.split, bench.task) == ("zsre", "forget50-seed0", "zsre")
    f = bench.forget[0]
    k = int(f.id.split("/")[1])
    assert f == FactRecord(
        subject=f"Watts Humphrey {k}",
        prompt=f"What university did Watts Humphrey {k} attend?",
        answer="Illinois Institute of Technology",
        rephrase=f"What university did Watts Humphrey {k} take part in?",
        neighborhood_prompt=f"nq question: who wrote book number {k}?",
        neighborhood_answer=f"Author {k}",
        id=f"zsre/{k}",
    )
    assert bench.prompt_format is RAW_TEXT
    assert "seed 0" in bench.description and "neighbourhood" in bench.description


def test_sizes_and_sets_follow_the_protocol(big_file):
    bench = load_benchmark("zsre", source=big_file)  # the default split: seed 0
    assert bench.split == "forget50-seed0"
    assert len(bench.forget) == 50 and len(bench.retain) == 1000
    assert all(isinstance(f, FactRecord) for f in bench.forget)
    assert bench.eval_sets["forget"] == bench.forget
    assert [q.question for q in bench.eval_sets["neighborhood"]] == [f.neighborhood_prompt for f in bench.forget]
    r = bench.retain[0]
    k = int(r.id.split("/")[1])
    assert r == QAExample(question=f"What university did Watts Humphrey {k} attend?",
                          answer=" Illinois Institute of Technology", subject=f"Watts Humphrey {k}",
                          id=f"zsre/{k}/retain")


def test_forget_retain_and_evaluation_sets_are_disjoint(big_file):
    for split in ("forget50-seed0", "forget50-seed7"):
        bench = load_benchmark("zsre", split, source=big_file)
        forget_ids = {f.id for f in bench.forget}
        retain_ids = {r.id.removesuffix("/retain") for r in bench.retain}
        assert len(forget_ids) == 50 and len(retain_ids) == 1000 and not forget_ids & retain_ids
        retain_prompts = {r.question for r in bench.retain}
        evaluated = {t for f in bench.eval_sets["forget"] for t in (f.prompt, f.rephrase)}
        evaluated |= {q.question for q in bench.eval_sets["neighborhood"]}
        assert len(evaluated) == 150 and not evaluated & retain_prompts


def test_each_seed_is_one_sample_and_seeds_differ(big_file):
    a = load_benchmark("zsre", "forget50-seed3", source=big_file)
    assert load_benchmark("zsre", "forget50-seed3", source=big_file) == a
    b = load_benchmark("zsre", "forget50-seed4", source=big_file)
    assert {f.id for f in a.forget} != {f.id for f in b.forget}
    assert {r.id for r in a.retain} != {r.id for r in b.retain}
    assert load_benchmark("zsre", "forget50", source=big_file) == load_benchmark("zsre", source=big_file)
    firsts = {load_benchmark("zsre", s, source=big_file).forget[0].id for s in zsre.SPLITS}
    assert len(zsre.SPLITS) == 10 and len(firsts) > 1


def test_sample_facts_skips_retain_candidates_that_repeat_an_evaluation_text():
    base = [fact(k) for k in range(4)]
    pool = base + [fact(10 + k, prompt=f.rephrase) for k, f in enumerate(base)] \
        + [fact(20 + k, prompt=f.neighborhood_prompt) for k, f in enumerate(base)] \
        + [fact(30 + k, prompt=f.prompt, answer=f.answer) for k, f in enumerate(base)]  # the fact again
    forget, _ = zsre.sample_facts(pool, 2, 1, seed=0)
    banned = {t for f in forget for t in (f.prompt, f.rephrase, f.neighborhood_prompt)}
    clean = [f for f in pool if f not in forget and f.prompt not in banned]  # the reference
    assert len(clean) < len(pool) - 2  # the draw did hit clashes
    forget2, retain = zsre.sample_facts(pool, 2, len(clean), seed=0)
    assert forget2 == forget and sorted(r.id for r in retain) == sorted(f.id for f in clean)
    with pytest.raises(BenchmarkError, match=rf"only {len(clean)} of the 14 other facts"):
        zsre.sample_facts(pool, 2, len(clean) + 1, seed=0)


def test_sample_facts_is_deterministic_and_refuses_too_few():
    facts = [fact(k) for k in range(30)]
    assert zsre.sample_facts(facts, 5, 10, seed=1) == zsre.sample_facts(facts, 5, 10, seed=1)
    assert zsre.sample_facts(facts, 5, 10, seed=1) != zsre.sample_facts(facts, 5, 10, seed=2)
    with pytest.raises(BenchmarkError, match=r"30 usable facts; the split needs 31: 5 to forget and 26"):
        zsre.sample_facts(facts, 5, 26, seed=0)
    same = [fact(k, prompt="Where did everyone study?") for k in range(30)]
    with pytest.raises(BenchmarkError, match=r"only 0 of the 25 other facts"):
        zsre.sample_facts(same, 5, 10, seed=0)


def test_a_file_too_small_for_the_protocol_says_how_many_it_has(tmp_path):
    path = write_json(tmp_path / "z.json", [record(k) for k in range(N - 1)])
    with pytest.raises(BenchmarkError, match=r"z.json\), split forget50-seed0: 1049 usable facts; the "
                                             r"split needs 1050: 50 to forget and 1000"):
        load_benchmark("zsre", source=path)


def test_an_unknown_split_lists_the_seed_splits(big_file):
    with pytest.raises(BenchmarkError, match=r"unknown split 'eval'.*forget50-seed0.*forget50-seed9"):
        load_benchmark("zsre", "eval", source=big_file)
    with pytest.raises(BenchmarkError, match=r"unknown split 'forget50-seed10'"):
        zsre.load_zsre("forget50-seed10", big_file)


def test_without_a_source_the_file_to_provide_is_named():
    with pytest.raises(BenchmarkError, match=r"give source= the path of zsre_mend_eval.json"):
        load_benchmark("zsre")


def test_a_folder_holding_the_file_is_read(big_file):
    assert load_benchmark("zsre", source=big_file.parent) == load_benchmark("zsre", source=big_file)


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
    with caplog.at_level(logging.WARNING, logger="grom.tasks.zsre"):
        facts = zsre.read_facts(path)
    assert [f.subject for f in facts] == ["Watts Humphrey 1"]
    assert "does not occur in src" in caplog.text


def test_an_empty_file_is_refused(tmp_path):
    path = write_json(tmp_path / "z.json", [])
    with pytest.raises(BenchmarkError, match=r"zsre .*z.json\) is empty"):
        load_benchmark("zsre", source=path)


def _bench_zsre():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_zsre.py"
    spec = importlib.util.spec_from_file_location("bench_zsre", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_averages_each_metric_over_the_seeds(big_file, plain_tokenizer):
    from tests.conftest import tiny_llama

    bench = _bench_zsre()
    per_seed = bench.zsre_over_seeds(tiny_llama(len(plain_tokenizer), layers=2), plain_tokenizer,
                                     big_file, seeds=(0, 5))
    assert list(per_seed["seed"]) == [0, 0, 5, 5] and list(per_seed["row"]) == ["Base", "Edited"] * 2
    avg = bench.average_over_seeds(per_seed)
    for row in ("Base", "Edited"):
        for metric in bench.METRICS:
            values = per_seed.loc[per_seed["row"] == row, metric]
            assert avg.loc[row, (metric, "mean")] == pytest.approx(values.mean())
            assert avg.loc[row, (metric, "std")] == pytest.approx(values.std())
