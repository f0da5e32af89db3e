"""Issue 39 item 4: the studio's TOFU evaluation in OpenUnlearning's log format
(`grom.eval.openunlearning`), checked against the schema upstream writes, transcribed in
tests/data/openunlearning/ (commit and source paths in its README), on the demo's forget10
with GROM's demo preset; written and read back; forget quality from a retain model's log
as upstream's ``privacy.ks_test`` computes it, against scipy and a hand computation."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ks_2samp

from grom.eval.openunlearning import (
    EVAL_FILE,
    OU_COMMIT,
    STUDIO_NAMES,
    SUMMARY_FILE,
    SUMMARY_METRICS,
    ks_test,
    read_openunlearning,
    summarize,
    to_openunlearning,
    write_openunlearning,
)
from grom.eval.results import EDITED, REFERENCE, Report, Row, subset

SCHEMA = json.loads((Path(__file__).parent / "data" / "openunlearning" / "tofu_eval_schema.json").read_text())
N = 6  # examples per set: the format, not the numbers, is under test


@pytest.fixture(scope="module")
def demo_report():
    """GROM (the demo preset) on the demo's forget10, evaluated with the retain model; a
    tenth of the retain set gives the keys, to keep it quick."""
    from grom import PRESETS, demo_preset, run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model
    from grom.eval import evaluate

    model, tok = load_demo_model("full")
    ref, _ = load_demo_model("retain")
    bench = load_benchmark("demo", "forget10")
    config = PRESETS[demo_preset("forget10")].replace(prompt_format=bench.prompt_format)
    edit = run_edit(model, tok, bench.forget, bench.retain[::10], config)
    report = evaluate(model, tok, bench, edit=edit, reference=ref, max_examples=N, include_base=False)
    return report, bench, edit


def _type_ok(value, kind: str) -> bool:
    ok = {"number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          "string": lambda v: isinstance(v, str), "null": lambda v: v is None}
    return any(ok[k](value) for k in kind.split("|"))


def _check(result: dict, shape: dict, where: str, n_examples: int) -> list[str]:
    """Differences of one result from its handler's shape in the schema."""
    problems = []
    if set(result) != set(shape):
        return [f"{where}: keys {sorted(result)} != upstream's {sorted(shape)}"]
    for key, kind in shape.items():
        if key == "value_by_index":
            if not result[key] or len(result[key]) > n_examples:
                problems.append(f"{where}: {len(result[key])} per-index values")
            for i, v in result[key].items():
                if not (isinstance(i, str) and i.isdecimal()):
                    problems.append(f"{where}: index {i!r} is not a decimal string")
                if set(v) != set(kind):
                    problems.append(f"{where}[{i}]: keys {sorted(v)} != upstream's {sorted(kind)}")
                problems += [f"{where}[{i}].{k}: {v[k]!r} is not {t}" for k, t in kind.items()
                             if k in v and not _type_ok(v[k], t)]
        elif isinstance(kind, dict):
            problems += _check(result[key], kind, f"{where}.{key}", n_examples)
        elif not _type_ok(result[key], kind):
            problems.append(f"{where}.{key}: {result[key]!r} is not {kind}")
    return problems


def test_the_schema_is_the_pinned_commits():
    assert SCHEMA["source"]["commit"] == OU_COMMIT
    assert set(STUDIO_NAMES) <= set(SCHEMA["metrics"])
    assert set(SUMMARY_METRICS) <= set(SCHEMA["default_metrics"]) | set(SCHEMA["commented_metrics"])
    assert set(SCHEMA["default_metrics"]) <= set(SUMMARY_METRICS)  # every default metric exported


def test_demo_forget10_log_has_upstreams_schema(demo_report):
    report, bench, _ = demo_report
    logs = to_openunlearning(report, benchmark=bench)
    assert list(logs) == sorted(logs)  # save_logs: dict(sorted(logs.items()))
    json.dumps(logs, allow_nan=False)  # strict JSON
    sizes = {"forget": len(bench.eval_sets["forget"]), "holdout": len(bench.eval_sets["holdout"])}
    problems = []
    for metric, result in logs.items():
        assert metric in SCHEMA["metrics"], f"{metric} is no key upstream writes"
        handler = SCHEMA["metrics"][metric]
        problems += _check(result, SCHEMA["handlers"][handler], metric, max(sizes.values()))
    assert not problems, "\n".join(problems)
    # every default metric of configs/eval/tofu.yaml and model_utility's nine pre-computes
    assert set(SCHEMA["default_metrics"]) | set(SCHEMA["pre_compute"]["model_utility"]) <= set(logs)
    assert set(logs) == set(STUDIO_NAMES)  # and nothing but the metrics defined as upstream's
    assert logs["forget_quality"]["agg_value"] is not None  # the report had a retain model


