"""The first click on a fresh server, with a second visitor beside it (issue 37), in a real
browser: what a new user of `python app.py` meets.

    python bench/first_click.py [--model smollm2-135m-instruct] [--port 7960] [--shots DIR]

Starts `python app.py` as README's first command does (its warm-up included), opens page A
the moment the server answers and page B beside it (a second visitor, at phone width),
presses Run edit on A as soon as A's page has loaded, and while A's edit runs asks a
question on B. Prints, from A's click: when A's status first says what runs, when the
card's headline is on screen and in view, and when B's answer came; and the seconds the
server's warm-up gave way. Screenshots of both pages go to --shots.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
CARD = ".result-card:not(.rc-from-store)"  # the card of this click, not one kept on disk (components/studio/cards.py)
KEPT = ".result-card.rc-from-store [data-card-key]"  # a card kept for the page's settings, shown as it opens
CARD_IN_VIEW = """() => { const c = document.querySelector('.result-card:not(.rc-from-store)');
  if (!c) return false; const r = c.getBoundingClientRect(), s = getComputedStyle(c);
  return s.visibility !== 'hidden' && r.height > 0 && r.top >= 0 && r.top < window.innerHeight; }"""


def serve(model: str, port: int, log: Path) -> subprocess.Popen:
    # both pages come from 127.0.0.1, one visitor to the server's per-visitor job limit: raised so
    # that they count as the two visitors they stand for (on a Space they have two addresses)
    # each turn on the device logged as it ends (GROM_TRACE_DEVICE): who held it while A waited
    env = dict(os.environ, PYTHONUNBUFFERED="1", GROM_MAX_QUEUED_PER_VISITOR="100", GROM_TRACE_DEVICE="1")
    return subprocess.Popen([sys.executable, "app.py", "--model", model, "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_answer(url: str, server: subprocess.Popen, seconds: float = 900) -> float:
    t0, deadline = time.perf_counter(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, "the server exited"
        try:
            urllib.request.urlopen(url, timeout=2)
            return time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--port", type=int, default=7960)
    ap.add_argument("--shots", default="/tmp/first_click")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    shots = Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}/"
    log = shots / "server.log"
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}, model {args.model}")
    server = serve(args.model, args.port, log)
    try:
        up = wait_answer(url, server)
        print(f"server answered after {up:.1f} s")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
            a = browser.new_context(viewport={"width": 1366, "height": 768}).new_page()
            b = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True).new_page()
            opened = time.perf_counter()
            a.goto(url)
            b.goto(url)
            a.wait_for_function("document.body.innerText.includes('Loaded ')", timeout=600_000)
            try:  # the first visitor's result at once: the card kept for the page's settings, if any
                a.wait_for_selector(KEPT, state="attached", timeout=30_000)
                print(f"A: a kept card on the page {time.perf_counter() - opened:.1f} s after it was opened")
            except Exception:  # noqa: BLE001  (none kept: the server's first start, its warm-up not done)
                print("A: no kept card within 30 s of the page's load")
            t = time.perf_counter()
            a.click("#run-edit")
            a.wait_for_function("document.querySelector('#edit-status')?.innerText.length > 0", timeout=60_000)
            b.screenshot(path=str(shots / "b_390_open.png"))
            tab = b.get_by_role("tab", name="Compare", exact=True)
            if tab.is_visible():
                tab.click()
            else:  # on a phone the tabs that do not fit are in gradio's overflow menu
                b.locator(".overflow-menu button").first.click()
                b.locator(".overflow-dropdown button", has_text="Compare").first.click()
            b.get_by_label("Ask your own question").fill("Which planet is known as the Red Planet?")
            tb = time.perf_counter()
            b.get_by_role("button", name="Ask before and after").click()
            try:
                b.wait_for_function("Array.from(document.querySelectorAll('.gen-table')).some("
                                    "t => t.innerText.includes('Red Planet'))", timeout=900_000)
            except Exception:
                b.screenshot(path=str(shots / "b_390_stuck.png"))
                print("B's page:", b.evaluate("document.body.innerText")[-1500:])
                raise
            b_s = time.perf_counter() - tb
            b.screenshot(path=str(shots / "b_390.png"), full_page=False)
            a.wait_for_selector(CARD, state="attached", timeout=1_200_000)
            attached = time.perf_counter() - t
            a.wait_for_function(CARD_IN_VIEW, timeout=600_000)
            in_view = time.perf_counter() - t
            time.sleep(2.0)  # the card's scroll into view: after it is drawn, smoothly
            rect = a.evaluate("(() => { const r = document.querySelector('" + CARD + "').getBoundingClientRect();"
                              " return [r.top, r.bottom, window.innerHeight]; })()")
            print(f"A's card: top {rect[0]:.0f} px, bottom {rect[1]:.0f} px of a {rect[2]} px screen")
            a.screenshot(path=str(shots / "a_1366_card.png"))
            head = a.evaluate("document.querySelector('" + CARD + "').innerText.split('\\n')[0]")
            print(f"B's question answered {b_s:.1f} s after it was asked (during A's edit)")
            print(f"A: card in the page {attached:.1f} s, visible and in view {in_view:.1f} s after the click")
            print(f"A's card: {head}")
            b.reload()
            b.wait_for_function("document.body.innerText.includes('Loaded ')", timeout=600_000)
            b.screenshot(path=str(shots / "b_390_page.png"), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    text = log.read_text()
    print("warm-up:", "; ".join(line.split(" INFO ")[-1] for line in text.splitlines()
                                if "warm-up" in line or "first page" in line)[:400])
    print(turns(text))


def turns(text: str) -> str:
    """The device's turns in the server log (GROM_TRACE_DEVICE), summed per job kind: seconds
    held, number of turns, seconds waited; in the order each kind first held it."""
    held: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = re.search(r"device turn: (.+?) held ([\d.]+) s after waiting ([\d.]+) s", line)
        if m:
            h = held.setdefault(m.group(1), [0.0, 0, 0.0])
            h[0] += float(m.group(2))
            h[1] += 1
            h[2] += float(m.group(3))
    return "device turns (kind: held s / turns / waited s): " + "; ".join(
        f"{kind}: {h:.1f} / {n} / {w:.1f}" for kind, (h, n, w) in held.items())


if __name__ == "__main__":
    main()
