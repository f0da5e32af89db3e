"""The bundled demo end to end: on each QA split, the split's preset makes the full model
stop giving the forget authors' facts while it keeps the retain ones."""
import pytest

from grom import PRESETS, demo_preset, run_edit
from grom.data import load_benchmark
from grom.demo import load_demo_model
from grom.demo.train import recall_scores


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_demo_model("full")


@pytest.mark.parametrize("split", ["forget01", "forget05", "forget10"])
def test_demo_preset_forgets_its_split_and_keeps_retain(model_and_tokenizer, split):
    model, tok = model_and_tokenizer
    bench = load_benchmark("demo", split)
    step = max(1, len(bench.eval_sets["forget"]) // 25)  # about 25 questions per set
    forget, retain = bench.eval_sets["forget"][::step], bench.eval_sets["retain"][::step]
    before_f, before_r = recall_scores(model, tok, forget), recall_scores(model, tok, retain)
    config = PRESETS[demo_preset(split)].replace(prompt_format=bench.prompt_format)
    edit = run_edit(model, tok, bench.forget, bench.retain, config)
    with edit.applied(model):
        after_f, after_r = recall_scores(model, tok, forget), recall_scores(model, tok, retain)
    assert before_f["fact_recall"] > 0.8 and before_r["fact_recall"] > 0.8
    assert after_f["fact_recall"] < before_f["fact_recall"] - 0.3
    assert after_r["fact_recall"] > before_r["fact_recall"] - 0.1


def test_each_demo_split_has_a_preset():
    from grom.demo import SPLITS

    assert demo_preset("forget10") == "demo" and demo_preset("forget01") == "demo-forget01"
    assert all(demo_preset(s) in PRESETS for s in SPLITS)
