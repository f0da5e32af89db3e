"""Issue 37, item 2, through the app's endpoints (gradio_client, the demo model): one
visitor's long job (a sweep: one device turn per point) does not hold the device for its
whole run; another visitor's question is answered between its points. The queue admits
GROM_DEVICE_JOBS model jobs at once; the fair line (`DEVICE_LOCK`) does the rest."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("gradio_client")

from components.server.device import DEVICE_LOCK  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import QUICK, new_client  # noqa: E402


def test_a_question_is_answered_between_the_points_of_anothers_sweep(url):  # noqa: F811
    a, b = new_client(url), new_client(url)
    a.predict(api_name="/run_edit", **QUICK)
    sweep = a.submit("beta", "2, 4, 8, 16, 32, 64, 128, 256", api_name="/sweep")
    deadline = time.monotonic() + 120
    while not (DEVICE_LOCK.holder is not None and DEVICE_LOCK.holder.kind == "on_sweep"):
        assert time.monotonic() < deadline and not sweep.done(), "the sweep never took the device"
        time.sleep(0.05)
    t0 = time.perf_counter()
    html = b.predict("Where was Zorvath Quill born?", api_name="/generate")
    asked = time.perf_counter() - t0
    assert "Zorvath" in html
    assert not sweep.done(), f"the question ({asked:.1f} s) waited for the whole sweep"
    plot, table, note = sweep.result(timeout=600)
    assert len(table["data"] if isinstance(table, dict) else table) >= 8  # the sweep was not cut short


def test_a_question_is_answered_between_the_steps_of_anothers_training(url):  # noqa: F811
    """A baseline trains on the shared model: between its optimizer steps it lends the
    model, as found, to the visitors waiting (`run_baseline(between=)`)."""
    a, b = new_client(url), new_client(url)
    a.predict(api_name="/run_edit", **QUICK)
    training = a.submit("ga", 3, 1e-4, 5, False, api_name="/run_baseline")
    deadline = time.monotonic() + 120
    while not (DEVICE_LOCK.holder is not None and DEVICE_LOCK.holder.kind == "on_run_baseline"):
        assert time.monotonic() < deadline and not training.done(), "the training never took the device"
        time.sleep(0.05)
    time.sleep(1.0)  # into its optimizer steps
    html = b.predict("Where was Zorvath Quill born?", api_name="/generate")
    assert "Zorvath" in html and not training.done()
    summary, table = training.result(timeout=900)
    assert "Gradient Ascent" in summary or "GA" in summary, summary


def test_a_question_is_answered_while_anothers_lunar_runs(url, monkeypatch):  # noqa: F811
    """Issue 45, item 3: LUNAR on the shared model lends it between its activation batches
    and its AdamW epochs (`run_lunar(between=give_turn)`, through `run_comparator`): a
    visitor's question is answered while LUNAR itself still runs, not after it."""
    import grom.methods.lunar.run as lunar_run

    span: dict[str, float] = {}
    real = lunar_run.run_lunar

    def timed(*args, **kw):
        span["start"] = time.monotonic()
        try:
            return real(*args, **kw)
        finally:
            span["end"] = time.monotonic()

    monkeypatch.setattr(lunar_run, "run_lunar", timed)  # the registry's row calls it by this name
    a, b = new_client(url), new_client(url)
    training = a.submit("lunar", 3, 0.01, 5, False, api_name="/run_baseline")
    deadline = time.monotonic() + 120
    while "start" not in span:
        assert time.monotonic() < deadline and not training.done(), "LUNAR never started"
        time.sleep(0.05)
    time.sleep(0.5)  # into its activation batches
    html = b.predict("Where was Zorvath Quill born?", api_name="/generate")
    answered = time.monotonic()
    assert "Zorvath" in html
    assert "end" not in span, f"the question waited {answered - span['start']:.1f} s, for LUNAR's whole run"
    summary, _table = training.result(timeout=900)
    assert "LUNAR" in summary, summary


def test_a_page_opens_while_the_device_is_busy(url):  # noqa: F811
    """A new visitor's page gets its model, split and preset while another job holds the
    device: its load event is not in the device queue (it used to wait behind every job)
    and needs the device only to load a start model pushed out."""
    import threading

    from components import page
    from components.server import model_choices as core_models
    from components.server.session import Session

    start = core_models.model_key("demo", "cpu", "float32")
    held, done = threading.Event(), threading.Event()

    def hold():
        with DEVICE_LOCK:
            held.set()
            done.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    held.wait(10)
    try:
        t0 = time.monotonic()
        out = page.on_page_load(Session(), start)
        assert out[2] == start.shown and out[7] == "demo"
        # finding the loaded model asks no device (it waited for the holder's 30 s before,
        # and a second visitor's page showed "processing" meanwhile)
        assert time.monotonic() - t0 < 5 and not done.is_set(), "the page waited for the device"
    finally:
        done.set()
    source = open(page.__file__).read()
    load = source[source.index("opened = demo.load("):source.index("opened.success(")]
    assert "device_queue()" not in load


def test_a_question_is_answered_while_anothers_edit_runs(url, monkeypatch):  # noqa: F811
    """Issue 45: GROM's own edit lends the model between its forward batches and its
    layers (`run_edit(between=give_turn)`, the layers patched so far reverted there): a
    visitor's question is answered while another's Run edit still runs. On the demo an
    edit takes about a second, so each of its step boundaries is slowed by a pause (an
    edit that gives no turn is not slowed, and answers before the question)."""
    from components.studio import edits

    span: dict[str, float] = {}
    real = edits.run_edit

    def slowed(*args, between=None, **kw):
        def slow(as_found):
            time.sleep(0.05)
            between(as_found)

        span["start"] = time.monotonic()
        try:
            return real(*args, between=slow if between is not None else None, **kw)
        finally:
            span["end"] = time.monotonic()

    monkeypatch.setattr(edits, "run_edit", slowed)  # compute_edit calls it by this name
    a, b = new_client(url), new_client(url)
    edit = a.submit(api_name="/run_edit", **QUICK)
    deadline = time.monotonic() + 120
    while "start" not in span:
        assert time.monotonic() < deadline and not edit.done(), "the edit never started"
        time.sleep(0.05)
    time.sleep(0.3)  # into its batches
    html = b.predict("Where was Zorvath Quill born?", api_name="/generate")
    answered = time.monotonic()
    assert "Zorvath" in html
    assert "end" not in span, f"the question waited {answered - span['start']:.1f} s, for the whole edit"
    summary, _table, _norms = edit.result(timeout=300)
    assert "Edit" in summary or "edit" in summary, summary
