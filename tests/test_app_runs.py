"""The Runs tab and the export/import round trip through the API (gradio_client, the demo
model): an exported edit.json names its model, benchmark, split and retain sample; loaded
into a fresh session it restores every setting, and running those settings gives the same
patches bit for bit; with patch.safetensors the edit itself comes back. Bad files answer
with what to do and change nothing. Sweeps over w_r and the band, bounded."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from components.core.form import RESTORED  # noqa: E402
from components.core.session import REGISTRY  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import QUICK, new_client, weights_hash  # noqa: E402

RUN_EDIT = ("preset", "target", "beta", "beta_relative", "w_r", "rho", "c", "matrix", "use_alpha",
            "band_mode", "band_text", "k", "seed", "forget_budget", "retain_budget", "batch_size",
            "retain_examples")


def export_to(client: Client, folder: Path) -> tuple[Path, Path]:
    files, _, _ = client.predict(api_name="/export")
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, folder / Path(f).name)
    return folder / "edit.json", folder / "patch.safetensors"


def test_an_exported_run_is_restored_and_reproduced_bit_for_bit(url, tmp_path):
    a = new_client(url)
    a.predict(api_name="/run_edit", **(QUICK | dict(band_mode="manual", band_text="3-5", beta=120.0, w_r=150.0,
                                                    seed=3)))
    _, first, _, _ = a.predict(max_examples=6, api_name="/compare")
    meta_file, patch_file = export_to(a, tmp_path / "a")
    meta = json.loads(meta_file.read_text())
    assert meta["model_name"] == "demo" and "assets" not in meta_file.read_text()  # a name, not a path
    run = meta["run"]
    assert (run["model"], run["benchmark"], run["split"], run["retain_examples"], run["n_retain"], run["seed"],
            run["band"], run["band_mode"]) == ("demo", "demo", "forget10", 300, 300, 3, [3, 4, 5], "manual")
    assert meta["config"]["beta"] == 120.0 and meta["config"]["w_r"] == 150.0 and meta["config"]["seed"] == 3

    b = Client(url, verbose=False)  # a fresh session: nothing loaded but the page's defaults
    b.predict("demo", "auto", "auto", api_name="/load_model")
    b.predict("demo", "forget01", "", None, None, api_name="/load_benchmark")  # another split
    out = b.predict([handle_file(str(meta_file))], api_name="/import_run")
    widgets = dict(zip(RESTORED, out))
    name, split, note = out[len(RESTORED)], out[len(RESTORED) + 1], out[-1]
    assert split["choices"] and ["forget10", "forget10"] in split["choices"]  # the split box gets its choices
    assert (name, split["value"]) == ("demo", "forget10") and "Restored" in note
    assert (widgets["beta"], widgets["w_r"], widgets["band_text"], widgets["seed"], widgets["retain_examples"]) \
        == (120.0, 150.0, "3-5", 3, 300)
    b.predict(api_name="/run_edit", **{k: widgets[k] for k in RUN_EDIT})  # the restored settings, run again
    _, again = export_to(b, tmp_path / "b")
    P1, P2 = load_file(str(patch_file)), load_file(str(again))
    assert set(P1) == set(P2) and all(torch.equal(P1[k], P2[k]) for k in P1)  # bit for bit

    c = Client(url, verbose=False)  # the edit itself, from its files
    c.predict("demo", "auto", "auto", api_name="/load_model")
    out = c.predict([handle_file(str(meta_file)), handle_file(str(patch_file))], api_name="/import_run")
    assert "Loaded" in out[len(RESTORED) + 6] and "edit itself is loaded" in out[-1]
    _, third, _, _ = c.predict(max_examples=6, api_name="/compare")
    assert third["data"] == first["data"]  # the same edit: the same metrics


def bad_import(client, tmp_path, name: str, content, message: str):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    files = [handle_file(str(path))]
    with pytest.raises(Exception, match=message):
        client.predict(files, api_name="/import_run")


def test_bad_files_are_refused_and_nothing_is_lost(url, tmp_path):
    c = new_client(url)
    c.predict(api_name="/run_edit", **QUICK)
    meta_file, patch_file = export_to(c, tmp_path / "ok")
    meta = json.loads(meta_file.read_text())
    before = weights_hash(REGISTRY.current.model)
    bad_import(c, tmp_path, "edit.json", "{oops", "not valid JSON")
    bad_import(c, tmp_path, "edit.json", json.dumps({"config": meta["config"]}), 'no "run"')
    run = {k: v for k, v in meta["run"].items() if k != "split"}
    bad_import(c, tmp_path, "edit.json", json.dumps(meta | {"run": run}), "lacks split")
    other = meta | {"run": meta["run"] | {"model": "smollm2-135m-instruct"}}
    bad_import(c, tmp_path, "edit.json", json.dumps(other), "made with the model smollm2-135m-instruct")
    bad_import(c, tmp_path, "notes.txt", "hello", "Invalid file type")  # gradio checks the kind
    with pytest.raises(Exception, match="Upload one edit.json"):
        c.predict([handle_file(str(meta_file)), handle_file(str(meta_file))], api_name="/import_run")
    wrong = tmp_path / "wrong" / "patch.safetensors"
    wrong.parent.mkdir()
    from safetensors.torch import save_file

    save_file({"model.layers.3.mlp.down_proj.weight": torch.zeros(3, 3)}, str(wrong))
    with pytest.raises(Exception, match="does not fit the loaded model"):
        c.predict([handle_file(str(meta_file)), handle_file(str(wrong))], api_name="/import_run")
    assert weights_hash(REGISTRY.current.model) == before
    text, _, _, _ = c.predict(max_examples=5, api_name="/compare")  # the session's edit is still there
    assert "Compared" in text


def test_sweeps_over_w_r_and_the_band(url):
    c = new_client(url)
    c.predict(api_name="/run_edit", **(QUICK | dict(band_mode="manual", band_text="3-5")))
    plot, points, note = c.predict("w_r", "10, 1000", api_name="/sweep")
    rows = points["data"]
    assert [r[0] for r in rows] == ["base (no edit)", "w_r 10", "w_r 1000"] and "gold answer" in note
    assert points["headers"][1:3] == ["p(answer), forget", "p(answer), retain"]
    assert rows[1][2] < rows[2][2]  # protecting the retain set more keeps more of it
    axes = json.loads(plot["plot"])["layout"]
    assert "mean p(gold answer)" in axes["xaxis"]["title"]["text"]
    _, points, _ = c.predict("band", "2-4; 3-5", api_name="/sweep")
    assert [r[0] for r in points["data"]] == ["base (no edit)", "band 2-4", "band 3-5"]
    with pytest.raises(Exception, match="at most 8"):
        c.predict("beta", "1 2 3 4 5 6 7 8 9", api_name="/sweep")
