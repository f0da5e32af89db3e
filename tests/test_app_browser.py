"""GROM Studio in a real browser: Debian's chromium driven by Playwright, headless. Open
the page, run the demo edit, check that the comparison is shown and that the console has
no errors, and save screenshots (a temporary folder; the first also into
/tmp/app_screens/ for a person to look at)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHARED = Path("/tmp/app_screens")
SIZES = [(1366, 900), (1920, 1080)]

from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def text_of(page, selector: str) -> str:
    return page.evaluate(f"(document.querySelector({selector!r}) || {{innerText: ''}}).innerText")


def open_page(browser, url: str, width: int = 1366, height: int = 900):
    """A new page at `url` once its layer scores are drawn; (page, the page errors seen)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=300_000)
    return page, errors


WHOLE_CARD = "#result-card .result-card:not(:has(.rc-pending))"  # not the first verdict alone

WATCH_CARD = """() => { window.__card = {gone: !document.querySelector('#result-card .result-card')};
  new MutationObserver(() => { const c = document.querySelector('#result-card .result-card'), w = window.__card;
    if (!c) { w.gone = true; return; }
    if (w.gone && c.querySelector('.rc-pending') && !w.first) w.first = c.querySelector('.rc-head').textContent;
  }).observe(document.querySelector('#result-card'), {subtree: true, childList: true, characterData: true}); }"""
"""Records the first verdict's headline (the card before the kept facts are counted) as the
new card goes by, however briefly it shows."""


def run_edit_to_card(page) -> None:
    page.click("#run-edit")
    page.wait_for_selector(WHOLE_CARD, timeout=600_000)


@pytest.mark.parametrize("width,height", SIZES)
def test_demo_edit_in_the_browser(url, browser, width, height, tmp_path):
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("document.querySelector('.status-line')?.innerText.includes('Loaded')",
                           timeout=60_000)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=120_000)  # S_l drawn
    page.screenshot(path=str(tmp_path / f"start_{width}.png"))

    page.click("#run-edit")
    page.wait_for_function("document.querySelector('#compare-summary')?.innerText.includes('Final score')",
                           timeout=240_000)
    summary = text_of(page, "#compare-summary")
    assert "Base" in summary and "Edited" in summary and "Retain model" in summary
    assert "Final score" in text_of(page, "#metrics-table")
    assert page.locator("#forget-generations .w-del").count() > 0  # changed words are marked
    page.wait_for_selector("#result-card .result-card", timeout=60_000)  # the card follows the comparison
    card = text_of(page, "#result-card")  # the result card under Run edit
    assert "Forgot" in card and "forget facts it knew" in card and "kept" in card, card
    page.screenshot(path=str(tmp_path / f"compare_{width}.png"))
    page.screenshot(path=str(tmp_path / f"compare_full_{width}.png"), full_page=True)
    assert not errors, f"console errors: {errors}"
    SHARED.mkdir(parents=True, exist_ok=True)
    for shot in tmp_path.glob("*.png"):
        shutil.copy(shot, SHARED / shot.name)
    page.close()


def test_a_gradient_baseline_in_the_browser(url, browser, tmp_path):
    """Compare tab: open the baseline accordion, read SimNPO's glossary line beside the box,
    train it for one epoch, read the table Base / GROM / SimNPO / Retain model (saved as
    /tmp/app_screens/baseline.png), then find its row in the run history."""
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=120_000)
    page.click("#run-edit")
    page.wait_for_function("document.querySelector('#compare-summary')?.innerText.includes('Final score')",
                           timeout=240_000)
    page.get_by_text("Compare with a baseline").click()
    assert page.locator("#baseline-panel input[type=number]").nth(1).input_value() == "0.001"  # demo lr
    assert "Simple NPO" in text_of(page, "#baseline-method-note")  # its glossary line
    page.locator("#baseline-panel input[type=number]").first.fill("1")
    page.click("#baseline-run")
    page.wait_for_function("document.querySelector('#baseline-summary')?.innerText.includes('updated the weights')",
                           timeout=240_000)
    summary = text_of(page, "#baseline-summary")
    assert "as long" in summary or "did not forget" in summary  # timed against GROM only if it forgot
    table = text_of(page, "#baseline-table")
    for name in ("Base", "GROM", "SimNPO", "Retain model", "× GROM's time"):
        assert name in table
    panel = page.locator("#baseline-panel")
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(tmp_path / "baseline.png"))
    page.get_by_role("tab", name="Edit details").click()  # the run history: SimNPO's row above GROM's
    page.wait_for_function("document.querySelector('#history-table')?.innerText.includes('SimNPO')", timeout=30_000)
    assert not errors, f"console errors: {errors}"
    SHARED.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "baseline.png", SHARED / "baseline.png")
    page.close()


def shot(page, name: str, tmp_path, full_page: bool = True) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=full_page)
    SHARED.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / name, SHARED / name)


