"""The benchmark scripts run, as a user runs them (another working directory, a fresh
interpreter), at their smallest sizes, and print their tables. Nothing here is timed:
the numbers belong in BENCHMARKS.md."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_script(tmp_path, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_bench_edit_splits_the_time_for_both_paths(tmp_path):
    out = run_script(tmp_path, "bench_edit.py", "--layers", "4", "--hidden", "64", "--examples", "6",
                     "--band", "1-2", "--repeats", "1")
    assert "forget 6 / retain 54 QA pairs, band [1, 2]" in out
    assert "keys s" in out and "solve s" in out and "peak GB" in out
    assert sum(line.split()[0] in ("stream", "replay") for line in out.splitlines()) == 2


def test_bench_scaling_and_influence_quick(tmp_path):
    out = run_script(tmp_path, "bench_scaling.py", "--quick")
    assert "## solve vs key dimension n" in out and "## key collection vs tokens" in out
    assert "## the memory plan against the measured peak" in out  # one quick shape, in a child process
    out = run_script(tmp_path, "bench_influence.py", "--quick")
    difference = float(out.split("largest relative difference:")[1].split()[0])
    assert difference < 1e-6  # the Woodbury influences match the re-solves


@pytest.mark.parametrize("script, args", [
    # its plumbing on GROM and two trained methods (each method has its own tests): all 16 at 20 examples took 199 s
    ("bench_baselines.py", ["--quick", "--methods", "npo,simnpo", "--max-examples", "8"]),
    ("bench_eval.py", ["--split", "forget01", "--max-examples", "2"]),
])
def test_bench_demo_scripts_quick(tmp_path, script, args):
    out = run_script(tmp_path, script, *args)
    assert "Final" in out and "Forget" in out


def test_bench_attack_targets_on_the_demo_with_a_probe_upload(tmp_path):
    """GROM and NPO (at its starting point and at an lr of the run's own) through two attacks
    on an uploaded benchmark with probe rows (the demo model has no probes of its own), then
    the JSON read back as tables."""
    import json

    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    row = lambda ex, split: {"question": ex.question, "answer": ex.answer, "fact": ex.fact,  # noqa: E731
                             "split": split}
    rows = [row(ex, "forget") for ex in demo.forget[:12]] + [row(ex, "probe") for ex in demo.forget[12:18]]
    rows += [row(ex, "retain") for ex in demo.retain[:12]]
    upload = tmp_path / "p.jsonl"
    upload.write_text("\n".join(json.dumps(r) for r in rows))
    model = str(BENCH.parent / "assets" / "demo-full")
    out = run_script(tmp_path, "bench_attack_targets.py", "--model", model, "--preset", "demo-forget01",
                     "--custom", str(upload), "--methods", "grom,npo,npo@2e-3", "--attacks", "heldout,quant8",
                     "--threads", "1", "--json", "out.json")
    assert "### custom: 12 fitted, 6 held-out probes" in out and "| heldout | 1.00 |" in out
    res = json.loads((tmp_path / "out.json").read_text())["results"][0]
    assert set(res["methods"]) == {"grom", "npo", "npo@2e-3"}
    assert res["methods"]["npo"]["settings"]["lr"] == 1e-3  # the demo's starting point
    assert res["methods"]["npo@2e-3"]["settings"]["lr"] == 2e-3
    for m in res["methods"].values():
        assert set(m["attacks"]) == {"heldout", "quant8"} and m["edit_seconds"] > 0
    tables = run_script(tmp_path, "bench_attack_targets.py", "--tables", "out.json")
    assert "| attack | base | GROM | NPO | NPO 0.002 | grom s | npo s | npo@2e-3 s |" in tables


def test_bench_attack_targets_runs_lunar_and_grom_refusal_with_the_evaluation(tmp_path):
    """GROM's refusal target and LUNAR (unverifiable prompts, closed form at a given ridge)
    through one attack, each edit also evaluated as the studio evaluates (--evaluate)."""
    import json

    upload = tmp_path / "p.jsonl"
    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    rows = [{"question": ex.question, "answer": ex.answer, "fact": ex.fact, "split": split}
            for split, part in (("forget", demo.forget[:8]), ("probe", demo.forget[8:12]), ("retain", demo.retain[:8]))
            for ex in part]
    upload.write_text("\n".join(json.dumps(r) for r in rows))
    out = run_script(tmp_path, "bench_attack_targets.py", "--model", str(BENCH.parent / "assets" / "demo-full"),
                     "--preset", "demo-forget01", "--custom", str(upload), "--methods", "grom:refusal,lunar-cf-u",
                     "--lunar-rho", "0.03", "--attacks", "heldout", "--evaluate", "--threads", "1", "--json", "o.json")
    assert "| attack | base | GROM (refusal target) | LUNAR (closed form, unverifiable prompts) |" in out
    assert "| Retain fact recall |" in out  # the evaluation's rows under the attacks'
    res = json.loads((tmp_path / "o.json").read_text())["results"][0]["methods"]
    assert res["grom:refusal"]["settings"]["target"] == "refusal"
    settings = res["lunar-cf-u"]["settings"]
    assert (settings["prompts"], settings["solver"], settings["rho"]) == ("unverifiable", "closed-form", 0.03)
    assert "Retain fact recall" in res["lunar-cf-u"]["evaluation"]


def test_bench_name_only_on_the_demo_then_again_from_its_rows(tmp_path):
    """What the model writes, the standard split and written variants, each edited and
    evaluated; a second run reuses the rows of the first (no writing)."""
    import json

    model = str(BENCH.parent / "assets" / "demo-full")
    common = ["--model", model, "--preset", "demo", "--subjects", "the-solar-system", "--all-facts", "--threads", "1"]
    out = run_script(tmp_path, "name_only.py", *common, "--passages", "2", "--questions", "0", "--neighbours", "1",
                     "--neighbour-passages", "1", "--neighbour-questions", "0",
                     "--variants", "standard,passages@wr=10", "--json", "a.json")
    assert "written 0 question/answer pairs and 2 passages about it" in out and "| passages@wr=10 | 2 / 1 |" in out
    first = json.loads((tmp_path / "a.json").read_text())["targets"][0]
    assert [r["kind"] for r in first["rows"]] == ["passage"] * 3 and set(first["variants"]) == {
        "standard", "passages@wr=10"}
    out = run_script(tmp_path, "name_only.py", *common, "--rows", "a.json", "--variants", "both@band=1-2",
                     "--json", "b.json")
    again = json.loads((tmp_path / "b.json").read_text())["targets"][0]
    assert again["rows"] == first["rows"] and again["write_seconds"] is None
    assert again["variants"]["both@band=1-2"]["band"] == [1, 2]


def test_bench_gpu_scaled_down_on_the_cpu(tmp_path, monkeypatch):
    """The GPU benchmark's one command at a tiny scale on the CPU: every stage timed and
    metered beside the plan, the band cut with the layers. One workload, in this test's one
    process (its glibc setting given, no child is started), the corpus one; the QA one
    runs the same code but for its data."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    out = run_script(tmp_path, "bench_gpu.py", "--device", "cpu", "--scale", "0.005", "--layers", "5",
                     "--workload", "muse-8b")
    section = out.split("## muse-8b:")[1]
    assert "band [1, 2, 3, 4]" in section and "9 forget / 9 retain examples" in section, section
    rows = {line.split()[0]: line.split()[1:] for line in section.splitlines()[2:7]}
    assert list(rows) == ["load", "scores", "keys", "solve", "apply"], section
    assert all(float(r[1]) > 0 for r in rows.values()) and float(rows["solve"][2]) > 0  # peaks, a plan


