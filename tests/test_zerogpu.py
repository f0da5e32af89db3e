"""The app on a ZeroGPU Space, with a stand-in `spaces` (tests/fake_spaces): each GPU
function runs in a forked process, its arguments and result pickled, CUDA raising in the
parent. Every flow of the app passes under it (tests/zerogpu_flows.py, in a fresh
interpreter: the app decides at import whether it runs on ZeroGPU); the stand-in itself
and the pricing of GPU time are checked here against hand-computed values.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
import pytest
import torch

from components.server import device
from components.server.errors import JobCancelled, UserError
from components.server.gpu_time import (
    Rate,
    Shape,
    edit_flops,
    eval_work,
    example_tokens,
    gpu_seconds,
    plan_training,
    refuse_over,
    train_flops,
)
from grom.data.schema import QAExample, TextExample

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_spaces"


def test_every_flow_of_the_app_runs_under_zerogpu(tmp_path):
    """Page load, Run edit, Compare (twice: the Base report kept in the parent), a typed
    question, the three diagnostics, a sweep (a call per point), the landscape (a call per
    cell), a baseline (training and
    evaluation apart; one priced above a call trained in 3 calls, equal to the plain run),
    export then import (bit for bit), the attacks (refused without
    probes; on an upload with probes, a call per attack and edit): in the
    parent no CUDA call, no model loaded in a worker, the base weights unchanged, every
    call asking for 1..300 s."""
    env = dict(os.environ, SPACES_ZERO_GPU="true", GROM_MODELS="demo", OMP_NUM_THREADS="1",
               GROM_CARD_DIR=str(tmp_path / "cards"),  # none kept by this worker's earlier tests
               PYTHONPATH=os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tests.zerogpu_flows"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    names = [name for name, _ in seen["calls"]]
    assert names[:2] == ["compute_scores", "compute_edit"] and names.count("sweep_point") == 3
    assert {"_outputs", "_influence", "_quant", "train_call", "_generate"} <= set(names)
    assert names[-5:] == ["train_call"] + ["attack_once"] * 4 and seen["attack_rows"] == 2
    assert seen["parts"]["calls"] == 3  # a training priced above one call: 3 calls, the same Edit
    assert all(1 <= s <= 300 for _, s in seen["calls"])
    assert "held-out probe" in seen["attacks"] and seen["baseline"].startswith("**GA**")


@pytest.fixture
def fake_spaces():
    """The stand-in module, loaded under another name (the suite's own `spaces` import, if
    any, is not touched); torch.cuda given back afterwards."""
    spec = importlib.util.spec_from_file_location("fake_spaces_for_test", FAKE / "spaces" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        module._allow_cuda()


STATE = {"n": 0}


def bump(by: int) -> int:
    STATE["n"] += by
    return STATE["n"]


def fail(message: str) -> None:
    raise UserError(message)


def test_the_stand_in_forks_pickles_and_forbids_cuda(fake_spaces):
    gpu = fake_spaces.GPU(duration=lambda by: 5 * by)(bump)
    assert gpu(3) == 3 and STATE["n"] == 0  # changed in the worker only
    assert fake_spaces.CALLS == [("bump", 15)]
    assert fake_spaces.GPU(bump)(1) == 1 and fake_spaces.CALLS[-1] == ("bump", 60)  # the default
    with pytest.raises(UserError, match="what to do"):
        fake_spaces.GPU(fail)("what to do")
    with pytest.raises(RuntimeError, match="illegal duration"):
        fake_spaces.GPU(duration=301)(bump)(1)
    with pytest.raises(RuntimeError, match="main process of a ZeroGPU Space"):
        torch.cuda.is_available()
    with pytest.raises(RuntimeError, match="main process"):
        torch.cuda.mem_get_info()


def test_off_zerogpu_the_compute_functions_are_the_plain_functions():
    """A plain machine or a plain GPU Space: nothing wrapped, every cache kept."""
    assert not device.ON_ZEROGPU
    assert device.on_device(bump) is bump and device.on_device(duration=lambda *a: 1)(bump) is bump
    cache = {}
    assert device.kept_cache(cache) is cache


def test_a_worker_error_reaches_the_page_with_its_message():
    """spaces passes only a gr.Error on with its text: the wrapper makes one of any error."""
    with pytest.raises(gr.Error, match="press Load"):
        device._worker_errors(fail)("the model was unloaded: press Load model")


def test_the_lock_is_new_in_a_forked_child():
    """A ZeroGPU worker forked while another request holds the lock can still take it."""
    lock = device.DeviceLock()
    holder = threading.Thread(target=lock.acquire)  # another request's thread, not in the child
    holder.start()
    holder.join()
    assert not lock.acquire(timeout=0.1)
    lock.renew()  # what os.register_at_fork runs in the child
    assert lock.acquire(timeout=1) and lock.holder is not None and not lock.line
    lock.release()


def test_gpu_seconds_by_hand():
    rate = Rate(flops_per_s=1e12, step_s=0.01, margin=2.0, overhead_s=10.0)
    assert gpu_seconds(5e12, rate=rate, cap=300) == 20  # 10 + 2 x 5 s
    assert gpu_seconds(5e12, steps=100, rate=rate, cap=300) == 22  # + 2 x 100 x 0.01 s
    assert gpu_seconds(1.0, rate=rate, cap=300) == 11  # a part of a second rounds up
    assert gpu_seconds(1e15, rate=rate, cap=300) == 300  # never above ZeroGPU's limit


def test_the_work_measures_by_hand():
    ex = QAExample(question="abcdef", answer="xyz", perturbed_answers=("abc",))
    assert example_tokens([ex, TextExample(text="123456789")]) == (6 + 3 + 3 + 9) / 3
    shape = Shape(layers=2, layer_params=10, key_dim=3)
    assert edit_flops(shape, tokens=4, band_layers=1, with_scores=False) == 2 * 4 * 2 * 10 + (2 * 4 * 9 + 27)
    assert edit_flops(shape, 4, 1, True) == 2 * 2 * 4 * 2 * 10 + (2 * 4 * 9 + 27)
    assert eval_work(shape, tokens=5, answers=33, new_tokens=4, rows=3, batch=32) == (
        3 * 2 * (5 + 33 * 4) * 2 * 10, 3 * 2 * 4 * 2)
    assert train_flops(shape, tokens=4, epochs=0.5) == 12 * 0.5 * 4 * 2 * 10


def test_the_paper_shapes_are_priced_and_capped():
    """Llama-3.2-1B (16 layers of ~61 M parameters, MLP 8192) on TOFU-10%-sized data
    (~260k tokens, band of 5): about two minutes asked; an 8B (32 x ~218 M, MLP 14336) on
    a MUSE-sized million tokens: more than one call may take, so the cap."""
    small = gpu_seconds(edit_flops(Shape(16, 61_000_000, 8192), 2.6e5, 5, True), cap=300)
    assert 60 < small < 300
    assert gpu_seconds(edit_flops(Shape(32, 218_000_000, 14336), 1e6, 4, True), cap=300) == 300


def test_an_over_long_training_is_refused_naming_the_limits():
    with pytest.raises(UserError, match="GROM_GPU_SECONDS") as err:
        refuse_over(1234.2, "Training GA for 10 epochs on 4,000 examples", "fewer epochs, GROM_MAX_EPOCHS")
    assert "1,235 s" in str(err.value) and "GROM_MAX_EPOCHS" in str(err.value)
    refuse_over(299, "Training", "")  # within the limit: nothing


def test_a_worker_forked_before_a_load_loads_the_model_itself(monkeypatch):
    """spaces reuses an idle worker: one forked before the main process loaded a model
    loads it itself; the main process never loads in `resident`."""
    from components.server import model_choices
    from components.server import session as core_session

    key = model_choices.model_key("demo", "cpu", "float32")
    monkeypatch.setattr(core_session.REGISTRY, "_handles", {})
    with pytest.raises(UserError, match="was unloaded"):
        core_session.resident(key)
    monkeypatch.setattr(core_session, "in_gpu_worker", lambda: True)
    handle = core_session.resident(key)
    assert handle.key == key and core_session.REGISTRY.get(key) is handle


def test_a_training_plan_by_hand():
    """Per call: 10 s overhead + 2 x (2 x 1 GB) / 0.5 GB/s = 18 s for the checkpoint written
    and read, then 2 x 3e13 / 2e13 = 3 s a step: (300 - 18) / 3 = 94 steps a call."""
    plan = plan_training(3e13, 200, 1e9, cap=300)
    assert (plan.call_s, plan.step_s, plan.steps_per_call, plan.calls) == (18.0, 3.0, 94, 3)
    assert plan.seconds(94) == 300 and plan.seconds(12) == 54 and plan.seconds(10 ** 6) == 300
    assert plan_training(3e15, 10, 1e9, cap=300).calls == 0  # one step (2 x 150 s) + 18 s cannot fit


SPLIT = dict(lr=1e-3, epochs=3, batch_size=1, grad_accum=2, warmup_epochs=1.0)  # 6 steps, 2 an epoch


def _held(watch, hold: bool):
    """`watch` (the worker's FileProgress), which once half the run is done waits (at most
    10 s) for the main process to ask it to stop: a Stop that lands within the call, not
    after it, whatever the machine's load."""
    def report(fraction, message):
        watch(fraction, message)
        deadline = time.monotonic() + 10
        while hold and fraction >= 0.5 and time.monotonic() < deadline:
            if os.path.exists(os.path.join(watch.folder, "stop")):
                return
            time.sleep(0.05)
    return report


