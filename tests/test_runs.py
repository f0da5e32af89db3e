"""Run records, the run history and the sweep's values, without a server: a run's settings
restored into the widgets give the same EditConfig back (every preset); an exported edit
loads back bit for bit and names its model, benchmark and retain sample, never a server
path; bad edit.json files are refused with what to do."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("gradio")

from components import history_panel as H  # noqa: E402
from components.edit_panel import on_preset as fill_preset  # noqa: E402
from components.server.errors import UserError  # noqa: E402
from components.server.session import Session  # noqa: E402
from components.studio import history as runs_history  # noqa: E402
from components.studio.form import (
    RESTORED,
    edit_config,  # noqa: E402
    hidden_differences,
    restore_values,
)
from components.studio.runs import band_text, check_run, portable_model_name, run_record
from components.sweep_panel import MAX_POINTS, sweep_values  # noqa: E402
from grom import PRESETS, Edit, EditConfig  # noqa: E402

SCORES = SimpleNamespace(S=[0.1 * ((7 * l) % 11) for l in range(32)])  # some S_l: a suggested band
class FakeEdit(SimpleNamespace):
    """An edit's settings without patches (a subclass: weak-referenceable, as the history needs)."""


EDIT_ARGS = ("preset", "target", "beta", "beta_relative", "w_r", "rho", "c", "matrix", "use_alpha", "key_positions",
             "band_mode", "band_text", "k", "seed", "forget_budget", "retain_budget", "batch_size")


def widgets_of(preset: str) -> dict:
    """The Edit panel after choosing `preset` (as fill_preset sets it) and a few changes."""
    (target, beta, _, rel, w_r, _, rho, _, c, matrix, alpha, where, mode, band, k) = fill_preset(preset)
    return dict(preset=preset, target=target, beta=beta * 1.5, beta_relative=rel, w_r=w_r, rho=rho, c=c,
                matrix=matrix, use_alpha=alpha, key_positions=where, band_mode=mode,
                band_text=band if isinstance(band, str) else "",
                k=k, seed=7, forget_budget=0, retain_budget=1234, batch_size=8)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_restored_run_gives_the_same_config_back(preset):
    w = widgets_of(preset)
    config = edit_config(w, n_layers=32, scores=SCORES)
    band = list(config.layers or [])
    run = run_record("demo", "demo/forget10", "", 300, 7, 300, preset, w["band_mode"], w["k"], band)
    values = dict(zip(RESTORED, restore_values(config.to_dict(), run)))
    assert values["preset"] == "(custom)" and values["retain_examples"] == 300 and values["seed"] == 7
    again = edit_config({k: values[k] for k in EDIT_ARGS}, n_layers=32, scores=SCORES)
    hidden = hidden_differences(config.to_dict())
    assert (preset == "zsre") == bool(hidden)  # zsre's key_mode has no widget: the note names it
    assert again.replace(**{k: getattr(config, k) for k in ("key_mode",)}) == config
    assert values["beta_log"] == pytest.approx(__import__("math").log10(config.beta), abs=1e-3)


def test_model_names_are_portable_and_runs_are_checked(tmp_path, monkeypatch):
    from components.server.errors import REPO_ROOT

    assert portable_model_name("demo") == "demo" and portable_model_name("org/m") == "org/m"
    assert portable_model_name(str((REPO_ROOT / "assets" / "demo-full").resolve())) == "demo"
    assert portable_model_name(str((REPO_ROOT / "assets" / "demo-retain").resolve())) == "assets/demo-retain"
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path))
    assert portable_model_name(str(tmp_path / "my-model")) == "my-model"
    assert portable_model_name("/somewhere/else/x") == "x"  # never the server's path
    assert band_text([3, 4, 5]) == "3-5" and band_text([2, 7]) == "2,7" and band_text([4]) == "4"
    run = run_record("demo", "demo/forget10", " ", 0, 0, 400, "demo", "manual", 3, (3, 4, 5))
    assert check_run(json.loads(json.dumps(run))) == run
    with pytest.raises(UserError, match="no \"run\""):
        check_run({})
    with pytest.raises(UserError, match="lacks split"):
        check_run({k: v for k, v in run.items() if k != "split"})
    with pytest.raises(UserError, match="run.seed"):
        check_run(run | {"seed": -1})
    with pytest.raises(UserError, match="run.band"):
        check_run(run | {"band": ["3"]})


