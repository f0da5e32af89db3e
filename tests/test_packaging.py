"""`pip install .` makes `grom` importable outside the repository: the wheel is built from a
copy of the sources (no network: --no-build-isolation, --no-index, --no-deps) into a
folder, and from another directory the export snippet the studio shows runs as written on
the bundled demo model, which the wheel carries."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("setuptools")


def test_the_installed_library_runs_the_export_snippet(tmp_path):
    from components.export_panel import snippet
    from grom import PRESETS, run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model

    src = tmp_path / "src"  # a copy: the build's build/ and egg-info stay out of the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "grom", src / "grom", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for kind in ("demo-full", "demo-retain"):
        shutil.copytree(REPO / "assets" / kind, src / "assets" / kind)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-index", "--quiet", "--target", str(site), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    assert (site / "grom" / "demo" / "models" / "demo-full" / "model.safetensors").is_file()
    assert (site / "grom" / "data" / "knowledge" / "the-solar-system.json").is_file()
    # every subpackage of the sources is in the wheel (the packages list is written by hand:
    # grom.robustness was once left out, and `grom attack` failed after `pip install .`)
    subpackages = {p.parent.relative_to(REPO) for p in (REPO / "grom").rglob("__init__.py")}
    missing = [str(p) for p in sorted(subpackages) if not (site / p / "__init__.py").is_file()]
    assert not missing, f"not in the wheel: {missing}; add them to pyproject.toml's packages"

    model, tok = load_demo_model("full")  # an edit to apply there, made here
    bench = load_benchmark("demo", "forget10")
    edit = run_edit(model, tok, bench.forget[:8], bench.retain[:16],
                    PRESETS["demo"].replace(prompt_format=bench.prompt_format))
    work = tmp_path / "elsewhere"
    edit.save(work / "grom-edit")
    code = snippet("demo", "grom-edit") + (
        "import grom, torch, grom.robustness.suite\n"
        "assert grom.__file__.startswith(%r), grom.__file__\n"
        "base, _ = load_demo_model('full')\n"
        "exact = all(torch.equal(model.get_parameter(n), base.get_parameter(n) + P)\n"
        "            for n, P in edit.patches.items())\n"
        "print('applied', edit.is_applied, exact)\n" % str(site))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "applied True True" in out.stdout  # W + P, from the packaged demo weights
    assert "pip install ." in snippet("demo", "grom-edit")


def test_every_package_of_grom_is_listed_for_the_wheel():
    """pyproject.toml lists the packages by hand (grom.demo.models comes from assets/): a new
    package under grom/ must be in the list, or the installed library cannot import it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "grom").rglob("__init__.py")}
    assert found - listed == set(), f"add to pyproject.toml's packages: {sorted(found - listed)}"
    assert listed - found - {"grom.demo.models"} == set(), f"listed but not a package: {sorted(listed - found)}"
