"""The "Is it gone?" panel before and during a run, without a server: each attack's estimate
(it grows with the model and the probes, and is within 3x of what a cheap attack takes on
the demo), the quick set ticked when the panel opens, the summary that says what runs, and
the progress that counts the ticked attacks (i/n, not the suite's "1/1" per call)."""
from __future__ import annotations

import time

import pytest

gr = pytest.importorskip("gradio")

from components import attack_panel as ap  # noqa: E402
from components.core import durations as D  # noqa: E402
from components.core.model_choices import ensure_model, model_key  # noqa: E402
from components.core.session import Session  # noqa: E402
from grom.closed_form.config import PRESETS  # noqa: E402
from grom.closed_form.pipeline import run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.robustness.probes import PROBE_TYPES  # noqa: E402
from grom.robustness.result import Probe  # noqa: E402
from grom.robustness.suite import attack_names  # noqa: E402
from tests.conftest import FORGET, RETAIN, tiny_llama  # noqa: E402
from tests.test_app_attacks import probe_upload  # noqa: E402


def probes(n: int) -> tuple[Probe, ...]:
    """`n` probes (question, answer, fact, subject) from the fixtures' examples."""
    rows = (FORGET + RETAIN) * n
    return tuple(Probe(ex.question, ex.answer, ex.answer.split()[-1].rstrip("."), subject="the authors")
                 for ex in rows[:n])


def estimate(model, tokenizer, n: int) -> dict[str, float]:
    """Every attack's seconds at the CPU rate, on `n` probes (fitted and holdout: 4 each)."""
    inputs = D.attack_inputs(model, tokenizer, probes(n), tuple(FORGET), tuple(RETAIN[:4]), None)
    return D.attack_seconds(inputs, attack_names("all"), D.CPU_WALL)


def test_the_estimate_grows_with_the_model_and_the_probes(tokenizer):
    small, large = tiny_llama(len(tokenizer), layers=2), tiny_llama(len(tokenizer), layers=8)
    few, many, deep = estimate(small, tokenizer, 4), estimate(small, tokenizer, 32), estimate(large, tokenizer, 4)
    written = [n for n, t in PROBE_TYPES.items() if t.written]
    for name in attack_names("all"):
        if name in written:  # the written probes of no bundled target ("the authors"): nothing to ask
            assert few[name] == many[name] == deep[name] < 0.1, name  # its fixed cost only
            continue
        assert many[name] > few[name], name  # more probes: more answers, scored rows, lens rows
        assert deep[name] > few[name], name  # more layers: every pass costs more
    about_mars = tuple(Probe(p.question, p.answer, p.fact, subject="the solar system") for p in probes(4))
    inputs = D.attack_inputs(small, tokenizer, about_mars, tuple(FORGET), tuple(RETAIN[:4]), None)
    asked = D.attack_seconds(inputs, written, D.CPU_WALL)
    assert all(asked[n] > few[n] for n in written)  # the solar system's written probes: asked whatever their number
    assert few["relearn"] == max(few.values())  # two fine-tunings, each scored three times
    assert few["logit_lens"] < few["heldout"]  # two teacher-forced passes against two decodings


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A session on the demo model and an upload of demo/forget01 with 8 held-out probes (the
    app's attack test's), with GROM's demo edit."""
    handle = ensure_model(model_key("demo", "cpu", "float32"))
    session = Session()
    session.model_key, session.bench_label = handle.key, "custom/forget"
    session.benchmark = load_benchmark("custom", "forget",
                                       source=str(probe_upload(tmp_path_factory.mktemp("probes") / "p.jsonl")))
    bench = session.benchmark
    session.edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain, PRESETS["demo"])
    session.edit_for = handle.key
    return session


@pytest.mark.parametrize("name", ["heldout", "format"])
def test_a_cheap_attacks_estimate_is_within_4x_of_its_time_on_the_demo(demo, name):
    """Timed as CPU seconds of this process (one torch thread, tests/conftest.py): what a quiet
    machine's wall time is, whatever else runs on the cores; the best of two runs. Within 4x:
    the constants were set on an AMD EPYC; on an Intel Xeon (AVX-512) the cheap attacks took
    2.9-3.6x their estimate, the landed code and this round's alike (2026-11-28), so 3x failed
    there by chance. Estimates measured on the host replace these constants (issue 49)."""
    handle = ensure_model(demo.model_key)
    guess = ap.attack_estimates(handle, demo.benchmark)[name]
    took = []
    for _ in range(2):
        t0 = time.process_time()
        ap.attack_once(handle.key, demo.benchmark, demo.edit, name)
        took.append(time.process_time() - t0)
    assert guess / 4 <= min(took) <= 4 * guess, (name, guess, took)


