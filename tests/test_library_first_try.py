"""A new user's first try of the library (issue 49, item 8): every public name of `grom`
imports, though `import grom` loads no torch; the benchmarks' registry is full whatever is
imported first; and README's "library in ten lines" runs as written from another folder."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grom

ROOT = Path(__file__).resolve().parents[1]


def ten_lines() -> str:
    """The Python block under README's "The library in ten lines"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The library in ten lines", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_every_public_name_imports_as_its_module_has_it():
    from grom.closed_form import config, directions, influence, layer_scores, pipeline, solve
    from grom.edit import Edit

    where = {"Edit": Edit, "PRESETS": config.PRESETS, "EditConfig": config.EditConfig, "preset": config.preset,
             "demo_preset": config.demo_preset, "specificity_weights": directions.specificity_weights,
             "example_influence": influence.example_influence,
             "example_influence_bruteforce": influence.example_influence_bruteforce,
             "LayerScores": layer_scores.LayerScores, "best_window": layer_scores.best_window,
             "score_layers": layer_scores.score_layers, "run_edit": pipeline.run_edit,
             "ridge_mu": solve.ridge_mu, "solve_update": solve.solve_update}
    assert sorted(grom.__all__) == sorted(where)
    for name, value in where.items():
        exec(f"from grom import {name} as got", scope := {})
        assert scope["got"] is value and getattr(grom, name) is value, name
    assert set(grom.__all__) <= set(dir(grom))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        grom.nothing_here  # noqa: B018


@pytest.mark.slow  # a fresh interpreter: in this one the tasks are imported already
def test_import_grom_is_light_and_the_benchmarks_fill_themselves(tmp_path):
    code = ("import sys\nimport grom\nassert 'torch' not in sys.modules\n"
            "from grom.data import BENCHMARKS, load_benchmark\n"
            "assert list(BENCHMARKS)[0] == 'demo' and 'real-knowledge' in BENCHMARKS, list(BENCHMARKS)\n"
            "assert load_benchmark('demo').forget\n"
            "from grom.tasks import TASKS\nassert 'tofu' in TASKS\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_ten_lines_import_what_they_name():
    imports = "\n".join(line for line in ten_lines().splitlines() if line.startswith(("from ", "import ")))
    assert "run_edit" in imports and "load_benchmark" in imports
    exec(imports, {})


@pytest.mark.slow
def test_the_ten_lines_run_as_written_from_another_folder(real, tmp_path):
    """As README gives them, in a fresh process from a folder outside the repository, on
    SmolLM2 (the `real` fixture: fetched once, else skipped). Outside the checkout, grom
    is found only as README's commands install it (`pip install ... -e .`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", ten_lines()], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "out" / "my-edit" / "edit.json").is_file() and "total" in run.stdout