OVERFLOW = "document.documentElement.scrollWidth - window.innerWidth"


def test_the_layers_panel_in_the_browser(url, browser, tmp_path):
    """After Load benchmark the old plot goes and the text says what to press; a band the
    demo's 6 layers do not have is said inline at once (no Error badge); k typed and Enter
    redraws; with F_l and R_l shown they get their own axis."""
    page, errors = open_page(browser, url)
    band_info = "document.querySelector('#layer-plot').parentElement.innerText"
    box = page.get_by_label("Manual band (layers)")
    box.fill("7-9")
    page.wait_for_function("document.body.innerText.includes('outside the model: it has layers 0..5')",
                           timeout=30_000)
    assert page.locator(".band-problem").count() == 1 and page.locator(".error").count() == 0
    shot(page, "layers_bad_band.png", tmp_path, full_page=False)
    box.fill("3-5")
    page.wait_for_function("!document.body.innerText.includes('outside the model')", timeout=30_000)
    k = page.locator("input[aria-label='number input for Band width k']")
    k.fill("2")
    k.press("Enter")
    page.wait_for_function("document.body.innerText.includes('Band (suggested for k = 2)')", timeout=30_000)
    page.get_by_label("Show F_l and R_l as lines").check()
    page.wait_for_function(  # the second panel's axis title, F<sub>l</sub>, R<sub>l</sub>
        "document.querySelector('#layer-plot')?.innerText.replaceAll('\\u200b', '').includes('Fl, Rl')",
        timeout=30_000)
    shot(page, "layers_parts.png", tmp_path, full_page=False)
    page.get_by_role("button", name="Load benchmark").click()
    page.wait_for_function("document.querySelector('#layer-plot')?.innerText.includes('New data loaded')",
                           timeout=60_000)
    assert "Press Compute layer scores" in page.evaluate(band_info)
    assert "Loaded demo/forget10" in text_of(page, "#edit-status")
    assert not errors, errors
    page.close()


def test_a_failed_model_load_leaves_the_box_on_the_loaded_model(url, browser):
    page, errors = open_page(browser, url)
    choice = page.get_by_label("Model", exact=True)
    choice.fill("no-such-org/no-such-model")
    choice.press("Enter")
    page.get_by_role("button", name="Load model").click()
    page.wait_for_function("document.body.innerText.includes('That model did not load')", timeout=60_000)
    assert "Still loaded: the bundled demo model" in page.evaluate("document.body.innerText")
    assert choice.input_value().startswith("Demo: tiny Llama")
    assert not errors, errors
    page.close()


def test_no_sideways_scroll_at_phone_width(url, browser, tmp_path):
    """390 px wide: the page fits at start, and with the result card and the comparison."""
    page, errors = open_page(browser, url, 390, 844)
    assert page.evaluate(OVERFLOW) <= 0
    shot(page, "phone_start.png", tmp_path)
    page.click("#run-edit")
    page.wait_for_selector("#result-card .result-card", timeout=240_000)
    assert page.evaluate(OVERFLOW) <= 0, "the page scrolls sideways with the comparison shown"
    shot(page, "phone_result.png", tmp_path)
    page.get_by_role("tab", name="5 · Compare").click()
    page.wait_for_function("document.querySelector('#metrics-table tbody td')", timeout=60_000)
    wide = page.evaluate("""(() => { const t = document.querySelector('#metrics-table');
        return t.querySelector('table').scrollWidth - t.clientWidth; })()""")
    assert wide <= 1, f"the metrics table hides {wide}px of its columns at 390 px"  # Edited and goal
    tabs = page.evaluate("""(() => { const [a, b] = ['#tabs [role=tablist]', '#tabs .overflow-menu']
        .map(s => document.querySelector(s)?.getBoundingClientRect()); return b ? Math.abs(a.top - b.top) : 0; })()""")
    assert tabs <= 4, "the tabs' '...' menu left the tabs' line"
    assert not errors, errors
    page.close()


