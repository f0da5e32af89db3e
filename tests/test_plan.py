"""grom.closed_form.memory_plan: the formulas by hand, against a real model's parameter count, against the
peak memory `run_edit` measures on the CPU at three scaled shapes, and the CLI's --plan and
its refusal before the model is loaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from grom import EditConfig
from grom.closed_form.memory_plan import GPU_HEADROOM, GiB, ModelShape, WillNotFit, check_fits, headroom_for, plan
from tests.conftest import FORGET, RETAIN, tiny_llama

ROOT = Path(__file__).resolve().parents[1]


def _cfg(h=64, inter=256, layers=4, vocab=300, tie=False):
    return LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_is_the_models(tie):
    model = tiny_llama(300, tie=tie)
    assert ModelShape.from_config(model.config).n_params == sum(p.numel() for p in model.parameters())


def test_parts_by_hand():
    cfg = _cfg()
    ec = EditConfig(batch_size=4, forget_budget=None, retain_budget=None)
    p = plan(cfg, [1, 2], 1000, 3000, "float32", None, config=ec, seq_len=50)
    n, m, h = 256, 64, 64
    assert p.parts["system"] == 8 * (n * n + m * n)
    assert p.parts["hidden_cache"] == 4000 * (h + 2 * 16 + 50) * 4
    assert p.parts["patches"] == 2 * 2 * m * n * 4 and p.parts["keys_kept"] == 0
    assert p.parts["key_pass"] == 4000 * (n + h) * 4  # two layers: the first advances linearly
    assert p.stages["weights"] == ModelShape.from_config(cfg).n_params * 4
    # 20 batches of 200 tokens, 4000 keys: 200 keys a batch
    assert p.parts["batch_keys"] == 3 * 8 * n * 200 + 12 * m * 200
    # solving the first layer, the stream's pass cache is still held (it advances with P after)
    base = p.stages["weights"] + p.parts["hidden_cache"] + p.parts["patches"]
    assert p.stages["solve"] == base + p.parts["key_pass"] + p.parts["system"] + p.parts["solve_extra"]
    kept = plan(cfg, [1, 2], 1000, 3000, "float32", None, config=ec.replace(keep_keys=True), seq_len=50)
    assert kept.parts["keys_kept"] == 2 * 4 * n * 4000 and kept.peak > p.peak
    half = plan(cfg, [1, 2], 1000, 3000, "bfloat16", None, config=ec, seq_len=50)
    assert half.stages["weights"] * 2 == p.stages["weights"]
    capped = plan(cfg, [1, 2], 1000, 3000, "float32", 1000, config=ec, seq_len=50)
    assert capped.parts["hidden_cache"] == 1000
    budget = plan(cfg, [1], 1000, 3000, "float32", None, config=EditConfig(forget_budget=100, retain_budget=200),
                  seq_len=50)
    assert (budget.settings["forget_keys"], budget.settings["retain_keys"]) == (100, 200)


def test_head_edit_and_o_proj_use_their_shapes():
    cfg = _cfg()
    head = plan(cfg, [], 100, 100, config=EditConfig(matrix="lm_head"), seq_len=10)
    assert (head.settings["m"], head.settings["n"]) == (300, 64) and head.parts["hidden_cache"] == 0
    o = plan(cfg, [0], 100, 100, config=EditConfig(matrix="o_proj"), seq_len=10)
    assert (o.settings["m"], o.settings["n"]) == (64, 64)


def test_check_fits_names_the_stage_and_what_would_fit():
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)  # Llama-3.1-8B
    p = plan(cfg, [28, 29, 30, 31], 1_000_000, 1_000_000, "bfloat16", None,
             config=EditConfig(forget_budget=None, retain_budget=None), seq_len=512)
    assert 14 < p.stages["weights"] / GiB < 16  # 8.0e9 parameters in bf16
    check_fits(p, p.peak)  # exactly enough: fine
    with pytest.raises(WillNotFit) as err:
        check_fits(p, int(30 * GiB), cfg, EditConfig(forget_budget=None, retain_budget=None))
    msg = str(err.value)
    assert "will not fit" in msg and f"stage {p.peak_stage!r}" in msg and "30.00 GiB are free" in msg
    assert "hidden_budget=" in msg  # 2M tokens of states entering the band: the cache is what overflows
    with pytest.raises(WillNotFit, match="use a larger device"):
        check_fits(p, GiB, cfg)
    # on a GPU the peak is taken with a quarter more (an H100 measured up to 1.26x the plan)
    assert headroom_for("cuda:0") == headroom_for("cuda") == GPU_HEADROOM == 1.25
    assert headroom_for("cpu") == headroom_for(None) == 1
    assert headroom_for("auto") == (GPU_HEADROOM if torch.cuda.is_available() else 1)  # a map: its GPUs, if any
    check_fits(p, int(p.peak * 1.2))
    with pytest.raises(WillNotFit, match=r"and 25% for what a GPU measured beyond it\) at stage"):
        check_fits(p, int(p.peak * 1.2), cfg, headroom=GPU_HEADROOM)
    check_fits(p, int(p.peak * 1.25) + 1, headroom=GPU_HEADROOM)


_MEASURE = textwrap.dedent("""
    import ctypes, gc, json, sys, torch
    sys.path.insert(0, {root!r})
    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM
    from grom import EditConfig, run_edit
    from grom.closed_form.memory_plan import plan_edit
    from tests.conftest import make_tokenizer, FORGET, RETAIN

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    h, inter, band, keep, layers = {shape!r}
    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    ec = EditConfig(layers=tuple(band), beta=5.0, w_r=10.0, keep_keys=keep)
    forget, retain = FORGET * 8, RETAIN * 8
    run_edit(model, tok, forget, retain, ec)  # the first run's one-off allocations (BLAS, caches)
    gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    run_edit(model, tok, forget, retain, ec)
    measured = status("VmHWM") - before
    p = plan_edit(cfg, tok, forget, retain, ec)
    print(json.dumps({{"measured": measured, "planned": p.peak - p.parts["weights"], "stage": p.peak_stage}}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's VmHWM reset")
@pytest.mark.parametrize("shape", [(64, 2048, [1], False, 2), (128, 3072, [0, 1], True, 2),
                                   (128, 2048, [1, 2, 3], False, 4)])  # a band of three: two linear advances
def test_plan_within_15_percent_of_the_measured_peak(shape):
    """The peak resident memory `run_edit` adds (the model loaded before) against the plan
    less the weights, in a fresh process. glibc's malloc is told to hand every buffer over
    64 KiB straight back (MALLOC_MMAP_THRESHOLD_): by default it raises that threshold
    after large frees and keeps up to 32 MiB buffers in its heap, and at these tiny shapes
    the retained heap read as up to 40% more than the tensors held (measured here), which
    is the allocator's, not the edit's."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _MEASURE.format(root=str(ROOT), shape=shape)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(got["measured"] - got["planned"]) <= 0.15 * got["measured"], got


def test_cli_plan_prints_and_refuses_before_loading(tmp_path, tokenizer, capsys, monkeypatch):
    from grom import cli
    from grom.model import loading as models
    from tests.test_library import save_tiny

    folder = save_tiny(tmp_path, tokenizer)
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"question": e.question, "answer": e.answer}) for e in rows))
    files = ["--forget", str(tmp_path / "forget.jsonl"), "--retain", str(tmp_path / "retain.jsonl")]
    loads = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(1))
    assert cli.main(["edit", "--model", str(folder), "--device", "cpu", "--layers", "1-2", *files, "--plan"]) == 0
    out = capsys.readouterr().out
    assert "solve" in out and "peak:" in out and loads == []
    monkeypatch.setattr("grom.closed_form.memory_plan.free_bytes", lambda device: 1000)
    with pytest.raises(SystemExit, match="will not fit on this device.*here is what would fit|will not fit"):
        cli.main(["edit", "--model", str(folder), "--device", "cpu", "--layers", "1-2", *files,
                  "--out", str(tmp_path / "e")])
    assert loads == [] and not (tmp_path / "e").exists()
