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


def _dropdown_list_asset() -> str | None:
    """The name of the installed Gradio's script that draws a dropdown's open list (the
    one that prints "choices shown"), or None where it is not found."""
    import gradio

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    for script in sorted(assets.glob("Index-*.js")):
        if "choices shown," in script.read_text(errors="ignore"):
            return script.name
    return None


DROPDOWN_LIST = _dropdown_list_asset()


def gradio_list_race(error: str) -> bool:
    """Whether a page error is Gradio's own (6.31) when a dropdown's choices shrink while its
    list is open: the list is drawn once with the new choices and the indices kept for the
    old ones before the component resets them (js/dropdown/shared/Dropdown.svelte updates
    `filtered_indices` in an effect that runs after the draw). The list then shows the new
    choices and picks from them (`test_a_split_list_open_while_the_benchmark_changes`); a
    visitor who opens Split before a new benchmark's splits arrive sees no difference."""
    first_frame = error.split(" at ", 1)[1][:200] if " at " in error else ""
    return ("Cannot read properties of undefined (reading '0')" in error and DROPDOWN_LIST is not None
            and DROPDOWN_LIST in first_frame)


def watch_errors(page, console: bool = False) -> list[str]:
    """The page's errors as they come (and its console's, with `console`), less Gradio's
    dropdown race (`gradio_list_race`), which is not the studio's."""
    errors: list[str] = []

    def page_error(e) -> None:
        text = f"{e} (stack: {str(getattr(e, 'stack', ''))[:1500]})"
        if not gradio_list_race(text):
            errors.append(text)

    page.on("pageerror", page_error)
    if console:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def text_of(page, selector: str) -> str:
    return page.evaluate(f"(document.querySelector({selector!r}) || {{innerText: ''}}).innerText")


