"""The studio's views without a server (issue 13): the directions the outputs moved along,
checked against numpy and scikit-learn; the layer plot's own panel for F_l and R_l; a band
the model cannot take said inline; the metrics' goals; the retain-size rule; the 4-bit
verdict; the widgets put back after a failed load."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("gradio")

from components.server.session import Session  # noqa: E402
from components.views import plots  # noqa: E402
from grom.closed_form.diagnostics import ExampleOutputs, movement_axes  # noqa: E402


def low_rank_moves(n: int = 60, m: int = 12, seed: int = 0) -> torch.Tensor:
    """(n, m) displacements: a common move, a second direction, a little noise."""
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(m, generator=g, dtype=torch.float64), torch.randn(m, generator=g, dtype=torch.float64)
    a = 3 + torch.randn(n, 1, generator=g, dtype=torch.float64)
    b = torch.randn(n, 1, generator=g, dtype=torch.float64)
    return a * u + b * v + 0.05 * torch.randn(n, m, generator=g, dtype=torch.float64)


def test_movement_axes_are_the_uncentred_principal_directions_of_the_moves():
    from sklearn.decomposition import TruncatedSVD

    D = low_rank_moves()
    axes, share = movement_axes(D, 3)
    _, s, vh = np.linalg.svd(D.numpy(), full_matrices=False)  # by hand
    for i in range(3):
        assert abs(abs(float(axes[i] @ torch.from_numpy(vh[i]))) - 1) < 1e-10
    assert np.allclose(share.numpy(), s[:3] ** 2 / (s ** 2).sum())
    assert share[:2].sum() > 0.99  # two directions hold almost all of this movement
    assert torch.allclose(axes @ axes.T, torch.eye(3, dtype=torch.float64), atol=1e-12)
    svd = TruncatedSVD(n_components=3, algorithm="arpack", random_state=0).fit(D.numpy())
    assert np.allclose(np.abs(svd.transform(D.numpy())), np.abs((D @ axes.T).numpy()), atol=1e-8)
    assert ((D @ axes.T).sum(0) >= 0).all()  # signed so that the summed move points forward
    with pytest.raises(ValueError, match="moved no output"):
        movement_axes(torch.zeros(4, 3))


def test_the_view_shows_forget_outputs_moving_and_retain_outputs_staying():
    """Forget outputs move by 5 along e_0, retain outputs not at all: the first axis is
    e_0, each forget point moves 5 along it, each retain point stays where it was."""
    from components.diagnostics_panel import project, relative_move

    g = torch.Generator().manual_seed(1)
    fb, rb = torch.randn(30, 8, generator=g), torch.randn(50, 8, generator=g)
    move = torch.zeros(8)
    move[0] = 5.0
    fa = fb + move + 0.01 * torch.randn(30, 8, generator=g)
    out = ExampleOutputs(fb, fa, rb, rb.clone())
    points, share, keep = project(out)
    assert share[0] > 0.99 and len(keep["forget"]) == 30 and len(keep["retain"]) == 50
    dx = points["forget_after"][:, 0] - points["forget_before"][:, 0]
    assert np.allclose(dx, 5.0, atol=0.1)
    assert np.allclose(points["retain_after"], points["retain_before"])
    origin = torch.cat([fb, rb]).double().mean(0)
    axis0 = torch.zeros(8, dtype=torch.float64)
    axis0[0] = 1.0
    assert np.allclose(points["retain_before"][:, 0], ((rb.double() - origin) @ axis0).numpy(), atol=0.01)
    by_hand = ((fa - fb).norm(dim=1) / fb.norm(dim=1)).mean()
    assert relative_move(fb, fa) == pytest.approx(float(by_hand))
    fig = plots.plot_pca(points, share)
    assert "movement direction 1 (100% of the movement)" == fig.layout.xaxis.title.text


def test_f_and_r_get_a_panel_of_their_own_below_s():
    S, F, R = [0.1, -0.5, 0.2], [10.0, 12.0, 15.0], [9.9, 12.5, 14.8]
    fig = plots.plot_layer_scores(S, F, R, [0, 1], show_parts=True, suggested=[1, 2])
    bars, f, r = fig.data
    assert bars.yaxis == "y" and f.yaxis == r.yaxis == "y2"  # S_l is not squashed by F_l's scale
    assert fig.layout.yaxis.title.text == "S<sub>l</sub>"
    assert fig.layout.yaxis2.title.text == "F<sub>l</sub>, R<sub>l</sub>"
    alone = plots.plot_layer_scores(S, F, R, [0, 1])
    assert len(alone.data) == 1 and "yaxis2" not in alone.layout.to_plotly_json()


class Scores:
    def __init__(self, S):
        self.S = S
        self.F = [1.0] * len(S)
        self.R = [1.0] * len(S)


def test_a_band_the_model_cannot_take_is_said_inline_and_not_drawn():
    from components.layers_panel import band_text_md, scores_figure, stale_figure
    from components.layers_panel import on_redraw as redraw

    scores = Scores([0.1, -0.8, -0.2, 0.3, 0.4, 0.2])
    text = band_text_md(scores, 3, "manual", "7-9")
    assert "band-problem" in text and "outside the model" in text and "0..5" in text
    assert "Suggested band: 3–5" in text
    fig = scores_figure(scores, 3, "manual", "7-9", False)
    assert set(fig.data[0].marker.color) == {plots.MUTED}  # no band drawn, the suggested outlined
    assert "outside" not in band_text_md(scores, 3, "manual", "3-5")
    assert "whole number" in band_text_md(scores, "", "suggested", "")  # k being typed
    session = Session()
    plot, info = redraw(3, "suggested", "", True, session)  # no scores: say what to press
    assert "Compute layer scores" in info
    assert plot.layout.annotations[0].text == stale_figure().layout.annotations[0].text


def test_goal_arrows_follow_the_metric_definitions():
    from components.views.tables import goal_arrow

    # min(TR, 1/TR) is 1 when the model cannot tell right from wrong answers, but the retain
    # model (the gold standard) does not reach 1: the goal is its value, not up
    assert goal_arrow("Forget truth ratio") == "≈ retain model"
    assert goal_arrow("Retain truth ratio") == "↑"  # mean max(0, 1 - TR): telling right from wrong
    assert goal_arrow("Forget quality") == "↑" and goal_arrow("MIA AUC") == "→ 0.5"
    assert goal_arrow("Text perplexity") == "≈ base" and goal_arrow("Forget answer perplexity") == "↓"
    for kept in ("Neighbour fact recall", "General prob", "Kept fact recall", "Knowledge score",
                 "KnowMem retain", "Real authors ROUGE-L", "Model utility", "Final score"):
        assert goal_arrow(kept) == "↑", kept
    assert goal_arrow("Forget facts known") == "" and goal_arrow("Retain cost") == "→ 0"
    assert goal_arrow("Retain text loss") == "≈ base" and goal_arrow("Forget text loss") == "↑"


def test_the_glossary_names_every_goal_and_the_metrics_of_the_table():
    from components.views.text import GLOSSARY

    for word in ("ROUGE-L", "truth ratio", "Forget quality", "MIA AUC", "Model utility", "Retain cost",
                 "Knowledge score", "≈ retain model", "≈ base", "fact recall"):
        assert word in GLOSSARY, word


def test_the_retain_set_should_be_at_least_the_forget_set_and_twenty():
    from types import SimpleNamespace

    from components.studio.benchmarks import retain_needed, retain_warning

    assert retain_needed(3) == 20 and retain_needed(20) == 20 and retain_needed(55) == 55
    small = SimpleNamespace(forget=[0] * 8, retain=[0] * 3)
    assert "Only 3 retain examples" in retain_warning(small) and "at least 20" in retain_warning(small)
    assert "at least 40" in retain_warning(SimpleNamespace(forget=[0] * 40, retain=[0] * 39))
    assert retain_warning(SimpleNamespace(forget=[0] * 8, retain=[0] * 20)) == ""


def quant_table(base, base4, edited, edited4, retain=(0.9, 0.9, 0.9, 0.88)) -> pd.DataFrame:
    df = pd.DataFrame({"Forget ROUGE-L": [base, base4, edited, edited4], "Retain ROUGE-L": list(retain)},
                      index=["Base, full precision", "Base, 4-bit (rtn)", "Edited, full precision",
                             "Edited, 4-bit (rtn)"])
    return df


def test_the_4_bit_verdict():
    from components.diagnostics_panel import quant_verdict_md
    from grom.eval.quant_check import quantization_verdict

    v = quantization_verdict(quant_table(1.0, 0.98, 0.4, 0.45))
    assert v.survives and v.forget_kept == pytest.approx(0.53 / 0.6) and v.retain_lost == pytest.approx(1 - 0.88 / 0.9)
    back = quantization_verdict(quant_table(1.0, 0.98, 0.4, 0.9))  # the forgetting came back
    assert back.survives is False and back.forget_kept == pytest.approx(0.08 / 0.6)
    broken = quantization_verdict(quant_table(1.0, 0.98, 0.4, 0.4, retain=(0.9, 0.9, 0.9, 0.7)))
    assert broken.survives is False and broken.retain_lost > 0.2
    assert quantization_verdict(quant_table(1.0, 1.0, 0.99, 0.99)).survives is None
    assert "survives 4-bit" in quant_verdict_md(quant_table(1.0, 0.98, 0.4, 0.45))
    assert "does not survive" in quant_verdict_md(quant_table(1.0, 0.98, 0.4, 0.9))


def test_a_benchmark_starts_on_its_default_split():
    from components.benchmark_panel import on_benchmark_change
    from components.page import start_benchmark
    from components.studio.benchmarks import default_split

    assert default_split("demo") == "forget10" and default_split("tofu") == "forget01"
    assert default_split("real-knowledge") == "the-solar-system" and default_split("nope") is None
    assert on_benchmark_change("demo", 0, Session())[0].value == "forget10"
    assert start_benchmark("demo") == ("demo", "forget10")


def test_a_failed_load_puts_back_the_widgets_of_what_is_still_loaded(monkeypatch):
    from types import SimpleNamespace

    from components import model_panel
    from components.benchmark_panel import on_restore_benchmark as restore_benchmark
    from components.server import model_choices as core_models
    from components.server import session as core_session
    from components.server.session import ModelHandle, ModelKey

    key = ModelKey("demo", "cpu", "float32")
    handle = ModelHandle(key, SimpleNamespace(config=None), None, 0.0)
    monkeypatch.setattr(core_session.REGISTRY, "_handles", {key: handle})
    monkeypatch.setattr(model_panel, "n_layers", lambda h: 6)
    monkeypatch.setattr(core_models, "n_layers", lambda h: 6)  # its status line
    session = Session()
    session.model_key = key
    session.extra["model_widgets"] = ("demo", "auto", "auto")
    choice, device, dtype, device_map, max_memory, status = model_panel.on_restore_model(session)
    assert (choice, device, dtype, device_map, max_memory) == ("demo", "auto", "auto", "none", "")
    assert "Still loaded: the bundled demo" in status

    from grom.data import load_benchmark

    session.benchmark, session.bench_label = load_benchmark("demo", "forget05"), "demo/forget05"
    name, split, info = restore_benchmark(session)
    assert name == "demo" and split.value == "forget05" and "Still loaded" in info and "forget05" in info


def test_a_new_page_opens_on_the_apps_start_model_not_the_last_one_loaded(monkeypatch):
    """Two apps in one process (or one app after a visitor loaded another model): a new page
    opens on the model its app was built for, loaded again if it was pushed out."""
    from components import page
    from components.server import model_choices as core_models
    from components.server import session as core_session
    from components.server.session import ModelHandle, ModelKey

    model_key = core_models.model_key
    start = model_key("demo", "cpu", "float32")
    real = core_models.ensure_model(start)
    other = ModelHandle(ModelKey("some/other-model", "cpu", "float32"), real.model, real.tokenizer, 0.0)
    monkeypatch.setattr(core_session.REGISTRY, "_handles", {start: real, other.key: other})
    assert core_session.REGISTRY.current is other  # another visitor's model is the latest
    session = Session()
    out = page.on_page_load(session, start)
    assert session.model_key == start and out[2] == start.shown and session.bench_label == "demo/forget10"

    monkeypatch.setattr(core_session.REGISTRY, "_handles", {other.key: other})  # pushed out
    session = Session()
    page.on_page_load(session, start)
    assert session.model_key == start and core_session.REGISTRY.get(start) is not None


def test_the_server_precomputes_the_first_page_in_the_background(caplog):
    """`build_app(warm=True)` (what `python app.py` runs) computes a new page's layer scores
    with the page's default widgets in a thread, into the caches every page shares."""
    import threading

    import app
    from components.server import model_choices as core_models

    handle = core_models.ensure_model(core_models.model_key("demo", "cpu", "float32"))
    handle.scores_cache.clear()
    with caplog.at_level("INFO", logger="grom.studio"):
        app.build_app(warm=True)
        for thread in threading.enumerate():
            if thread.name == "warm-first-page":
                thread.join(timeout=120)
    assert "first page precomputed" in caplog.text
    assert handle.scores_cache  # the S_l a new demo page asks for is there


