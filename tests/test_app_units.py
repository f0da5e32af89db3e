"""GROM Studio's pieces without a server: the plot builders, the word diff, the widgets ->
EditConfig function, the band parser, and what a user may type as a source."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest

pytest.importorskip("gradio")

from components.edit_panel import on_preset as fill_preset  # noqa: E402
from components.server.allowed_sources import allowed_source  # noqa: E402
from components.server.errors import UserError  # noqa: E402
from components.server.validate import parse_band, retain_subset  # noqa: E402
from components.studio.form import edit_config  # noqa: E402
from components.views import plots  # noqa: E402
from components.views.diff import generations_html, word_diff  # noqa: E402

WIDGETS = dict(preset="demo", target="suppression", beta=150.0, beta_relative=True, w_r=100.0, rho=0.03,
               c=45.0, matrix="down_proj", use_alpha=True, band_mode="manual", band_text="3-5", k=3,
               seed=0, forget_budget=20000, retain_budget=40000, batch_size=32)


def test_layer_scores_plot_marks_the_band_and_shows_f_and_r():
    S, F, R = [0.1, 0.5, 0.9, 0.2], [1.0, 2.0, 3.0, 1.5], [0.9, 1.5, 2.1, 1.3]
    fig = plots.plot_layer_scores(S, F, R, [1, 2], show_parts=True, suggested=[2, 3])
    bars = fig.data[0]
    assert isinstance(fig, go.Figure) and list(bars.y) == S
    assert [c == plots.ACCENT for c in bars.marker.color] == [False, True, True, False]
    assert np.allclose(bars.customdata, np.stack([F, R], 1))  # F_l, R_l on hover
    assert {t.name for t in fig.data[1:]} == {"F<sub>l</sub> (forget)", "R<sub>l</sub> (retain)"}
    assert len(fig.layout.shapes) == 2  # the band, and the suggested band where it differs


def test_pca_plot_has_hollow_before_and_filled_after():
    pts = {f"{p}_{w}": np.random.default_rng(0).normal(size=(5, 3)) for p in ("forget", "retain")
           for w in ("before", "after")}
    fig = plots.plot_pca(pts, [0.5, 0.3, 0.1])
    symbols = {t.name: t.marker.symbol for t in fig.data if t.mode == "markers"}
    assert symbols == {"forget, before": "circle-open", "forget, after": "circle",
                       "retain, before": "circle-open", "retain, after": "circle"}
    assert "movement direction 1 (50% of the movement)" == fig.layout.xaxis.title.text


def test_influence_plot_is_sorted_and_marks_the_largest():
    shares = np.array([0.01, 0.2, 0.05])
    fig = plots.plot_influence(shares, ["a", "b", "c"])
    assert list(fig.data[0].y) == [0.2, 0.05, 0.01] and list(fig.data[0].customdata) == ["b", "c", "a"]
    assert fig.data[0].marker.color[0] == plots.ACCENT and fig.layout.annotations[0].text == "largest"


def test_sweep_plot_names_its_axes_and_marks_the_unedited_and_current_points():
    fig = plots.plot_sweep(["base (no edit)", "β 75", "β 150"], [0.9, 0.5, 0.2], [0.95, 0.94, 0.9],
                           "forget", "neighbours", current=2)
    assert list(fig.data[0].x) == [0.5, 0.2] and fig.data[1].marker.symbol == "star"
    assert fig.data[1].x[0] == 0.9 and fig.data[2].x[0] == 0.2  # unedited; the current edit ringed
    assert fig.layout.xaxis.title.text.startswith("forget: mean p(gold answer)")
    assert fig.layout.yaxis.title.text.startswith("neighbours: mean p(gold answer)")
    assert "utility" not in fig.to_json().lower()  # p(answer) is not the Compare tab's Model utility
    json.loads(fig.to_json())  # serialisable for the browser


def test_tradeoff_plot_has_a_point_per_run_and_rings_the_latest():
    fig = plots.plot_tradeoff([0.8, 0.3], [0.99, 0.9], ["#1: β 50", "#2: β 150"], x_title="Forget fact recall",
                              y_title="Retain fact recall")
    assert list(fig.data[0].customdata) == ["#1: β 50", "#2: β 150"]  # every run on hover
    assert list(fig.data[1].text) == ["latest: #2"] and fig.data[1].x[0] == 0.3  # only the latest labelled
    assert fig.layout.xaxis.title.text == "Forget fact recall"


def test_word_diff_marks_runs_of_changed_words():
    left, right = word_diff("born in Lysdell, a fishing village", "born in Mauith, a town")
    assert ("Lysdell,", "del") in left and ("fishing village", "del") in left
    assert ("Mauith,", "ins") in right and ("town", "ins") in right
    assert "".join(p for p, _ in left) == "born in Lysdell, a fishing village"


def test_generations_html_escapes_text():
    html = generations_html([{"question": "<b>q</b>", "answer": "a & b", "before": "x", "after": "<i>y",
                              "prob_before": 0.9, "prob_after": None}])
    assert "<b>q</b>" not in html and "&lt;b&gt;q&lt;/b&gt;" in html and "&lt;i&gt;y" in html
    assert "p=0.90" in html


def test_generations_mark_forgotten_and_lost_facts_differently():
    row = lambda before, after: {"question": "q", "answer": "a", "before": "x", "after": "y",  # noqa: E731
                                 "fact_before": before, "fact_after": after}
    forget = generations_html([row(True, False), row(True, True)], kind="forget")
    retain = generations_html([row(True, False), row(True, True), row(False, False)], kind="retain")
    assert "v-good\">forgotten" in forget and "v-warn\">still stated" in forget
    assert "v-bad\">fact lost" in retain and "v-good\">kept" in retain and "not known before" in retain
    assert "gen-legend" in retain and "broken only when" in retain  # what each badge means
    assert "verdict" not in generations_html([row(True, False)])  # no kind: no verdict
    looping = row(True, False) | {"after": "the the the the", "class_after": "degenerate"}
    marked = generations_html([looping, row(True, False) | {"class_after": "fluent"}], kind="forget")
    assert "v-bad\">degenerate text" in marked and marked.count("v-good\">forgotten") == 1  # never green


def test_the_result_card_says_what_was_forgotten_and_kept():
    import pandas as pd

    from components.compare_panel import remember, result_card
    from components.server.session import Session
    from grom.eval.report import Report, Row

    def frame(recall, classes=None):
        df = pd.DataFrame({"question": ["q1", "q2"], "answer": ["a1", "a2"], "generation": ["g1", "g2"],
                           "fact_recall": recall, "prob": [0.5, 0.5]})
        return df.assign(answer_class=classes) if classes else df

    base = Row({"Kept fact recall": 1.0}, {"forget": frame([1.0, 1.0]), "neighbours": frame([1.0, 0.0])})
    edited = Row({"Retain cost": 0.0, "Retain broken": 0.0},
                 {"forget": frame([0.0, 1.0], ["degenerate", "kept"]), "neighbours": frame([1.0, 1.0])})
    session = Session()
    report = Report("real-knowledge", "s", "knowledge", {"Base": base, "Edited": edited}, 1.0,
                    n_examples={"forget": 2, "neighbours": 2})
    session.edit = type("E", (), {"timings": {"total": 6.2}})()
    remember(session, session.edit, report, True)  # all examples
    card = result_card(session)
    # the one answer that no longer states its fact is degenerate: broken, not forgotten
    assert "Forgot <b>0 of the 2</b> forget facts it knew · <b>1</b> broke into degenerate text" in card
    assert "kept <b>1 of 1</b>" in card
    assert "6.2 s" in card and "Retain set intact: no retain metric fell" in card and "before: g1" in card
    assert "1 degenerate text" in card and "not counted as forgetting" in card  # what the answers became
    assert "Counted on all the split" in card and "the 2 forget and 1 other facts" in card
    edited.metrics.update({"Retain cost": 0.1, "Kept fact recall": 0.9})  # at the line: held, named
    assert "Retain set held: Kept fact recall fell 10% (more than 10% counts as broken)" in result_card(session)
    edited.metrics.update({"Retain broken": 1.0, "Retain cost": 0.3})
    assert "The retain set broke" in result_card(session)
    # a later, smaller sample does not replace the whole split's verdict; a new edit's does
    sample = Report("real-knowledge", "s", "knowledge", {"Base": base, "Edited": edited}, 1.0,
                    n_examples={"forget": 1, "neighbours": 1})
    remember(session, session.edit, sample, False)
    assert "Counted on all the split" in result_card(session)
    session.edit = type("E", (), {"timings": {"total": 5.0}})()
    remember(session, session.edit, sample, False)
    assert "A sample of 1 questions per set" in result_card(session) and "95% intervals" in result_card(session)


def test_the_first_verdict_states_the_forget_side_and_says_the_kept_facts_follow():
    """The card's first step (a forget-stage report: the forget answers alone) counts the
    forget facts, broken ones apart, says the kept facts are being counted, and never
    replaces a card of the same edit; the whole card then replaces it."""
    import pandas as pd

    from components.compare_panel import remember, result_card
    from components.server.session import Session
    from grom.eval.report import Report, Row

    def frame(recall, classes=None):
        df = pd.DataFrame({"question": ["q1", "q2", "q3"], "answer": ["a1", "a2", "a3"],
                           "generation": ["g1", "g2", "g3"], "fact_recall": recall})
        return df.assign(answer_class=classes) if classes else df

    base = Row({}, {"forget": frame([1.0, 1.0, 1.0]), "neighbours": frame([1.0, 1.0, 0.0])})
    first = Report("real-knowledge", "s", "knowledge",
                   {"Base": base, "Edited": Row({}, {"forget": frame([0.0, 0.0, 1.0],
                                                                   ["fluent", "degenerate", "kept"])})},
                   1.0, n_examples={"forget": 3, "neighbours": 3}, stage="forget")
    session = Session()
    session.edit = type("E", (), {"timings": {"total": 2.5}})()
    remember(session, session.edit, first, True)
    card = result_card(session)
    assert "Forgot <b>1 of the 3</b> forget facts it knew · <b>1</b> broke into degenerate text" in card
    assert "the facts it kept: counting…" in card and "rc-pending" in card
    assert "the 3 forget facts the unedited model stated" in card and "Retain set" not in card
    whole = Report("real-knowledge", "s", "knowledge",
                   {"Base": base, "Edited": Row({"Retain cost": 0.0, "Retain broken": 0.0},
                                                {"forget": frame([0.0, 0.0, 1.0], ["fluent", "degenerate", "kept"]),
                                                 "neighbours": frame([1.0, 0.0, 0.0])})},
                   1.0, n_examples={"forget": 3, "neighbours": 3}, stage="answers")
    remember(session, session.edit, whole, True)
    card = result_card(session)
    assert "kept <b>1 of 2</b>" in card and "rc-pending" not in card
    remember(session, session.edit, first, True)  # a late first verdict does not undo the whole card
    assert "kept <b>1 of 2</b>" in result_card(session)


def test_a_first_verdict_cut_short_does_not_call_its_unstated_answers_forgotten():
    """A first verdict with answers not read in full (column "cut": read as far as they agree
    with the unedited answers, or within FIRST_VERDICT_BUDGET tokens): an answer that stated
    its fact is final; the others may state it later or break once read in full (on
    SmolLM2, 6 of 8 verdicts read to 24 tokens counted differently), so the card says "not
    stated so far", not "Forgot", and gives no classes until the whole card."""
    import pandas as pd

    from components.compare_panel import remember, result_card
    from components.server.session import Session
    from grom.eval.report import Report, Row

    def frame(recall, cut=None):
        df = pd.DataFrame({"question": ["q1", "q2", "q3"], "answer": ["a1", "a2", "a3"],
                           "generation": ["g1", "g2", "g3"], "fact_recall": recall,
                           "answer_class": ["fluent" if r == 0 else "kept" for r in recall]})
        return df.assign(cut=cut) if cut is not None else df

    base = Row({}, {"forget": frame([1.0, 1.0, 1.0]), "probes": frame([1.0, 1.0, 0.0])})
    edited = Row({}, {"forget": frame([0.0, 0.0, 1.0], [True, True, False]),
                      "probes": frame([0.0, 1.0, 0.0], [True, False, True])})
    first = Report("real-knowledge", "s", "knowledge", {"Base": base, "Edited": edited}, 1.0,
                   n_examples={"forget": 3, "probes": 3}, stage="forget")
    session = Session()
    session.edit = type("E", (), {"timings": {"total": 2.5}})()
    remember(session, session.edit, first, True)
    card = result_card(session)
    assert "<b>2 of the 3</b> forget facts it knew not stated so far, 1 still stated" in card, card
    assert "Forgot" not in card and "forgot" not in card and "The forget answers now" not in card, card
    assert "<b>1 of the 2</b> it knew not stated so far, 1 still stated" in card, card
    assert "g1 … (still being read)" in card and "g3 … (still" not in card, card  # the answers not read in full


