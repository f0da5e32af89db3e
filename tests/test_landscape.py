"""The landscape (`grom.landscape`): its grid around the current setting, the Pareto front
against brute force, the reader's teacher-forced reading against the answers decoding
gives, and each cell as the edit Run edit makes."""
from __future__ import annotations

import itertools
import random

import pytest

from grom import EditConfig, run_edit
from grom.eval import evaluate
from grom.eval.results import EDITED
from grom.eval.runner import generate
from grom.landscape import AnswerReader, Cell, Grid, Question, around, landscape, pareto
from grom.landscape import run as landscape_run
from tests.test_eval_knowledge import _knowledge_bench

CONFIG = EditConfig(layers=(1, 2), beta=30.0, w_r=30.0)


def test_the_grid_goes_around_the_current_setting():
    assert around(65.0) == (16.25, 32.5, 65.0, 130.0, 260.0)
    assert around(0.3, (0.1, 1.0, 10.0)) == (0.03, 0.3, 3.0)
    grid = Grid.around(EditConfig(beta=65.0, w_r=100.0, rho=0.03))
    assert grid.size == 25 and grid.w_rs == (10.0, 30.0, 100.0, 300.0, 1000.0) and grid.rho == 0.03
    order = grid.order((65.0, 100.0))
    assert order[0] == (65.0, 100.0) and sorted(order) == sorted(itertools.product(grid.strengths, grid.w_rs))
    assert set(order[1:9]) == {(s, w) for s in (32.5, 65.0, 130.0) for w in (30.0, 100.0, 300.0)} - {(65.0, 100.0)}
    corrupt = EditConfig(target="corruption", c=45.0, w_r=1000.0)
    assert Grid.around(corrupt).strengths[2] == 45.0
    assert Grid.around(corrupt).config(corrupt, 90.0, 100.0).c == 90.0
    with pytest.raises(ValueError, match="rho"):
        Grid((1.0,), (1.0,), 0.0)


def test_the_front_is_the_points_no_other_beats():
    rng = random.Random(0)
    for _ in range(50):
        pts = [(rng.choice([0.0, 0.25, 0.5, 1.0]), rng.choice([0.0, 0.1, 0.3])) for _ in range(rng.randint(1, 12))]
        brute = [i for i, (f, c) in enumerate(pts)
                 if not any(f2 >= f and c2 <= c and (f2, c2) != (f, c) for f2, c2 in pts)]
        assert pareto(pts) == brute


def test_a_cell_pools_its_sets_by_either_reading():
    cell = Cell(65.0, 100.0, 0.03, {"forget": (10, 2, 4), "neighbours": (8, 6, 8), "general": (2, 1, 2)})
    assert cell.lost("forget", "stated") == pytest.approx(0.8) and cell.lost("forget") == pytest.approx(0.6)
    assert cell.lost(("neighbours", "general", "retain"), "stated") == pytest.approx(0.3)
    assert cell.lost(("neighbours", "general")) == 0.0 and cell.lost("probes") is None


def _edited(model, tokenizer, bench, **changes):
    return run_edit(model, tokenizer, bench.forget, bench.retain, CONFIG.replace(**changes), progress=False)


def test_a_reading_says_what_the_decoded_answers_say(trained_llama, tokenizer):
    """Stated along the unedited answer: the card, which decodes, states it too; the cloze
    reading holds every stated fact; the unedited model reads every fact it stated; the
    states kept at the band's first layer give the same reading as a pass from the start."""
    bench = _knowledge_bench()
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers")
    reader = AnswerReader.from_report(tokenizer, bench, base, batch_size=8)
    known = base.tallies("Base")
    assert reader.sizes == {name: t.known for name, t in known.items() if t.known}
    fresh = AnswerReader.from_report(tokenizer, bench, base, batch_size=8)
    whole = AnswerReader.from_report(tokenizer, bench, base, batch_size=8)
    unedited = reader.record(trained_llama, 1)
    assert all(r.counts() == (r.read,) * 3 and r.words[0] == r.words[1] for r in unedited.values())
    for beta in (3.0, 30.0, 300.0):
        edit = _edited(trained_llama, tokenizer, bench, beta=beta)
        plain = reader.read(trained_llama, edit)
        assert fresh.read(trained_llama, edit) == plain
        whole._linear = lambda *a: None  # every band layer run as edited, none from the unedited pass
        assert whole.read(trained_llama, edit) == plain
        card = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8, stage="answers", reuse=base)
        for name, got in plain.items():
            read, stated, top = got.counts()
            assert stated <= top <= read == card.tallies()[name].known
            assert all(t for s, t in zip(got.stated, got.top) if s)
            # stated along the unedited words: on the card too, question by question
            df = card.examples(EDITED, name)
            known = base.examples("Base", name)["fact_recall"].to_numpy() == 1.0
            still = df["fact_recall"].to_numpy()[known] == 1.0
            assert all(c for s, c in zip(got.stated, still) if s)


def test_a_whole_answer_is_the_same_exactly_when_decoding_gives_it(trained_llama, tokenizer):
    """Without facts, a question counts as held when the edited greedy answer is the
    unedited one, token for token, and ends where it ended."""
    bench = _knowledge_bench()
    questions = [ex.question for ex in bench.forget + bench.retain]
    unedited = generate(trained_llama, tokenizer, questions, max_new_tokens=12)
    ended = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) < 12 for a in unedited]
    reader = AnswerReader(tokenizer, {"all": [Question(q, a, ended=e) for q, a, e in zip(questions, unedited, ended)]},
                          batch_size=4)
    assert all(reader.read(trained_llama)["all"].stated)
    for beta in (30.0, 300.0):
        edit = _edited(trained_llama, tokenizer, bench, beta=beta)
        with edit.applied(trained_llama):
            edited = generate(trained_llama, tokenizer, questions, max_new_tokens=12)
        got = reader.read(trained_llama, edit)["all"]
        assert got.stated == got.top == tuple(a == b for a, b in zip(unedited, edited))


def test_each_cell_is_the_edit_run_edit_makes(trained_llama, tokenizer, monkeypatch):
    """Every cell's counts are those of run_edit at its settings, read; the session's own edit
    is reused, not made again; cells already computed are skipped; the model is left as found."""
    from tests.conftest import assert_bit_exact, snapshot

    bench = _knowledge_bench()
    base = evaluate(trained_llama, tokenizer, bench, batch_size=8, stage="answers")
    reader = AnswerReader.from_report(tokenizer, bench, base, batch_size=8)
    current = _edited(trained_llama, tokenizer, bench)
    grid = Grid((15.0, 30.0, 60.0), (10.0, 30.0), CONFIG.rho)
    made, real = [], landscape_run.cell_edit

    def counting(*args, **kwargs):
        made.append(args[4])
        return real(*args, **kwargs)
    monkeypatch.setattr(landscape_run, "cell_edit", counting)
    snap = snapshot(trained_llama)
    cells = list(landscape(trained_llama, tokenizer, bench.forget, bench.retain, CONFIG, grid, reader,
                           current=current, skip=[(60.0, 30.0)]))
    assert_bit_exact(trained_llama, snap)
    assert [c.key()[:2] for c in cells][0] == (30.0, 30.0) and len(cells) == 5  # the current one first
    assert len(made) == 4 and all(c.beta != 30.0 or c.w_r != 30.0 for c in made)
    for cell in cells[1:3]:
        edit = _edited(trained_llama, tokenizer, bench, beta=cell.strength, w_r=cell.w_r)
        assert cell.counts == {n: r.counts() for n, r in reader.read(trained_llama, edit).items()}