@pytest.mark.parametrize("text,message", [
    ("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ('{"run": {}}', 'no "settings"'),
    ('{"config": {"beta": -1}}', "settings of grom cannot be read"),
    ('{"config": {"colour": 1}}', "unknown EditConfig"),
    ('{"config": {}, "run": [1]}', '"run" must be a JSON object'),
])
def test_bad_edit_json_is_refused_with_what_is_wrong(text, message):
    from grom.edit import read_metadata

    with pytest.raises(ValueError, match=message):
        read_metadata(text)


@pytest.fixture(scope="module")
def demo_edit():
    """A real edit of the bundled demo model (a few examples: quick)."""
    from grom import run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model

    model, tok = load_demo_model("full")
    bench = load_benchmark("demo", "forget10")
    config = PRESETS["demo"].replace(prompt_format=bench.prompt_format)
    edit = run_edit(model, tok, bench.forget[:20], bench.retain[:40], config)
    edit.run = run_record("demo", "demo/forget10", "", 40, 0, 40, "demo", "manual", 3, edit.band)
    return model, edit


def test_an_exported_edit_loads_back_bit_for_bit_with_its_run(demo_edit, tmp_path):
    from grom import Edit

    model, edit = demo_edit
    edit.model_name = portable_model_name(edit.model_name)  # what the studio writes
    edit.save(tmp_path)
    meta = (tmp_path / "edit.json").read_text()
    assert str(tmp_path.anchor) + "work" not in meta and '"model_name": "demo"' in meta
    loaded = Edit.load(tmp_path)
    assert loaded.run == edit.run and loaded.settings == edit.settings and loaded.band == edit.band
    assert set(loaded.patches) == set(edit.patches)
    for name, P in edit.patches.items():  # bit for bit
        assert loaded.patches[name].dtype == P.dtype and torch.equal(loaded.patches[name], P)
    values = dict(zip(RESTORED, restore_values(loaded.settings.to_dict(), loaded.run)))
    assert values["band_text"] == "3-5" and values["beta"] == edit.settings.beta


def shown(session):
    """The history table and scatter as the page gets them (the table as a DataFrame)."""
    import pandas as pd

    update, fig = H.on_show_history(session)
    return pd.DataFrame(update.value["data"], columns=update.value["headers"]), fig, update.label


def test_the_history_keeps_settings_and_metrics_and_restores_a_row(demo_edit):
    from grom.eval.report import BASE, EDITED, Report, Row

    _, edit = demo_edit
    session = Session()
    session.edit, session.bench_label = edit, "demo/forget10"
    table, _, _ = shown(session)
    table, _, _ = shown(session)  # the same edit: still one row
    assert len(table) == 1 and table.iloc[0]["#"] == 1 and table.iloc[0]["band"] == "3-5"
    report = Report("demo-authors", "forget10", "tofu", {
        BASE: Row({"Final score": 0.5, "Forget fact recall": 0.9, "Retain fact recall": 0.95}),
        EDITED: Row({"Final score": 0.6, "Forget fact recall": 0.3, "Retain fact recall": 0.9,
                     "Model utility": 0.5, "Retain cost": 0.05})}, 1.0)
    session.report, session.report_for = report, (None, edit, 8)
    table, fig, _ = shown(session)
    row = table.iloc[0]
    assert (row["Final score"], row["Forget fact recall"], row["Retain fact recall"], row["Retain cost"]) == \
        (0.6, 0.3, 0.9, 0.05)
    assert list(fig.data[0].x) == [0.3] and list(fig.data[0].y) == [0.9]
    assert ("patches" not in str(runs_history.history(session)[0])
            and "Tensor" not in str(runs_history.history(session)[0]))
    second = EditConfig(**(edit.settings.to_dict() | {"beta": 40.0, "layers": (2, 3)}))
    session.edit = FakeEdit(settings=second, run=edit.run | {"band": [2, 3]}, timings={"total": 1.0},
                                   method="grom")
    table, _, _ = shown(session)
    assert list(table["#"]) == [2, 1] and list(table["β"]) == ["40 rel.", "150 rel."]
    evt = SimpleNamespace(index=[1, 3])  # a click on the second row shown: run #1
    values = H.on_history_select.__wrapped__(evt, session)
    restored = dict(zip(RESTORED, values))
    assert restored["beta"] == 150.0 and restored["band_text"] == "3-5" and "run #1" in values[-1]
    assert list(table.columns[:2]) == ["#", "Final score"]  # the metrics before the settings
    session.bench_label = "demo/forget01"  # another benchmark: its runs only, the others counted
    table, fig, label = shown(session)
    assert len(table) == 0 and "2 runs on other benchmarks kept" in label


def test_sweep_points_reach_the_history():
    session = Session()
    session.bench_label = "demo/forget10"
    run = {"benchmark": "demo", "split": "forget10", "band": [3, 4, 5]}
    runs_history.add_row(session, EditConfig(beta=80.0).to_dict(), run, 2.5, source="sweep",
                         metrics={"Sweep p(forget)": 0.2, "Sweep p(retain)": 0.7})
    table, _, _ = shown(session)
    assert table.iloc[0]["from"] == "sweep" and table.iloc[0]["Sweep p(forget)"] == 0.2


def test_the_history_is_capped():
    session = Session()
    edits = [FakeEdit(settings=EditConfig(beta=float(i + 1)), run={}, timings={}, method="grom")
             for i in range(runs_history.MAX_ROWS + 5)]
    for e in edits:
        runs_history.add_run(session, e)
    rows = runs_history.history(session)
    assert len(rows) == runs_history.MAX_ROWS and rows[0]["n"] == 6 and rows[-1]["n"] == runs_history.MAX_ROWS + 5


def test_sweep_values_typed_default_and_bounded():
    cfg = EditConfig(beta=150.0, w_r=100.0, rho=0.03, layers=(3, 4, 5))
    assert sweep_values("beta", "", cfg, [3, 4, 5], 6) == [37.5, 75.0, 150.0, 300.0, 600.0]
    assert sweep_values("w_r", "10, 100 100;1e3", cfg, [3, 4, 5], 6) == [10.0, 100.0, 1000.0]
    assert sweep_values("band", "2-4; 3-5|5", cfg, [3, 4, 5], 6) == [(2, 3, 4), (3, 4, 5), (5,)]
    assert sweep_values("band", "", cfg, [3, 4, 5], 6) == [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5)]
    for param, values, message in [("beta", "abc", "not a number"), ("rho", "0", "out of range"),
                                    ("beta", ", ".join(map(str, range(1, MAX_POINTS + 2))), "at most"),
                                    ("band", "4-9", "outside the model"), ("w_r", "1e12", "out of range")]:
        with pytest.raises(UserError, match=message):
            sweep_values(param, values, cfg, [3, 4, 5], 6)
    with pytest.raises(UserError, match="no band"):
        sweep_values("band", "", cfg.replace(matrix="lm_head", layers=None), [], 6)


