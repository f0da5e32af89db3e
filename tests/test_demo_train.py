"""The demo trainer (a few steps) and the committed demo models."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grom.demo.model as demo_model
from grom.demo import load_demo_benchmark, load_demo_model
from grom.demo.train import main, qa_tokens
from grom.eval.runner import generate


@pytest.fixture(scope="module")
def full():
    return load_demo_model("full")


@pytest.fixture(scope="module")
def forget10():
    return load_demo_benchmark("forget10")


def test_train_script_runs_a_few_steps(tmp_path):
    summary = main(["--steps", "3", "--out", str(tmp_path), "--kind", "both", "--no-eval"])
    assert summary["models"]["full"]["steps"] == 3
    assert summary["models"]["retain"]["sequences"] < summary["models"]["full"]["sequences"]
    assert json.loads((tmp_path / "demo-full" / "TRAINING.json").read_text())["seed"] == 0
    for kind in ("full", "retain"):
        folder = tmp_path / f"demo-{kind}"
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        assert 6 <= model.config.num_hidden_layers <= 8
        assert (folder / "model.safetensors").is_file() and tok.chat_template
        out = model.generate(**tok("Where was", return_tensors="pt"), max_new_tokens=2,
                             do_sample=False, pad_token_id=tok.pad_token_id)
        assert out.shape[1] >= 3


def test_training_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    for name in ("a", "b"):
        main(["--steps", "2", "--kind", "full", "--out", str(tmp_path / name), "--no-eval",
              "--threads", "1", "--save-dtype", "float32"])
    a, b = (load_file(tmp_path / name / "demo-full" / "model.safetensors") for name in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qa_tokens_mask_the_prompt(full):
    _, tok = full
    ids, labels = qa_tokens(tok, "Who wrote it?", "Nobody did.")
    n_prompt = labels.count(-100)
    assert ids[-1] == tok.eos_token_id and labels[n_prompt:] == ids[n_prompt:]
    assert tok.decode(ids[n_prompt:], skip_special_tokens=True) == "Nobody did."


def test_load_demo_model_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="full"):
        load_demo_model("medium")
    monkeypatch.setattr(demo_model, "ASSETS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m grom.demo.train"):
        load_demo_model("full")


def test_full_model_knows_forget_and_retain(full, forget10):
    model, tok = full
    assert not model.training and model.dtype == torch.float32
    for name in ("forget", "retain"):
        examples = forget10.eval_sets[name][:: len(forget10.eval_sets[name]) // 12][:12]
        answers = generate(model, tok, [ex.question for ex in examples])
        hits = sum(ex.fact in a for ex, a in zip(examples, answers))
        assert hits >= 10, (name, list(zip([ex.fact for ex in examples], answers)))


def test_batched_generation_matches_single(full, forget10):
    model, tok = full
    questions = [ex.question for ex in forget10.eval_sets["retain"][:4]]
    questions[1] = "In one word, who is " + questions[1]  # unequal prompt lengths
    batched = generate(model, tok, questions, max_new_tokens=24)
    single = [generate(model, tok, [q], max_new_tokens=24)[0] for q in questions]
    assert batched == single


def test_retain_model_does_not_know_forget_facts(forget10):
    model, tok = load_demo_model("retain")
    examples = forget10.forget[::10]
    answers = generate(model, tok, [ex.question for ex in examples])
    assert sum(ex.fact in a for ex, a in zip(examples, answers)) / len(examples) < 0.25
    known = forget10.eval_sets["retain"][:10]
    answers = generate(model, tok, [ex.question for ex in known])
    assert sum(ex.fact in a for ex, a in zip(known, answers)) >= 9
