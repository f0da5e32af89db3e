"""The landscape panel's handlers in process (the demo model, a small edit): the grid streamed
cell by cell and kept, nothing computed again for a second map; the sliders' preview only
where a cell is cheap enough, and then a cell kept like the others; bad values refused."""
from __future__ import annotations

import pytest

pytest.importorskip("gradio")

import gradio as gr  # noqa: E402

from components import landscape_panel as L  # noqa: E402
from components.server.errors import UserError  # noqa: E402
from components.server.model_choices import ensure_model, model_key  # noqa: E402
from components.server.session import Session  # noqa: E402
from components.studio.form import from_log10, log10  # noqa: E402
from grom import PRESETS, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402

TOP = next(iter(L.READINGS))


@pytest.fixture(scope="module")
def session():
    """The demo model on demo/forget01 with an edit of 40 retain examples (the session's
    edit inputs, as the Edit panel keeps them)."""
    handle = ensure_model(model_key("demo", "cpu", "float32"))
    s = Session()
    s.model_key, s.bench_label = handle.key, "demo/forget01"
    s.benchmark = bench = load_benchmark("demo", "forget01")
    s.extra["edit_inputs"] = (bench.forget, bench.retain[:40])
    s.edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain[:40], PRESETS["demo"],
                      progress=False)
    s.edit_for = handle.key
    return s


def _map(session, rho=None):
    return list(L.on_landscape.__wrapped__(rho, "fitted questions", TOP, 5, False, session,
                                           progress=lambda *a, **k: None))


def test_the_grid_streams_cell_by_cell_and_is_kept(session, monkeypatch):
    steps = _map(session)
    assert len(steps) == 26  # what was kept (nothing), then one view a cell
    held = session.extra["landscape"]
    assert len(held.cells) == 25 and len(held.shown) == 25
    _, _, table, note = steps[-1]
    assert len(table) == 25 and (table["front"] == "★").any() and "Each cell is the edit Run edit makes" in note
    sizes = [len(step[2]) for step in steps[1:]]
    assert sizes == list(range(1, 26))  # one more row each step
    own = held.cells[(session.edit.settings.beta, session.edit.settings.w_r, session.edit.settings.rho)]
    assert own.edit_s == pytest.approx(session.edit.timings["total"])  # the session's edit, not made again

    def refuse(*a, **k):
        raise AssertionError("a kept cell was computed again")
    monkeypatch.setattr(L, "landscape_cell", refuse)
    again = _map(session)
    assert len(again) == 1 and again[0][2].equals(table)


def test_a_preview_only_where_a_cell_is_cheap_and_then_kept(session, monkeypatch):
    _map(session)
    held = session.extra["landscape"]
    args = (log10(100.0), log10(50.0), log10(0.03), "fitted questions", TOP, 5, False, session)
    monkeypatch.setattr(L, "PREVIEW_WITHIN_S", 0.0)
    line, front = L.on_preview.__wrapped__(*args)
    assert line == gr.skip() and (100.0, 50.0, 0.03) not in held.cells  # skipped: a cell is too slow here
    monkeypatch.setattr(L, "PREVIEW_WITHIN_S", 1e9)
    line, front = L.on_preview.__wrapped__(*args)
    beta, w_r, rho = (from_log10(v) for v in args[:3])  # the values the number boxes show, as Run edit reads them
    assert line.startswith(f"**Preview** at β {beta:g}, w_r {w_r:g}, ρ {rho:g}") and "Run edit for the card" in line
    assert (beta, w_r, rho) in held.cells
    assert any(t.name == "preview" for t in front.data)


@pytest.mark.parametrize("rho", ["abc", -1.0, 1e9, float("nan")])
def test_a_bad_rho_is_refused(session, rho):
    with pytest.raises(UserError, match="rho|ρ"):
        _map(session, rho)


def test_a_new_edit_moves_you_are_here_or_clears_a_map_of_other_data(session):
    _map(session)
    held = session.extra["landscape"]
    handle = ensure_model(session.model_key)
    before = session.edit
    s, w = next(k for k in held.shown if k != (before.settings.beta, before.settings.w_r))
    forget, retain = session.extra["edit_inputs"]
    try:
        session.edit = run_edit(handle.model, handle.tokenizer, forget, retain,
                                before.settings.replace(beta=s, w_r=w, layers=tuple(before.band)), progress=False)
        rho_box, fig_map, fig_front, table, _ = L.on_edit_made.__wrapped__("fitted questions", TOP, session)
        (rect,) = fig_map.layout.shapes
        i, j = sorted({k[0] for k in held.shown}).index(s), sorted({k[1] for k in held.shown}).index(w)
        assert (rect.x0 + 0.5, rect.y0 + 0.5) == (i, j) and len(table) == 25  # the same map, you are here moved
        session.edit = run_edit(handle.model, handle.tokenizer, forget, retain,
                                before.settings.replace(layers=(1,)), progress=False)  # another band
        _, fig_map, _, table, note = L.on_edit_made.__wrapped__("fitted questions", TOP, session)
        assert len(table) == 0 and "another edit" in fig_map.layout.annotations[0].text and note == ""
    finally:
        session.edit = before


def test_a_click_restores_the_rho_of_the_map_shown(session):
    _map(session)
    other = L.rho_choices(session.edit.settings.rho)[-1]
    held = session.extra["landscape"]
    s, w = held.shown[0]
    held.cells[(s, w, other)] = held.cells[(s, w, held.base.rho)]  # as if mapped at that rho too
    held.shown_rho = other
    values = L.on_pick.__wrapped__(f"{s:g},{w:g}", session)
    from components.studio.form import RESTORED

    assert dict(zip(RESTORED, values))["rho"] == other