def snippet_question(code: str) -> str:
    """The question the snippet asks, read from its code (it must parse as Python)."""
    import ast

    tree = ast.parse(code)
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") == "question")


def test_the_snippet_is_for_the_session_s_model_and_asks_its_question():
    from components.export_panel import PENDING, on_show_snippet, session_snippet
    from components.server.allowed_sources import DEMO, REAL
    from components.server.session import ModelKey
    from grom.data.schema import QAExample, TextExample

    session = Session()
    assert session_snippet(session) == PENDING  # no model yet: nothing model-specific
    session.model_key = ModelKey(REAL, "auto", "auto")
    code = session_snippet(session)
    assert f"load_model({REAL!r})" in code and "load_demo_model" not in code and "edit.applied(model)" in code
    odd = 'Who wrote "{x}"?\n\'\'\' import os'  # quotes, braces, a newline: still one string literal
    session.benchmark = SimpleNamespace(forget=(TextExample("a b c"), QAExample(odd, "Ann.")))
    assert snippet_question(on_show_snippet(session)) == "a b c"  # the first example with a prompt
    session.benchmark = SimpleNamespace(forget=(QAExample(odd, "Ann."),))
    assert snippet_question(session_snippet(session)) == odd
    session.model_key = ModelKey(DEMO, "auto", "auto")
    code = session_snippet(session)
    assert 'load_demo_model("full")' in code and "from grom.model.loading" not in code
    session.edit = object()
    session.extra["export"] = (session.edit, [])
    assert on_show_snippet(session).__class__.__name__ != "str"  # the export's own snippet stays


def test_a_recomputed_edit_is_judged_by_its_hash_then_by_its_patch():
    from components.studio.runs import recompute_verdict

    def edit_of(P):
        return Edit(settings=EditConfig(), patches={"w": P})

    P = torch.linspace(-1, 1, 12).reshape(3, 4)
    exported = edit_of(P)
    same = recompute_verdict(edit_of(P.clone()), exported.sha256(), 1.0, None)
    assert "identical to the exported edit bit for bit" in same
    nudged = edit_of(P * (1 + 2**-19))  # 1.9e-06, exact in float32
    text = recompute_verdict(nudged, exported.sha256(), 2.5, None)
    assert "Recomputed** in 2.5 s" in text and "**not identical**" in text and "upload its patch.safetensors" in text
    text = recompute_verdict(nudged, exported.sha256(), 1.0, exported)
    assert "by at most 1.9e-06 of a matrix's norm (‖ΔP‖/‖P‖), which is rounding: another torch" in text
    text = recompute_verdict(edit_of(1.1 * P), exported.sha256(), 1.0, exported)
    assert "1.0e-01" in text and "more than rounding" in text
    assert "other matrices" in recompute_verdict(Edit(EditConfig(), {"v": P}), exported.sha256(), 1.0, exported)
    assert "records no patch sha256" in recompute_verdict(nudged, None, 1.0, None)
    assert "**not identical**" in recompute_verdict(nudged, None, 1.0, exported)  # the file's own hash
