"""A new user's first try of the library (issue 49, item 8): every public name of `grom`
imports, though `import grom` loads no torch; the benchmarks' registry is full whatever is
imported first; README's "library in ten lines" finds grom and its data from another folder; and
`run_edit` says what it is doing (a bar on a terminal), the edit the same bit for bit."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grom
from grom import EditConfig, run_edit
from tests.conftest import FORGET, RETAIN, tiny_llama

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
             "demo_preset": config.demo_preset, "keyed_at": config.keyed_at,
             "specificity_weights": directions.specificity_weights,
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


@pytest.mark.slow  # a fresh interpreter, in a folder outside the checkout
def test_the_ten_lines_find_grom_and_their_data_from_another_folder(tmp_path):
    """README's lines up to the model, as written, outside the checkout: grom is found only
    as README's commands install it (`pip install ... -e .`). The whole block takes about 5
    minutes of CPU on SmolLM2, too long for the suite; it was run as written in a fresh
    virtual environment made by README's first command (issue 49, item 8)."""
    lines = [ln for ln in ten_lines().splitlines() if ln.startswith(("from ", "import ", "bench = "))]
    assert len(lines) == 4, lines
    code = "\n".join([*lines, "assert bench.forget and bench.retain", "print(len(bench.forget))"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) > 0


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_llama(len(tokenizer))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _same(a, b) -> bool:
    return a.patches.keys() == b.patches.keys() and all(torch.equal(a.patches[n], b.patches[n]) for n in a.patches)


@pytest.mark.parametrize("stream", [True, False])
def test_run_edit_names_its_stages_in_order_and_edits_the_same(tiny, tokenizer, stream):
    config = EditConfig(k=2, beta=0.5, beta_relative=True, w_r=10.0, stream=stream)
    calls = []
    told = run_edit(tiny, tokenizer, FORGET, RETAIN, config, progress=lambda f, m: calls.append((f, m)))
    quiet = run_edit(tiny, tokenizer, FORGET, RETAIN, config, progress=False)
    assert _same(told, quiet)
    fractions, messages = [f for f, _ in calls], [m for _, m in calls]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert messages[0] == "tokenizing" and messages[-1] == "done"
    said = "\n".join(messages)
    for stage in ("scoring layers: forget batches", "scoring layers: retain batches", "beta from the forget outputs",
                  "(forget)", "(retain)", ": solving"):
        assert stage in said, stage
    assert ("collecting keys up to layer" in said) == stream
    assert sum(m.endswith(": solving") for m in messages) == 2  # one a layer of the band


def test_run_edit_draws_a_bar_on_a_terminal_only(tiny, tokenizer, monkeypatch):
    config = EditConfig(layers=(1, 2), beta=5.0, w_r=10.0)
    plain = run_edit(tiny, tokenizer, FORGET, RETAIN, config, progress=None)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert _same(run_edit(tiny, tokenizer, FORGET, RETAIN, config), plain)
    drawn = sys.stderr.getvalue()
    assert "layer 2 (2/2): solving" in drawn and "100%" in drawn
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, a pipe: no bar
    run_edit(tiny, tokenizer, FORGET, RETAIN, config)
    assert sys.stderr.getvalue() == ""
