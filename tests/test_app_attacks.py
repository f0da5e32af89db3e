"""The "Is it gone?" tab through the app's API, on the demo model: an uploaded benchmark
with held-out probe rows, GROM's edit, then the attack suite (and a baseline beside it);
the card gains the held-out line; a benchmark without probes is told what to load, and a
run with no attack ticked what to tick. (The estimates, the quick set, the summary at the
start and the progress count: tests/test_attack_estimates.py, without a server.)"""
from __future__ import annotations

import json
import math

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)

ATTACKS = ["heldout", "paraphrase", "cloze", "quant8", "logit_lens", "depth", "relearn", "mia"]


def probe_upload(path):
    """The demo's forget01 authors: 16 forget rows (fitted), 8 probe rows (the same authors'
    other questions, never fitted), 24 retain rows; every row with its fact."""
    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    row = lambda ex, split: {"question": ex.question, "answer": ex.answer, "fact": ex.fact,  # noqa: E731
                             "paraphrased_question": ex.paraphrased_question, "split": split}
    rows = [row(ex, "forget") for ex in demo.forget[:16]] + [row(ex, "probe") for ex in demo.forget[16:24]]
    rows += [row(ex, "retain") for ex in demo.retain[:24]]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_the_attack_suite_on_an_uploaded_benchmark_with_probes(url, tmp_path):  # noqa: F811
    c = Client(url, verbose=False)
    info, *_ = c.predict("custom", "forget", "", handle_file(str(probe_upload(tmp_path / "p.jsonl"))), None,
                         api_name="/load_benchmark")
    assert "16 forget" in info
    c.predict(preset="(custom)", beta=150.0, beta_relative=True, api_name="/run_edit")
    summary, table, plot, lens, depth, answers = c.predict(ATTACKS, False, "npo", 1, 1e-3, api_name="/attacks")
    rows = {r[0]: r for r in table["data"]}
    assert table["headers"][:3] == ["attack", "Base", "GROM"] and len(rows) == len(ATTACKS)
    held = dict(zip(table["headers"], rows["Held-out probes"]))
    assert held["probes"] == 8 and 0 <= float(held["GROM"]) <= 1 and float(held["Base"]) > 0  # the base knew some
    # of the facts the base model stated, those the edit forgot, by the card's rule (issue 49, item 3)
    forgot, known = map(int, held["GROM forgot"].split(" · ")[0].split(" of "))
    assert known == round(float(held["Base"]) * 8) and forgot <= known
    assert "held-out probes" in summary and "Worst attack" in summary
    assert "Relearning (lr 0.0003, calibrated for this model) on 16 fitted questions" in summary
    assert "The unedited model relearned the same way: 0 steps" in summary  # the control, beside the edit's
    assert float(rows["Relearning"][1]) > 0  # its Base: the unedited model after the same steps
    assert plot["type"] == "plotly" and lens["type"] == "plotly" and depth["type"] == "plotly"
    # the depth score: no retain model for an upload, so against the edit's own output, said as not UDS
    assert "Depth (each layer's states patched into the unedited model" in summary and "not UDS" in summary
    assert "Depth (share of layers erased; 1 = gone at every layer)" in rows
    assert "the 8 questions asked" in answers
    mia = rows["Membership inference (Min-K AUC; 0.5 = can't tell)"]  # the upload's retain rows as holdout
    assert 0 <= float(mia[1]) <= 1 and 0 <= float(mia[2]) <= 1
    assert ("Membership inference (Min-K AUC of the 16 fitted forget answers against 24 answers "
            "the edit did not aim at") in summary


def test_a_baseline_beside_grom_and_a_benchmark_without_probes(url, tmp_path):  # noqa: F811
    c = Client(url, verbose=False)
    c.predict("custom", "forget", "", handle_file(str(probe_upload(tmp_path / "p.jsonl"))), None,
              api_name="/load_benchmark")
    c.predict(preset="(custom)", beta=150.0, beta_relative=True, api_name="/run_edit")
    _, table, *_ = c.predict(["heldout", "quant4"], True, "npo", 1, 1e-3, api_name="/attacks")
    assert table["headers"][:4] == ["attack", "Base", "GROM", "NPO"]
    assert all(not math.isnan(float(r[3])) for r in table["data"])
    with pytest.raises(Exception, match="not in the list of choices"):  # gradio refuses it before the handler
        c.predict(["heldout", "telepathy"], False, "npo", 1, 1e-3, api_name="/attacks")
    with pytest.raises(Exception, match="Tick at least one attack"):  # none ticked: refused, not all 14 run
        c.predict([], False, "npo", 1, 1e-3, api_name="/attacks")
    c.predict("demo", "forget01", "", None, None, api_name="/load_benchmark")
    c.predict(preset="demo", api_name="/run_edit")
    with pytest.raises(Exception, match="no held-out probe"):
        c.predict(["heldout"], False, "npo", 1, 1e-3, api_name="/attacks")