def test_bench_gpu_methods_scaled_down_on_the_cpu(tmp_path):
    """The Time column's command at a tiny scale on the CPU: GROM, a trained method with its
    recipe's steps extrapolated from the measured ones, AltPO with its alternates timed and
    scaled, and two editors sharing one value optimisation, as table rows and JSON."""
    import json

    out = run_script(tmp_path, "bench_gpu_methods.py", "--device", "cpu", "--scale", "0.01", "--steps", "2",
                     "--alt-questions", "1", "--methods", "grom,npo,altpo,rome,memit",
                     "--tokenizer", str(BENCH.parent / "assets" / "demo-full"), "--json", "rows.json")
    rows = {r["method"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert list(rows) == ["grom", "npo", "altpo", "rome", "memit"] and not any("error" in r for r in rows.values())
    assert "20 forget / 36 retain, band [11, 12, 13, 14, 15]" in out
    npo = rows["npo"]  # 20 questions, batch 8 x 4: one step an epoch, the recipe's 10 epochs
    assert (npo["measured_steps"], npo["recipe_steps"]) == (2, 10)
    assert npo["full_s"] >= npo["loop_s"] + 8 * npo["step_s"] - 1e-9
    assert rows["altpo"]["recipe_steps"] == 40 and rows["altpo"]["alternates_s"] > 0  # 5 alternates each
    assert rows["rome"]["values_s"] == rows["memit"]["values_s"] and rows["rome"]["value_steps"] == 25
    table = out.split("x GROM")[1]
    assert all(m in table for m in rows)


def test_bench_specs_parse_before_any_model_loads(monkeypatch):
    """The comparison's `method@lr` specs and the editors' `--settings` grid: parsed as
    said, and a wrong name or value stopped with a message that says what to write."""
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_compare import lr_grid, method_grids
    from bench_editors import editor_settings

    grids = method_grids("ga, npo@3e-4,NPO@1e-3")
    assert list(grids) == ["ga", "npo"] and grids["npo"] == (3e-4, 1e-3) and grids["ga"] == lr_grid("ga")
    for bad, said in (("nope@1e-3", "unknown method 'nope'"), ("npo@x", "must be a number"),
                      ("npo@2", "must be in (0, 1)")):
        with pytest.raises(SystemExit, match=said.replace("(", r"\(").replace(")", r"\)")):
            method_grids(bad)
    assert editor_settings("") == [{}]
    assert editor_settings("w_r=1500; null_threshold=1e-3,l2=1;k=3") == [
        {"w_r": 1500.0}, {"null_threshold": 1e-3, "l2": 1.0}, {"k": 3}]
    with pytest.raises(SystemExit, match="'layers' is not a numeric EditorConfig field"):
        editor_settings("layers=3")