def test_the_diagnostics_read_in_full(url, browser, tmp_path):
    """Where the outputs moved, the influence text and table, the 4-bit check with its
    verdict: nothing clipped (scrollHeight <= clientHeight, cells as wide as their text)."""
    page, errors = open_page(browser, url)
    page.click("#run-edit")
    page.wait_for_selector("#result-card .result-card", timeout=240_000)
    page.get_by_role("tab", name="6 · Diagnostics").click()
    page.click("#pca-button")
    page.wait_for_function("document.body.innerText.includes('outputs by')", timeout=120_000)
    page.get_by_role("button", name="Influence", exact=True).click()
    page.wait_for_function("document.body.innerText.includes('Rank 1')", timeout=120_000)
    page.get_by_text("4-bit quantization check").click()
    page.get_by_role("button", name="Check", exact=True).click()
    page.wait_for_function("document.querySelector('#quant-note')?.innerText.includes('4-bit quantization')",
                           timeout=300_000)
    clipped = page.evaluate("""[...document.querySelectorAll('.prose')].filter(e => e.offsetParent &&
        e.scrollHeight > e.clientHeight + 1).map(e => e.innerText.slice(0, 60))""")
    assert not clipped, f"text clipped in its box: {clipped}"
    cut = page.evaluate("""[...document.querySelectorAll('#influence-table td, #quant-table td')]
        .filter(e => e.innerText.trim() && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText.slice(0, 60))""")
    assert not cut, f"table cells cut: {cut}"
    wide = page.evaluate("""[...document.querySelectorAll('#quant-table table, #influence-table table')]
        .filter(t => t.scrollWidth > t.parentElement.clientWidth + 1).length""")
    assert wide == 0, "a diagnostics table is wider than its panel"
    assert "Forget ROUGE-L" in text_of(page, "#quant-table")
    shot(page, "diagnostics.png", tmp_path)
    assert not errors, errors
    page.close()


def test_the_run_history_restores_a_run_in_the_browser(url, browser, tmp_path):
    """Two edits (β 150, then 60) make two history rows under Edit details; a click on the
    first run's row puts β 150 back into the Edit panel (screenshots in /tmp/app_screens/)."""
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=120_000)
    beta = page.get_by_label("β (relative)")
    page.click("#run-edit")
    page.wait_for_function("document.querySelector('#result-card')?.innerText.includes('Forgot')", timeout=300_000)
    beta.fill("60")
    beta.press("Tab")
    page.click("#run-edit")
    page.wait_for_function("!document.querySelector('#result-card')?.innerText.includes('Forgot')", timeout=60_000)
    page.wait_for_function("document.querySelector('#result-card')?.innerText.includes('Forgot')", timeout=300_000)
    page.get_by_role("tab", name="Edit details").click()
    page.locator("#history-table").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#history-table [data-testid=\"cell-1-0\"]')?.innerText === '1'",
                           timeout=30_000)
    assert "60 rel." in page.locator('#history-table [data-testid^="cell-0-"]').all_inner_texts()  # its β
    assert beta.input_value() == "60"
    page.locator('#history-table [data-testid="cell-1-0"]').click()  # run #1, the second row shown
    page.wait_for_function("document.querySelector('#restore-note')?.innerText.includes('run #1')", timeout=30_000)
    assert beta.input_value() == "150"
    assert "Final score" in page.locator("#history-table").inner_text()  # its comparison's metrics
    page.screenshot(path=str(tmp_path / "history_1366.png"))
    assert not errors, errors
    SHARED.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "history_1366.png", SHARED / "history_1366.png")
    page.close()


def test_name_only_from_the_written_table_to_a_card(url, browser, tmp_path):
    """RWKU's name-only setting in the browser, on the demo model (it writes passages; it
    knows no real fact, so the card says there was nothing to forget): the box shows with
    its benchmark, the model writes the table, Load benchmark fits what it holds, and Run
    edit gives a card."""
    page, errors = open_page(browser, url, 1366, 900)
    assert not page.locator("#name-only").is_visible()
    page.get_by_label("Benchmark", exact=True).click()
    page.get_by_role("option", name="Real knowledge, name only (RWKU): the model writes the forget set").click()
    page.wait_for_selector("#name-only", state="visible")
    for label, value in (("Passages about the target", "3"), ("Questions about the target", "0"),
                         ("Neighbouring targets (kept)", "1")):
        box = page.get_by_label(f"number input for {label}")
        box.fill(value)
        box.press("Enter")
    page.get_by_role("button", name="Write with the model").click()
    page.wait_for_function("document.body.innerText.includes('The model wrote') "
                           "|| document.querySelector('.toast-body.error')", timeout=300_000)
    table = text_of(page, "#name-only")
    assert "The model wrote 3 texts about" in table, (table, text_of(page, ".toast-body.error"))
    assert "the-solar-system" in table and "the-human-body" in table and "passage" in table
    page.get_by_label("passages", exact=True).check()  # the demo model writes no question that reads as one
    page.get_by_role("button", name="Load benchmark").click()
    page.wait_for_function("document.body.innerText.includes('name only (RWKU')", timeout=120_000)
    shot(page, "name_only_loaded.png", tmp_path, full_page=False)
    cards = "Array.from(document.querySelectorAll('#result-card .result-card')).map(c => c.textContent).join(' ')"
    page.click("#run-edit")
    page.wait_for_function(f"({cards}).includes('facts') || document.querySelector('.toast-body.error')",
                           timeout=600_000)
    card = page.evaluate(cards)
    assert "nothing to forget" in card, (card, text_of(page, ".toast-body.error"))
    assert not errors, f"page errors: {errors}"
    page.close()