def test_the_panel_opens_on_the_quick_set_and_says_what_it_costs(demo):
    with gr.Blocks():
        panel = ap.build_attack_panel()
    assert panel.attacks.value == list(ap.QUICK) == ap.on_quick_set()
    assert ap.on_every_attack() == list(attack_names("all"))
    update, line = ap.on_attack_estimates(list(ap.QUICK), False, demo)
    labels = dict((v, k) for k, v in update.choices)
    assert update.value == list(ap.QUICK) and all(" · " in label for label in labels.values()), labels
    assert labels["relearn"].startswith("Relearning · ")
    assert "The 5 ticked attack(s) take about" in line and "the 8 held-out probes" in line
    seconds = ap.attack_estimates(ensure_model(demo.model_key), demo.benchmark)
    assert sum(seconds[n] for n in ap.QUICK) < sum(seconds.values()) / 3  # quick: a fraction of the suite
    assert "With the baseline" in ap.on_attack_total(["heldout"], True, demo)
    assert ap.on_attack_total([], False, demo).startswith("No attack ticked")
    plain = Session()  # the demo's own split: no held-out probes, no estimate, and it says what to load
    plain.model_key, plain.benchmark = demo.model_key, load_benchmark("demo", "forget01")
    update, line = ap.on_attack_estimates(list(ap.QUICK), False, plain)
    assert line.startswith("No estimate:") and "Load the real-knowledge benchmark" in line
    assert all(" · " not in label for label, _ in update.choices)


def test_the_summary_says_what_runs_as_the_run_starts(demo):
    line = ap.on_attacks_start(["heldout", "paraphrase"], False, demo)
    assert line.startswith("Running 2 attack(s) on GROM's edit, about ") and "Held-out probes, Paraphrase" in line
    assert "Run an edit" not in line and ap.START_SUMMARY != line
    assert "the baseline set in Compare" in ap.on_attacks_start(["heldout"], True, demo)
    assert ap.on_attacks_start([], False, demo).startswith("Not run: Tick at least one attack")
    fresh = Session()
    fresh.model_key, fresh.benchmark = demo.model_key, demo.benchmark
    assert ap.on_attacks_start(["heldout"], False, fresh).startswith("Not run: There is no edit yet")
    with pytest.raises(gr.Error, match="Tick at least one attack"):  # none ticked no longer means all 14
        ap.on_run_attacks([], False, "npo", 1, 1e-3, demo, progress=lambda *a, **k: None)


class Recorder:
    """A stand-in for gr.Progress: every (fraction, message) it is given."""
    def __init__(self):
        self.calls: list[tuple[float, str]] = []

    def __call__(self, fraction, desc=None, **_):
        self.calls.append((fraction, desc))


def test_progress_counts_the_ticked_attacks(demo, monkeypatch):
    ticked = ["heldout", "paraphrase", "logit_lens"]
    progress = Recorder()
    ap.on_run_attacks.__wrapped__(ticked, False, "npo", 1, 1e-3, demo, progress=progress)
    said = [m for _, m in progress.calls]
    for i, name in enumerate(ticked, 1):
        assert f"GROM: attack {i}/3: {ap.LABELS[name]}" in said, said
    assert not any("1/1" in m for m in said), said  # the suite's own count, one attack per call
    fractions = [f for f, _ in progress.calls]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0

    # with a baseline (its training stood in for by GROM's edit): each method counts its own attacks
    monkeypatch.setattr(ap, "check_gpu_time", lambda *a, **k: None)
    monkeypatch.setattr(ap, "train_comparator", lambda key, bench, method, *a: demo.edit)
    progress = Recorder()
    ap.on_run_attacks.__wrapped__(ticked[:2], True, "npo", 1, 1e-3, demo, progress=progress)
    said = [m for _, m in progress.calls]
    assert {"GROM: attack 1/2: Held-out probes", "NPO: attack 2/2: Paraphrase"} <= set(said), said
    fractions = [f for f, _ in progress.calls]
    assert fractions == sorted(fractions) and fractions[0] >= ap.TRAIN_SHARE
