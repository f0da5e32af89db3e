"""The "Is it gone?" panel before and during a run, without a server: each attack's estimate
(it grows with the model and the probes, follows the host's measured pace, and is within
1.5x of what a cheap attack takes on the demo once one run was timed), the quick set ticked
when the panel opens, the summary that says what runs, and the progress that counts the
ticked attacks (i/n, not the suite's "1/1" per call)."""
from __future__ import annotations

import statistics
import time

import pytest

gr = pytest.importorskip("gradio")

from components import attack_panel as ap  # noqa: E402
from components.server import durations as D  # noqa: E402
from components.server import pace  # noqa: E402
from components.server.model_choices import ensure_model, model_key  # noqa: E402
from components.server.session import Session  # noqa: E402
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
        if name in written:  # the written probes of no bundled subject ("the authors"): nothing to ask
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
    deep_inputs = D.attack_inputs(large, tokenizer, probes(4), tuple(FORGET), tuple(RETAIN[:4]), None)
    band, every = D.attack_work(deep_inputs, "depth", first=6), D.attack_work(deep_inputs, "depth", first=0)
    # a band edit: its two layers patched; a trained method: all eight (each patched pass runs the layers above it)
    assert every.flops > 3.5 * band.flops


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


@pytest.mark.parametrize("name", ["heldout", "format", "depth"])
def test_a_cheap_attacks_estimate_is_within_1_5x_of_its_time_on_the_demo(demo, name):
    """Wall time, as the estimate is: its work priced at this host's pace (the model's
    calibration, the attack's own pace, the CPU's load now: components.server.pace). Each run
    is timed into the pace, as every run in the app is, and the next one, estimated from
    it, takes within 1.5x of its estimate: the median of three runs against the median of
    their estimates, a CI machine's other test worker being what it is (the estimate follows
    the load between runs, not a burst within one: a run of 0.45 s took 2.06 s once beside
    it, and an estimate made just after such a run reads high). On this 2-core Xeon at a
    load of 15-18: 0.82-1.27x; on the 2-core EPYC, two failing runs of the old rule (two of
    three within 1.5x) had medians 0.80x and 0.87x."""
    handle = ensure_model(demo.model_key)
    pace.calibrate(handle)
    ap.compute_attacks(handle.key, demo.benchmark, demo.edit, (name,), None, None)  # timed into the pace
    runs = []
    for _ in range(3):
        guess = ap.attack_estimates(handle, demo.benchmark, demo.edit)[name]  # depth: the edit's layers
        t0 = time.perf_counter()
        ap.compute_attacks(handle.key, demo.benchmark, demo.edit, (name,), None, None)
        runs.append((guess, time.perf_counter() - t0))
    guess, took = (statistics.median(v) for v in zip(*runs))
    assert guess / 1.5 <= took <= 1.5 * guess, (name, runs)


def test_the_estimates_follow_the_hosts_pace(demo, monkeypatch, tmp_path):
    """Priced at the constants until the host is measured; then each attack at its own
    measured pace (an attack not run yet at its family's), and all of them at the load now."""
    monkeypatch.setenv("GROM_UNEDITED_DIR", str(tmp_path))  # nothing kept: both sides of every attack priced
    handle = ensure_model(demo.model_key)
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    load = {"now": 1.0}
    monkeypatch.setattr(pace, "load_now", lambda handle, calibration: load["now"])
    pace.PACE.calibrated(handle.key, pace.Calibration(D.wall_rate(handle.model), 0.0, 0.0))
    before = ap.attack_estimates(handle, demo.benchmark)
    inputs = ap.inputs_of(handle, demo.benchmark)
    assert before == pytest.approx(D.attack_seconds(inputs, attack_names("all"), D.wall_rate(handle.model)))
    pace.PACE.record(handle.key, "attack:heldout", 1.0, 3.0)  # heldout ran 3x slower than priced
    after = ap.attack_estimates(handle, demo.benchmark)
    assert after["heldout"] == pytest.approx(3 * before["heldout"])
    assert after["relearn"] == pytest.approx(3 * before["relearn"])  # not run yet: the attacks' pace
    pace.PACE.record(handle.key, "attack:relearn", 1.0, 1.0)
    assert ap.attack_estimates(handle, demo.benchmark)["relearn"] == pytest.approx(before["relearn"])
    load["now"] = 2.0  # the CPU twice as busy as when the model was measured
    busy = ap.attack_estimates(handle, demo.benchmark)
    assert busy["heldout"] == pytest.approx(6 * before["heldout"])
    line = ap.on_attack_total(["heldout"], False, demo)
    assert f"take about **{ap.about(busy['heldout']).lstrip('~')}**" in line and "at the pace this server" in line


