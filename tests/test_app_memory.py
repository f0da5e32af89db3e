"""The app's side of issue 26's sharding and memory plan: the model panel's device map and
max-memory box (validated; a sharded tiny model loaded, the layers it cannot edit named),
and Run edit's memory plan (shown; "will not fit" refused before any work, against a
monkeypatched free-memory figure)."""
from __future__ import annotations

import pytest

from components import edit_panel, model_panel
from components.server import fit_check
from components.server import session as core_session
from components.server.errors import UserError
from components.server.model_choices import ensure_model, model_key
from components.server.session import ModelKey, Session
from components.server.sharded import offload_note, sharded_key
from components.studio import form
from grom import PRESETS
from grom.data import load_benchmark
from tests.test_library import save_tiny
from tests.test_sharding import SMALL_CPU


def test_sharded_key_validates_the_widgets():
    key = ModelKey("org/model", "cpu", "float32")
    assert sharded_key(key, "none", "") == key
    got = sharded_key(key, "sequential", "cpu=1GiB")
    assert (got.device_map, got.max_memory) == ("sequential", f"cpu={2**30}")
    assert "device map sequential within cpu=" in got.label()
    for dmap, mem, match in (("everywhere", "", "Device map must be"), ("auto", "cpu:1GB", "device=size"),
                             ("none", "cpu=1GiB", "pick a device map"), ("auto", "0=lots", "20GiB")):
        with pytest.raises(UserError, match=match):
            sharded_key(key, dmap, mem)
    with pytest.raises(UserError, match="demo model is tiny"):
        sharded_key(ModelKey("demo", "cpu", "float32"), "auto", "")


def test_load_a_sharded_model_names_the_layers_it_cannot_edit(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path))
    monkeypatch.setattr(core_session.REGISTRY, "_handles", {})
    save_tiny(tmp_path, tokenizer)
    session = Session()
    status, summary, _ = model_panel.on_load_model("tiny", "cpu", "float32", "sequential", f"cpu={SMALL_CPU}B",
                                                   session, progress=lambda *a, **k: None)
    assert session.model_key.device_map == "sequential" and "sharded by device map sequential" in status
    handle = core_session.REGISTRY.get(session.model_key)
    disk = [l for l in range(4) if handle.model.model.layers[l].mlp.down_proj.weight.device.type == "meta"]
    assert disk and "on disk" in status and "cannot be edited" in status
    assert f"model.layers.{disk[0]}.mlp.down_proj is offloaded" in status  # grom.model.editable's message
    assert "| layers | 4 |" in summary
    # the same folder whole on the CPU: no note
    status, _, _ = model_panel.on_load_model("tiny", "cpu", "float32", "none", "", session,
                                             progress=lambda *a, **k: None)
    assert "cannot be edited" not in status and offload_note(core_session.REGISTRY.get(session.model_key)) == ""


def _demo_session(monkeypatch) -> tuple[Session, dict]:
    key = model_key("demo", "cpu", "float32")
    ensure_model(key)
    session = Session()
    session.model_key, session.benchmark, session.bench_label = key, load_benchmark("demo", "forget01"), "demo/forget01"
    c = PRESETS["demo"]
    mode, text, k = form.band_widgets("demo")
    v = dict(preset="demo", target=c.target, beta=c.beta, beta_relative=c.beta_relative, w_r=c.w_r, rho=c.rho,
             c=c.c, matrix=c.matrix, use_alpha=c.use_alpha, key_positions="answer", band_mode=mode, band_text=text,
             k=k, seed=0,
             forget_budget=c.forget_budget, retain_budget=c.retain_budget, batch_size=c.batch_size,
             retain_examples=20)
    return session, v


def _run(v, session):
    """on_run_edit without gradio's wrappers (ui_errors, the form's positional widgets)."""
    return edit_panel.on_run_edit.__wrapped__.__wrapped__(v, session, lambda *a, **k: None)


def test_run_edit_refuses_what_will_not_fit_before_any_work(monkeypatch):
    session, v = _demo_session(monkeypatch)
    calls = []
    monkeypatch.setattr(edit_panel, "compute_edit", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(fit_check, "free_bytes", lambda device: 1 << 20)  # 1 MiB free
    with pytest.raises(UserError) as err:
        _run(v, session)
    msg = str(err.value)
    assert msg.startswith("This edit will not fit on this device") and "1.00 MiB" not in msg
    assert "0.00 GiB are free" in msg and "GiB more at stage" in msg and calls == []
    shown = edit_panel.on_show_plan(session)
    assert "Memory plan" in shown and "| keys" in shown and "0.00 GiB free now" in shown


def test_run_edit_shows_the_plan_and_runs_when_it_fits(monkeypatch):
    session, v = _demo_session(monkeypatch)
    monkeypatch.setattr(fit_check, "free_bytes", lambda device: 64 << 30)
    summary, _, _ = _run(v, session)
    assert session.edit is not None and "edited" in summary.lower()
    shown = edit_panel.on_show_plan(session)
    assert "64.00 GiB free now" in shown and "(peak)" in shown
    # the held weights: the plan less the loaded model's weights is what must be free
    handle = core_session.REGISTRY.get(session.model_key)
    p = fit_check.plan_run(handle, session.benchmark.forget, session.benchmark.retain[:20],
                        form.edit_config(v, n_layers=6))
    fit_check.check_run(handle, p, None, p.peak - p.parts["weights"])  # exactly enough: fine
    with pytest.raises(UserError, match="will not fit"):
        fit_check.check_run(handle, p, None, p.peak - p.parts["weights"] - 1)