QUESTIONS = ["What is the name of the first rocket mission that landed people on the Moon?",
             "Which planet is known as the Red Planet?",
             "What is the name of the first rocket mission that landed people on Mars?",
             "What does NASA stand for?"]


def test_the_influence_bars_are_labelled_with_their_questions():
    """Each bar is named by its question (cut on the axis, whole on hover), largest first;
    two questions cut to the same text stay two bars."""
    shares = np.array([0.30, 0.05, 0.20, 0.10])
    fig = plots.plot_influence(shares, QUESTIONS)
    bar = fig.data[0]
    order = [0, 2, 3, 1]
    assert list(bar.y) == [0.30, 0.20, 0.10, 0.05]
    assert list(bar.customdata) == [QUESTIONS[i] for i in order]  # the hover: the whole question
    ticks = list(fig.layout.xaxis.ticktext)
    assert ticks == [plots.tick_label(QUESTIONS[i]) for i in order]
    assert ticks[0] == ticks[1] == "What is the name of the first r…"  # cut alike, still two bars
    assert list(fig.layout.xaxis.tickvals) == list(bar.x) == [0, 1, 2, 3]
    assert ticks[2:] == ["What does NASA stand for?", "Which planet is known as the Re…"]
    assert not any(t.startswith("#") for t in ticks)
    assert "%{customdata}" in bar.hovertemplate and "of ‖P‖" in bar.hovertemplate
    assert fig.layout.annotations[0].text == "largest" and fig.layout.annotations[0].x == 0
    picked = plots.plot_influence(shares, QUESTIONS, selected=2)
    assert picked.layout.annotations[0].x == 2 and picked.data[0].marker.color[2] == plots.ACCENT