def test_the_card_puts_the_held_out_probes_beside_the_fitted_questions():
    import pandas as pd

    from components.views.card import probe_line
    from grom.eval.report import Report, Row

    def frame(recall):
        return pd.DataFrame({"question": [f"q{i}" for i in range(len(recall))], "fact_recall": recall})

    base = Row({}, {"forget": frame([1.0, 1.0, 1.0, 0.0]), "probes": frame([1.0, 1.0, 1.0, 1.0, 0.0])})
    edited = Row({}, {"forget": frame([0.0, 0.0, 0.0, 0.0]), "probes": frame([0.0, 1.0, 1.0, 1.0, 1.0])})
    report = Report("real-knowledge", "s", "knowledge", {"Base": base, "Edited": edited}, 1.0,
                    n_examples={"forget": 4, "probes": 5})
    line = probe_line(report, whole=True)  # 3 of 3 fitted forgotten, 1 of the 4 known probes
    assert "forgot **1 of the 4** it knew (25%, against 100% of the fitted ones)" in line, line
    assert "95%" in probe_line(report, whole=False)
    del base.examples["probes"], edited.examples["probes"]
    assert probe_line(report, whole=True) == ""


def test_the_real_models_first_comparison_counts_every_example_of_a_small_split():
    from types import SimpleNamespace

    from components.studio.comparison import SAMPLE_EXAMPLES, covers_split, default_examples

    small = SimpleNamespace(eval_sets={"forget": [0] * 27, "neighbours": [0] * 43, "general": [0] * 16})
    big = SimpleNamespace(eval_sets={"forget": [0] * 40, "retain": [0] * 400})
    assert default_examples(small, real=True) == 45 and covers_split(small, 45) and covers_split(small, 43)
    assert not covers_split(small, 40) and covers_split(big, None) and not covers_split(big, 200)
    assert default_examples(big, real=True) == SAMPLE_EXAMPLES and default_examples(small, real=False) == 20
    assert default_examples(None, real=True) == SAMPLE_EXAMPLES  # no benchmark yet: a sample
    plain = SimpleNamespace(eval_sets={}, forget=[0] * 7, retain=[0] * 3)
    assert default_examples(plain, real=True) == 10 and covers_split(plain, 7)


