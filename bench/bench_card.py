"""Run edit to result card on the default page, timed in a real browser (issue 22).

    python bench/bench_card.py [--runs 2] [--threads 2]

Launches the app on SmolLM2-135M-Instruct in this process (as `python app.py` opens it),
opens the page in headless chromium at 1366x768, waits for the page-load warm-ups (layer
scores, the stream into the suggested band, the Base row of the comparison), then clicks
Run edit `--runs` times (the same edit: each click makes it again) and prints, per click,
the seconds to the first verdict (the forget facts, `stage="forget"`), to the whole card
(drawn from the answers of every known fact) and to the full comparison (the
teacher-forced scores added), with the card's first line. The same steps in the library
alone, on any device: `bench/card_steps.py`.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


WATCH = """() => { window.__card = {gone: false};
  new MutationObserver(() => { const c = document.querySelector('#result-card .result-card'), w = window.__card;
    const now = performance.now() - w.t0;
    if (!c) { w.gone = true; return; }
    if (!w.gone) return;
    if (w.first === undefined) { w.first = now; w.head = c.querySelector('.rc-head').textContent; }
    if (!c.querySelector('.rc-pending') && w.whole === undefined) w.whole = now;
  }).observe(document.querySelector('#result-card'), {subtree: true, childList: true, characterData: true}); }"""
"""In the page: from the click (`t0`, the page's clock), when the new card first shows (the
forget verdict where it comes first) and when it is whole (no `.rc-pending`), each seen as
the page changes, however briefly."""

HANDLERS = ("on_run_edit", "on_show_plan", "on_edit_done", "on_card_first", "on_compare", "result_card",
            "on_show_history", "on_edit_made")


def _time_handlers() -> None:
    """Wrap the after-edit chain's handlers where the panels' wiring reads them (each
    panel's module and components.page, before the page is built) so that each prints its
    seconds on the server."""
    import functools

    from components import compare_panel, edit_panel, history_panel, page, sweep_panel

    def timed(fn):
        @functools.wraps(fn)
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                from components.server.session import REGISTRY
                cache = getattr(REGISTRY.current, "prefix_cache", None)
                state = (f" (prefix cache: {len(cache)} entries, {cache.nbytes / 2**20:.0f} MiB, "
                         f"{cache.hits} hits, {cache.misses} misses)" if cache is not None else "")
                print(f"  {fn.__name__}: {time.perf_counter() - t:.2f} s{state}", flush=True)
        return run

    def timed_steps(fn):  # a streaming handler: the seconds to each yield
        @functools.wraps(fn)
        def run(*a, **k):
            t = time.perf_counter()
            for i, value in enumerate(fn(*a, **k)):
                print(f"  {fn.__name__} step {i + 1}: {time.perf_counter() - t:.2f} s", flush=True)
                yield value
        return run

    import inspect
    for name in HANDLERS:
        for module in (compare_panel, edit_panel, history_panel, page, sweep_panel):
            fn = getattr(module, name, None)
            if fn is not None:
                setattr(module, name, timed_steps(fn) if inspect.isgeneratorfunction(fn) else timed(fn))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="print each handler's seconds on the server")
    ap.add_argument("--no-cancel-checks", action="store_true", help="measure without the Stop checks")
    ap.add_argument("--shots", help="a folder: the page's first screen after each click (run-N.png)")
    args = ap.parse_args(argv)
    import torch
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(args.threads)
    from components.server.allowed_sources import REAL
    from tests.app_fixtures import launch

    if args.profile:
        _time_handlers()
    if args.no_cancel_checks:  # what the cancellation checks cost (a measurement, not a mode)
        import components.server.device as device
        device.job_cancelled = lambda: False
    blocks, url = launch(REAL)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        t0 = time.perf_counter()
        page.goto(url)
        page.wait_for_function("document.body.innerText.includes('Band (')", timeout=600_000)
        time.sleep(1.0)
        # the page's warm-ups (the stream into the band, the Base row) run after the scores: wait them out
        page.wait_for_function("!document.querySelector('.progress-text, .eta-bar')", timeout=600_000)
        time.sleep(20.0)
        print(f"page ready (scores shown, warm-ups given 20 s) in {time.perf_counter() - t0:.1f} s")
        page.evaluate(WATCH)
        for run in range(args.runs):
            before = page.evaluate("document.querySelector('#compare-summary')?.innerText || ''")
            page.evaluate("window.__card = {gone: false}")
            t = time.perf_counter()
            page.evaluate("() => { window.__card.t0 = performance.now(); "
                          "document.querySelector('#run-edit').click(); }")
            page.wait_for_function("window.__card.whole !== undefined", timeout=600_000)
            page.wait_for_function("(s) => { const x = document.querySelector('#compare-summary')?.innerText || '';"
                                   " return x !== s && x.startsWith('Compared'); }", arg=before, timeout=600_000)
            full_s = time.perf_counter() - t
            w = page.evaluate("window.__card")
            card = page.evaluate("document.querySelector('#result-card .result-card').textContent")
            first_s = "-" if w.get("first") is None else f"{w['first'] / 1000:.1f}"
            if args.shots:
                Path(args.shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(args.shots) / f"run-{run + 1}.png"))
            print(f"run {run + 1}: Run edit to the first verdict {first_s} s ({w.get('head', '')}), "
                  f"to the whole card {w['whole'] / 1000:.1f} s, to the full comparison {full_s:.1f} s, "
                  f"load {os.getloadavg()[0]:.2f}; card: {' '.join(card.split())[:150]}")
        browser.close()
    blocks.close()


if __name__ == "__main__":
    main()