def test_the_sum_under_the_influence_bars():
    from components.diagnostics_panel import shares_md

    line = shares_md(np.array([0.3, 0.4, 0.5]))
    assert "The 3 bars add up to **120%** of ‖P‖, not 100%" in line
    assert "squares add up to 50%" in line  # 0.09 + 0.16 + 0.25
    assert "largest 2 drawn" in shares_md(np.array([0.3, 0.4, 0.5]), top=2)
    assert "**100%**" in shares_md(np.array([1.0])) and "no patch" in shares_md(np.array([1.0]))


def test_the_influence_handler_labels_the_bars_and_sums_every_share(monkeypatch):
    """on_influence end to end with the model work stubbed: the bars carry the forget
    questions, the line under them sums the shares ‖ΔP_i‖ / ‖P‖, the example follows."""
    from types import SimpleNamespace

    from components import diagnostics_panel as panel

    name = "model.layers.3.mlp.down_proj.weight"
    edit = SimpleNamespace(keys={name: None}, layers=[SimpleNamespace(param_name=name, patch_norm=2.0)])
    monkeypatch.setattr(panel, "current_model", lambda s: SimpleNamespace(key=None))
    monkeypatch.setattr(panel, "current_edit", lambda s: edit)
    monkeypatch.setattr(panel, "_influence", lambda key, e, inputs, param: np.array([0.6, 0.1, 0.4, 0.2]))
    session = Session()
    session.extra["edit_inputs"] = ([SimpleNamespace(question=q, answer="a") for q in QUESTIONS], ())
    fig, table, note = panel.on_influence("", session)
    assert list(fig.data[0].customdata) == [QUESTIONS[i] for i in (0, 2, 3, 1)]
    assert list(fig.layout.xaxis.ticktext)[2] == "What does NASA stand for?"
    assert note.startswith("The 4 bars add up to **65%** of ‖P‖")  # (0.6 + 0.1 + 0.4 + 0.2) / 2
    assert "**Rank 1**" in note and QUESTIONS[0] in note
    assert list(table["example"])[0] == QUESTIONS[0]
    note, fig = panel.on_influence_example(3, session)
    assert note.startswith("The 4 bars add up to **65%**") and "**Rank 3**" in note and "NASA" in note


