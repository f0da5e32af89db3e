"""Issue 37, item 2: the device is shared fairly. `DeviceLock` hands the device out in the
order it was asked for, so a long job that takes it once per step lets the jobs that
arrived meanwhile run between its steps; a waiting job learns its place and an estimate;
its wait does not count as its run time; background work never counts as a visitor
waiting; a session's own jobs keep their order (`in_turn`). Threads stand in for gradio's
workers here; tests/test_device_queue_app.py checks the same through the app's endpoints.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

from components.server import device
from components.server.device import DeviceLock, Yielded, yielding
from components.server.errors import JOB_NAME, JOB_STARTED


def run_as(kind: str, fn, *args):
    """`fn(*args)` in a new thread, as the handler `kind` (its JOB_NAME) would run it."""
    def body():
        JOB_NAME.set(kind)
        fn(*args)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def wait_until(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_device_goes_to_the_jobs_in_the_order_they_asked():
    lock, order = DeviceLock(), []
    lock.acquire()

    def job(name):
        with lock:
            order.append(name)

    threads = []
    for i, name in enumerate("abcdef"):
        threads.append(run_as("on_generate", job, name))
        wait_until(lambda i=i: len(lock.line) == i + 1)  # each one asks after the one before
    lock.release()
    for t in threads:
        t.join(5)
    assert order == list("abcdef")


def test_a_long_job_lets_the_jobs_that_arrived_run_between_its_steps():
    """Three steps of an attack suite, each a turn; a question asked during the first step
    runs right after it, not after the whole suite (a plain RLock gives the device back to
    the thread that let it go, which then takes it again at once)."""
    lock, order = DeviceLock(), []
    first_step = threading.Event()

    def suite():
        for step in range(3):
            with lock:
                if step == 0:
                    first_step.set()
                time.sleep(0.15)
                order.append(f"attack {step}")

    def question():
        with lock:
            order.append("question")

    long = run_as("on_run_attacks", suite)
    first_step.wait(5)
    short = run_as("on_generate", question)
    long.join(10)
    short.join(10)
    assert order == ["attack 0", "question", "attack 1", "attack 2"]


def test_a_waiting_job_is_told_its_place_and_an_estimate():
    lock = DeviceLock()
    lock.typical.update(on_run_attacks=40.0, on_run_edit=20.0)
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    def queued():
        with lock:
            pass

    seen = []
    run_as("on_run_attacks", hold)
    held.wait(5)
    run_as("on_run_edit", queued)
    wait_until(lambda: len(lock.line) == 1)

    device.WAIT_SHOWN_S, saved = 0.1, device.WAIT_SHOWN_S
    try:
        def record(text):
            seen.append(text)

        def waiting_job():
            token = device.WAIT_REPORT.set(record)
            try:
                with lock:
                    pass
            finally:
                device.WAIT_REPORT.reset(token)

        me = run_as("on_generate", waiting_job)
        wait_until(lambda: seen)
        release.set()
        me.join(10)
    finally:
        device.WAIT_SHOWN_S = saved
    text = seen[0]
    assert text.startswith("Waiting for the device: 2 jobs before yours (an attack, an edit)"), text
    seconds = float(text.split("about ")[1].split(" s")[0].replace(",", ""))
    assert 50 <= seconds <= 60, text  # what is left of the attack's turn (~40 s) + an edit's turn (20 s)
    assert lock.typical["on_generate"] < 1.0  # learnt from the turn it took


def test_a_jobs_wait_is_not_its_run_time():
    """GROM_MAX_JOB_SECONDS counts a job's own work: the clock moves on by its wait."""
    lock = DeviceLock()
    lock.acquire()
    out = {}

    def job():
        JOB_STARTED.set(time.monotonic())
        before = JOB_STARTED.get()
        with lock:
            out["moved"] = JOB_STARTED.get() - before

    t = run_as("on_compare", job)
    wait_until(lambda: lock.line)
    time.sleep(0.4)
    lock.release()
    t.join(5)
    assert out["moved"] >= 0.35


def test_reentrant_and_only_its_holder_releases_it():
    lock = DeviceLock()
    with lock:
        with lock:
            assert lock.is_free()  # free for its holder
        errors = []

        def other():
            try:
                lock.release()
            except RuntimeError as err:
                errors.append(err)
            errors.append(lock.acquire(blocking=False))

        t = threading.Thread(target=other)
        t.start()
        t.join(5)
        assert isinstance(errors[0], RuntimeError) and errors[1] is False
    assert lock.acquire(timeout=0.1)
    lock.release()


def test_a_timed_acquire_leaves_the_line():
    lock = DeviceLock()
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.3)))
    t.start()
    t.join(5)
    assert got == [False] and not lock.line
    lock.release()


def test_background_work_waiting_is_no_visitor_and_gives_way_to_one():
    """The server's warm-up waiting in the line is not a visitor waiting (it would give
    way to itself), and it leaves the line as soon as a visitor's job waits."""
    lock = device.DEVICE_LOCK
    lock.acquire()
    out = []

    def background():
        with yielding():
            try:
                with lock:
                    out.append("ran")
            except Yielded:
                out.append("gave way")

    t = run_as("warm_first_page", background)
    wait_until(lambda: len(lock.line) == 1)
    assert lock.waiting == 0 and not device.visitors_waiting()
    visitor = run_as("on_generate", lambda: lock.acquire() and lock.release())
    t.join(10)
    assert out == ["gave way"]
    lock.release()
    visitor.join(5)
    assert not lock.line