def test_the_wilson_interval_brackets_a_sample_share():
    from components.views.card import wilson

    lo, hi = wilson(9, 9)
    assert 0.65 < lo < 0.72 and hi == 1.0  # 9 of 9 forgotten says little more than "most"
    lo, hi = wilson(0, 0)
    assert (lo, hi) == (0.0, 1.0)
    lo, hi = wilson(25, 50)
    assert lo < 0.5 < hi and hi - lo < 0.3


def test_edit_config_from_widgets():
    cfg = edit_config(WIDGETS, n_layers=6)
    assert cfg.layers == (3, 4, 5) and cfg.beta == 150.0 and cfg.beta_relative and cfg.batch_size == 32
    auto = edit_config(WIDGETS | dict(band_mode="suggested"), n_layers=6)
    assert auto.layers is None and auto.k == 3  # run_edit picks the band from S_l
    head = edit_config(WIDGETS | dict(matrix="lm_head", preset="zsre"), n_layers=6)
    assert head.layers is None and head.key_mode == "subject_last"  # the preset's hidden fields


@pytest.mark.parametrize("change,message", [
    (dict(beta=-1.0), "out of range"), (dict(rho=0.0), "out of range"), (dict(w_r=float("nan")), "out of range"),
    (dict(band_text="4-9"), "outside the model"), (dict(band_text=""), "empty"),
    (dict(band_text="a-b"), "write layers as"), (dict(k=7, band_mode="suggested"), "band width"),
    (dict(batch_size=0), "batch size"), (dict(target="erase"), "target must be"),
])
def test_edit_config_rejects_bad_values_with_a_message(change, message):
    with pytest.raises(UserError, match=message):
        edit_config(WIDGETS | change, n_layers=6)


def test_parse_band_and_presets():
    assert parse_band("3-5", 6) == (3, 4, 5) and parse_band("1, 3 5", 6) == (1, 3, 5)
    values = fill_preset("tofu10")
    assert values[1] == 65.0 and values[-3:] == ["manual", "11-15", 5]
    assert len(retain_subset(range(100), 10, 0)) == 10 and len(retain_subset(range(5), 10, 0)) == 5


def test_sources_are_the_demo_hub_ids_or_allowed_folders(tmp_path, monkeypatch):
    assert allowed_source("demo", "model") == "demo"
    assert allowed_source("org/some-model", "model") == "org/some-model"
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path))
    (tmp_path / "mine").mkdir()
    assert allowed_source("mine", "model") == str((tmp_path / "mine").resolve())
    (tmp_path / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "deep" / "er")  # relative paths never depend on the server's cwd
    assert allowed_source("./mine", "model") == str((tmp_path / "mine").resolve())
    assert allowed_source("assets/demo-full", "model").endswith("assets/demo-full")
    for bad, message in [("/etc", "outside"), ("../../etc", "outside"), ("a/b/c/../..", "does not exist"),
                         ("bad id!", "neither"), ("", "Type a model")]:
        with pytest.raises(UserError, match=message):
            allowed_source(bad, "model")


