"""The unedited model's side of the attack suite kept on disk (grom.robustness.kept): a
second run on the same weights reads the unedited answers and relearning's control instead
of computing them and reports the same numbers and answers; other weights, another
tokenizer or another version read nothing; an unreadable file is computed again; "off"
keeps nothing."""
from __future__ import annotations

import pytest
import torch

from grom.closed_form.config import EditConfig
from grom.closed_form.pipeline import run_edit
from grom.robustness import kept as K
from grom.robustness import suite, weights
from grom.robustness.result import Recall
from grom.robustness.suite import run_attacks
from tests.conftest import FORGET, RETAIN
from tests.test_robustness_probes import PROBES

RECALLS = [Recall(0.5, ("Jupiter is the largest.", "I do not know."), (1.0, 0.0))]


@pytest.fixture(scope="module")
def edited(trained_llama, tokenizer):
    edit = run_edit(trained_llama, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0, w_r=10.0))
    return trained_llama, tokenizer, edit


def test_what_is_kept_is_read_back_only_for_the_same_weights_tokenizer_and_version(edited, tmp_path, monkeypatch):
    model, tok, _ = edited
    side = K.UneditedSide(model, tok, tmp_path)
    assert side.recalls("probe_recall", ["q"]) is None
    side.keep("probe_recall", ["q"], RECALLS)
    assert K.UneditedSide(model, tok, tmp_path).recalls("probe_recall", ["q"]) == RECALLS
    assert side.recalls("probe_recall", ["another question"]) is None
    assert side.recalls("relearn_control", ["q"]) is None  # another kind
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        was = w[0, 0].item()
        w[0, 0] += 1.0
        try:
            assert K.UneditedSide(model, tok, tmp_path).recalls("probe_recall", ["q"]) is None  # other weights
        finally:
            w[0, 0] = was
    assert K.UneditedSide(model, tok, tmp_path).recalls("probe_recall", ["q"]) == RECALLS
    monkeypatch.setattr(K, "tokenizer_digest", lambda _t: "another tokenizer")
    assert K.UneditedSide(model, tok, tmp_path).recalls("probe_recall", ["q"]) is None
    monkeypatch.undo()
    monkeypatch.setattr(K, "VERSION", K.VERSION + 1)
    assert K.UneditedSide(model, tok, tmp_path).recalls("probe_recall", ["q"]) is None


def test_an_unreadable_file_is_computed_again_and_off_keeps_nothing(edited, tmp_path, monkeypatch):
    model, tok, _ = edited
    side = K.UneditedSide(model, tok, tmp_path)
    side.keep("probe_recall", ["q"], RECALLS)
    (path,) = (tmp_path / "probe_recall").glob("*.json")
    path.write_text("{not json", encoding="utf-8")
    assert side.recalls("probe_recall", ["q"]) is None
    side.keep("probe_recall", ["q"], RECALLS)  # written over
    assert side.recalls("probe_recall", ["q"]) == RECALLS
    monkeypatch.setenv("GROM_UNEDITED_DIR", "off")
    assert K.unedited_root() is None
    off = K.UneditedSide(model, tok)
    off.keep("probe_recall", ["q"], RECALLS)
    assert off.recalls("probe_recall", ["q"]) is None and off.written == 0
    monkeypatch.setenv("GROM_UNEDITED_DIR", str(tmp_path / "there"))
    assert K.unedited_root() == tmp_path / "there"


def test_a_second_suite_run_reads_the_unedited_side_and_reports_the_same(edited, tmp_path, monkeypatch):
    """Run 1 computes and keeps the unedited answers of three probe attacks and relearning's
    control; run 2, on another edit of the same model, computes only the edited side and
    gives the same unedited numbers and answers; without `kept` the numbers are the same."""
    model, tok, edit = edited
    names = "heldout,paraphrase,cloze,relearn"
    plain = run_attacks(model, tok, edit, PROBES, fitted=FORGET, attacks=names)
    controls, generated = [], []
    real_control = weights.relearn_control
    monkeypatch.setattr(weights, "relearn_control", lambda *a, **k: controls.append(1) or real_control(*a, **k))
    first = K.UneditedSide(model, tok, tmp_path)
    entries = suite.unedited_inputs(model, PROBES, FORGET, None, names)  # what a caller checks ahead of a run
    assert set(entries) == {"heldout", "paraphrase", "cloze", "relearn"}
    assert not any(first.holds(kind, what) for wanted in entries.values() for kind, what in wanted)
    one = run_attacks(model, tok, edit, PROBES, fitted=FORGET, attacks=names, kept=first)
    assert (first.read, first.written, len(controls)) == (0, 4, 1)  # three answer groups and the control
    assert all(first.holds(kind, what) for wanted in entries.values() for kind, what in wanted)
    assert first.read == 0  # holds reads nothing
    for name in plain:
        a, b = plain[name], one[name]
        assert (a.base, a.edited, a.base_answers, a.edited_answers) == (b.base, b.edited, b.base_answers,
                                                                         b.edited_answers), name
    assert one["relearn"].details == plain["relearn"].details
    other = run_edit(model, tok, FORGET, RETAIN, EditConfig(layers=(1,), beta=2.0, w_r=10.0))
    real_recalls = suite.probe_recalls
    monkeypatch.setattr(suite, "probe_recalls", lambda *a, **k: generated.append(len(a[2])) or real_recalls(*a, **k))
    second = K.UneditedSide(model, tok, tmp_path)
    two = run_attacks(model, tok, other, PROBES, fitted=FORGET, attacks=names, kept=second)
    assert (second.read, second.written, len(controls)) == (4, 0, 1)  # nothing unedited computed again
    assert len(generated) == 1  # the edited side's one run for the three attacks
    alone = run_attacks(model, tok, other, PROBES, fitted=FORGET, attacks=names)
    for name in alone:
        a, b = alone[name], two[name]
        assert (a.base, a.edited, a.base_answers, a.edited_answers) == (b.base, b.edited, b.base_answers,
                                                                         b.edited_answers), name
    assert two["relearn"].details == alone["relearn"].details
    assert not other.is_applied and not edit.is_applied
