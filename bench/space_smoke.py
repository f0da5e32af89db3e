"""A smoke run of a deployed studio through its public API, as a visitor's script would
drive it: one edit, one comparison and one baseline, each timed, and a second visitor's
question answered while the first one's edit runs.

    python bench/space_smoke.py --url http://127.0.0.1:7860/        # a local server
    python bench/space_smoke.py --url https://<owner>-<space>.hf.space/ --method ga --epochs 1

Prints one line per step and a JSON line of every figure at the end; exits non-zero on the
first step that fails. The README's deployment section gives the commands that start a
server the way a ZeroGPU Space does and what this printed there.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def step(name: str, figures: dict, fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    figures[f"{name}_s"] = round(time.perf_counter() - t0, 1)
    print(f"{name}: {figures[f'{name}_s']} s", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("--method", default="ga", help="the baseline to train (a row of the Compare tab)")
    p.add_argument("--epochs", type=float, default=1)
    p.add_argument("--lr", type=float, default=1e-5, help="its learning rate (1e-5: SmolLM2's range)")
    p.add_argument("--examples", type=int, default=10, help="examples per set the comparison evaluates")
    args = p.parse_args(argv)

    from gradio_client import Client

    figures: dict = {"url": args.url}
    visitor = step("connect", figures, Client, args.url, verbose=False)
    other = Client(args.url, verbose=False)
    waited: dict = {}

    def second_visitor() -> None:
        time.sleep(1.0)  # the edit is running by then
        t0 = time.perf_counter()
        other.predict("What is the largest planet?", api_name="/generate")
        waited["s"] = round(time.perf_counter() - t0, 1)

    asking = threading.Thread(target=second_visitor)
    asking.start()
    summary, _, _ = step("edit", figures, visitor.predict, api_name="/run_edit")
    asking.join()
    figures["second_visitor_generate_s"] = waited.get("s")
    print(f"  {summary.splitlines()[0][:160]}\n  second visitor's question answered in {waited.get('s')} s")
    headline, _, _, _ = step("compare", figures, visitor.predict, args.examples, False, api_name="/compare")
    print(f"  {headline.splitlines()[0][:160]}")
    base_summary, _ = step("baseline", figures, visitor.predict, args.method, args.epochs, args.lr,
                           args.examples, False, api_name="/run_baseline")
    print(f"  {base_summary.splitlines()[0][:160]}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
