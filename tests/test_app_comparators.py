"""Compare's baselines and editors in the studio, driven through the panels' handlers on the
demo model without a server: each run becomes a row of the run history beside GROM's (its
method as the source, its settings, time and metrics; a click on it restores nothing and
says why), the editors are greyed out with the reason where the split has no subjects,
and each method's glossary line sits beside the method box.

A quarter epoch of GA and a 3-step ROME on 10 of the demo's forget01 facts (40 retain
examples), evaluated on 5 examples per set: a few seconds each on one CPU thread.
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest

gr = pytest.importorskip("gradio")

from components import baseline_panel as bp  # noqa: E402
from components import history_panel as hp  # noqa: E402
from components.server.errors import UserError  # noqa: E402
from components.server.model_choices import ensure_model, model_key  # noqa: E402
from components.server.session import Session  # noqa: E402
from components.studio import history as runs_history  # noqa: E402
from components.studio.comparators import check_request, check_sizes, glossary, unavailable  # noqa: E402
from components.studio.form import RESTORED  # noqa: E402
from grom import EditConfig  # noqa: E402
from grom.data.loaders import load_benchmark  # noqa: E402
from grom.data.schema import Benchmark, QAExample  # noqa: E402
from grom.methods import EDITORS, METHODS, get  # noqa: E402

N = 5  # examples per evaluation set
# a TOFU row as the hub gives it (no subject field) that the loader cannot place in a whole
# author's block of 20, so it gets no subject (grom.tasks.tofu.with_authors)
NO_SUBJECT = Benchmark("tofu", "forget01", (QAExample("Who wrote 'The Tides'?", "Jaime Vasquez wrote it."),),
                       (QAExample("What is 2 + 2?", "4."),))


def no_progress(*_, **__):
    return None


@pytest.fixture(scope="module")
def demo_session():
    """A session on the demo model and demo/forget01 (its facts carry their author as
    subject), cut to 10 forget and 40 retain examples: an editor's retain covariance and
    band search read the whole retain set (3560 rows, half a minute on a loaded CPU)."""
    handle = ensure_model(model_key("demo", "cpu", "float32"))
    bench = load_benchmark("demo", "forget01")
    session = Session()
    session.model_key, session.bench_label = handle.key, "demo/forget01"
    session.benchmark = replace(bench, forget=bench.forget[:10], retain=bench.retain[:40])
    return session


def table_of(session: Session) -> tuple[pd.DataFrame, object, str]:
    update, fig = hp.on_show_history(session)
    return pd.DataFrame(update.value["data"], columns=update.value["headers"]), fig, update.label


def test_baseline_and_editor_runs_join_the_history_beside_grom(demo_session):
    session = demo_session
    grom_metrics = {"Final score": 0.7, "Forget fact recall": 0.1, "Retain fact recall": 0.9, "Retain cost": 0.02}
    runs_history.add_row(session, EditConfig(beta=60.0, layers=(3, 4, 5)).to_dict(),
                         {"benchmark": "demo", "split": "forget01", "band": [3, 4, 5]}, 1.5, source="edit",
                         metrics=grom_metrics)  # GROM's row, as its comparison leaves it
    bp.on_run_baseline.__wrapped__("ga", 0.25, 1e-3, N, False, session, progress=no_progress)
    bp.on_run_baseline.__wrapped__("rome", 3, 0.5, N, False, session, progress=no_progress)
    table, fig, label = table_of(session)
    assert list(table["#"]) == [3, 2, 1]  # the newest first
    rome, ga, grom = (table.iloc[i] for i in range(3))
    assert (ga["from"], ga["settings"], ga["β"]) == ("GA", "0.25 epochs, lr 0.001", "")
    assert (rome["from"], rome["settings"]) == ("ROME", "3 value steps, lr 0.5") and rome["band"] != ""
    assert (grom["from"], grom["settings"], grom["β"], grom["band"]) == ("", "", "60", "3-5")
    rows = {r["source"]: r for r in runs_history.history(session)}
    for name in ("GA", "ROME"):  # each row's metrics are its own evaluation's Edited row
        metrics = rows[name]["metrics"]
        assert set(metrics) >= {"Final score", "Forget fact recall", "Retain fact recall"}, metrics
        shown = table[table["from"] == name].iloc[0]
        assert shown["edit s"] > 0 and shown["Forget fact recall"] == round(metrics["Forget fact recall"], 3)
    # the scatter: GROM's point violet, the two others orange diamonds, named on hover
    points = fig.data[0]
    assert list(points.marker.symbol) == ["circle", "diamond", "diamond"]
    assert points.customdata[1].startswith("#2: GA, 0.25 epochs") and points.customdata[0].startswith("#1: β 60")
    # a click on a baseline's row restores nothing and says why; GROM's row restores as before
    out = hp.on_history_select.__wrapped__(SimpleNamespace(index=[1, 0]), session)
    assert len(out) == len(RESTORED) + 1 and all(v == gr.skip() for v in out[:-1])  # every widget left as it is
    assert "not a GROM edit" in out[-1] and "Compare with a baseline" in out[-1] and "#2" in out[-1]
    out = hp.on_history_select.__wrapped__(SimpleNamespace(index=[2, 0]), session)
    assert dict(zip(RESTORED, out))["beta"] == 60.0 and "run #1" in out[-1]
    # another benchmark's runs never share these columns: they are counted, not shown
    session.bench_label = "demo/forget05"
    table, _, label = table_of(session)
    assert len(table) == 0 and "3 runs on other benchmarks kept" in label
    session.bench_label = "demo/forget01"


def test_editors_are_greyed_out_with_the_reason_where_the_split_has_no_subjects():
    demo, facts = load_benchmark("demo", "forget01"), load_benchmark("real-knowledge")
    for bench in (demo, facts):  # both carry a subject per fact: nothing greyed out
        assert not any(label.startswith("⊘") for label, _ in bp.method_choices(bench))
        assert unavailable("memit", bench) is None
    choices = dict((name, label) for label, name in bp.method_choices(NO_SUBJECT))
    assert all(choices[name] == f"⊘ {e.label}: not on this split (no facts with a subject)"
               for name, e in EDITORS.items())
    assert not any(choices[name].startswith("⊘") for name in METHODS)  # the trained methods can train on it
    note = bp.method_note("rome", NO_SUBJECT)
    assert note.startswith(glossary("rome")) and "⊘ **Not on this split.**" in note
    with pytest.raises(UserError) as refused:  # a direct run is refused with the same words
        check_request("rome", NO_SUBJECT, 5, 0.5)
    assert str(refused.value) in note and "has no subject" in str(refused.value)
    # a split without a retain set: the retain-term methods and the editors are greyed out, GA is not
    bare = Benchmark("custom", "forget", demo.forget[:4], ())
    labels = dict((name, label) for label, name in bp.method_choices(bare))
    assert labels["ga"].startswith("GA:") and labels["graddiff"].startswith("⊘ GradDiff")
    assert labels["memit"] == "⊘ MEMIT: not on this split (no retain set)"
    assert "needs a retain set" in bp.method_note("alphaedit", bare)
    assert "no retain examples: choose GA" in bp.method_note("npo", bare)


def test_each_method_has_its_glossary_line_beside_the_box(demo_session):
    for name, row in list(METHODS.items()) + list(EDITORS.items()):
        line = glossary(name)
        assert line.startswith(f"**{row.label}** (") and row.description in line and "needs" in row.description
        assert bp.method_note(name, demo_session.benchmark) == line  # nothing missing on the demo
    assert glossary("rome").startswith("**ROME** (closed-form editor") and "(trained method)" in glossary("npo")
    assert bp.on_method_note("simnpo", demo_session) == glossary("simnpo")
    box, note = bp.on_methods_for_data("rome", SimpleNamespace(benchmark=NO_SUBJECT))
    assert ("⊘ ROME: not on this split (no facts with a subject)", "rome") in box.choices  # the chosen value kept
    assert "has no subject" in note


def test_altpo_counts_its_alternates_against_the_hosts_example_limit(monkeypatch):
    """AltPO trains on n_alternates rows per forget question (and writes them first): a split
    within GROM_MAX_EXAMPLES for the other methods can be over it for AltPO, refused before work."""
    bench = load_benchmark("demo", "forget01")
    n = len(bench.forget)
    bench = replace(bench, retain=bench.retain[:n])
    monkeypatch.setenv("GROM_MAX_EXAMPLES", str(n + 1))
    check_sizes(bench, get("ga"))  # within the limit
    per = int(METHODS["altpo"].defaults["n_alternates"])
    with pytest.raises(UserError, match=f"{per} alternates for each of {n} questions"):
        check_sizes(bench, get("altpo"))


def test_an_editor_leaves_a_band_that_ends_at_the_top_layer_and_says_so(demo_session):
    """At the model's last layer an editor's value vector reaches no answer token (SmolLM2's
    default band 25-29 of 30; the demo's 3-5 of 6): the editors take the upstream band there
    and the summary says why; a band below the top is GROM's, as the paper compares."""
    from components.studio.comparators import band_note
    from grom import run_edit
    from grom.methods.editors.locate_then_edit import editor_band

    assert editor_band((25, 26, 27, 28, 29), 30) == (4, 5, 6, 7, 8) == editor_band(None, 30)
    assert editor_band((3, 4, 5), 6) == (1, 2, 3) and editor_band((10, 12), 30) == (10, 12)
    assert band_note((10, 12), (12, 10), 30) == "" and "layers 4-8" in band_note((4, 5, 6, 7, 8), (25, 29), 30)
    session = Session()
    session.model_key, session.bench_label = demo_session.model_key, demo_session.bench_label
    session.benchmark = demo_session.benchmark
    handle = ensure_model(session.model_key)
    bench = session.benchmark
    session.edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain,
                            EditConfig(layers=(3, 4, 5), beta=60.0))
    session.edit_for = handle.key
    summary, _ = bp.on_run_baseline.__wrapped__("rome", 3, 0.5, N, False, session, progress=no_progress)
    assert "layers 1-3" in summary and "ends at the model's last layer (5)" in summary, summary
    assert "closed-form editor: layer 3 edited" in summary  # ROME edits the last layer of its band


