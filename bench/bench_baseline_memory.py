"""Resident memory of one gradient-baseline run on SmolLM2-135M-Instruct: before, at its peak,
and after it finished or was cancelled (an exception from the progress callback, or from a
forward hook in the middle of a step, as the app cancels).

    python bench/bench_baseline_memory.py                       # NPO, 16 forget / 16 retain, 1 epoch
    python bench/bench_baseline_memory.py --method simnpo --examples 32

Each ending runs in a fresh interpreter, so one cannot inherit another's heap. "after" is
measured while the caller still holds what the run gave it (the Edit, or the exception with
its traceback); "dropped" once the caller let go of it and called
`grom.model.process_memory.release_memory()`. Peak is sampled every 5 ms. Prints a markdown table;
numbers go into BENCHMARKS.md with the machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom.data import load_benchmark  # noqa: E402
from grom.methods import answer_nll, get_method, run_baseline  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.model.process_memory import release_memory, resident_bytes  # noqa: E402

ENDINGS = ("finished", "cancelled from progress", "cancelled from a hook")


class Cancelled(RuntimeError):
    """What the benchmark raises to stop a run, as the app's cancel does."""


class PeakSampler:
    """The largest resident size seen while the `with` block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.peak, self._stop = resident_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


def _cancel_at_first_step(fraction: float, message: str) -> None:
    if fraction > 0:
        raise Cancelled("cancelled after the first optimizer step")


def _hook_cancelling_at(model, call: int):
    """A forward hook on the last decoder layer that raises on its `call`-th call."""
    calls = []

    def hook(module, args, output):
        calls.append(1)
        if len(calls) == call:
            raise Cancelled(f"cancelled in forward pass {call}")

    return model.model.layers[-1].register_forward_hook(hook)


def measure(args) -> dict:
    """One ending in this interpreter: RSS in bytes before, peak, after and dropped."""
    torch.set_num_threads(args.threads)
    model, tok = load_model("smollm2-135m-instruct", local_files_only=True)
    bench = load_benchmark("real-knowledge")
    forget, retain = list(bench.forget[:args.examples]), list(bench.retain[:args.examples])
    answer_nll(model, tok, forget[:2], prompt_format=bench.prompt_format)  # lazy set-up, not the run's
    release_memory()
    kw = dict(epochs=args.epochs, lr=1e-5, batch_size=args.batch_size, grad_accum=args.grad_accum,
              prompt_format=bench.prompt_format)
    before = resident_bytes()
    held, handle = None, None
    if args.ending == ENDINGS[2]:  # the reference passes, then forget (+ retain) per micro-batch:
        row = get_method(args.method)  # stop in the second micro-batch's forget forward
        n_ref = -(-len(forget) // args.batch_size) if row.needs_reference else 0
        handle = _hook_cancelling_at(model, n_ref + (3 if row.needs_retain else 2))
    t0 = time.perf_counter()
    with PeakSampler() as sampler:
        try:
            progress = _cancel_at_first_step if args.ending == ENDINGS[1] else None
            held = run_baseline(args.method, model, tok, forget, retain, progress=progress, **kw)
        except Cancelled as err:
            held = err  # the caller keeps the exception (and its traceback) a while
        finally:
            if handle is not None:
                handle.remove()
    seconds = time.perf_counter() - t0
    after = resident_bytes()
    del held
    release_memory()
    return {"before": before, "peak": sampler.peak, "after": after, "dropped": resident_bytes(),
            "seconds": seconds, "params": sum(p.numel() for p in model.parameters())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="npo")
    ap.add_argument("--examples", type=int, default=16, help="forget and retain examples each")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ending", choices=ENDINGS, help=argparse.SUPPRESS)  # one ending, in this process
    a = ap.parse_args(argv)
    if a.ending:
        print(json.dumps(measure(a)))
        return
    print("# " + " ".join(["python", "bench/bench_baseline_memory.py", *(sys.argv[1:] if argv is None else argv)]))
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {a.threads} threads; "
          f"{a.method}, {a.examples} forget / {a.examples} retain, {a.epochs:g} epoch(s), "
          f"batch {a.batch_size} x {a.grad_accum}\n")
    print("| ending | before GB | peak GB | after GB | dropped GB | run s |\n|---|---|---|---|---|---|")
    for ending in ENDINGS:
        cmd = [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv), "--ending", ending]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        gb = [f"{r[k] / 2**30:.2f}" for k in ("before", "peak", "after", "dropped")]
        print(f"| {ending} | " + " | ".join(gb) + f" | {r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