def test_baseline_settings_defaults_and_data_checks():
    from components import baseline_panel as bp
    from components.server.session import ModelKey
    from components.studio.comparators import check_request, row_of
    from grom.data.schema import Benchmark, QAExample

    assert row_of("SimNPO").name == "simnpo" and row_of("ga").name == "ga"
    with pytest.raises(UserError, match="Unknown baseline"):
        row_of("sgd")
    assert bp.defaults_of("npo", ModelKey("demo", "cpu", "float32"))[0] == 1e-3
    assert bp.defaults_of("npo", ModelKey("org/model", "cuda", "bfloat16"))[0] == 1e-5  # the recipe's
    from components.server.session import Session

    mine = Session()
    mine.model_key = ModelKey("org/model", "cpu", "float32")
    lr, epochs = bp.on_method_change("npo", mine)  # the session's model, whatever was loaded last
    assert (lr["value"], epochs["value"]) == (1e-5, 10)
    from grom.methods.trained.starting_points import MODEL_DEFAULTS
    smol = ModelKey("smollm2-135m-instruct", "cpu", "float32")
    row = next(r for r in MODEL_DEFAULTS if r.family == "smollm2").methods["simnpo"]
    assert bp.defaults_of("simnpo", smol) == (row.lr, row.epochs)
    qa = (QAExample("q?", "a."),)
    bench = Benchmark("mine", "forget", qa, qa)
    assert check_request("npo", bench, 10, 1e-5)[1:] == (10.0, 1e-5)
    for epochs, lr, message in [(0, 1e-3, "Epochs"), (float("nan"), 1e-3, "Epochs"), (1, 0.0, "Learning rate"),
                                (1, None, "Learning rate"), (1000, 1e-3, "Epochs")]:
        with pytest.raises(UserError, match=message):
            check_request("npo", bench, epochs, lr)
    no_retain = Benchmark("mine", "forget", qa, ())
    check_request("ga", no_retain, 1, 1e-5)  # GA has no retain term
    with pytest.raises(UserError, match="no retain examples: choose GA"):
        check_request("npo", no_retain, 1, 1e-5)
    odd = Benchmark("odd", "forget", ("not an example",), qa)
    with pytest.raises(UserError, match="no question/answer or text examples"):
        check_request("simnpo", odd, 1, 1e-5)


def test_a_registered_method_is_offered_and_checked_with_no_ui_change():
    """A new baseline is its loss and its registry row: the panel lists it, labels it,
    checks its needs (here a random-label-like method with no retain term; the library's
    tests train one)."""
    import gradio as gr
    import torch

    from components import baseline_panel as bp
    from components.studio.comparators import check_request, row_of
    from grom.data.schema import Benchmark, QAExample
    from grom.methods import LossInputs, Method, register_method, unregister_method

    def random_label(x: LossInputs):
        loss = torch.log1p(x.forget_nll / x.forget_counts.clamp(min=1)).mean()  # toward any other token
        return loss, {"forget": loss}

    register_method(Method("random-label", "RandomLabel", random_label, "Pushes each answer toward noise."), order=999)
    try:
        assert ("RandomLabel: Pushes each answer toward noise (trained method)", "random-label") in bp.method_choices()
        assert bp.method_choices()[-1][1] == "random-label"  # its order, 999: after every other method
        with gr.Blocks():
            panel = bp.build_baseline_panel()
        assert "random-label" in [value for _, value in panel.method.choices]
        assert row_of("RandomLabel").name == "random-label"
        check_request("random-label", Benchmark("mine", "forget", (QAExample("q?", "a."),), ()), 1, 1e-3)
    finally:
        unregister_method("random-label")
    with pytest.raises(UserError, match="Unknown baseline"):
        row_of("random-label")


def test_baseline_table_puts_the_models_side_by_side():
    from components.baseline_panel import table_frame

    rows = [("Base", {"Final score": 0.37, "Forget prob": 0.99, "Model utility": 0.75, "Retain prob": 0.9}, None),
            ("GROM", {"Final score": 0.58, "Forget prob": 0.25, "Model utility": 0.76, "Retain prob": 0.9}, 5.0),
            ("NPO", {"Final score": 0.5, "Forget prob": 0.5, "Model utility": 0.7, "Retain prob": 0.8}, 120.0)]
    df = table_frame(rows, 5.0, "tofu")
    assert list(df.columns) == ["metric", "Base", "GROM", "NPO", "goal"]
    assert list(df["metric"]) == ["Time of update", "× GROM's time", "Final score", "Forget prob",
                                  "Retain prob", "Model utility"]
    assert list(df.iloc[1, 1:4]) == ["", "1.0×", "24×"] and df.iloc[0, 3] == "120.0 s"
    assert list(df["goal"])[2:4] == ["↑", "↓"]


def test_layer_scores_are_cached_per_model_data_and_config(monkeypatch):
    from components.server.session import ModelHandle, ModelKey
    from components.studio import scores as lp
    from grom import EditConfig
    from grom.data.schema import QAExample

    calls = []
    monkeypatch.setattr(lp, "compute_scores", lambda key, f, r, config, progress: calls.append(config) or object())
    handle = ModelHandle(ModelKey("demo", "cpu", "float32"), None, None, 0.0)
    forget, retain = [QAExample("q", "a")], [QAExample("r", "b"), QAExample("s", "c")]
    first = lp.cached_scores(handle, forget, retain, EditConfig(seed=0), None)
    assert lp.cached_scores(handle, list(forget), list(retain), EditConfig(seed=0), None) is first
    assert len(calls) == 1
    assert lp.cached_scores(handle, forget, retain[:1], EditConfig(seed=0), None) is not first
    assert lp.cached_scores(handle, forget, retain, EditConfig(seed=1), None) is not first
    other = ModelHandle(handle.key, None, None, 0.0)  # a reloaded model starts empty
    assert lp.cached_scores(other, forget, retain, EditConfig(seed=0), None) is not first
    assert len(calls) == 4
    for i in range(lp.SCORES_CACHE_SIZE + 3):
        lp.cached_scores(handle, forget, retain, EditConfig(seed=10 + i), None)
    assert len(handle.scores_cache) == lp.SCORES_CACHE_SIZE


