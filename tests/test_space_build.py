"""The Space builds on ZeroGPU (issue 36): README.md's front matter and requirements.txt
against the versions Hugging Face documents, and the import order ZeroGPU needs.

ZeroGPU runs one Python and a list of PyTorch releases (hub-docs, docs/hub/spaces-zerogpu.md,
"Supported Versions", read at commit 00b2cbfeede7): a requirements.txt whose torch admits
none of them fails the build with "No candidate PyTorch version found for ZeroGPU". The
lists below are that page's; when Hugging Face adds a release, add it here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
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

from components.core.sources import REAL
from grom.fetch import registry_model

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
