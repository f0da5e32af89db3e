"""The card in two steps (issue 37, item 5): the forget verdict first, then the whole card,
sent by a generator handler whose wrappers (`ui_errors`, `in_turn`) work step by step."""
from __future__ import annotations

import threading

import gradio as gr
import pytest

from components.server.errors import JOB_STARTED, ui_errors
from components.server.session import Session, in_turn


def test_a_streaming_handler_is_wrapped_step_by_step():
    """Each yield reaches gradio; an error in a later step is a gr.Error with its message;
    nothing set for the job (its clock) outlives a step, which gradio may run in another
    thread; and the session's turn is free while gradio sends what a step yielded."""
    session = Session()
    seen = []

    def handler(x, session):
        seen.append(("clock", JOB_STARTED.get() is not None))
        yield f"first {x}"
        seen.append(("held", session.turn._is_owned()))
        yield f"second {x}"
        raise ValueError("the third step failed")

    wrapped = in_turn(ui_errors(handler))
    import inspect
    assert inspect.isgeneratorfunction(wrapped)  # gradio streams what it yields
    steps = wrapped(1, session)
    assert next(steps) == "first 1" and JOB_STARTED.get() is None
    free = []
    t = threading.Thread(target=lambda: free.append(session.turn.acquire(timeout=1) and session.turn.release()
                                                    is None))
    t.start()
    t.join()
    assert free == [True]  # another job of the session may run between the steps
    assert next(steps) == "second 1"
    with pytest.raises(gr.Error, match="the third step failed"):
        next(steps)
    assert seen == [("clock", True), ("held", True)]


def test_a_stopped_stream_closes_its_handler():
    closed = []

    def handler(session):
        try:
            yield "one"
            yield "two"
        finally:
            closed.append(True)

    steps = in_turn(ui_errors(handler))(Session())
    assert next(steps) == "one"
    steps.close()  # gradio cancels the job between two yields
    assert closed == [True]


def test_the_card_comes_in_two_steps_on_a_knowledge_benchmark():
    """On the demo model and real-knowledge: the first card is the forget verdict (the kept
    facts still being counted), the second the whole card, from the answers stage that
    the comparison after it reads; each step a report of its stage."""
    import app
    from components.compare_panel import on_card_first
    from components.server.allowed_sources import DEMO
    from components.server.session import REGISTRY
    from grom import EditConfig, run_edit
    from grom.data import load_benchmark

    app.preload(DEMO, "cpu")
    handle = REGISTRY.current
    session = Session()
    session.model_key = handle.key
    session.benchmark = load_benchmark("real-knowledge")
    bench = session.benchmark
    session.edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain[:24],
                            EditConfig(layers=(3, 4), beta=30.0, w_r=30.0, prompt_format=bench.prompt_format))
    session.edit_for = handle.key
    progress = []
    cards = list(in_turn(on_card_first)(5, False, session, progress=lambda f, desc=None: progress.append(desc)))
    assert len(cards) == 2, cards
    first, whole = cards
    assert "rc-pending" in first and "rc-pending" not in whole
    assert session.extra["answers"][3].stage == "answers"
    # each step's own time, the first one's as the first card showed it
    shown = first[first.index("Times: "):first.index("</div>", first.index("Times: "))]
    assert "the forget answers" in shown and "the other answers" in whole and shown.rstrip(".") in whole
    assert session.extra["card"][1].stage == "answers"
    assert any(d and d.startswith("the forget answers:") for d in progress), progress
    assert any(d and d.startswith("the other answers:") for d in progress), progress


@pytest.mark.parametrize("held", ["answers", "full"])
def test_a_first_verdict_waits_for_the_warm_ups_forget_answers_alone(held, tmp_path, monkeypatch):
    """A page's warm-up computes the unedited rows in stages (`comparison.BASE_STAGES`): the
    forget side's answers, the others, then the scores the comparison adds, each stage's
    answers lent to the next. A card asked
    meanwhile reads the answers as soon as those it reads are kept, not computed again: a
    first verdict those to the forget questions and the probes, while the kept sets'
    answers or the scores (`held` back here) are still being computed (on SmolLM2's
    default page on a 2-core CPU the answers take 17 s, the scores 31 s more); the
    comparison after it reads the full Base report."""
    import app
    from components.server import flights
    from components.server.allowed_sources import DEMO
    from components.server.session import REGISTRY
    from components.studio import comparison
    from grom import EditConfig, run_edit
    from grom.data import load_benchmark

    monkeypatch.setenv("GROM_CARD_DIR", str(tmp_path))
    app.preload(DEMO, "cpu")
    handle = REGISTRY.current
    session = Session()
    session.model_key = handle.key
    session.benchmark = bench = load_benchmark("real-knowledge")
    comparison._BASE_CACHE.clear()
    calls, scoring, release = [], threading.Event(), threading.Event()
    original = comparison.compute_report

    def watched(key, bench, edit, n, progress, record_at=(), prior=None, prefix=True, stage="full", answers=None):
        calls.append((edit is None, stage, prior is not None and prior.stage))
        if edit is None and stage == held:  # the warm-up's stage `held`: held until the card is done
            scoring.set()
            assert release.wait(60)
        return original(key, bench, edit, n, progress, record_at, prior, prefix, stage, answers)
    monkeypatch.setattr(comparison, "compute_report", watched)
    warm = threading.Thread(target=comparison.warm_base_rows, args=(5, session))
    warm.start()
    try:
        assert scoring.wait(120)
        edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain[:24],
                        EditConfig(layers=(3, 4), beta=30.0, w_r=30.0, prompt_format=bench.prompt_format))
        first = comparison.comparison_report(handle, bench, edit, 5, None, stage="forget")
        assert first.stage == "forget" and flights.running(comparison.base_flight(handle.key, bench, 5, held))
    finally:
        release.set()
        warm.join(120)
    warm = [(True, "forget", False), (True, "answers", "forget"), (True, "full", "answers")]
    upto = 2 if held == "answers" else 3
    assert calls[:upto + 1] == warm[:upto] + [(False, "forget", "forget" if held == "answers" else "answers")]
    assert calls[upto + 1:] == warm[upto:]
    full = comparison.base_report(handle.key, bench, 5)
    assert full is not None and full.stage == "full" and "Forget prob" in full.rows["Base"].metrics
    assert full.rows["Base"].examples["forget"]["generation"].tolist() == \
        first.rows["Base"].examples["forget"]["generation"].tolist()
