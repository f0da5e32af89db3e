"""One rule for what became of a fact the unedited model knew (issue 49, item 3): forgot,
broke (degenerate text) or still stated, counted by `grom.eval.verdicts` and read alike by
the card's headline and probe line, the Compare summary, the attack table and its summary,
the history and the exported comparison. The card once said "Forgot 11 of the 15" beside
"against 93% of the fitted ones", the second counting broken answers as forgotten."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from grom.eval import metrics as M
from grom.eval.report import Report, Row
from grom.eval.verdicts import Tally, pooled, tally, tally_answers
from grom.tasks.knowledge import _knowledge_relative

LOOP = "the the the the the the the the the the"


def test_a_tally_splits_the_known_facts_in_three():
    t = tally([1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 1, 1])
    assert t == Tally(known=4, forgot=2, broke=1, still=1)  # a stated fact is never broken; unknown ones count not
    assert t.forgot + t.broke + t.still == t.known and t.share("forgot") == 0.5
    assert tally([1, 1], [0, 0]) == Tally(2, 2, 0, 0)  # no classes: nothing broke
    assert pooled({"a": Tally(2, 1, 0, 1), "b": Tally(3, 0, 1, 2)}, ("a", "b", "c")) == Tally(5, 1, 1, 3)
    assert pooled({}, ("a",)) is None
    with pytest.raises(ValueError, match="must be known"):
        Tally(3, 1, 1, 0)
    answers = tally_answers(["Mars", "Venus", "Saturn", "Titan"], ["Mars.", "Venus.", "Saturn.", "No idea."],
                            ["I don't know.", LOOP, "Saturn.", "Titan."])
    assert answers == Tally(known=3, forgot=1, broke=1, still=1)


FORGET = [("Which planet is red?", "Mars"), ("Which planet is closest to the Sun?", "Mercury"),
          ("Which planet has rings?", "Saturn"), ("Which planet is largest?", "Jupiter"),
          ("Which planet is hottest?", "Venus"), ("Which is the largest moon of Saturn?", "Titan")]
FORGET_AFTER = ["Mars.", "Mercury.", "I don't know.", "It is Neptune.", LOOP, "..."]  # 2 still, 2 forgot, 2 broke
PROBES = [("What is the red planet called?", "Mars"), ("Name the planet nearest the Sun.", "Mercury"),
          ("Which planet is famous for its rings?", "Saturn"), ("Name the biggest planet.", "Jupiter"),
          ("What is Earth's moon called?", "Luna")]
PROBES_BEFORE = ["Mars.", "Mercury.", "Saturn.", "Jupiter.", "The Moon."]  # the last one not known
PROBES_AFTER = ["Mars.", LOOP, "Uranus.", "I'm not sure.", "Luna."]  # 1 still, 1 broke, 2 forgot
KEPT = [("What is the capital of France?", "Paris"), ("What is the capital of Italy?", "Rome")]


def frame(pairs, answers):
    return pd.DataFrame({"question": [q for q, _ in pairs], "answer": [f"It is {f}." for _, f in pairs],
                         "fact": [f for _, f in pairs], "generation": answers,
                         "fact_recall": [M.fact_recall(f, a) for (_, f), a in zip(pairs, answers)],
                         "answer_class": [M.answer_class(f, a) for (_, f), a in zip(pairs, answers)]})


def knowledge_report() -> Report:
    base = Row({}, {"forget": frame(FORGET, [f"{f}." for _, f in FORGET]),
                    "probes": frame(PROBES, PROBES_BEFORE), "neighbours": frame(KEPT, ["Paris.", "Rome."])})
    edited = Row({"Retain cost": 0.0, "Retain broken": 0.0},
                 {"forget": frame(FORGET, FORGET_AFTER), "probes": frame(PROBES, PROBES_AFTER),
                  "neighbours": frame(KEPT, ["Paris.", "Milan."])})
    rows = {"Base": base, "Edited": edited}
    _knowledge_relative(rows)  # the task's metrics: recall, classes and the Knowledge score
    return Report("real-knowledge", "the-solar-system", "knowledge", rows, 3.0,
                  n_examples={"forget": 6, "probes": 5, "neighbours": 2})


def test_every_place_that_counts_gives_the_same_counts(tmp_path, monkeypatch):
    pytest.importorskip("gradio")
    from components.attack_panel import results_frame
    from components.attack_panel import summary_md as attack_summary
    from components.compare_panel import summary_md
    from components.studio import downloads
    from components.studio.history import headline_metrics
    from components.views.card import card_html, headline, probe_line
    from grom.robustness import AttackResult
    from grom.robustness.result import Probe

    report = knowledge_report()
    forget, probes = report.tallies()["forget"], report.tallies()["probes"]
    assert forget == Tally(known=6, forgot=2, broke=2, still=2) and probes == Tally(known=4, forgot=2, broke=1, still=1)
    # the Knowledge score's rule: forgotten = 1 - recall - degenerate
    m = report.rows["Edited"].metrics
    assert m["Forget clean forgetting"] == pytest.approx(forget.share("forgot"))
    assert m["Probe degenerate"] == pytest.approx(probes.share("broke"))

    said = "Forgot **2 of the 6** forget facts it knew · **2** broke into degenerate text"
    line = ("Held-out probes the edit never saw: forgot **2 of the 4** it knew (50%, against 33% of the fitted "
            "ones), 1 broke into degenerate text.")
    assert headline(report).startswith(said) and probe_line(report, whole=True) == line
    card = card_html(report, 1.0, True, [])
    assert "Forgot <b>2 of the 6</b>" in card and "forgot <b>2 of the 4</b> it knew (50%, against 33%" in card
    summary = summary_md(report, None, True)
    assert said in summary and line in summary

    held = [Probe(q, f"It is {f}.", f) for q, f in PROBES]
    hits = lambda answers: [M.fact_recall(p.fact, a) for p, a in zip(held, answers)]  # noqa: E731
    results = {"GROM": {"heldout": AttackResult("heldout", sum(hits(PROBES_BEFORE)) / 5, sum(hits(PROBES_AFTER)) / 5,
                                                1.0, 5, tuple(PROBES_BEFORE), tuple(PROBES_AFTER))}}
    table = results_frame(results, ("heldout",), held)
    assert table.loc[0, "GROM forgot"] == "2 of 4 · 1 broke"
    assert "(of the 4 it stated before, it forgot 2, 50%, 1 broke into degenerate text)" in \
        attack_summary(results, ("heldout",), held)

    history = headline_metrics(report)
    assert (history["Known"], history["Forgot"], history["Broke"]) == (6, 2, 2)
    assert (history["Probes known"], history["Probes forgot"], history["Probes broke"]) == (4, 2, 1)

    monkeypatch.setattr(downloads, "_folder", lambda: tmp_path)
    paths = downloads.report_files(report, "x")
    written = json.loads(Path(next(p for p in paths if p.endswith(".json"))).read_text())
    assert written["tallies"]["Edited"]["forget"] == {"known": 6, "forgot": 2, "broke": 2, "still": 2}
    assert written["tallies"]["Edited"]["probes"] == {"known": 4, "forgot": 2, "broke": 1, "still": 1}
    assert report.to_dict()["tallies"] == written["tallies"]  # the CLI's --json too