def test_metric_values_keep_tiny_p_values_readable():
    from components.views.tables import format_metric

    assert format_metric(0.58034) == "0.580" and format_metric(0.0) == "0.000"
    assert format_metric(5.8e-14) == "5.8e-14" and format_metric(-100.0) == "-100.000"
    assert format_metric(None) == "" and format_metric(float("nan")) == ""


def test_a_benchmark_split_suggests_its_preset():
    from components.studio.benchmarks import preset_for, preset_note

    assert preset_for("demo", "forget10") == "demo" and preset_for("demo", "forget01") == "demo-forget01"
    assert preset_for("tofu", "forget05") == "tofu10" and preset_for("custom", "") == "(custom)"
    assert preset_for("real-knowledge", "the-solar-system") == "smollm2"
    assert "10x" in preset_note("tofu", "forget01") and preset_note("demo", "forget01") == ""


def test_a_preset_or_benchmark_that_does_not_fit_the_model_is_adapted_and_said():
    """The demo benchmark on SmolLM2 takes SmolLM2's preset (not the demo's band 3-5 and
    relative beta 150), and the benchmark line says the model cannot know its facts."""
    from components.server.allowed_sources import DEMO, REAL
    from components.studio.benchmarks import fit_note, preset_for

    assert preset_for("demo", "forget10", REAL) == "smollm2" and preset_for("demo", "forget01", DEMO) == "demo-forget01"
    assert preset_for("real-knowledge", "the-solar-system", DEMO) == "demo"
    assert preset_for("tofu", "forget10", DEMO) == "demo"  # tofu10's band 11-15 is not in the demo's 6 layers
    assert preset_for("tofu", "forget10", "open-unlearning/tofu_Llama-3.2-1B-Instruct_full") == "tofu10"
    assert preset_for("demo", "forget10", "org/other") == "(custom)"
    assert "never saw the demo's invented authors" in fit_note("demo", REAL)
    assert "knows none of these real facts" in fit_note("real-knowledge", DEMO)
    assert fit_note("demo", DEMO) == fit_note("real-knowledge", REAL) == fit_note("tofu", REAL) == ""


def test_a_baseline_that_did_not_forget_is_said_so_and_not_timed_against_grom():
    from components import baseline_panel as bp
    from grom.data.schema import Benchmark  # noqa: F401  (the panel's data types load)

    base = {"Forget fact recall": 1.0, "Kept fact recall": 1.0}
    assert "did not forget" in bp.did_not_forget(base, {"Forget fact recall": 0.95})
    assert "rose" in bp.did_not_forget({"Forget prob": 0.44, "Forget ROUGE-L": 0.444},
                                       {"Forget ROUGE-L": 0.612})
    assert bp.did_not_forget(base, {"Forget fact recall": 0.5}) == ""
    assert bp.did_not_forget({}, {}) == ""

    class FakeEdit:
        timings, info = {"total": 266.0}, {"steps": 10}

    failed = bp.did_not_forget(base, {"Forget fact recall": 1.0})
    text = bp.summary_md("simnpo", {"epochs": 10, "lr": 1e-5}, FakeEdit(), 4.8, {}, 10, "", failed)
    assert "did not forget" in text and "as long" not in text and "4.8 s" in text
    text = bp.summary_md("simnpo", {"epochs": 10, "lr": 1e-5}, FakeEdit(), 4.8, {}, 10, "")
    assert "55×" in text  # a baseline that forgot is timed against GROM


def test_every_table_downloads_as_csv_and_json(tmp_path, monkeypatch):
    import pandas as pd

    from components.studio import downloads
    from grom.eval.report import BASE, EDITED, Report, Row

    monkeypatch.setattr(downloads, "upload_folder", lambda: tmp_path)
    frame = pd.DataFrame({"metric": ["Forget fact recall"], "Base": ["1.000"], "Edited": ["0.000"]})
    csv, js = downloads.table_files(frame, "compare metrics/1")
    assert csv.endswith("compare-metrics-1.csv") and pd.read_csv(csv).iloc[0]["Edited"] == 0.0
    assert json.loads(Path(js).read_text())[0]["metric"] == "Forget fact recall"
    assert downloads.table_files({"headers": ["a"], "data": [[1]]}, "x") is not None  # gradio's form
    assert downloads.table_files(pd.DataFrame(columns=["a"]), "empty") is None
    answers = pd.DataFrame({"question": ["q?"], "answer": ["a."], "generation": ["b."], "fact_recall": [0.0]})
    report = Report("real-knowledge", "the-solar-system", "knowledge",
                    {BASE: Row({"Forget fact recall": 1.0}, {"forget": answers}),
                     EDITED: Row({"Forget fact recall": 0.0}, {"forget": answers})}, 1.0)
    paths = downloads.report_files(report, "real-knowledge-the-solar-system")
    assert [Path(p).suffix for p in paths] == [".csv", ".csv", ".json"]
    rows = pd.read_csv(paths[1])
    assert list(rows["model"]) == [BASE, EDITED] and list(rows.columns[:2]) == ["model", "set"]
    assert json.loads(Path(paths[2]).read_text())["rows"][EDITED]["metrics"]["Forget fact recall"] == 0.0