def open_page(browser, url: str, width: int = 1366, height: int = 900):
    """A new page at `url` once its layer scores are drawn; (page, the page errors seen)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors = watch_errors(page)
    page.goto(url)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=300_000)
    return page, errors


RUN_CARD = "#result-card .result-card:not(.rc-from-store)"  # this visit's card: not one kept on disk (cards.py)
WHOLE_CARD = RUN_CARD + ":not(:has(.rc-pending))"  # not the first verdict alone

WATCH_CARD = """() => { const run = '#result-card .result-card:not(.rc-from-store)';
  window.__card = {gone: !document.querySelector(run)};
  new MutationObserver(() => { const c = document.querySelector(run), w = window.__card;
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
    errors = watch_errors(page, console=True)
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
    page.wait_for_selector(RUN_CARD, timeout=60_000)  # the card follows the comparison
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
    errors = watch_errors(page, console=True)
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
    """After another split is chosen (which loads it) the old plot goes and the text says what to press; a band the
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
    page.get_by_label("Split", exact=True).click()  # choosing the split loads it: no Load press
    page.get_by_role("option", name="forget05", exact=True).click()
    page.wait_for_function("document.querySelector('#layer-plot')?.innerText.includes('New data loaded')",
                           timeout=60_000)
    assert "Press Compute layer scores" in page.evaluate(band_info)
    page.wait_for_function("document.querySelector('#edit-status')?.innerText.includes('Loaded demo/forget05')",
                           timeout=30_000)
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


def test_a_split_list_open_while_the_benchmark_changes(url, browser):
    """A visitor who opens Split before a new benchmark's splits have come (the server held
    back here): the open list of 15 real-knowledge splits becomes the demo's 5, a split
    picked from it loads, and no error but Gradio's own dropdown race (`gradio_list_race`,
    counted apart) reaches the page."""
    page, errors = open_page(browser, url)
    raw: list[str] = []
    page.on("pageerror", lambda e: raw.append(f"{e} (stack: {str(getattr(e, 'stack', ''))[:1500]})"))
    page.get_by_label("Benchmark", exact=True).click()
    page.get_by_role("option", name="Real knowledge: famous facts (bundled)").click()
    page.wait_for_function("document.querySelector('#edit-status')?.innerText.includes('Loaded real-knowledge/')",
                           timeout=120_000)
    held, holding = [], [True]
    page.route("**/*", lambda r: held.append(r) if holding[0] and r.request.method == "POST" else r.continue_())
    page.get_by_label("Benchmark", exact=True).click()
    page.get_by_role("option", name="Demo: fictitious authors (bundled)").click()
    page.get_by_label("Split", exact=True).click()  # its list opens on the old benchmark's splits
    assert page.locator("li.item").count() == 15
    assert held, "the benchmark's change did not reach the server"
    holding[0] = False
    for route in held:
        route.continue_()
    page.wait_for_function("document.querySelectorAll('li.item').length === 5", timeout=60_000)
    page.get_by_role("option", name="forget05", exact=True).click()
    page.wait_for_function("document.querySelector('#edit-status')?.innerText.includes('Loaded demo/forget05')",
                           timeout=120_000)
    page.unroute("**/*")
    assert page.get_by_label("Split", exact=True).input_value() == "forget05"
    assert not errors, errors
    assert all(gradio_list_race(e) for e in raw), raw  # Gradio's race at most (6.31 has it)
    page.close()


def test_no_sideways_scroll_at_phone_width(url, browser, tmp_path):
    """390 px wide: the page fits at start, and with the result card and the comparison."""
    page, errors = open_page(browser, url, 390, 844)
    assert page.evaluate(OVERFLOW) <= 0
    shot(page, "phone_start.png", tmp_path)
    page.click("#run-edit")
    page.wait_for_selector(RUN_CARD, timeout=240_000)
    assert page.evaluate(OVERFLOW) <= 0, "the page scrolls sideways with the comparison shown"
    shot(page, "phone_result.png", tmp_path)
    page.get_by_role("tab", name="Compare", exact=True).click()
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
    page.wait_for_selector(RUN_CARD, timeout=240_000)
    page.get_by_role("tab", name="Diagnostics", exact=True).click()
    page.click("#pca-button")
    page.wait_for_function("document.body.innerText.includes('outputs by')", timeout=120_000)
    page.get_by_role("button", name="Influence", exact=True).click()
    page.wait_for_function("document.body.innerText.includes('Rank 1')", timeout=120_000)
    page.get_by_text("4-bit quantization check").click()
    page.get_by_role("button", name="Check", exact=True).click()
    page.wait_for_function("document.querySelector('#quant-note')?.innerText.includes('4-bit quantization')",
                           timeout=300_000)
    # the model's and benchmark's status lines on top are one line by design (all of it on hover, and on a phone)
    clipped = page.evaluate("""[...document.querySelectorAll('.prose')].filter(e => e.offsetParent &&
        !e.closest('#setup-row .status-line') &&
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
    errors = watch_errors(page)
    page.goto(url)
    page.wait_for_function("document.body.innerText.includes('Band (')", timeout=120_000)
    beta = page.get_by_label("β (relative)")
    run_edit_to_card(page)  # this visit's card, not the one kept for the page's settings
    beta.fill("60")
    beta.press("Tab")
    page.click("#run-edit")
    page.wait_for_function("!document.querySelector('#result-card')?.innerText.includes('Forgot')", timeout=60_000)
    page.wait_for_selector(WHOLE_CARD, timeout=300_000)
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
    its benchmark, the model writes the table, Load what was written fits what it holds, and Run
    edit gives a card."""
    page, errors = open_page(browser, url, 1366, 900)
    assert not page.locator("#name-only").is_visible()
    page.get_by_label("Benchmark", exact=True).click()
    page.get_by_role("option", name="Real knowledge, name only (RWKU): the model writes the forget set").click()
    page.wait_for_selector("#name-only", state="visible")
    for label, value in (("Passages about the subject", "3"), ("Questions about the subject", "0"),
                         ("Neighbouring subjects (kept)", "1")):
        box = page.get_by_label(f"number input for {label}")
        box.fill(value)
        box.press("Enter")
    page.get_by_role("button", name="Write with the model").click()
    page.wait_for_function("document.body.innerText.includes('The model wrote') "
                           "|| document.querySelector('.toast-body.error')", timeout=300_000)
    table = text_of(page, "#name-only")
    assert "The model wrote 3 texts about" in table, (table, text_of(page, ".toast-body.error"))
    assert "the-solar-system" in table and "the-human-body" in table and "passage" in table
    fit_on = page.get_by_label("passages (RWKU's)", exact=True)  # RWKU's GA/NPO corpus, the default
    assert fit_on.is_checked()
    fit_on.check()  # the demo model writes no question that reads as one
    page.get_by_role("button", name="Load what was written").click()
    page.wait_for_function("document.body.innerText.includes('name only (RWKU')", timeout=120_000)
    shot(page, "name_only_loaded.png", tmp_path, full_page=False)
    cards = f"Array.from(document.querySelectorAll('{RUN_CARD}')).map(c => c.textContent).join(' ')"
    page.click("#run-edit")
    page.wait_for_function(f"({cards}).includes('facts') || document.querySelector('.toast-body.error')",
                           timeout=600_000)
    card = page.evaluate(cards)
    assert "nothing to forget" in card, (card, text_of(page, ".toast-body.error"))
    assert not errors, f"page errors: {errors}"
    page.close()


DOC_BOX = ("e => { const r = e.getBoundingClientRect(); "
           "return [r.top + window.scrollY, r.bottom + window.scrollY, r.height]; }")
"""An element's top, bottom and height on the page (not the window: the card scrolls itself into view)."""


def test_the_first_screen_holds_the_choices_the_settings_run_edit_and_the_card(url, browser, tmp_path):
    """Issue 49, item 7. At 1366 x 768 the first screen holds the model and the split, the β,
    w_r and ρ sliders with their boxes, Run edit and, once it ran, the result card's headline;
    the tabs are not numbered, the Edit panel is one element; at 390 x 844 a button is a
    button's height (Load model was a tall empty box beside its status)."""
    page, errors = open_page(browser, url, 1366, 768)
    assert page.locator("#edit-panel").count() == 1
    assert page.locator("#tabs [role=tab]").all_inner_texts() == ["Data", "Layers", "Trade-off", "Edit details",
                                                                  "Compare", "Is it gone?", "Diagnostics", "Export"]
    run_edit_to_card(page)
    shot(page, "first_screen_1366.png", tmp_path, full_page=False)
    first = {"model": page.get_by_label("Model", exact=True), "split": page.get_by_label("Split", exact=True),
             "beta": page.get_by_label("β (relative)", exact=True), "w_r": page.get_by_label("w_r", exact=True),
             "rho": page.get_by_label("ρ", exact=True), "sliders": page.locator(".log-pair input[type=range]").last,
             "run": page.locator("#run-edit"), "headline": page.locator(f"{RUN_CARD} .rc-head")}
    where = {name: loc.evaluate(DOC_BOX) for name, loc in first.items()}
    below = {name: box for name, box in where.items() if box[1] > 768 or box[2] <= 0}
    assert not below, f"below the first screen (top, bottom, height): {below}"
    assert not errors, errors
    page.close()
    phone, errors = open_page(browser, url, 390, 844)
    tall = phone.evaluate("[...document.querySelectorAll('button')].filter(b => b.offsetParent && "
                          "b.getBoundingClientRect().height > 64).map(b => b.innerText.trim())")
    assert not tall, f"buttons taller than a button at 390 px: {tall}"
    assert phone.evaluate(OVERFLOW) <= 0 and not errors, errors
    phone.close()
