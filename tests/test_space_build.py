"""The Space builds on ZeroGPU (issue 36): README.md's front matter and requirements.txt
against the versions Hugging Face documents, and the import order ZeroGPU needs.

ZeroGPU runs one Python and a list of PyTorch releases (hub-docs, docs/hub/spaces-zerogpu.md,
"Supported Versions", read at commit 00b2cbfeede7): a requirements.txt whose torch admits
none of them fails the build with "No candidate PyTorch version found for ZeroGPU". The
lists below are that page's; when Hugging Face adds a release, add it here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gradio
import torch
import yaml

try:
    import tomllib
except ImportError:  # Python 3.10, the Space's
    import tomli as tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from components.server.allowed_sources import REAL
from grom.model.fetch import registry_model

ROOT = Path(__file__).resolve().parents[1]
ZEROGPU_PYTHON = "3.10.13"
ZEROGPU_TORCH = ("2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.2", "2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0")


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md must start with the Space's YAML front matter between --- lines"
    return yaml.safe_load(match.group(1))


def requirements(name: str = "requirements.txt") -> dict[str, Requirement]:
    reqs = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            reqs[req.name.lower()] = req
    return reqs


def test_the_front_matter_names_zerogpus_python_and_the_gradio_the_tests_run_on():
    meta = front_matter()
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    assert str(meta["python_version"]) == ZEROGPU_PYTHON
    assert str(meta["sdk_version"]) == gradio.__version__, (
        "sdk_version must be the gradio these tests run on: the Space installs exactly it")
    assert requirements()["gradio"].specifier == SpecifierSet(f"=={meta['sdk_version']}")


def test_requirements_admit_a_zerogpu_torch_and_this_machines():
    spec = requirements()["torch"].specifier
    admitted = [v for v in ZEROGPU_TORCH if spec.contains(v)]
    assert admitted, f"torch{spec} admits none of ZeroGPU's releases {ZEROGPU_TORCH}"
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = Requirement(next(d for d in dependencies if d.startswith("torch"))).specifier
    assert all(floor.contains(v) for v in admitted), "the library's own torch floor refuses ZeroGPU's"
    assert spec.contains(Version(torch.__version__).base_version), (
        f"torch{spec} refuses the torch these tests run on ({torch.__version__})")


def test_the_python_the_space_runs_is_one_the_package_supports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert SpecifierSet(project["requires-python"]).contains(ZEROGPU_PYTHON)


def test_preload_from_hub_fetches_the_start_model_at_build_time():
    entries = front_matter()["preload_from_hub"]
    repo_files = dict((entry.split() + [""])[:2] for entry in entries)
    hub_id = registry_model(REAL).hub_id
    assert hub_id in repo_files, f"{hub_id}, the model the studio opens on, is not preloaded"
    files = set(filter(None, repo_files[hub_id].split(",")))
    assert not files or {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files


def test_on_a_space_app_imports_spaces_before_torch():
    """ZeroGPU refuses to start once CUDA was initialised before `spaces` was imported; the
    stand-in (tests/fake_spaces) raises the same and records whether torch came first."""
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACE_ID="someone/grom-studio",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "fake_spaces"), str(ROOT)]))
    code = "import app, spaces; print('torch first:', spaces.TORCH_BEFORE, spaces.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch first: False" in out.stdout and "fake_spaces" in out.stdout, out.stdout


def test_the_app_started_as_a_zerogpu_space_serves_an_edit_a_comparison_and_a_baseline(tmp_path):
    """`python app.py` with a Space's environment (SPACE_ID, SPACES_ZERO_GPU, the stand-in
    `spaces` that forks a worker per GPU call), driven by bench/space_smoke.py through the
    public API, as README's deployment section shows on Python 3.10.13 and torch 2.8.0.
    (The first such run hung: the cancel check of a forward pass asked the parent's event
    loop from the forked worker, which has none.)"""
    from tests.app_fixtures import free_port

    port = free_port()
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACE_ID="someone/grom-studio", GRADIO_SERVER_NAME="127.0.0.1",
               GRADIO_SERVER_PORT=str(port), GRADIO_TEMP_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "fake_spaces"), str(ROOT)]))
    log = (tmp_path / "server.log").open("w+")
    server = subprocess.Popen([sys.executable, "app.py", "--model", "demo", "--device", "cpu"], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(240):
            if server.poll() is not None or "Running on" in (tmp_path / "server.log").read_text():
                break
            time.sleep(0.5)
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        smoke = subprocess.run([sys.executable, "bench/space_smoke.py", "--url", f"http://127.0.0.1:{port}/",
                                "--lr", "1e-3"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert smoke.returncode == 0, (smoke.stdout[-2000:] + smoke.stderr[-3000:]
                                       + (tmp_path / "server.log").read_text()[-3000:])
        figures = json.loads(smoke.stdout.strip().splitlines()[-1])
        assert {"edit_s", "compare_s", "baseline_s", "second_visitor_generate_s"} <= figures.keys()
        assert "Edited" in smoke.stdout and "Forgot" in smoke.stdout and "GA" in smoke.stdout, smoke.stdout
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def test_readme_lists_every_host_limit_with_its_default():
    """The hosting table of README.md says every variable components/server/limits.py reads,
    with the default it has."""
    from components.server import limits

    text = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(GROM_[A-Z_]+)` \| ([^|]+) \|", text, re.M))
    for name, default in limits.DEFAULTS.items():
        assert name in rows, f"README.md's limits table lacks {name}"
        assert rows[name].strip() == str(default), (name, rows[name], default)
    assert "GROM_PROXY_HOPS" in rows and "GROM_MODELS" in rows


def test_the_console_names_this_apps_share_flag(monkeypatch, capsys):
    """`python app.py` prints its address and, off a Space, that --share makes a public
    link (gradio's own line told to "set share=True in launch()", which a user of the app
    cannot do)."""
    import app

    class Blocks:
        def launch(self, **kw):
            assert kw["quiet"] and kw["prevent_thread_lock"]
            return None, "http://127.0.0.1:7860/", None

        def block_thread(self):
            pass

    monkeypatch.setattr(app, "preload", lambda *a, **k: "demo")
    monkeypatch.setattr(app, "build_app", lambda warm=False: Blocks())
    monkeypatch.delenv("SPACE_ID", raising=False)
    app.main(["--model", "demo", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "Running on local URL: http://127.0.0.1:7860/" in out and "--share" in out and "launch()" not in out
    monkeypatch.setenv("SPACE_ID", "someone/grom-studio")
    app.main(["--model", "demo", "--device", "cpu"])
    assert "--share" not in capsys.readouterr().out