def test_the_attack_summary_says_what_ran_and_what_could_not():
    """Quantization's `skipped` lists the modules it left alone (the head): that attack ran;
    a probe type that could make no probe did not, and says why."""
    import math

    from components.attack_panel import summary_md
    from grom.robustness import AttackResult

    results = {"GROM": {
        "heldout": AttackResult("heldout", 1.0, 0.53, 1.0, 15),
        "quant4": AttackResult("quant4", 0.67, 0.2, 1.0, 15, details={"skipped": ["lm_head"]}),
        "reverse": AttackResult("reverse", math.nan, math.nan, 0.0, 0, details={"skipped": "no subject"})}}
    text = summary_md(results, ("heldout", "quant4", "reverse"))
    assert "from **1.00** to **0.53** (the edit removed 47% of it)" in text
    assert "4-bit quantization not run" not in text and "Reverse query not run: no subject" in text
    assert ("Worst attack: **4-bit quantization**, recall **0.20** (base 0.67), no higher than the plain "
            "probes' 0.53: no attack brought recall back.") in text  # SmolLM2's relearning read "worst" alone
    results["GROM"]["paraphrase"] = AttackResult("paraphrase", 0.67, 0.6, 1.0, 15)
    assert ("Worst attack: **Paraphrase**, recall **0.60** (base 0.67), above the plain probes' 0.53: it brought "
            "back 0.07.") in summary_md(results, ("heldout", "quant4", "reverse", "paraphrase"))
    results["GROM"] |= {"multi_hop": AttackResult("multi_hop", 0.8, 0.8, 1.0, 5),
                        "alias": AttackResult("alias", math.nan, math.nan, 0.0, 0, details={"skipped": "none"})}
    text = summary_md(results, ("heldout", "quant4", "reverse", "paraphrase", "multi_hop", "alias"))
    assert "Worst attack: **Paraphrase**" in text  # other questions: not read against the plain probes
    assert ("Questions written to reach the same facts another way (other questions, so read them against "
            "their own base): multi-hop 0.80 → 0.80 (5 questions).") in text
    assert "Alias (another name) not run: none." in text


def test_the_relearning_sentence_gives_the_lr_the_control_and_warns_when_the_control_falls():
    """The lr and whether it was calibrated for the model; the unedited model's curve beside
    the edit's; a warning where the fine-tune alone cost the unedited model more than the
    tolerance (world-war-ii on SmolLM2: 1.00 -> 0.71 at 1e-5), none where it did not."""
    from components.attack_panel import relearn_md
    from grom.robustness import AttackResult

    def result(control, calibrated=True):
        return AttackResult("relearn", control[-1], 0.21, 1.0, 14, details={
            "steps": [0, 5, 10], "recall": [0.43, 0.29, 0.21], "base_recall": control, "lr": 1e-5,
            "lr_calibrated": calibrated, "n_train": 9})

    text = relearn_md(result([1.0, 0.79, 0.71]))
    assert text.startswith("Relearning (lr 1e-05, calibrated for this model) on 9 fitted questions: "
                           "0 steps 0.43, 5 steps 0.29, 10 steps 0.21.")
    assert "The unedited model relearned the same way: 0 steps 1.00, 5 steps 0.79, 10 steps 0.71." in text
    assert "cost the unedited model 0.29 of its recall" in text
    quiet = relearn_md(result([1.0, 0.93, 1.0], calibrated=False))
    assert "not calibrated for this model" in quiet and "⚠" not in quiet


# ----------------------------------------------------------------------------- issue 37, item 7: stale words


def test_the_model_panel_describes_the_loaded_model_not_the_demo(monkeypatch):
    from components import model_panel as mp
    from components.server.allowed_sources import DEMO, REAL
    from components.server.session import REGISTRY, ModelKey, Session

    real = mp.model_intro(REAL)
    assert "Loaded: **SmolLM2-135M-Instruct**, a real chat model" in real
    assert "Or pick the demo" in real and "trained on fictitious authors (seconds" not in real
    assert "Loaded: **the bundled demo**" in mp.model_intro(DEMO)
    assert "Loaded: `org/model`" in mp.model_intro("org/model", "org/model")
    session = Session()
    session.model_key = ModelKey(REAL, "cpu", "float32")
    monkeypatch.setattr(REGISTRY, "peek", lambda key: SimpleNamespace(key=key))
    assert mp.on_model_intro(session) == real  # after a load: the session's model


def test_the_baseline_placeholder_quotes_the_hosts_pace(monkeypatch):
    """Its time per epoch on the loaded model and data at the pace this server measured (not
    a constant from another machine), and nothing where it cannot say (no model, no data)."""
    from components import baseline_panel as bp
    from components.server import durations as D
    from components.server import pace
    from components.server.model_choices import ensure_model, model_key
    from components.server.session import ModelKey
    from grom.data import load_benchmark

    handle = ensure_model(model_key("demo", "cpu", "float32"))
    bench = load_benchmark("demo", "forget01")
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    monkeypatch.setattr(pace, "load_now", lambda handle, calibration: 1.0)
    pace.PACE.calibrated(handle.key, pace.Calibration(D.wall_rate(handle.model), 0.0, 0.0))
    plain = "Pick a method and press **Train the baseline and compare**."
    assert bp.placeholder(handle.key) == plain  # no data: nothing to count
    assert bp.placeholder(ModelKey("org/model", "cpu", "float32"), bench) == plain  # not loaded
    epoch, npo = (bp.training_seconds(handle, bench, m, 1) for m in ("simnpo", "npo"))
    assert 0 < epoch < bp.training_seconds(handle, bench, "simnpo", 10)
    line = bp.on_baseline_model(SimpleNamespace(model_key=handle.key, benchmark=bench))
    assert line.startswith(plain[:-1]) and f"SimNPO here now: about {epoch:.0f} s per epoch" in line
    pace.PACE.record(handle.key, "train:simnpo", 1.0, 4.0)  # SimNPO ran 4x slower than priced
    assert bp.training_seconds(handle, bench, "simnpo", 1) == pytest.approx(4 * epoch)
    assert bp.training_seconds(handle, bench, "npo", 1) == pytest.approx(4 * npo)  # the trainings' pace
    assert bp.training_seconds(handle, bench, "rome", 5) is None  # an editor trains nothing


def test_a_baselines_training_says_its_estimate_and_is_timed_into_the_pace(monkeypatch):
    from components import baseline_panel as bp
    from components.server import pace
    from components.server.model_choices import ensure_model, model_key
    from grom.data import load_benchmark

    handle = ensure_model(model_key("demo", "cpu", "float32"))
    bench = load_benchmark("demo", "forget01")
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    said = []
    with bp.paced_training(handle.key, bench, "npo", 2, lambda f, m: said.append((f, m))):
        sum(range(100_000))  # some work to time
    assert said and said[0][0] == 0.0 and said[0][1].startswith("NPO: about ") and "of training here now" in said[0][1]
    assert pace.PACE.kinds[handle.key, "train:npo"].jobs == 1
    with bp.paced_training(handle.key, bench, "rome", 5, lambda f, m: said.append((f, m))):
        pass  # an editor: no estimate, nothing recorded
    assert len(said) == 1 and (handle.key, "train:rome") not in pace.PACE.kinds


