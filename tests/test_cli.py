"""`python -m grom`: it answers `--help` without loading torch (what the parser shows is
written out in grom/cli.py, checked here against its sources), and `edit`, `scores` and
`--plan` print a summary for a reader, their JSON behind `--json`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grom import cli
from grom.closed_form import config as edit_config
from grom.edit import Edit
from grom.model import sharding
from tests.conftest import FORGET, RETAIN
from tests.test_library import save_tiny

ROOT = Path(__file__).resolve().parents[1]


def test_what_the_parser_shows_is_its_sources():
    assert cli.PRESET_NAMES == tuple(sorted(edit_config.PRESETS))
    assert cli.TARGETS == edit_config.TARGETS
    assert cli.KEY_POSITIONS == tuple(edit_config.KEY_POSITIONS)
    assert (cli.DEVICE_MAP_HELP, cli.MAX_MEMORY_HELP) == (sharding.DEVICE_MAP_HELP, sharding.MAX_MEMORY_HELP)


def test_a_bad_device_map_is_refused_with_the_parsers_message(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["edit", "--model", "m", "--device-map", "everywhere"])
    assert "device map 'everywhere' is unknown" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["edit", "--model", "m", "--device-map", "auto", "--max-memory", "cpu=1GiB"])
    assert (args.device_map, args.max_memory) == ("auto", {"cpu": 2**30})


@pytest.mark.slow  # a fresh interpreter: this one has torch loaded already
def test_help_loads_no_torch():
    code = ("import sys, runpy; sys.argv = ['grom', 'edit', '--help']\n"
            "try:\n    runpy.run_module('grom', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--json [FILE]" in run.stdout and "--preset" in run.stdout


def test_layers_text():
    assert cli.layers_text([11, 12, 13]) == "11-13"
    assert cli.layers_text([3, 5]) == "3, 5"
    assert cli.layers_text([4]) == "4"


@pytest.fixture()
def files(tmp_path, tokenizer):
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"question": e.question, "answer": e.answer}) for e in rows))
    model = save_tiny(tmp_path, tokenizer)
    data = ["--forget", str(tmp_path / "forget.jsonl"), "--retain", str(tmp_path / "retain.jsonl")]
    return ["--model", str(model), "--device", "cpu", *data]


def test_edit_prints_a_summary_and_json_on_request(tmp_path, files, capsys):
    edit_args = ["edit", *files, "--layers", "1-2", "--beta", "5", "--w-r", "10"]
    assert cli.main([*edit_args, "--out", str(tmp_path / "a")]) == 0
    summary = capsys.readouterr().out
    assert "layers 1-2 (given)" in summary and "model.layers.2.mlp.down_proj" in summary
    assert "load" in summary and "solve" in summary and not summary.lstrip().startswith("{")

    assert cli.main([*edit_args, "--out", str(tmp_path / "b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert doc["band"] == [1, 2] and doc["out"] == str(tmp_path / "b")
    assert {"load", "keys", "solve", "apply", "total"} <= set(doc["timings"])
    assert [r["layer"] for r in doc["layers"]] == [1, 2] and doc["n_forget"] == len(FORGET)
    edit = Edit.load(tmp_path / "b")
    assert doc["patch_norm"] == pytest.approx(edit.patch_norm())

    assert cli.main([*edit_args, "--out", str(tmp_path / "c"), "--json", str(tmp_path / "c.json")]) == 0
    assert "GROM edit" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["band"] == [1, 2]


def test_scores_and_plan_as_json(files, capsys):
    assert cli.main(["scores", *files, "-k", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["S"]) == 4 and len(doc["band"]) == 2 and doc["k"] == 2
    assert cli.main(["edit", *files, "--layers", "1-2", "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["peak"] == max(plan["stages"].values()) and plan["peak_stage"] in plan["stages"]
    assert cli.main(["edit", *files, "--layers", "1-2", "--plan"]) == 0
    assert capsys.readouterr().out.startswith("memory plan for: ")
