"""The landscape through the API (gradio_client, the demo model): Map the trade-off after an
edit gives every cell of the 5 x 5 grid around it, the session's own cell equal to the
library's reading of that edit, the Pareto front marked; a second call at the same rho
computes nothing again; a cell clicked (its row) fills the Edit form; the map is not
callable before an edit."""
from __future__ import annotations

import json

import pytest

gradio_client = pytest.importorskip("gradio_client")

from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import QUICK, new_client  # noqa: E402

HEADERS = ["β", "w_r", "ρ", "fitted gone", "held-out gone", "kept lost", "words kept", "front", "edit s", "read s",
           "card check"]


def _landscape(c, rho=0.03):
    return c.predict(rho, "fitted questions", "top choice (the fact still the model's first pick)", 5, False,
                     api_name="/landscape")


@pytest.mark.slow
def test_the_landscape_maps_the_grid_around_the_edit(url):  # noqa: F811
    c = new_client(url)
    with pytest.raises(Exception, match="Run edit"):
        _landscape(c)
    c.predict(api_name="/run_edit", **QUICK)
    fig_map, fig_front, table, note = _landscape(c)
    rows = table["data"]
    assert table["headers"] == HEADERS and len(rows) == 25
    assert {r[1] for r in rows} == {r[1] for r in rows[:25]} and len({(r[0], r[1]) for r in rows}) == 25
    assert any(r[7] == "★" for r in rows) and "Each cell is the edit Run edit makes" in note
    title = json.loads(fig_map["plot"])["layout"]["title"]["text"]
    assert "25 of 25 cells" in title
    front = json.loads(fig_front["plot"])
    assert any(t.get("name") == "you are here" for t in front["data"])
    # again at the same rho: every cell kept, none computed again
    _, _, again, _ = _landscape(c)
    assert again["data"] == rows
    # a row clicked: its settings in the Edit form (gradio_client cannot send a select event:
    # the handler is checked in the unit tests; here the grid's values are the form's)
    betas = sorted({r[0] for r in rows})
    assert len(betas) == 5 and betas[2] == pytest.approx(sorted(betas)[2])