def test_values_indices_and_aggregates_are_the_reports(demo_report):
    report, bench, _ = demo_report
    logs, row = to_openunlearning(report, benchmark=bench), report.rows[EDITED]
    for metric, studio in STUDIO_NAMES.items():
        assert logs[metric]["agg_value"] == pytest.approx(row.metrics[studio], rel=1e-9, abs=1e-12), metric
    forget = bench.eval_sets["forget"]
    index = [int(i) for i in logs["forget_Q_A_Prob"]["value_by_index"]]
    assert index == list(subset(range(len(forget)), N)) and index[-1] == len(forget) - 1
    df = row.examples["forget"]
    assert [forget[i].question for i in index] == list(df["question"])
    probs = logs["forget_Q_A_Prob"]["value_by_index"].values()
    assert [v["prob"] for v in probs] == pytest.approx(list(df["prob"]))
    assert [math.exp(-v["avg_loss"]) for v in probs] == pytest.approx(list(df["prob"]))
    assert [v["score"] for v in logs["forget_truth_ratio"]["value_by_index"].values()] == \
        pytest.approx(list(row.raw["forget/truth_ratio"]))
    rouge = list(logs["forget_Q_A_ROUGE"]["value_by_index"].values())
    assert [v["generation"] for v in rouge] == list(df["generation"])
    assert all(v["rougeL_f1"] <= 1 and v["rouge1_recall"] >= v["rougeL_recall"] for v in rouge)  # LCS <= unigrams
    mia = logs["mia_min_k"]
    assert mia["auc"] == mia["agg_value"] and len(mia["holdout"]["value_by_index"]) == N
    # without the benchmark: the positions among the evaluated examples
    assert list(to_openunlearning(report)["forget_Q_A_Prob"]["value_by_index"]) == [str(i) for i in range(N)]


def test_write_then_read_gives_the_same_values(demo_report, tmp_path):
    report, bench, _ = demo_report
    eval_path, summary_path = write_openunlearning(report, tmp_path / "edited", benchmark=bench)
    assert (eval_path.name, summary_path.name) == (EVAL_FILE, SUMMARY_FILE) == ("TOFU_EVAL.json", "TOFU_SUMMARY.json")
    logs = to_openunlearning(report, benchmark=bench)
    assert json.loads(eval_path.read_text()) == logs
    assert eval_path.read_text() == json.dumps(logs, indent=4)  # as json.dump(logs, f, indent=4)
    summary = json.loads(summary_path.read_text())
    assert summary == summarize(logs) and set(summary) == set(SUMMARY_METRICS)
    back = read_openunlearning(tmp_path / "edited")  # the folder, or the file
    assert back.logs == logs and read_openunlearning(eval_path).logs == logs
    assert back.values("forget_Q_A_Prob") == \
        {i: v["prob"] for i, v in logs["forget_Q_A_Prob"]["value_by_index"].items()}
    assert back.values("mia_min_k", side="holdout") == \
        {i: v["score"] for i, v in logs["mia_min_k"]["holdout"]["value_by_index"].items()}
    row = report.rows[EDITED].metrics
    assert back.studio_metrics() == pytest.approx({STUDIO_NAMES[k]: row[STUDIO_NAMES[k]] for k in logs})
    assert read_openunlearning(summary_path).summary == summary  # a summary file reads as aggregates


def test_forget_quality_from_a_retain_models_log(demo_report, tmp_path):
    """The retain model's row written as its own log, read back as upstream reads
    ``retain_logs_path``: the KS test of the two forget truth ratio samples."""
    report, bench, _ = demo_report
    retain_path, _ = write_openunlearning(report, tmp_path / "retain", REFERENCE, benchmark=bench)
    edited_path, _ = write_openunlearning(report, tmp_path / "edited", benchmark=bench, retain_logs=retain_path)
    edited, retain = read_openunlearning(edited_path), read_openunlearning(retain_path)
    expected = ks_2samp(report.rows[EDITED].raw["forget/truth_ratio"],
                        report.rows[REFERENCE].raw["forget/truth_ratio"]).pvalue
    assert edited.forget_quality(retain_path) == pytest.approx(expected, rel=1e-12)
    assert edited.summary["forget_quality"] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(report.rows[EDITED].metrics["Forget quality"], rel=1e-12)
    assert retain.forget_quality(retain) == 1.0  # a sample against itself
    no_retain = Report(report.benchmark, report.split, report.task, {EDITED: report.rows[EDITED]}, 0.0)
    logs = to_openunlearning(no_retain, benchmark=bench)
    assert logs["forget_quality"] == {"agg_value": None} and "forget_quality" not in summarize(logs)
    # privleak against the retain log's mia_min_k AUC, else upstream's ref_value 0.5
    auc, ref = logs["mia_min_k"]["agg_value"], retain.summary["mia_min_k"]
    assert edited.summary["privleak"] == pytest.approx(((1 - auc) - (1 - ref)) / ((1 - ref) + 1e-10) * 100)
    assert logs["privleak"]["agg_value"] == pytest.approx(((1 - auc) - 0.5) / (0.5 + 1e-10) * 100)


