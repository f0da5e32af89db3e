"""The habits the code keeps, checked on every run (issue 38, items 6 and 7):

- ruff, as pyproject.toml's [tool.ruff] configures it: pyflakes, import order, line
  length and a complexity limit;
- no private name (one that starts with a single underscore) used outside the module that
  defines it, in the library, the app or the benchmarks (tests may reach into the module
  they test);
- no `importlib` in the library, the app or the benchmarks: an import is written where it
  is needed, so an import circle shows as one.
"""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ("grom", "components", "bench")
OURS = ("grom", "components", "app", "bench")


def _sources():
    yield ROOT / "app.py"
    for top in CODE:
        yield from sorted((ROOT / top).rglob("*.py"))


def private_uses(path: Path) -> list[str]:
    """`from x import _name` and `alias._name` where x / alias is one of our modules."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT)
    ours: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{where}:{node.lineno}: from {node.module} import {a.name}")
                ours.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            ours.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in OURS)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in ours):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_used_outside_its_module():
    found = [use for path in _sources() for use in private_uses(path)]
    assert not found, "private names used outside their module (make them public or keep them home):\n" + \
        "\n".join(found)


def test_no_importlib_in_the_library_or_the_app():
    found = [f"{p.relative_to(ROOT)}" for p in _sources() if "importlib" in p.read_text()]
    assert not found, f"importlib in {found}: write the import where it is needed"


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (pip install -r requirements-test.txt)")
def test_ruff_is_clean():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