def test_each_attack_run_is_timed_into_its_kinds_pace(demo, monkeypatch):
    handle = ensure_model(demo.model_key)
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    ap.compute_attacks(handle.key, demo.benchmark, demo.edit, ("heldout", "logit_lens"), None, None)
    kinds = {kind: p.jobs for (key, kind), p in pace.PACE.kinds.items() if key == handle.key}
    assert kinds == {"attack:heldout": 1, "attack:logit_lens": 1, "attack": 2}


def test_a_second_run_reads_the_unedited_side_kept_and_is_priced_so(demo, monkeypatch, tmp_path):
    """The app's attack runs keep the unedited model's side on disk (grom.robustness.kept):
    a run on another edit of the same model reads it, answers as a fresh run does, and its
    estimate and the work timed into the host's pace count the edited side alone."""
    monkeypatch.setenv("GROM_UNEDITED_DIR", str(tmp_path / "kept"))
    handle, bench, names = ensure_model(demo.model_key), demo.benchmark, ("heldout", "paraphrase")
    assert not ap.kept_attacks(handle, bench)
    first = ap.compute_attacks(handle.key, bench, demo.edit, names, None, None)["GROM"]
    assert ap.kept_attacks(handle, bench) == frozenset(names)  # written by the run (relearn's control: not run)
    monkeypatch.setattr(pace, "load_now", lambda handle, calibration: 1.0)  # the two estimates at one load
    once = ap.attack_estimates(handle, bench, demo.edit)  # at the pace the run left: both read it
    both = ap.attack_estimates(handle, bench, demo.edit, kept=frozenset())
    inputs = ap.inputs_of(handle, bench)
    for name in names:
        assert once[name] < 0.75 * both[name], (name, once[name], both[name])
        assert 2 * D.attack_work(inputs, name, kept=True).flops == pytest.approx(D.attack_work(inputs, name).flops)
    assert once["logit_lens"] == both["logit_lens"]  # nothing of it is kept
    line = ap.on_attack_total(list(names), False, demo)
    assert "The unedited model's side of 2 of them" in line and "kept from an earlier run" in line

    timed = []
    real_timed = pace.timed
    monkeypatch.setattr(pace, "timed", lambda h, kind, work, size: timed.append((kind, work)) or real_timed(
        h, kind, work, size))
    other = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain,
                     PRESETS["demo"].replace(beta=PRESETS["demo"].beta / 2))
    side = ap.unedited_side(handle)
    read = side.read
    second = ap.compute_attacks(handle.key, bench, other, names, None, None)["GROM"]
    assert side.read == read + len(names)
    first_layer = ap.changed_from(handle, other)
    assert dict(timed) == {ap.attack_kind(n): D.attack_work(inputs, n, first_layer, kept=True) for n in names}
    monkeypatch.setenv("GROM_UNEDITED_DIR", "off")  # the same edit computed whole: the same answers
    fresh = ap.compute_attacks(handle.key, bench, other, names, None, None)["GROM"]
    for name in names:
        assert second[name].base_answers == first[name].base_answers == fresh[name].base_answers
        assert second[name].base == fresh[name].base and second[name].edited == fresh[name].edited
    assert ap.unedited_side(handle) is None and not ap.kept_attacks(handle, bench)


def test_the_panel_opens_on_the_quick_set_and_says_what_it_costs(demo):
    with gr.Blocks():
        panel = ap.build_attack_panel()
    assert panel.attacks.value == list(ap.QUICK) == ap.on_quick_set()
    assert ap.on_every_attack() == list(attack_names("all"))
    update, line = ap.on_attack_estimates(list(ap.QUICK), False, demo)
    labels = dict((v, k) for k, v in update.choices)
    assert update.value == list(ap.QUICK) and all(" · " in label for label in labels.values()), labels
    assert labels["relearn"].startswith("Relearning · ")
    assert f"The {len(ap.QUICK)} ticked attack(s) take about" in line and "the 8 held-out probes" in line
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