def _tr_log(values: list[float], first: int = 0) -> dict:
    """A forget_truth_ratio result as upstream writes it (indices from `first`)."""
    scores = {str(first + i): {"score": v} for i, v in enumerate(values)}
    return {"forget_truth_ratio": {"agg_value": float(np.mean(np.minimum(values, 1 / np.array(values)))),
                                   "value_by_index": scores}}


def test_ks_test_by_hand(tmp_path):
    """Two samples of three, every forget value below every retain value: the empirical
    CDFs differ by D = 1 at 0.3, and of the C(6, 3) = 20 equally likely orderings only the
    2 fully separated ones reach it, so the exact two-sided p-value is 2/20 = 0.1."""
    forget, retain = [0.1, 0.2, 0.3], [0.5, 0.6, 0.7]
    (tmp_path / "retain.json").write_text(json.dumps(_tr_log(retain, first=100), indent=4))
    (tmp_path / "forget.json").write_text(json.dumps(_tr_log(forget), indent=4))
    log = read_openunlearning(tmp_path / "forget.json")
    assert log.forget_quality(tmp_path / "retain.json") == pytest.approx(0.1)
    assert ks_2samp(forget, retain).statistic == 1.0 and ks_2samp(forget, retain).pvalue == pytest.approx(0.1)
    # interleaved: F_forget - F_retain at the pooled values 0.1 0.2 0.5 0.6 0.8 0.9 is
    # 1/3, 2/3, 1/3, 0, 1/3, 0: D = 2/3, as scipy's statistic; the p-value is scipy's
    forget, retain = [0.1, 0.2, 0.8], [0.5, 0.6, 0.9]
    steps = [np.mean(np.array(forget) <= x) - np.mean(np.array(retain) <= x) for x in sorted(forget + retain)]
    assert max(map(abs, steps)) == pytest.approx(2 / 3) == pytest.approx(ks_2samp(forget, retain).statistic)
    got = ks_test(_tr_log(forget)["forget_truth_ratio"], _tr_log(retain)["forget_truth_ratio"])
    assert got == {"agg_value": pytest.approx(ks_2samp(forget, retain).pvalue)}
    assert ks_test(_tr_log(forget)["forget_truth_ratio"], None) == {"agg_value": None}


def test_only_a_tofu_report_and_its_own_benchmark():
    from grom.data import load_benchmark

    with pytest.raises(ValueError, match="TOFU"):
        to_openunlearning(Report("muse-news", "forget", "muse", {EDITED: Row()}, 0.0))
    with pytest.raises(KeyError, match="no row"):
        to_openunlearning(Report("demo", "forget10", "tofu", {}, 0.0))
    import pandas as pd
    row = Row(examples={"forget": pd.DataFrame({"question": ["Who is nobody?"], "answer": ["x"],
                                                "generation": ["x"], "rougeL_recall": [1.0], "prob": [0.5]})})
    with pytest.raises(ValueError, match="not the benchmark's"):
        to_openunlearning(Report("demo", "forget10", "tofu", {EDITED: row}, 0.0),
                          benchmark=load_benchmark("demo", "forget10"))


