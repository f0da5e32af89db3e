"""The landscape in a real browser (the demo model): after Run edit, Map the trade-off draws
the map cell by cell with the progress on its note (the map stays in view), and a click on a
computed square of the map puts that cell's settings in the Edit form."""
from __future__ import annotations

import pytest

from tests.app_fixtures import url  # noqa: F401  (the fixture)
from tests.test_app_browser import CHROMIUM, browser, open_page, run_edit_to_card  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser
assert CHROMIUM


def _w_r(page) -> float:
    return float(page.get_by_label("w_r", exact=True).input_value())


def test_a_click_on_the_map_fills_the_edit_form(url, browser):  # noqa: F811
    page, errors = open_page(browser, url, 1366, 900)
    run_edit_to_card(page)
    before = _w_r(page)
    page.get_by_role("tab", name="Trade-off", exact=True).click()
    page.click("#landscape-button")
    # the second cell computed: the current one's w_r a step down (`Grid.order`), at column 3 of 5, row 2 of 5
    page.wait_for_function("(document.querySelector('#landscape-map')?.innerText || '').includes(' 2 of 25 cells')",
                           timeout=600_000)
    assert page.locator("#landscape-map .js-plotly-plot").is_visible()  # not hidden under the progress
    page.locator("#landscape-map").scroll_into_view_if_needed()
    box = page.locator("#landscape-map .nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.7)
    page.wait_for_function(f"Number(document.querySelector('#edit-panel').querySelectorAll('input[type=number]')[3]"
                           f".value) !== {before}", timeout=60_000)
    assert _w_r(page) == pytest.approx(float(f"{before * 0.3:.4g}"))
    assert "landscape cell" in page.locator("#edit-status").inner_text()
    assert not errors, errors
    page.close()
