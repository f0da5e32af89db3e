"""The bundled demo end to end: the demo preset on forget10 makes the full model stop
giving the forget authors' facts while it keeps the retain ones."""
import pytest

from grom import PRESETS, run_edit
from grom.data import load_benchmark
from grom.demo import load_demo_model
from grom.demo.train import recall_scores


@pytest.fixture(scope="module")
def demo():
    model, tok = load_demo_model("full")
    return model, tok, load_benchmark("demo", "forget10")


def test_demo_preset_forgets_forget10_and_keeps_retain(demo):
    model, tok, bench = demo
    forget, retain = bench.eval_sets["forget"][::4], bench.eval_sets["retain"][::4]
    before_f, before_r = recall_scores(model, tok, forget), recall_scores(model, tok, retain)
    config = PRESETS["demo"].replace(prompt_format=bench.prompt_format)
    edit = run_edit(model, tok, bench.forget, bench.retain, config)
    with edit.applied(model):
        after_f, after_r = recall_scores(model, tok, forget), recall_scores(model, tok, retain)
    assert before_f["fact_recall"] > 0.8 and before_r["fact_recall"] > 0.8
    assert after_f["fact_recall"] < before_f["fact_recall"] - 0.3
    assert after_r["fact_recall"] > before_r["fact_recall"] - 0.1
