"""The Runs tab and the export/import round trip through the API (gradio_client, the demo
model): an exported edit.json names its model, benchmark, split and retain sample and the
sha256 of its patch; loaded alone into a fresh session it restores every setting and
computes the edit again, identical bit for bit; with patch.safetensors a differing
recomputation says by how much. Bad files answer with what to do and change nothing; a
patch over the upload limit is refused saying that edit.json alone is enough. The export's
code runs. Sweeps over w_r and the band, bounded."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from components.server.session import REGISTRY  # noqa: E402
from components.studio.form import RESTORED  # noqa: E402
from grom import Edit  # noqa: E402
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


RESULT = len(RESTORED) + 6  # the import's outputs: the widgets, the benchmark's six, the edit's summary


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
    assert meta["settings"]["beta"] == 120.0 and meta["settings"]["w_r"] == 150.0 and meta["settings"]["seed"] == 3
    exported = Edit.load(meta_file.parent)
    assert len(meta["patch_sha256"]) == 64 and exported.sha256() == meta["patch_sha256"]

    b = Client(url, verbose=False)  # a fresh session: nothing loaded but the page's defaults
    b.predict("demo", "auto", "auto", api_name="/load_model")
    b.predict("demo", "forget01", "", None, None, api_name="/load_benchmark")  # another split
    out = b.predict([handle_file(str(meta_file))], api_name="/import_run")  # edit.json alone
    widgets = dict(zip(RESTORED, out))
    name, split, note = out[len(RESTORED)], out[len(RESTORED) + 1], out[-1]
    assert split["choices"] and ["forget10", "forget10"] in split["choices"]  # the split box gets its choices
    assert (name, split["value"]) == ("demo", "forget10") and "Restored" in note
    assert "The edit is loaded" in note and "run it again" not in note  # one thing to do, not two
    assert (widgets["beta"], widgets["w_r"], widgets["band_text"], widgets["seed"], widgets["retain_examples"]) \
        == (120.0, 150.0, "3-5", 3, 300)
    assert "Recomputed" in out[RESULT]
    assert f"identical to the exported edit bit for bit (sha256 `{meta['patch_sha256'][:16]}" in note
    again_meta, again = export_to(b, tmp_path / "b")  # the recomputed edit, exported
    P1, P2 = load_file(str(patch_file)), load_file(str(again))
    assert set(P1) == set(P2) and all(torch.equal(P1[k], P2[k]) for k in P1)  # bit for bit
    assert json.loads(again_meta.read_text())["patch_sha256"] == meta["patch_sha256"]
    _, second, _, _ = b.predict(max_examples=6, api_name="/compare")
    assert second["data"] == first["data"]  # the same edit: the same metrics
    b.predict(api_name="/run_edit", **{k: widgets[k] for k in RUN_EDIT})  # the restored settings, run again
    _, third = export_to(b, tmp_path / "c")
    P3 = load_file(str(third))
    assert all(torch.equal(P1[k], P3[k]) for k in P1)

    c = Client(url, verbose=False)  # with its patch: checked against it too
    c.predict("demo", "auto", "auto", api_name="/load_model")
    out = c.predict([handle_file(str(meta_file)), handle_file(str(patch_file))], api_name="/import_run")
    assert "identical to the exported edit bit for bit" in out[RESULT] and "The edit is loaded" in out[-1]


def test_a_recomputation_that_differs_says_so_and_by_how_much(url, tmp_path):
    a = new_client(url)
    a.predict(api_name="/run_edit", **QUICK)
    meta_file, patch_file = export_to(a, tmp_path / "a")
    meta = json.loads(meta_file.read_text())
    changed = tmp_path / "changed" / "edit.json"  # other settings under the same hash: not that edit
    changed.parent.mkdir()
    changed.write_text(json.dumps(meta | {"settings": meta["settings"] | {"beta": meta["settings"]["beta"] * 1.01}}))
    b = new_client(url)
    out = b.predict([handle_file(str(changed))], api_name="/import_run")
    assert "**not identical**" in out[-1] and "upload its patch.safetensors" in out[-1]
    assert "The recomputed edit is loaded" in out[-1] and "Recomputed" in out[RESULT]
    out = b.predict([handle_file(str(changed)), handle_file(str(patch_file))], api_name="/import_run")
    assert re.search(r"differs from the uploaded patch by at most 1\.\de-02 .*more than rounding", out[-1])
    old = tmp_path / "old" / "edit.json"  # written before exports recorded a hash
    old.parent.mkdir()
    old.write_text(json.dumps({k: v for k, v in meta.items() if k != "patch_sha256"}))
    out = b.predict([handle_file(str(old))], api_name="/import_run")
    assert "records no patch sha256" in out[-1]
    out = b.predict([handle_file(str(old)), handle_file(str(patch_file))], api_name="/import_run")
    assert "identical to the exported edit bit for bit" in out[-1]  # compared with the uploaded patch


def test_a_patch_over_the_upload_limit_is_refused_saying_edit_json_is_enough(url, tmp_path, monkeypatch):
    c = new_client(url)
    c.predict(api_name="/run_edit", **QUICK)
    meta_file, patch_file = export_to(c, tmp_path / "a")
    monkeypatch.setenv("GROM_MAX_PATCH_MB", "1")  # the server's check (gradio's stays as launched)
    big = tmp_path / "big" / "patch.safetensors"
    big.parent.mkdir()
    big.write_bytes(patch_file.read_bytes() + b" " * (1 << 20))  # 1.75 MiB
    with pytest.raises(Exception, match=r"more than the 1 MB this server takes \(GROM_MAX_PATCH_MB\). "
                                        "edit.json alone brings back"):
        c.predict([handle_file(str(meta_file)), handle_file(str(big))], api_name="/import_run")
    huge = tmp_path / "huge" / "patch.safetensors"  # over gradio's max_file_size: refused at the upload
    huge.parent.mkdir()
    huge.write_bytes(b"\0" * ((24 << 20) + 1))  # gradio's limit: the larger of the upload and patch limits
    with pytest.raises(Exception, match="exceeds the maximum file size of 25165824 bytes"):  # said by gradio
        c.predict([handle_file(str(meta_file)), handle_file(str(huge))], api_name="/import_run")


def test_the_export_snippet_asks_before_and_after(url, tmp_path):
    c = new_client(url)
    c.predict(api_name="/run_edit", **QUICK)
    files, note, code = c.predict(api_name="/export")
    assert "sha256" in note and "edit.json` alone brings the edit back" in note
    assert "load_demo_model(\"full\")" in code and "edit.applied(model)" in code
    folder = tmp_path / "grom-edit"
    folder.mkdir()
    for f in files:
        shutil.copy(f, folder / Path(f).name)
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1",
                        "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in out.stdout.splitlines() if line.startswith(("before:", "after:")))
    assert lines["before"].strip() and lines["before"] != lines["after"]  # the edit changed the answer


def test_an_edit_of_uploaded_files_comes_back_from_its_factored_patch(url, tmp_path):
    from grom.edit import read_patch_layout
    from tests.test_app import demo_upload

    _, upload = demo_upload(tmp_path / "mine.jsonl", 6, 24)
    a = new_client(url)
    a.predict("custom", "forget", "", handle_file(str(upload)), None, api_name="/load_benchmark")
    a.predict(preset="(custom)", beta=150.0, beta_relative=True, api_name="/run_edit")
    meta_file, patch_file = export_to(a, tmp_path / "a")
    ranks = {p.rank for p in read_patch_layout(patch_file).values()}
    assert None not in ranks and max(ranks) < 100  # 6 questions' answer tokens: factors, not 128 x 512
    b = new_client(url)  # the server does not keep uploaded data: edit.json alone restores the settings
    out = b.predict([handle_file(str(meta_file))], api_name="/import_run")
    assert "uploaded benchmark files (custom): load them" in out[-1] and "edit is loaded" not in out[-1]
    with pytest.raises(Exception, match="load them in the Benchmark panel first"):
        b.predict([handle_file(str(meta_file)), handle_file(str(patch_file))], api_name="/import_run")
    b.predict("custom", "forget", "", handle_file(str(upload)), None, api_name="/load_benchmark")
    out = b.predict([handle_file(str(meta_file)), handle_file(str(patch_file))], api_name="/import_run")
    assert "**Loaded** from patch.safetensors: 3 as rank-" in out[RESULT] and "up to rounding" in out[-1]
    _, metrics, _, _ = b.predict(max_examples=6, api_name="/compare")
    _, mine, _, _ = a.predict(max_examples=6, api_name="/compare")
    assert metrics["data"] == mine["data"]  # the same edit, to float32 rounding: the same metrics


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
    bad_import(c, tmp_path, "edit.json", json.dumps({"settings": meta["settings"]}), 'no "run"')
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