def test_the_epochs_note_says_default_only_while_the_box_holds_it():
    from components import baseline_panel as bp
    from components.server.allowed_sources import REAL
    from components.server.session import ModelKey

    session = SimpleNamespace(model_key=ModelKey(REAL, "cpu", "float32"))
    lr, epochs = bp.on_method_change("simnpo", session)
    assert lr["info"] == epochs["info"] == "this model's default"
    d_lr, d_epochs = bp.defaults_of("simnpo", session.model_key)
    e_note, l_note = bp.on_setting_change("simnpo", d_epochs + 3, d_lr, session)
    assert e_note["info"] == f"this model's default: {d_epochs:g}" and l_note["info"] == "this model's default"
    e_note, _ = bp.on_setting_change("simnpo", d_epochs, d_lr, session)  # typed back
    assert e_note["info"] == "this model's default"
    steps, _ = bp.on_setting_change("rome", 99, 0.5, session)  # an editor: its value steps
    assert steps["info"].startswith("ROME's default: ")  # not fitted to the model
    assert bp.default_note("abc", 5) == "this model's default: 5"  # a box being typed in


def _values(preset: str, **change) -> dict:
    from components.studio import form

    values = dict(zip(form.PRESET_FILLED, form.preset_values(preset)))
    return {name: values[name] for name in form.PRESET_FIELDS} | change


def test_the_preset_box_names_a_preset_exactly_when_the_values_are_its_own():
    from components.edit_panel import on_form_change
    from components.studio import form

    fields = form.PRESET_FIELDS
    by_hand = lambda current, v: on_form_change(current, *[v[f] for f in fields])  # noqa: E731
    assert by_hand("smollm2", _values("smollm2")) == "smollm2"
    for change in (dict(beta=80.0), dict(w_r=300.0), dict(rho=0.01), dict(k=4)):
        assert by_hand("smollm2", _values("smollm2", **change)) == form.CUSTOM, change
    assert by_hand(form.CUSTOM, _values("smollm2")) == "smollm2"  # typed back: named again
    assert by_hand(form.CUSTOM, _values("smollm2", band_text="25-29")) == "smollm2"  # suggested: no band text
    assert by_hand("demo", _values("demo", band_text="3,4,5")) == "demo"  # the same band, written out
    assert by_hand("demo", _values("demo", band_text="2-4")) == form.CUSTOM
    assert by_hand("wmdp-bio", _values("wmdp-bio", c=50.0)) == form.CUSTOM  # c is the corruption's setting
    assert by_hand("smollm2", _values("smollm2", c=50.0)) == "smollm2"  # and no other's
    assert by_hand("demo-forget05", _values("demo")) == "demo"


def test_a_restored_run_names_its_preset_as_typed_values_do():
    """An import or a history row with the preset's very values names it (it said "(custom)"
    before, while the same values typed by hand said "smollm2"); changed values, or a hidden
    setting the preset does not have, give "(custom)"."""
    from components.studio import form
    from components.studio.runs import run_record
    from grom import PRESETS

    def restored(config, mode="suggested", band=(25, 26, 27, 28, 29), k=5):
        run = run_record("smollm2-135m-instruct", "real-knowledge/the-solar-system", "", 128, 0, 128,
                         "smollm2", mode, k, band)
        return dict(zip(form.RESTORED, form.restore_values(config.to_dict(), run, 30)))["preset"]

    config = PRESETS["smollm2"].replace(layers=(25, 26, 27, 28, 29))
    assert restored(config) == "smollm2"
    assert restored(config.replace(beta=80.0)) == form.CUSTOM
    assert restored(config.replace(max_length=256)) == form.CUSTOM  # no widget holds it: not the preset's edit
    assert restored(config.replace(key_mode="qa")) == "smollm2"  # the answer tokens, as "auto" reads questions
    assert restored(config, mode="manual") == form.CUSTOM  # a fixed band is not the preset's suggested one
    tofu = PRESETS["tofu10"]
    assert restored(tofu, mode="manual", band=tofu.layers, k=5) == "tofu10"
    zsre = PRESETS["zsre"]
    assert restored(zsre, band=(), k=5) == "zsre"  # its hidden key_mode is the preset's


def test_plot_titles_sit_below_the_toolbar():
    """Plotly's toolbar appears at a figure's top right on hover (on a phone, on a tap): every
    title starts below its strip, with room for it in the top margin."""
    S = [0.1, 0.5, 0.9, 0.2]
    pts = {f"{p}_{w}": np.zeros((3, 2)) + i for i, (p, w) in
           enumerate((p, w) for p in ("forget", "retain") for w in ("before", "after"))}
    figures = [plots.plot_layer_scores(S, S, S, [1, 2]), plots.plot_layer_scores(S, S, S, [1], show_parts=True),
               plots.plot_patch_norms(["a"], [1.0], [0.1]), plots.plot_pca(pts, [0.6, 0.3]),
               plots.plot_influence(np.array([0.1, 0.2]), ["q1", "q2"]),
               plots.plot_sweep(["base", "β 1"], [0.9, 0.5], [0.9, 0.8], "f", "r", current=1),
               plots.plot_tradeoff([0.5], [0.9], ["#1: x"], x_title="x", y_title="y", note="a note"),
               plots.plot_attacks(["heldout"], {"Base": [1.0], "GROM": [0.2]}),
               plots.plot_logit_lens([0, 1], {"Base": [0.1, 0.2]}, [1])]
    for fig in figures:
        title = fig.layout.title
        assert title.text and title.yref == "container" and title.yanchor == "top", title
        assert title.pad.t >= plots.MODEBAR_PX and fig.layout.margin.t >= plots.MODEBAR_PX + 20
    assert figures[6].layout.margin.t >= plots.MODEBAR_PX + 40  # two lines: the title and its note