@pytest.mark.parametrize("stop_at", ["within", "between"])
def test_stop_within_or_between_calls_removes_the_checkpoint(fake_spaces, trained_llama, tokenizer, tmp_path,
                                                             monkeypatch, stop_at):
    """A training of 6 steps as 3 forked calls of 2 (the real trainer, the stand-in's fork):
    the calls' Edit equals the one-piece run's; Stop asked during the second call stops its
    worker at the next micro-batch, Stop asked after the first call starts no other; either
    way JobCancelled reaches the page and the run's folder (its checkpoint) is gone."""
    from components.server.gpu_time import TrainPlan
    from components.server.train_parts import train_in_calls
    from grom.methods import run_baseline
    from tests.conftest import FORGET, RETAIN, weights_hash

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = weights_hash(trained_llama)
    plan = TrainPlan(total_steps=6, step_s=1.0, call_s=0.0, cap=2)

    hold = {"on": False}  # read in each forked worker as it was at the fork

    def train(part, watch):
        return run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, part=part,
                            progress=_held(watch, hold["on"]), **SPLIT)

    gpu = fake_spaces.GPU(duration=5)(train)
    if stop_at == "within":
        whole = run_baseline("ga", trained_llama, tokenizer, FORGET, RETAIN, **SPLIT)
        edit = train_in_calls(gpu, dataclasses.replace(plan, cap=6), "GA", cancelled=lambda: False)
        assert len(fake_spaces.CALLS) == 1 and all(torch.equal(p, edit.patches[n]) for n, p in whole.patches.items())
        fake_spaces.CALLS.clear()
        split = train_in_calls(gpu, plan, "GA", cancelled=lambda: False)
        assert len(fake_spaces.CALLS) == 3 and all(torch.equal(p, split.patches[n]) for n, p in whole.patches.items())
        fake_spaces.CALLS.clear()
    stop, seen = {"now": False}, []
    hold["on"] = stop_at == "within"

    def shown(fraction, message):
        seen.append(fraction)
        if (stop_at == "within" and fraction >= 0.5) or (stop_at == "between" and "after GPU call 1" in message):
            stop["now"] = True

    with pytest.raises(JobCancelled):
        train_in_calls(gpu, plan, "GA", progress=shown, cancelled=lambda: stop["now"])
    assert len(fake_spaces.CALLS) == (2 if stop_at == "within" else 1)
    assert max(seen) < (4 / 6 if stop_at == "within" else 0.5), seen  # the second call stopped before its end
    assert not list(tmp_path.iterdir()) and weights_hash(trained_llama) == before