def test_the_summary_says_how_many_facts_key_off_their_subject():
    """Real TOFU's rows get their author as subject (grom.tasks.tofu.with_authors), and a
    question that does not write it keys on its last token: the summary counts those."""
    from components.studio.comparators import key_note

    assert key_note({"facts": 40, "subject_last_keys": 40}) == "" == key_note({}) == key_note(None)
    assert key_note({"facts": 40, "subject_last_keys": 34}).startswith(" 6 of the 40 facts' questions")


def test_lunar_is_in_the_method_box_and_runs_through_compare(demo_session):
    """LUNAR (grom.methods.lunar) beside the others: in the box with its glossary line, its
    two boxes its AdamW epochs and learning rate, refused where the split lacks a retain
    set, and one run through the Compare panel's handler (2 epochs) joins the history."""

    session = demo_session
    labels = dict((name, label) for label, name in bp.method_choices(session.benchmark))
    assert labels["lunar"].startswith("LUNAR: ") and "activation redirection" in labels["lunar"]
    assert glossary("lunar").startswith("**LUNAR** (activation redirection") and "NeurIPS 2025" in glossary("lunar")
    lr, epochs = bp.on_method_change("lunar", session)
    assert (lr["value"], epochs["value"]) == (0.01, 20) and epochs["label"] == get("lunar").boxes(None)[0].label
    bare = Benchmark("custom", "forget", session.benchmark.forget[:4], ())
    assert dict((n, lab) for lab, n in bp.method_choices(bare))["lunar"] == "⊘ LUNAR: not on this split (no retain set)"
    with pytest.raises(UserError, match="retain set"):
        check_request("lunar", bare, 2, 0.01)
    summary, _table = bp.on_run_baseline.__wrapped__("lunar", 2, 0.01, N, False, session, progress=no_progress)
    assert summary.startswith("**LUNAR** (activation redirection: the down_proj of layer 4 refitted") and \
        "2 epochs of AdamW at lr 0.01" in summary
    row = runs_history.history(session)[-1]
    assert row["source"] == "LUNAR" and "Final score" in row["metrics"]


def test_lunars_own_epochs_are_accepted_and_priced_for_zerogpu(demo_session):
    """Upstream's 20 epochs (the box's default) are not refused by the trained methods'
    GROM_MAX_EPOCHS (10): LUNAR trains one matrix on activations read once. Its ZeroGPU
    duration is priced as such (the trained methods' plan does not know it)."""
    from components.server.durations import train_call_s
    from grom.methods.lunar.run import MAX_EPOCHS as REDIRECTION_MAX_EPOCHS

    bench = demo_session.benchmark
    assert check_request("lunar", bench, 20, 0.01)[1:] == (20, 0.01)
    with pytest.raises(UserError, match=f"a whole number from 1 to {REDIRECTION_MAX_EPOCHS}"):
        check_request("lunar", bench, REDIRECTION_MAX_EPOCHS + 1, 0.01)
    short, long = (train_call_s(demo_session.model_key, bench, "lunar", e, 0.01) for e in (1, 100))
    assert 1 <= short <= long