def test_the_influence_panel_says_what_a_bar_means_before_the_theorem():
    import gradio as gr

    from components.diagnostics_panel import build_diagnostics_panel
    from components.views import text

    plain = text.INFLUENCE
    for words in ("left out of the forget set", "shaped the edit most", "more than 100%",
                  "not slices of one whole", "labelled with its question"):
        assert words in plain
    assert "Theorem" not in plain and "Theorem 2" in text.INFLUENCE_MATH
    with gr.Blocks() as page:
        build_diagnostics_panel()
    shown = [b.value for b in page.blocks.values() if isinstance(b, gr.Markdown)]
    assert shown.index(plain) < shown.index(text.INFLUENCE_MATH)
    fold = [b for b in page.blocks.values() if isinstance(b, gr.Accordion) and "Theorem 2" in (b.label or "")]
    assert fold and fold[0].open is False


def test_the_layer_sign_text_says_what_s_l_measures_and_cites_its_evidence():
    from components.views import text

    sign = text.LAYERS_SIGN
    assert "would cost what you keep" not in sign  # a claim the measurements did not bear out
    assert "writes the forget answers' tokens" in sign and "BENCHMARKS.md" in sign
    assert "does not measure" in sign


def test_the_band_line_gives_each_bands_mean_score():
    from components.layers_panel import band_text_md

    scores = Scores([0.1, -0.8, -0.2, 0.3, 0.4, 0.2])
    line = band_text_md(scores, 3, "manual", "0-2")
    assert "layers **0, 1, 2** (mean S = -0.3)" in line and "suggested band 3–5 (mean S = 0.3)" in line
    line = band_text_md(scores, 3, "suggested", "")
    assert "Band (suggested for k = 3): layers **3, 4, 5** (mean S = 0.3)" in line
    assert "suggested band 3–5" not in line  # said once