def test_off_zerogpu_a_training_is_one_call_in_this_process(monkeypatch):
    """A plain machine or GPU Space: the training is `train_call` itself, no part, no folder."""
    from components.studio import comparators

    seen = []
    monkeypatch.setattr(comparators, "train_call", lambda *args: seen.append(args) or "edit")
    monkeypatch.setattr(comparators, "train_in_calls", lambda *a, **k: pytest.fail("split off ZeroGPU"))
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("a folder off ZeroGPU"))
    assert comparators.train_comparator("key", "bench", "ga", 1, 1e-5, None, None) == "edit"
    assert seen[0][:7] == ("key", "bench", "ga", 1, 1e-5, None, None)


def test_on_zerogpu_only_a_step_that_cannot_fit_a_call_is_refused(monkeypatch):
    """A training of 1,000 calls' worth is split, not refused (its total is bounded by
    GROM_MAX_EPOCHS x GROM_MAX_EXAMPLES before this check); one whose single step with its
    checkpoint needs more than GROM_GPU_SECONDS is refused, saying how long it needs."""
    from types import SimpleNamespace

    from components.server.gpu_time import TrainPlan
    from components.studio import comparators

    bench = SimpleNamespace(forget=[1] * 30, retain=[1] * 70)
    monkeypatch.setattr(comparators, "ON_ZEROGPU", True)
    monkeypatch.setattr(comparators, "train_plan", lambda *a: TrainPlan(10 ** 5, 2.8, 18.0, 300))
    comparators.check_gpu_time("key", bench, "ga", 10)
    monkeypatch.setattr(comparators, "train_plan", lambda *a: TrainPlan(10, 290.0, 18.0, 300))
    with pytest.raises(UserError, match="One optimizer step of GA on 100 examples") as err:
        comparators.check_gpu_time("key", bench, "ga", 10)
    assert "308 s" in str(err.value) and "GROM_GPU_SECONDS" in str(err.value)
    comparators.check_gpu_time("key", bench, "rome", 10)  # an editor: one short call, never priced here
