"""The studio's name-only box (components.studio.name_only, the benchmark panel): how much one
request writes is bounded and priced, the edited table becomes the benchmark "name-only" or
a message that says what to do, and the Write button runs the model's writing in the
session's turn, on the demo model."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from components import benchmark_panel
from components.server.durations import write_s
from components.server.errors import UserError
from components.server.model_choices import ensure_model, model_key
from components.server.session import Session
from components.studio.benchmarks import read_benchmark
from components.studio.name_only import COLUMNS, texts_written, writing_config, written_benchmark
from grom.data import QAExample, TextExample
from grom.tasks.knowledge import load_knowledge

TABLE = pd.DataFrame([
    dict(side="forget", subject="the-solar-system", kind="qa", prompt="Which planet has rings?",
         text="Saturn has rings."),
    dict(side="forget", subject="the-solar-system", kind="passage",
         prompt="Please write a short article about The Solar System.", text="Stars."),
    dict(side="retain", subject="the-human-body", kind="qa", prompt="What pumps blood?", text="The heart pumps blood."),
], columns=list(COLUMNS))  # the table's own column order


def test_the_sliders_make_a_writing_config_with_the_neighbours_share():
    config = writing_config(8, 16, 2)
    assert (config.passages, config.questions, config.neighbours) == (8, 16, 2)
    assert (config.neighbour_passages, config.neighbour_questions) == (2, 8)
    assert config.questions_kept == "all"  # RWKU's: one try a question, every one kept, then its answer
    assert texts_written(config) == 8 + 2 * 16 + 2 * (2 + 2 * 8) == 76
    project = dataclasses.replace(config, questions_kept="filtered")  # the project's: two tries a question
    assert texts_written(project) == 8 + 3 * 16 + 2 * (2 + 3 * 8) == 108


def test_a_request_past_the_limit_names_it(monkeypatch):
    with pytest.raises(UserError, match="GROM_MAX_WRITTEN"):
        writing_config(32, 48, 4)
    monkeypatch.setenv("GROM_MAX_WRITTEN", "1000")
    assert writing_config(32, 48, 4).neighbours == 4
    with pytest.raises(UserError, match="both sliders are at 0"):
        writing_config(0, 0, 2)
    with pytest.raises(UserError, match="neighbouring subjects must be a whole number from 0 to 4"):
        writing_config(1, 1, 9)


def test_writing_is_priced_by_what_it_writes():
    key = ensure_model(model_key("demo", "cpu", "float32")).key
    small, big = write_s(key, "the-solar-system", writing_config(2, 2, 0)), write_s(
        key, "the-solar-system", writing_config(16, 24, 2))
    assert 1 <= small < big


def test_the_table_becomes_the_name_only_benchmark():
    bench = written_benchmark("the-solar-system", TABLE, "questions", known_only=False)
    assert [type(x) for x in bench.forget] == [QAExample] and [type(x) for x in bench.retain] == [QAExample]
    assert bench.eval_sets == load_knowledge("the-solar-system").eval_sets
    both = written_benchmark("the-solar-system", TABLE, "both", known_only=False)
    assert [type(x) for x in both.forget] == [QAExample, TextExample]
    # the benchmark panel's path: the table as the API sends it (headers and data)
    api = {"headers": list(COLUMNS), "data": TABLE.values.tolist()}
    assert read_benchmark("name-only", "the-solar-system", "", None, None, None, pd.DataFrame(**{
        "data": api["data"], "columns": api["headers"]}), "questions").forget == bench.forget


@pytest.mark.parametrize("table, use, message", [
    (None, "questions", "Nothing written yet: press \\*\\*Write with the model\\*\\*"),
    (pd.DataFrame(columns=list(COLUMNS)), "questions", "Nothing written yet"),
    (TABLE.drop(columns=["kind"]), "questions", "lacks the column\\(s\\) kind"),
    (TABLE.assign(side=["forget", "keep", "retain"]), "questions", "written row 2: .*side 'keep'"),
    (TABLE, "passages+", "Fit on one of questions, passages, both"),
    (TABLE[TABLE.side == "forget"], "questions", "nothing written about the neighbours"),
])
def test_a_table_that_cannot_make_a_benchmark_says_what_to_do(table, use, message):
    with pytest.raises(UserError, match=message):
        written_benchmark("the-solar-system", table, use, known_only=False)


def test_an_unknown_target_is_refused_before_the_model_writes():
    session = Session()
    session.model_key = ensure_model(model_key("demo", "cpu", "float32")).key
    with pytest.raises(Exception, match="Choose one of the bundled subjects"):
        benchmark_panel.on_write("forget10", 2, 2, 1, session)


def test_the_box_shows_with_its_benchmark():
    split, box, _, asked = benchmark_panel.on_benchmark_change("name-only", 0, Session())
    assert split.value == "the-solar-system" and box.visible is True  # the subject SmolLM2 knows best
    assert not isinstance(asked, int)  # gr.skip(): not loaded, nothing is written yet
    _, box, _, asked = benchmark_panel.on_benchmark_change("demo", 0, Session())
    assert box.visible is False and asked == 1  # chosen: loaded


def test_write_fills_the_table_and_loading_it_fits_only_what_was_written():
    session = Session()
    session.model_key = ensure_model(model_key("demo", "cpu", "float32")).key
    table, line = benchmark_panel.on_write("the-solar-system", 2, 2, 1, session)
    assert list(table.columns) == list(COLUMNS)
    assert set(table.side) == {"forget", "retain"} and set(table.subject) == {"the-solar-system", "the-human-body"}
    assert "The model wrote" in line and "Load what was written" in line
    kept = benchmark_panel.written_frame(session.extra["written"][0])
    assert kept.equals(table)  # kept for Load benchmark (an API client has no change event), as JSON text
    again, _ = benchmark_panel.on_write("the-solar-system", 2, 2, 1, session)
    assert again.equals(table)  # seeded: the same texts on every press
    benchmark_panel.on_written_edit(table, "passages", session)  # the table's and the radio's change
    info, *_ = benchmark_panel.on_load_benchmark("name-only", "the-solar-system", "", None, None, session)
    assert "name only" in info and session.bench_label == "name-only/the-solar-system"
    assert {x.text for x in session.benchmark.forget} == set(table[(table.side == "forget")
                                                                    & (table.kind == "passage")].text)


def test_the_cards_probe_line_says_no_forget_question_was_fitted_in_the_name_only_setting():
    from types import SimpleNamespace

    from components.views.card import probe_line
    from grom.eval.verdicts import Tally

    report = SimpleNamespace(tallies=lambda: {"forget": Tally(10, 6, 0, 4), "probes": Tally(8, 2, 0, 6)})
    assert "against 60% of the fitted ones" in probe_line(report, True)
    line = probe_line(report, True, fitted=False)
    assert "forgot **2 of the 8**" in line and "against 60% of the other half, which it never saw either" in line
