"""Every flow of the app on a ZeroGPU Space, driven through its handlers on the demo model,
with the stand-in `spaces` of tests/fake_spaces (each GPU function in a forked process,
CUDA raising in this one). Run by tests/test_zerogpu.py in a fresh interpreter with
SPACES_ZERO_GPU=true and tests/fake_spaces first on the path, so that the app is imported
as a Space would import it; prints one JSON line of what it saw, and fails on the first
broken flow with its traceback.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import gradio as gr
import spaces  # the stand-in: imported first, as on a Space
import torch

assert spaces.__file__.replace("\\", "/").endswith("tests/fake_spaces/spaces/__init__.py"), spaces.__file__

import app  # noqa: E402
from components import (  # noqa: E402
    attack_panel,
    baseline_panel,
    benchmark_panel,
    compare_panel,
    diagnostics_panel,
    edit_panel,
    export_panel,
    landscape_panel,
    page,
    sweep_panel,
)
from components.layers_panel import score_widgets  # noqa: E402
from components.server import device, durations, gpu_time, model_choices  # noqa: E402
from components.server.allowed_sources import DEMO  # noqa: E402
from components.server.session import REGISTRY, Session  # noqa: E402
from components.studio import comparators, comparison, form  # noqa: E402
from tests.conftest import weights_hash  # noqa: E402


def quiet(*_args, **_kwargs) -> None:
    """A progress tracker that shows nothing."""


def loads_only_here() -> None:
    """A model loaded inside a GPU worker would be lost with it: fail if one is."""
    def guard(load):
        def wrapped(*args, **kwargs):
            assert not spaces.in_worker, "a model was loaded inside a GPU worker"
            return load(*args, **kwargs)
        return wrapped

    model_choices._load = guard(model_choices._load)
    comparison._reference_loader = guard(comparison._reference_loader)


def probe_rows() -> str:
    """An upload of the demo's forget01 authors: 8 fitted forget rows, 4 held-out probe rows
    (the same authors' other questions) and 20 retain rows, each with its fact."""
    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    row = lambda ex, split: {"question": ex.question, "answer": ex.answer, "fact": ex.fact,  # noqa: E731
                             "paraphrased_question": ex.paraphrased_question, "split": split}
    rows = [row(ex, "forget") for ex in demo.forget[:8]] + [row(ex, "probe") for ex in demo.forget[16:20]]
    rows += [row(ex, "retain") for ex in demo.retain[:20]]
    return "\n".join(json.dumps(r) for r in rows)


def calls_since(mark: int) -> list[str]:
    return [name for name, _ in spaces.CALLS[mark:]]


def training_in_calls() -> dict:
    """A baseline priced above one call (GROM_GPU_SECONDS lowered to 14 s, the rate slowed
    to 1 s a step: 3 steps a call) runs as 3 GPU calls, each resuming the last one's
    checkpoint, and gives the Edit of the same training run here in one piece; the page's
    progress counts across the calls; the run's folder is gone afterwards."""
    from grom.data import load_benchmark

    key, bench = REGISTRY.current.key, load_benchmark("demo", "forget01")  # 40 forget rows: 2 steps an epoch
    plan = durations.train_plan(key, bench, "npo", 4)
    saved_rate, saved_cap = gpu_time.RATE, os.environ.get("GROM_GPU_SECONDS")
    gpu_time.RATE = dataclasses.replace(saved_rate, flops_per_s=saved_rate.flops_per_s * plan.step_s)
    os.environ["GROM_GPU_SECONDS"] = str(math.ceil(plan.call_s + 3.5))
    spaces.MAX_DURATION_S = int(os.environ["GROM_GPU_SECONDS"])
    shown: list[float] = []
    try:
        slow = durations.train_plan(key, bench, "npo", 4)
        assert (slow.total_steps, slow.steps_per_call, slow.calls) == (8, 3, 3), slow
        comparators.check_gpu_time(key, bench, "npo", 4)  # one step fits: not refused
        before = set(os.listdir(tempfile.gettempdir()))
        mark = len(spaces.CALLS)
        edit = comparators.train_comparator(key, bench, "npo", 4, 1e-3, None, lambda f, m: shown.append(f))
        assert calls_since(mark) == ["train_call"] * 3, calls_since(mark)
        assert all(s <= spaces.MAX_DURATION_S for _, s in spaces.CALLS[mark:])
        assert not {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("grom-train-")} - before
    finally:
        gpu_time.RATE, spaces.MAX_DURATION_S = saved_rate, 300
        if saved_cap is None:
            os.environ.pop("GROM_GPU_SECONDS")
        else:
            os.environ["GROM_GPU_SECONDS"] = saved_cap
    handle = REGISTRY.get(key)
    whole = comparators.run_comparator("npo", handle.model, handle.tokenizer, bench, 4, 1e-3)  # here, in one piece
    assert whole.patches.keys() == edit.patches.keys() and whole.patches
    assert all(torch.equal(whole.patches[n], edit.patches[n]) for n in whole.patches)
    assert whole.info["history"] == edit.info["history"]
    assert shown == sorted(shown) and 0.75 in shown, shown  # after call 2: step 6 of 8
    return {"calls": 3, "progress": len(shown)}


def main() -> dict:
    assert device.ON_ZEROGPU
    loads_only_here()
    seen: dict = {}

    # start: the allow-listed models loaded in this process (GROM_MODELS=demo)
    assert [k.name for k in model_choices.preload_allowed("cpu")] == [DEMO]
    assert app.preload(DEMO, "cpu") == DEMO and not spaces.CALLS
    handle = REGISTRY.current
    start_key = handle.key
    before = weights_hash(handle.model)
    auto = model_choices.model_key(DEMO, "auto", "auto")  # "auto" is the GPU each call gets, asked of nothing
    assert (auto.device, auto.dtype) == ("cuda", "bfloat16"), auto

    # page load: the session, the summary (no CUDA here), the first layer scores; no warm-ups
    app.build_app()
    with gr.Blocks():
        ui = app.build_layout(DEMO, page.start_session(start_key))
    session = Session()
    out = page.on_page_load(session, start_key)
    assert "GPU attached per request (ZeroGPU)" in out[1], out[1]
    score_values = [c.value for c in score_widgets(ui)]
    mark = len(spaces.CALLS)
    page.on_first_scores(*score_values, session, progress=quiet)
    assert calls_since(mark) == ["compute_scores"]
    mark = len(spaces.CALLS)
    page.on_warm_comparison(20, 3, 300, 0, session)
    assert calls_since(mark) == []  # the warm-ups are skipped: their caches would stay in a worker

    # Run edit (a small retain sample, as the API tests use)
    values = dict(zip(form.NAMES, [c.value for c in form.widgets(ui.edit, ui.layers)]))
    values["retain_examples"] = 300
    summary, _, _ = edit_panel.on_run_edit(*[values[n] for n in form.NAMES], session, quiet)
    assert "Edited" in summary and session.edit is not None and not session.edit.is_applied
    assert all(p.device.type == "cpu" for p in session.edit.patches.values())

    # Compare twice: the Base report comes back to this process and is reused
    text, metrics, _, _ = compare_panel.on_compare(8, False, session, progress=quiet)
    assert "Final score" in text and comparison.base_report(start_key, session.benchmark, 8) is not None
    _, again, _, _ = compare_panel.on_compare(8, False, session, progress=quiet)
    assert again.data.equals(metrics.data)  # the same numbers, its Base rows reused
    seen["answer"] = compare_panel.on_generate("Where was Sina Cheithnu born?", session)[:40]

    # Diagnostics: outputs moved, influence, the 4-bit check
    diagnostics_panel.on_pca("", session)
    diagnostics_panel.on_influence("", session)
    quant, verdict = diagnostics_panel.on_quant_check(8, False, session)
    assert len(quant) and verdict

    # a sweep: one GPU call for the unedited model and one per point
    mark = len(spaces.CALLS)
    _, frame, _ = sweep_panel.on_sweep("beta", "20, 65", session, progress=quiet)
    assert calls_since(mark) == ["sweep_point"] * 3 and len(frame) == 3

    # the landscape: a call per cell (two cells here; the session's own edit among them, sent to the call)
    from grom.landscape import Grid

    mark = len(spaces.CALLS)
    landscape_panel.grid_for = lambda base, rho: Grid((base.beta, 2 * base.beta), (base.w_r,), rho)
    views = list(landscape_panel.on_landscape(None, "fitted questions", next(iter(landscape_panel.READINGS)), 8,
                                              False, session, progress=quiet))
    assert calls_since(mark) == ["landscape_cell"] * 2 and len(views[-1][2]) == 2, calls_since(mark)
    seen["landscape"] = views[-1][3][:40]

    # a baseline: training, then its evaluation, each a call of its own
    mark = len(spaces.CALLS)
    head, table = baseline_panel.on_run_baseline("ga", 1, 1e-5, 8, False, session, progress=quiet)
    assert calls_since(mark)[0] == "train_call" and "compute_report" in calls_since(mark), calls_since(mark)
    seen["baseline"] = head[:60]
    seen["parts"] = training_in_calls()

    # an attack per call (the demo split has no held-out probes: that is said, before any call)
    mark = len(spaces.CALLS)
    try:
        attack_panel.on_run_attacks(["paraphrase"], False, "ga", 1, 1e-5, session, progress=quiet)
    except gr.Error as err:
        seen["attacks"] = err.message[:60]
    assert calls_since(mark) == []

    # a GPU function's UserError reaches the page with its message (not "ZeroGPU worker error")
    try:
        diagnostics_panel._outputs(start_key, session.edit, None, "")
    except gr.Error as err:
        assert "press Run edit again" in err.message, err.message
    else:
        raise AssertionError("an edit without its examples was not reported")

    # export, then import: the edit computed again in a worker, bit for bit the same
    files, note, _ = export_panel.on_export(session)
    exported = session.edit
    restored = export_panel.on_import_run([files[1]], session, progress=quiet)
    assert "identical" in restored[-1], restored[-1]
    assert session.edit is not exported and session.edit.settings == exported.settings

    # the attacks on a split with held-out probes: the baseline's training, then a call per attack and edit
    probes = Path(tempfile.mkdtemp()) / "probes.jsonl"
    probes.write_text(probe_rows())
    benchmark_panel.on_load_benchmark("custom", "forget", "", str(probes), None, session)
    values.update(preset=form.CUSTOM, beta=150.0, beta_relative=True)
    edit_panel.on_run_edit(*[values[n] for n in form.NAMES], session, quiet)
    mark = len(spaces.CALLS)
    summary, frame, *_ = attack_panel.on_run_attacks(["heldout", "paraphrase"], True, "ga", 1, 1e-5, session,
                                                     progress=quiet)
    assert calls_since(mark) == ["train_call"] + ["attack_once"] * 4, calls_since(mark)
    assert list(frame.columns[:4]) == ["attack", "Base", "GROM", "GA"] and len(frame) == 2, frame.columns
    seen["attack_rows"] = len(frame)

    assert weights_hash(REGISTRY.get(start_key).model) == before  # the parent's base model, untouched
    assert all(0 < s <= spaces.MAX_DURATION_S for _, s in spaces.CALLS)
    seen["calls"] = spaces.CALLS
    return seen


if __name__ == "__main__":
    result = main()
    sys.stdout.write(json.dumps(result) + "\n")