def test_the_history_scatter_rings_the_latest_run_only_where_it_is_a_point():
    from components.history_panel import history_figure
    from grom import EditConfig

    def run(n, metrics):
        return {"n": n, "method": "grom", "config": EditConfig(beta=50.0 * n).to_dict(), "run": {"band": [3, 4]},
                "metrics": metrics, "source": "edit"}

    compared = [run(1, {"Forget fact recall": 0.8, "Kept fact recall": 0.99}),
                run(2, {"Forget fact recall": 0.3, "Kept fact recall": 0.9})]
    fig = history_figure(compared)
    assert list(fig.data[1].text) == ["latest: #2"] and fig.data[1].x[0] == 0.3
    # run #3 is just made (its comparison still running) or a sweep point: no ring on #2
    for newest in (run(3, {}), run(3, {"Sweep p(forget)": 0.1, "Sweep p(retain)": 0.9})):
        fig = history_figure(compared + [newest])
        assert [t.name for t in fig.data if t.name == "latest"] == []
        assert "The latest run, #3, has no comparison yet" in fig.layout.title.text


def test_finding_a_loaded_model_waits_for_no_device():
    """A page opening, a kept card and an estimate find the loaded model while another job
    holds the device (`ModelRegistry.get` takes the registry's own lock, not DEVICE_LOCK)."""
    import threading
    import time

    from components.server.device import DEVICE_LOCK
    from components.server.model_choices import ensure_model, model_key
    from components.server.session import REGISTRY

    key = model_key("demo", "cpu", "float32")
    ensure_model(key)
    held, done = threading.Event(), threading.Event()

    def hold():
        with DEVICE_LOCK:
            held.set()
            done.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    held.wait(10)
    try:
        t0 = time.monotonic()
        assert REGISTRY.get(key).key == key and REGISTRY.current is not None and key in REGISTRY.resident()
        assert time.monotonic() - t0 < 1.0
    finally:
        done.set()


def test_landscape_map_blanks_cells_to_come_and_marks_the_current_one_and_the_front():
    from grom.landscape import Cell

    cells = {(10.0, 100.0): Cell(10.0, 100.0, 0.03, {"forget": (15, 9, 12), "probes": (15, 10, 14),
                                                     "neighbours": (48, 40, 47)}),
             (20.0, 100.0): Cell(20.0, 100.0, 0.03, {"forget": (15, 0, 3), "neighbours": (48, 30, 40)})}
    fig = plots.plot_landscape_map([10.0, 20.0, 40.0], [30.0, 100.0], cells, strength="β", forget="forget",
                                   forget_label="fitted", kept=("neighbours", "general"), reading="top",
                                   current=(20.0, 100.0), front=[(20.0, 100.0)])
    heat = fig.data[0]
    assert heat.z[1][0] == pytest.approx(0.2) and heat.z[1][1] == pytest.approx(0.8) and heat.z[0][0] is None
    assert heat.text[0][0] == "…" and heat.text[1][1].startswith("★ fitted gone 12/15")
    assert "kept 40/48" in heat.text[1][1] and "held-out" not in heat.text[1][1]  # a set not read: no line
    assert "words kept" not in heat.text[1][1]  # none read
    assert heat.customdata[1][1] == "20,100" and list(fig.layout.xaxis.ticktext) == ["10", "20", "40"]
    (rect,) = fig.layout.shapes
    assert (rect.x0, rect.x1, rect.y0, rect.y1) == (0.5, 1.5, 0.5, 1.5)  # you are here: (20, 100)
    stated = plots.plot_landscape_map([10.0, 20.0, 40.0], [30.0, 100.0], cells, strength="β", forget="forget",
                                      forget_label="fitted", kept=("neighbours",), reading="stated")
    assert stated.data[0].z[1][0] == pytest.approx(0.4) and not stated.layout.shapes
    json.loads(fig.to_json())


def test_landscape_front_joins_the_front_and_rings_you_are_here():
    fig = plots.plot_landscape_front([(0.0, 0.2), (0.1, 0.8), (0.3, 0.7)], ["a", "b", "c"], ["1,1", "2,1", "3,1"],
                                     front=[1, 0], forget_label="held-out", current=2, preview=(0.05, 0.5, "p"))
    assert list(fig.data[1].x) == [0.0, 0.1] and list(fig.data[1].customdata) == ["1,1", "2,1"]
    assert fig.data[2].x[0] == 0.3 and fig.data[3].marker.symbol == "diamond-open"
    assert "held-out facts gone" in fig.layout.yaxis.title.text


def test_a_landscape_cell_picked_fills_the_edit_form_and_a_cell_not_computed_is_refused():
    from components import landscape_panel as L
    from components.server.session import Session
    from components.studio.form import RESTORED
    from grom import EditConfig
    from grom.landscape import Cell

    session = Session()
    base = EditConfig(beta=65.0, w_r=100.0, rho=0.03, layers=(25, 26, 27, 28, 29))
    held = L.Landscape(base, None, None, None, {"band": [25, 26, 27, 28, 29], "band_mode": "suggested"})
    held.cells[(130.0, 30.0, 0.03)] = Cell(130.0, 30.0, 0.03)
    held.shown = [(130.0, 30.0)]
    session.extra["landscape"] = held
    values = L.on_pick.__wrapped__("130,30", session)
    restored = dict(zip(RESTORED, values))
    assert restored["beta"] == 130.0 and restored["w_r"] == 30.0 and restored["rho"] == 0.03
    assert restored["band_text"] == "25-29" and "landscape cell 130,30" in values[-1]
    assert L.on_row.__wrapped__(SimpleNamespace(index=[0, 3]), session) == values
    for bad in ("260,30", "x" * 100_000, ""):
        with pytest.raises(UserError):
            L.on_pick.__wrapped__(bad, session)
    with pytest.raises(UserError, match="Map the trade-off"):
        L.on_row.__wrapped__(SimpleNamespace(index=[5, 0]), session)
