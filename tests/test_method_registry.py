"""The one method registry (grom.registry): GROM, every trained method and every
editor in it, each row saying what it can run on, and its defaults fitted to the model:
each trained method takes one optimizer step on the bundled demo model (6 layers) at its
defaults, each editor's and GROM's capability check says why it cannot run where it cannot."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from grom.data import load_benchmark
from grom.data.schema import QAExample, TextExample
from grom.demo import load_demo_model
from grom.methods import (
    ALL,
    EDITORS,
    FAMILIES,
    METHODS,
    Reason,
    can_run,
    family_of,
    get,
    names,
    resolve_settings,
    run_baseline,
)


@pytest.fixture(scope="module")
def demo():
    model, tokenizer = load_demo_model("full")
    bench = load_benchmark("demo", "forget01")
    return model, tokenizer, bench


def test_every_method_is_one_row_of_one_registry():
    assert names("closed-form") == ("grom",)
    assert names("trained") == tuple(METHODS) and len(METHODS) == 15
    assert names("editor") == tuple(EDITORS) == ("rome", "memit", "alphaedit", "zerounlearn")
    assert names("redirection") == ("lunar",)
    assert set(ALL) == set(METHODS) | set(EDITORS) | {"grom", "lunar"}
    for name, entry in ALL.items():
        assert (entry.family in FAMILIES and entry.label and entry.description
                and family_of(name.upper()) == entry.family)
    assert get("ROME").detail is EDITORS["rome"] and get("npo").detail is METHODS["npo"]
    with pytest.raises(ValueError, match="unknown method 'sgd'"):
        get("sgd")


def test_rmu_defaults_fit_the_model(demo, llama):
    model = demo[0]
    assert resolve_settings("rmu").method_args["layer"] == 7.0  # no model: upstream's (Zephyr-7B, SmolLM2)
    fitted = get("rmu").defaults(model)
    assert fitted["method_args"]["layer"] == 4.0
    assert fitted["params"] == tuple(f".layers.{i}.mlp.down_proj" for i in (2, 3, 4))
    assert resolve_settings("rmu", model=llama).params == tuple(f".layers.{i}.mlp.down_proj" for i in (0, 1, 2))


@pytest.mark.parametrize("name", list(METHODS))
def test_every_trained_method_runs_a_step_on_the_demo_at_its_defaults(demo, name):
    model, tokenizer, bench = demo
    assert can_run(name, model, bench) is None
    edit = run_baseline(name, model, tokenizer, bench.forget[:4], bench.retain[:8], max_steps=1, batch_size=2,
                        grad_accum=1, prompt_format=bench.prompt_format)
    assert edit.method == name and edit.info["steps"] == 1


def test_what_each_method_cannot_run_on(demo):
    model = demo[0]
    texts = SimpleNamespace(name="mine", split="forget", forget=(TextExample("a text to forget"),), retain=())
    qa_alone = SimpleNamespace(forget=(QAExample("Who?", "Nobody."),), retain=())
    for editor in EDITORS:
        why = can_run(editor, model, texts)
        assert isinstance(why, Reason) and why.words == "no facts with a subject" and "mine/forget" in str(why)
    assert can_run("npo", model, texts).words == "no retain set"
    assert can_run("idknll", None, SimpleNamespace(forget=texts.forget, retain=qa_alone.forget)).words == \
        "needs questions"
    assert can_run("ga", None, qa_alone) is None
    assert can_run("grom", model, qa_alone) is None
    assert can_run("grom", None, SimpleNamespace(forget=(), retain=())).words == "no forget set"