def test_cli_evaluate_writes_the_log_and_reads_a_retain_log(demo_report, tmp_path, capsys):
    """`python -m grom evaluate --openunlearning DIR`: the retain model's log first, then the
    edited model's with it as --retain-logs, as OpenUnlearning's retain_logs_path."""
    from grom.cli import main
    from grom.demo.model import demo_model_dir

    _, _, edit = demo_report
    edit.save(tmp_path / "edit")
    data = ["--device", "cpu", "--benchmark", "demo", "--split", "forget10", "--max-examples", "4"]
    assert main(["evaluate", "--model", str(demo_model_dir("retain")), *data,
                 "--openunlearning", str(tmp_path / "retain")]) == 0
    retain_log = tmp_path / "retain" / EVAL_FILE
    assert main(["evaluate", "--model", str(demo_model_dir("full")), *data, "--edit", str(tmp_path / "edit"),
                 "--openunlearning", str(tmp_path / "edited"), "--retain-logs", str(retain_log),
                 "--json", str(tmp_path / "report.json")]) == 0
    assert "OpenUnlearning log:" in capsys.readouterr().out
    edited = read_openunlearning(tmp_path / "edited")
    assert edited.summary["forget_quality"] == pytest.approx(edited.forget_quality(retain_log), rel=1e-12)
    assert read_openunlearning(retain_log).logs["forget_quality"] == {"agg_value": None}  # no retain log of its own
    metrics = json.loads((tmp_path / "report.json").read_text())["metrics"]
    assert list(metrics) == [EDITED] and metrics[EDITED]["Forget prob"] == pytest.approx(
        edited.summary["forget_Q_A_Prob"])
    with pytest.raises(SystemExit, match="--retain-logs goes with"):
        main(["evaluate", "--model", "x", *data, "--retain-logs", str(retain_log)])


def test_the_export_panel_adds_the_log_after_a_comparison(demo_report, monkeypatch, tmp_path):
    """Export after a TOFU comparison of the edit: its two files and TOFU_EVAL.json /
    TOFU_SUMMARY.json (upstream's names); a whole export uploaded back still imports."""
    from components import export_panel
    from components.server.files import edit_uploads
    from components.server.model_choices import ensure_model, model_key
    from components.server.session import Session

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    report, bench, edit = demo_report
    key = model_key("demo", "cpu", "float32")
    ensure_model(key)
    session = Session()
    session.model_key, session.benchmark = key, bench
    session.edit, session.edit_for = edit, key
    files, _, _ = export_panel.on_export.__wrapped__(session)
    assert sorted(Path(f).name for f in files) == ["edit.json", "patch.safetensors"]  # no comparison yet
    session.report, session.report_for = report, (bench, edit, N)
    files, note, _ = export_panel.on_export.__wrapped__(session)
    names = {Path(f).name: Path(f) for f in files}
    assert sorted(names) == ["TOFU_EVAL.json", "TOFU_SUMMARY.json", "edit.json", "patch.safetensors"]
    assert "OpenUnlearning" in note
    assert read_openunlearning(names["TOFU_EVAL.json"]).logs == to_openunlearning(report, benchmark=bench)
    assert edit_uploads(files) == (names["edit.json"], names["patch.safetensors"])


def test_the_prob_mean_truth_ratio_is_upstreams_option(demo_report):
    """locuslab/open-unlearning #163 (d3d7cf9, `memorization.truth_ratio`): with the
    ``prob_mean`` aggregator each question scores correct / (correct + wrong + 1e-10) and the
    aggregate is their mean; the default stays ``closer_to_1_better``. Checked against that
    formula on the probabilities, and through the export with the forget quality's KS test
    on the same scores."""
    from grom.eval import metrics as M

    correct, wrong = np.array([0.5, 0.01, 0.2, 1e-3]), np.array([0.25, 0.04, 0.2, 3e-3])  # normalised likelihoods
    upstream = correct / (correct + wrong + 1e-10)  # transcribed
    tr = wrong / (correct + 1e-10)  # what a report's rows hold
    assert M.truth_ratio_probs(tr) == pytest.approx(upstream, rel=1e-6)
    assert M.truth_ratio_prob_mean(tr) == pytest.approx(float(np.mean(upstream)), rel=1e-6)
    report, bench, _ = demo_report
    plain = to_openunlearning(report, benchmark=bench)
    probs = to_openunlearning(report, benchmark=bench, truth_ratio="prob_mean")
    ratios = [v["score"] for v in plain["forget_truth_ratio"]["value_by_index"].values()]
    shares = [v["score"] for v in probs["forget_truth_ratio"]["value_by_index"].values()]
    assert shares == pytest.approx([1 / (1 + r) for r in ratios])
    assert probs["forget_truth_ratio"]["agg_value"] == pytest.approx(np.mean(shares))
    assert probs["forget_quality"]["agg_value"] is not None and probs["forget_Q_A_Prob"] == plain["forget_Q_A_Prob"]
    with pytest.raises(ValueError, match="closer_to_1_better, prob_mean"):
        to_openunlearning(report, benchmark=bench, truth_ratio="median")
