"""A baseline's training split into parts (grom.methods.trained.checkpoint): each part resumes from
the checkpoint file the previous one wrote, and the parts together give the uninterrupted
run's Edit.

Equality is `torch.equal` (bit for bit), not a tolerance: a resumed part runs the same
floating-point operations in the same order on the same values (weights, AdamW's moments
and step counts, the schedule's position, the RNG states all restored exactly), so any
difference at all means a piece of the trainer's state was not carried.
"""
from __future__ import annotations

import os

import pytest
import torch

from grom.methods import run_baseline
from grom.methods.trained.checkpoint import Part, Paused, load_state, save_state
from tests.conftest import FORGET, RETAIN, tiny_gpt2, weights_hash

# 4 forget sequences, 1 per micro-batch, 2 per step: 2 steps an epoch, 3 epochs = 6 steps, a
# warm-up of one epoch then linear decay; parts end after step 2 (an epoch's end) and after
# step 3 (inside the second epoch), the last part runs to step 6
SPLIT = dict(lr=1e-3, epochs=3, batch_size=1, grad_accum=2, warmup_epochs=1.0)
UNTIL = (2, 3)
RMU = dict(lr=1e-3, max_steps=6, batch_size=1, grad_accum=2, method_args={"layer": 1.0},
           params=[".layers.0.mlp.down_proj", ".layers.1.mlp.down_proj"])  # RMU's own recipe otherwise
RUNS = {"ga": SPLIT, "npo": SPLIT, "rkld": SPLIT, "idknll": SPLIT, "pdu": SPLIT, "rmu": RMU,
        "altpo": dict(SPLIT, method_args={"n_alternates": 2.0, "max_new_tokens": 8.0})}


def in_parts(method, model, tokenizer, path, kw, until=UNTIL):
    """The run as parts ending after each step of `until`, then one to the end: (Paused, the
    alternates its checkpoint carries) of each pause, and the final Edit; the model is
    checked to come back unchanged from every part."""
    before = weights_hash(model)
    paused = []
    for stop in until:
        out = run_baseline(method, model, tokenizer, FORGET, RETAIN, part=Part(str(path), stop), **kw)
        assert isinstance(out, Paused) and out.steps == stop and os.path.exists(path)
        assert weights_hash(model) == before
        paused.append((out, load_state(path)["alternates"]))
    edit = run_baseline(method, model, tokenizer, FORGET, RETAIN, part=Part(str(path), 10 ** 9), **kw)
    assert weights_hash(model) == before and not os.path.exists(path)  # the last part removes the file
    return paused, edit


def assert_same_edit(whole, split):
    assert whole.patches.keys() == split.patches.keys() and whole.patches
    for name, p in whole.patches.items():
        assert torch.equal(p, split.patches[name]), name
    assert split.info["history"] == whole.info["history"]
    assert split.info["steps"] == whole.info["steps"]


@pytest.mark.parametrize("method", list(RUNS))
def test_three_parts_give_the_uninterrupted_edit(trained_llama, tokenizer, tmp_path, method):
    """GA; NPO (reference NLLs computed once, carried); RKLD (the unedited weights as
    teacher); IDK-NLL (its alternates carried); PDU (its dual variable and the epoch count);
    RMU (its control vector drawn from the global RNG, its constant recipe); AltPO (the
    alternates the model wrote in the first part, read back from the checkpoint by the
    later ones: 8 sequences, 12 steps, both pauses in the first epoch)."""
    kw = RUNS[method]
    whole = run_baseline(method, trained_llama, tokenizer, FORGET, RETAIN, **kw)
    parts, split = in_parts(method, trained_llama, tokenizer, tmp_path / "run.pt", kw)
    paused = [p for p, _ in parts]
    if method in ("altpo", "idknll"):  # the answers trained toward, written once and carried
        assert parts[0][1] == parts[1][1] == split.info["alternates"] == whole.info["alternates"]
    total = whole.info["steps"]
    assert [p.total_steps for p in paused] == [total, total] and paused[1].fraction == 3 / total
    assert total == (12 if method == "altpo" else 6)
    assert_same_edit(whole, split)
    assert split.timings["train"] >= paused[-1].seconds


def test_dropout_and_the_rng_are_carried(tokenizer, tmp_path):
    """GPT-2 trains with dropout 0.1 (the global RNG, every forward): the split run matches
    only if that RNG's state is carried; and with the state left out it does not (the test
    can fail)."""
    model = tiny_gpt2(len(tokenizer))
    kw = dict(SPLIT, params=["h.0.", "h.1."])
    whole = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, **kw)
    _, split = in_parts("graddiff", model, tokenizer, tmp_path / "run.pt", kw)
    assert_same_edit(whole, split)
    path = tmp_path / "broken.pt"
    run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, part=Part(str(path), 3), **kw)
    state = load_state(path)
    state["rng"]["global"] = torch.manual_seed(123).get_state()
    save_state(path, state)  # a new file (the old one is still mapped by `state`)
    broken = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, part=Part(str(path), 10 ** 9), **kw)
    assert any(not torch.equal(p, broken.patches[n]) for n, p in whole.patches.items())


def test_a_checkpoint_of_other_settings_is_refused(trained_llama, tokenizer, tmp_path):
    path = tmp_path / "run.pt"
    run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, part=Part(str(path), 1), **SPLIT)
    with pytest.raises(ValueError, match="another run"):
        run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, part=Part(str(path), 3), **dict(SPLIT, lr=2e-3))
    path.unlink()
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, part=Part(str(path), 3), **SPLIT)


def test_a_part_that_reaches_the_end_at_once_is_the_plain_run(trained_llama, tokenizer, tmp_path):
    """No checkpoint is written when the first part already covers the run."""
    path = tmp_path / "run.pt"
    whole = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, **SPLIT)
    once = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, part=Part(str(path), 6), **SPLIT)
    assert_same_edit(whole, once) and not path.exists()
