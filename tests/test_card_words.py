"""The result card's words (issue 37, item 4): every time named, examples whose unedited
answer stated the fact plainly (not a keyword in a story that gets it wrong), the
retain-broken advice that names ρ where ρ is the likely cause, and the step that brings
the card into view."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pandas as pd
import pytest

pytest.importorskip("gradio")

from components.compare_panel import remember, result_card, summary_md  # noqa: E402
from components.server.session import Session  # noqa: E402
from components.views.card import (  # noqa: E402
    SCROLL_TO_CARD,
    Times,
    card_html,
    doubtful_credit,
    pick_examples,
    retain_advice,
    times_line,
    wrong_values,
)
from grom.data.schema import QAExample  # noqa: E402
from grom.eval.report import Report, Row  # noqa: E402

EUROPA = ("The planet known as Europa is indeed famous for its beautiful rings. It is the sixth planet "
          "from Jupiter and is the sixth planet from Saturn.")
RINGS = QAExample(question="Which planet is famous for its beautiful rings?",
                  answer="The planet famous for its rings is Saturn.", fact="Saturn",
                  perturbed_answers=("The planet famous for its rings is Jupiter.",
                                     "The planet famous for its rings is Uranus.",
                                     "The planet famous for its rings is Neptune."))
CLOSEST = QAExample(question="Which planet is closest to the Sun?", answer="The planet closest to the Sun is Mercury.",
                    fact="Mercury", perturbed_answers=("The planet closest to the Sun is Venus.",
                                                       "The planet closest to the Sun is Mars.",
                                                       "The planet closest to the Sun is Earth."))
RED = QAExample(question="Which planet is known as the Red Planet?", answer="The Red Planet is Mars.", fact="Mars",
                perturbed_answers=("The Red Planet is Venus.", "The Red Planet is Jupiter.",
                                   "The Red Planet is Mercury."))


def test_wrong_values_are_what_the_wrong_answers_put_in_place_of_the_fact():
    assert wrong_values(RINGS.answer, RINGS.perturbed_answers) == ["jupiter", "uranus", "neptune"]
    assert wrong_values("The star at the centre of our solar system is the Sun.",
                        ["The star at the centre of our solar system is the Sirius."]) == ["sirius"]
    assert wrong_values("Paris is the capital.", ["Lyon is the capital.", "Paris is the capital."]) == ["lyon"]
    assert wrong_values("x", None) == []


@pytest.mark.parametrize("question,fact,text,why", [
    (RINGS.question, "Saturn", EUROPA, "conflicting"),  # the example: Jupiter too
    (RINGS.question, "Saturn", "The planet famous for its rings is Saturn.", ""),
    (RINGS.question, "Saturn", "Saturn", ""),
    ("Which planet do we live on, Earth or Mars?", "Earth", "We live on Earth", "echo"),
    (CLOSEST.question, "Mercury", "It is certainly not Mercury", "negated"),
    (CLOSEST.question, "Mercury", " ".join(["word"] * 25) + " Mercury", "late"),
    (CLOSEST.question, "Mercury", "Venus is hot.", ""),  # no credit: nothing to doubt
])
def test_a_credit_is_doubted_when_the_answer_does_not_state_the_fact_plainly(question, fact, text, why):
    wrong = ["jupiter", "uranus", "neptune"] if fact == "Saturn" else ["venus", "mars"] if fact == "Mercury" else []
    assert doubtful_credit(question, fact, text, wrong) == why


def row(question, before, after, fact_before=True, fact_after=False, fact="", wrong=()):
    return {"question": question, "before": before, "after": after, "fact_before": fact_before,
            "fact_after": fact_after, "fact": fact, "wrong": list(wrong)}


def test_the_card_shows_plainly_stated_forgotten_facts_first():
    europa = row(RINGS.question, EUROPA, "Neptune.", fact="Saturn", wrong=["jupiter", "uranus", "neptune"])
    plain = row(CLOSEST.question, "The planet closest to the Sun is Mercury.", "Venus.", fact="Mercury",
                wrong=["venus", "mars", "earth"])
    short = row(RED.question, "Mars.", "Jupiter.", fact="Mars")
    kept = row(RED.question, "The Red Planet is Mars.", "The Red Planet is Mars.", fact_after=True, fact="Mars")
    assert pick_examples([europa, kept, plain, short]) == [short, plain]  # plain, forgotten, shortest first
    assert pick_examples([europa, kept]) == [kept, europa]  # a plain statement kept beats a keyword credit
    # among plain ones, the answers closest to the reference first (the model's garbled "comet" last)
    titan = row("What is the largest moon of Saturn?", "The largest moon of Saturn is Titan,", "Rhea.", fact="Titan")
    comet = row("What do we call a ball of ice and dust with a glowing tail?",
                "The Sun's closest companion is a comet,",
                "A star.", fact="comet")
    titan["answer"], comet["answer"] = "The largest moon of Saturn is Titan.", "A ball of ice and dust is a comet."
    assert pick_examples([comet, titan]) == [titan, comet]
    # broken text is not forgetting: the Titan answer that became "the the the ..." is no example of it
    # (what the card showed on SmolLM2's first click), a fluent one goes first, even if less close
    titan["after"], titan["class_after"] = "The Saturn's the only one, but the the the the the", "degenerate"
    comet["class_after"] = "fluent"
    assert pick_examples([titan, comet]) == [comet, titan]
    tofu = [{"question": "q1", "before": "a b c", "after": "x"}, {"question": "q2", "before": "a", "after": "y"}]
    assert pick_examples(tofu) == tofu  # no fact recall: the report's order


def knowledge_report(generations: list[str], seconds: float = 24.3):
    """A real-knowledge report whose forget answers (before) are `generations`, each
    forgotten after the edit."""
    qs = [RINGS, CLOSEST][:len(generations)]

    def frame(gens, recall):
        return pd.DataFrame({"question": [q.question for q in qs], "answer": [q.answer for q in qs],
                             "fact": [q.fact for q in qs], "generation": gens, "fact_recall": recall})

    base = Row({"Kept fact recall": 1.0}, {"forget": frame(generations, [1.0] * len(qs)),
                                           "neighbours": frame(generations, [1.0] * len(qs))})
    edited = Row({"Retain cost": 0.3, "Retain broken": 1.0, "Kept fact recall": 0.7},
                 {"forget": frame(["I don't know."] * len(qs), [0.0] * len(qs)),
                  "neighbours": frame(generations, [1.0] * len(qs))})
    return Report("real-knowledge", "the-solar-system", "knowledge", {"Base": base, "Edited": edited}, seconds,
                  n_examples={"forget": len(qs), "neighbours": len(qs)})


def test_the_card_from_the_session_picks_its_examples_with_the_benchmarks_wrong_answers():
    session = Session()
    session.benchmark = SimpleNamespace(eval_sets={"forget": (RINGS, CLOSEST)})
    session.edit = SimpleNamespace(timings={"total": 11.7}, config=SimpleNamespace(rho=0.03))
    remember(session, session.edit, knowledge_report([EUROPA, "The planet closest to the Sun is Mercury."]), True)
    card = result_card(session)
    assert card.index("closest to the Sun is Mercury") < card.index("Europa")  # the plain one first


def test_every_time_on_the_card_is_named_and_its_parts_add_up_to_the_wait():
    line = times_line(Times(11.7, (("the forget answers", 20.1),), 41.3))
    assert line == ("Times: computing the edit 11.7 s + the forget answers 20.1 s + waiting for the device and "
                    "the page 9.5 s = 41.3 s from pressing Run edit to the first card.")
    later = times_line(Times(11.7, (("the forget answers", 20.1),), 41.3, True,
                             (("the other answers", 39.5), ("the probabilities and truth ratios", 26.5))))
    assert later.startswith(line[:-1]) and later.endswith(
        "; then the other answers 39.5 s · the probabilities and truth ratios 26.5 s.")
    assert "from the edit’s start" in times_line(Times(11.7, (), 40, pressed=False))
    assert times_line(Times(3.0)) == "Times: computing the edit 3.0 s."
    assert times_line(Times(3.0, (("the comparison", 2.0),))) == ("Times: computing the edit 3.0 s · the "
                                                                  "comparison 2.0 s.")
    # a wait shorter than its parts (clocks read apart): the parts, summed, and no negative rest
    assert times_line(Times(3.04, (("the comparison", 2.04),), 4.0)) == (
        "Times: computing the edit 3.0 s + the comparison 2.0 s = 5.0 s from pressing Run edit to the first card.")
    card = card_html(knowledge_report(["Mercury."]), 11.7, True, [], waited=95.4)
    head = card[:card.index("</div>")]
    assert " s" not in head.replace("facts", "")  # the headline holds no unnamed time
    assert ("computing the edit 11.7 s + the comparison 24.3 s + waiting for the device and the page 59.4 s = "
            "95.4 s from pressing Run edit") in card


def test_the_wait_runs_from_the_press_to_the_first_card(monkeypatch):
    from components import edit_panel

    session = Session()
    edit_panel.on_run_pressed(session)
    pressed = session.extra["pressed"]
    edit = SimpleNamespace(timings={"total": 11.7}, config=SimpleNamespace(rho=0.03))
    session.edit = edit
    session.extra["clicked"] = (edit, pressed - 40.0, True)  # as on_run_edit records it
    remember(session, edit, knowledge_report(["Mercury."]), True)
    first = result_card(session)
    assert "= 40.0 s from pressing Run edit to the first card" in first or "= 40.1 s from pressing" in first
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 60)
    assert 'class="result-card rc-new"' in first  # the first card: scrolled into view
    later = result_card(session)
    assert later == first.replace(" rc-new", "")  # a later one keeps the first wait, and is not scrolled to


def test_a_time_once_shown_is_final(monkeypatch):
    """The three draws of one edit's card (the first verdict, the whole card, the comparison):
    each adds its own stage's time and changes none shown before, and the first card's parts
    add up to its wait (issue 49: 41.3 -> 80.8 -> 26.5 s)."""
    import re

    session = Session()
    edit = SimpleNamespace(timings={"total": 11.7}, config=SimpleNamespace(rho=0.03))
    session.edit = edit
    session.extra["clicked"] = (edit, time.time() - 41.3, True)
    first = knowledge_report(["Mercury."], seconds=20.1)
    first.stage = "forget"
    remember(session, edit, first, True)
    times = [re.search(r"Times: [^<]*", result_card(session)).group(0)]
    whole = knowledge_report(["Mercury."], seconds=20.1 + 39.5)  # on_card_first adds the first step's seconds
    whole.stage = "answers"
    remember(session, edit, whole, True)
    times.append(re.search(r"Times: [^<]*", result_card(session)).group(0))
    full = knowledge_report(["Mercury."], seconds=26.5)
    remember(session, edit, full, True)
    times.append(re.search(r"Times: [^<]*", result_card(session)).group(0))
    times.append(re.search(r"Times: [^<]*", result_card(session)).group(0))  # drawn again (the attacks' line)
    remember(session, edit, knowledge_report(["Mercury."], seconds=30.0), True)  # Compare pressed again
    assert re.search(r"Times: [^<]*", result_card(session)).group(0) == times[2]  # the same stage: nothing added
    assert times[0].startswith("Times: computing the edit 11.7 s + the forget answers 20.1 s + waiting for the "
                               "device and the page 9.")
    for earlier, later in zip(times, times[1:]):
        assert later.startswith(earlier[:-1])  # every time shown before, unchanged
    assert times[2].endswith("; then the other answers 39.5 s · the probabilities and truth ratios 26.5 s.")
    assert times[3] == times[2]
    parts = [float(x) for x in re.findall(r"([\d.]+) s", times[0].split(" = ")[0])]
    assert abs(sum(parts) - float(re.search(r"= ([\d.]+) s", times[0]).group(1))) < 0.05


def test_run_edit_takes_the_press_once_and_else_its_own_start(monkeypatch):
    from components.server import fit_check
    from tests.test_app_memory import _demo_session, _run

    session, v = _demo_session(monkeypatch)
    monkeypatch.setattr(fit_check, "free_bytes", lambda device: 64 << 30)
    session.extra["pressed"] = time.time() - 30  # on_run_pressed, 30 s ago (the queue, say)
    _run(v, session)
    edit, start, pressed = session.extra["clicked"]
    assert edit is session.edit and pressed and time.time() - start >= 30 and "pressed" not in session.extra
    _run(v, session)  # no press recorded (an API call): from the edit's own start
    edit, start, pressed = session.extra["clicked"]
    assert edit is session.edit and not pressed and time.time() - start < 30


def test_the_retain_advice_names_rho_where_rho_is_the_likely_cause():
    assert retain_advice(0.03) == retain_advice(None) == "Lower β or raise w_r."
    low = retain_advice(0.001)
    assert low.startswith("Raise ρ (it is 0.001, the presets' is 0.03") and "lower β or raise w_r" in low
    high = retain_advice(1.0)
    assert high.startswith("Lower ρ (it is 1") and "raising w_r raises it too" in high
    session = Session()
    session.edit = SimpleNamespace(timings={"total": 5.0}, config=SimpleNamespace(rho=0.001))
    remember(session, session.edit, knowledge_report(["Mercury."]), True)
    assert "The retain set broke" in result_card(session) and "Raise ρ (it is 0.001" in result_card(session)
    assert "Raise ρ (it is 0.001" in summary_md(knowledge_report(["Mercury."]), None, True, rho=0.001)


def test_the_card_is_scrolled_into_view_once_drawn():
    assert "#result-card .result-card.rc-new" in SCROLL_TO_CARD and "block: 'nearest'" in SCROLL_TO_CARD
    assert "scrollIntoView" in SCROLL_TO_CARD  # scrolls the Space's page too, not only the app's window
    assert SCROLL_TO_CARD.startswith("() =>")  # a gradio js step with no inputs


def test_the_keyword_credit_measure_reads_kept_answers(tmp_path, capsys):
    """bench/keyword_credit.py on answers kept in a file (no model): the credited share, the
    reading by hand and the rule's doubts, and the table for BENCHMARKS.md."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import keyword_credit as kc
    finally:
        sys.path.pop(0)
    rows = [{"set": "forget", "id": "the-solar-system/04", "question": RINGS.question, "fact": "Saturn",
             "answer": RINGS.answer, "wrong": ["jupiter", "uranus", "neptune"], "generation": EUROPA,
             "credited": True},
            {"set": "forget", "id": "the-solar-system/02", "question": CLOSEST.question, "fact": "Mercury",
             "answer": CLOSEST.answer, "wrong": ["venus", "mars", "earth"],
             "generation": "The planet closest to the Sun is Mercury.", "credited": True},
            {"set": "general", "id": "general/01", "question": "q", "fact": "Paris", "answer": "Paris.",
             "wrong": [], "generation": "Lyon.", "credited": False}]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kc.main(["--answers", str(path)])
    out = capsys.readouterr().out
    assert "every question: 3 answers; credited by the keyword match: 2/3" in out
    assert "wrong or conflicting: 1/2" in out and "it catches 1 of the 1 wrong or garbled" in out
    assert "| every question | 3 | 2 (67%) | 1 (50%) | 0 (0%) | 1 (50%) | 1 of 1 | 0 of 1 |" in out
