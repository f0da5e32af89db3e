"""The start page's card computed ahead and shipped with the app (assets/cards), so that a
fresh clone's first visitor sees a card at once instead of after the warm-up (issue 49).

    python bench/start_card.py [--model smollm2-135m-instruct] [--out assets/cards]

Loads the start model on the CPU as `python app.py` does and runs the server's own warm-up
(`components.page.warm_first_page`: layer scores, unedited rows, then Run edit and the card
with the page's default widget values) into an empty card folder, then copies the card it
kept into --out. The card is found by its key (`components.studio.cards.card_key`: the
weights' fingerprint, the dtype, the data, the settings and the evaluation size), so a host
whose weights differ by one bit, or a page with other settings, does not show it; a test
(tests/test_app_browser_real.py) fails when the default page's key has no card here, which
is when this script runs again. Prints the key, the card's headline and the seconds it took.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(ROOT / "assets" / "cards"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="grom-start-card-"))
    os.environ["GROM_CARD_DIR"] = str(work)
    os.environ["GROM_BUNDLED_CARDS"] = "0"  # computed here, not read from what is shipped

    import app
    from components.server.session import REGISTRY
    from components.studio import cards

    t0 = time.perf_counter()
    assert app.preload(args.model, "cpu") == args.model, f"{args.model} could not be loaded"
    app.build_app(warm=True)
    for thread in threading.enumerate():
        if thread.name == "warm-first-page":
            thread.join()
    made = sorted(work.glob("*.json"))
    if len(made) != 1:
        sys.exit(f"the warm-up kept {len(made)} cards in {work} (one expected): see the log above")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):  # the cards of earlier weights, data or settings are never found again
        old.unlink()
    body = json.loads(made[0].read_text())
    # what it was computed on, for the test that tells a stale card (these weights, another key)
    # from a host whose weights differ (where it is rightly not shown)
    handle = REGISTRY.current
    body.update(weights=cards.known_fingerprint(handle.model), model=handle.key.name, dtype=handle.key.dtype)
    (out / made[0].name).write_text(json.dumps(body))
    (out / made[0].name).chmod(0o644)
    html = body["html"]
    head = re.sub(r"<[^>]+>", "", html.split('<div class="rc-head">', 1)[-1].split("</div>", 1)[0])
    print(f"card {made[0].stem} (version {cards.CARD_VERSION}) in {time.perf_counter() - t0:.1f} s: {head}")
    print(f"kept in {out / made[0].name}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