def test_the_pulse_and_the_calibration_time_on_while_a_busy_cpu_says_little(monkeypatch):
    """A pulse takes at least PULSE_WINDOWS[0] windows and more, up to PULSE_WINDOWS[1],
    while they disagree (a busy CPU), and gives their mean; a calibration run is timed
    CAL_TRIES times and on until the timings add up to CAL_MIN_S (at most CAL_MAX_TRIES):
    one window or one timing on a busy CPU priced every later job by chance."""
    clock = {"t": 0.0}
    steps = iter([0.01] * 3 + [0.01, 0.03, 0.01, 0.03, 0.01, 0.03, 0.01] * 3)  # quiet, then busy windows

    def product_time():
        clock["t"] += step["now"]
    step = {"now": 0.01}
    monkeypatch.setattr(pace.time, "perf_counter", lambda: clock["t"])

    class Fake:
        def __matmul__(self, other):
            product_time()
            return self
    monkeypatch.setattr(pace.torch, "randn", lambda *a, **k: Fake())
    monkeypatch.setattr(pace, "PULSE_WINDOW_S", 0.05)
    quiet = pace.sample_pulse()
    assert quiet == pytest.approx(0.01)
    windows = []
    real_fmean = pace.statistics.fmean
    monkeypatch.setattr(pace.statistics, "fmean", lambda xs: windows.append(len(xs)) or real_fmean(xs))

    def busy_product():
        step["now"] = next(steps, 0.02)
        clock["t"] += step["now"]
    Fake.__matmul__ = lambda self, other: busy_product() or self
    pace.sample_pulse()
    assert windows[-1] > pace.PULSE_WINDOWS[0]  # the windows disagreed: more of them
    took, each = [], {"s": pace.CAL_MIN_S / 4}

    def run():
        clock["t"] += each["s"]
        took.append(clock["t"])
    assert pace._timed(run, lambda: None, 100.0) == pytest.approx(pace.CAL_MIN_S / 4)
    assert len(took) == 1 + 4  # the untimed first, then 4 runs to reach CAL_MIN_S
    took.clear()
    each["s"] = 0.001
    assert pace._timed(run, lambda: None, 100.0) == pytest.approx(0.001)
    assert len(took) == 1 + pace.CAL_MAX_TRIES  # a model's run of a millisecond: capped
    took.clear()
    each["s"] = 0.1
    assert pace._timed(run, lambda: None, 0.15) == pytest.approx(0.1) and len(took) == 2  # past the budget: one


def test_a_slow_calibration_runs_in_the_background_once_the_device_is_quiet(demo, monkeypatch):
    """An estimate asked before the model was calibrated, where calibrating takes seconds
    (SmolLM2's), is priced at the constants and starts the calibration in the background,
    where it waits for the device to be quiet: it no longer takes the device the moment an
    edit ends, ahead of the card (6.3 s in the browser on SmolLM2's default page)."""
    import threading

    handle = ensure_model(demo.model_key)
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    monkeypatch.setattr(pace, "SYNC_CAL_S", 0.0)
    quiet = threading.Event()
    monkeypatch.setattr(pace, "wait_for_quiet", lambda quiet_s=3.0: quiet.wait(30))
    rate, calibration = pace.rate_of(handle)
    assert calibration is None and rate == D.wall_rate(handle.model)
    pace.rate_of(handle)  # asked again meanwhile: one calibration waits, not two
    assert sum(t.name == "calibrate" for t in threading.enumerate()) == 1
    assert pace.PACE.calibration(handle.key) is None
    quiet.set()
    deadline = time.monotonic() + 30
    while pace.PACE.calibration(handle.key) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pace.PACE.calibration(handle.key) is not None


def test_a_background_calibration_stops_for_a_visitors_job_and_starts_again(demo, monkeypatch):
    """A calibration in the background holds the device between its timed runs only while
    no visitor's job waits: one waiting stops it (`Yielded`), and it is done again once the
    device is quiet."""
    from components.server import device

    handle = ensure_model(demo.model_key)
    monkeypatch.setattr(pace, "PACE", pace.PaceBook())
    monkeypatch.setattr(pace, "SYNC_CAL_S", 0.0)
    monkeypatch.setattr(pace, "wait_for_quiet", lambda quiet_s=3.0: True)
    asked = {"n": 0}

    def waiting() -> bool:  # a visitor's job waits during the first calibration's first timed run
        asked["n"] += 1
        return asked["n"] == 1
    monkeypatch.setattr(device, "visitors_waiting", waiting)
    tries, real = [], pace.calibrate
    monkeypatch.setattr(pace, "calibrate", lambda h, wait=True: tries.append(1) or real(h, wait))
    pace.rate_of(handle)
    deadline = time.monotonic() + 30
    while pace.PACE.calibration(handle.key) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pace.PACE.calibration(handle.key) is not None and len(tries) == 2