def test_a_sessions_own_jobs_keep_their_order():
    """`in_turn`: a session's second device job waits for its first (a comparison asked
    during an edit compares that edit); another session's job does not wait for it."""
    from components.server.session import Session, in_turn

    order, gate = [], threading.Event()

    @in_turn
    def edit(session):
        order.append("edit starts")
        gate.wait(5)
        order.append("edit ends")

    @in_turn
    def compare(session):
        order.append("compare")

    @in_turn
    def other(session):
        order.append("other visitor")

    mine, theirs = Session(), Session()
    t1 = threading.Thread(target=edit, args=(mine,))
    t1.start()
    wait_until(lambda: order)
    t2 = threading.Thread(target=compare, args=(mine,))
    t2.start()
    time.sleep(0.2)
    other(theirs)
    gate.set()
    t1.join(5)
    t2.join(5)
    assert order == ["edit starts", "other visitor", "edit ends", "compare"]


@pytest.mark.parametrize("kind, words", [("on_run_edit", "an edit"), ("unknown_job", "a job")])
def test_jobs_are_named_in_words(kind, words):
    lock = DeviceLock()
    holder = device.Turn(kind, time.monotonic(), 1)
    lock.holder = holder
    mine = device.Turn("on_generate", time.monotonic(), 2)
    lock.line.append(mine)
    assert f"1 job before yours ({words})" in lock.wait_text(mine)


def test_a_training_lends_the_model_out_between_its_steps_with_the_same_result(tokenizer):
    """`run_baseline(between=)`: between two optimizer steps the model is as it was found
    (its weights, eval mode, grad flags), another job may run on it and draw random
    numbers, and the run ends with the patches and losses it has without the pauses."""
    from grom.methods import run_baseline
    from tests.conftest import FORGET, RETAIN, tiny_llama

    settings = dict(lr=1e-3, max_steps=4, batch_size=2, grad_accum=1, warmup_epochs=0)
    model = tiny_llama(len(tokenizer))
    found = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    plain = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, **settings)
    lent = []

    def between(as_found):
        with as_found() as m:
            assert not m.training and {n: p.requires_grad for n, p in m.named_parameters()} == flags
            assert all(torch.equal(p, found[n]) for n, p in m.named_parameters())
            torch.rand(1000)  # another job's random numbers
            with torch.no_grad():
                m(torch.tensor([[1, 2, 3]]))
            lent.append(True)

    paused = run_baseline("graddiff", model, tokenizer, FORGET, RETAIN, between=between, **settings)
    assert len(lent) == 3  # between the 4 steps, not after the last
    assert plain.patches.keys() == paused.patches.keys()
    assert all(torch.equal(plain.patches[n], paused.patches[n]) for n in plain.patches)
    assert plain.info["history"] == paused.info["history"]
    assert all(torch.equal(p, found[n]) for n, p in model.named_parameters())  # given back as found


def test_a_comparison_lends_the_model_out_between_its_rows():
    """`evaluate(between=)` runs between the rows it computes (Base, Edited, Retain model)
    and inside each (between its batches; tests/test_turns.py), the model unedited there;
    the numbers are the same."""
    from grom import EditConfig, run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model
    from grom.eval import evaluate

    model, tok = load_demo_model("full")
    reference = load_demo_model("retain")
    bench = load_benchmark("demo", "forget10")
    edit = run_edit(model, tok, bench.forget, bench.retain[:100], EditConfig(layers=(3, 4)))
    found = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls = []

    def between(as_found):
        with as_found():
            calls.append(all(torch.equal(p, found[n]) for n, p in model.named_parameters()))

    with_turns = evaluate(model, tok, bench, edit=edit, reference=reference, max_examples=4, between=between)
    plain = evaluate(model, tok, bench, edit=edit, reference=reference, max_examples=4)
    assert len(calls) > 2 and all(calls)  # between the rows and inside them, the edit reverted
    assert with_turns.table().equals(plain.table())


def test_a_long_job_passes_its_turn_at_any_depth():
    lock, order = DeviceLock(), []
    assert lock.acquire() and lock.acquire()  # held twice (a compute function in a handler)
    assert not lock.pass_turn()  # nobody waits: it goes on at once
    visitor = run_as("on_generate", lambda: (lock.acquire(), order.append("question"), lock.release()))
    wait_until(lambda: lock.line)
    assert lock.pass_turn() and order == ["question"]
    lock.release()
    assert not lock.is_free() or lock.holder is not None  # still held once
    lock.release()
    visitor.join(5)
    assert lock.holder is None and lock.acquire(blocking=False)
    lock.release()


def test_each_visitor_gets_a_turn_in_each_round_whatever_its_number_of_jobs(monkeypatch):
    """Issue 45, item 4: three visitors with three jobs each wait for the device; a fourth
    visitor's job, asked after all nine, goes fourth (a visitor never served first, each
    visitor's own jobs in their order), not tenth."""
    lock, order, who = DeviceLock(), [], threading.local()
    monkeypatch.setattr(device, "job_visitor", lambda: getattr(who, "visitor", ""))
    lock.acquire()

    def job(visitor, name):
        who.visitor = visitor
        with lock:
            order.append(name)

    threads = []
    for name in ["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2", "c3", "d1"]:
        threads.append(run_as("on_generate", job, name[0], name))
        wait_until(lambda n=len(threads): len(lock.line) == n)
    text = lock.wait_text(lock.line[-1])
    assert "4 jobs before yours" in text  # the holder, then a1, b1 and c1: its place as the line serves it
    lock.release()
    for t in threads:
        t.join(5)
    assert order == ["a1", "b1", "c1", "d1", "a2", "b2", "c2", "a3", "b3", "c3"]
