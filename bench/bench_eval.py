"""Time the evaluation of the bundled demo model on a demo split: the Base row alone, the
demo edit's Edited row, the retain model's row, and the 4-bit check.

    python bench/bench_eval.py                       # forget10, every example
    python bench/bench_eval.py --max-examples 40 --threads 1

Prints the timings and the metric table; numbers go into BENCHMARKS.md with the machine.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from grom import PRESETS, demo_preset, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.demo import load_demo_model  # noqa: E402
from grom.eval import evaluate, quantization_check  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="forget10")
    ap.add_argument("--max-examples", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"device {args.device}")
    model, tok = load_demo_model("full", device=args.device)
    ref, _ = load_demo_model("retain", device=args.device)
    bench = load_benchmark("demo", args.split)
    kw = dict(max_examples=args.max_examples, batch_size=args.batch_size)
    t0 = time.perf_counter()
    base = evaluate(model, tok, bench, **kw)
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    edit = run_edit(model, tok, bench.forget, bench.retain,
                    PRESETS[demo_preset(args.split)].replace(prompt_format=bench.prompt_format))
    t_edit = time.perf_counter() - t0
    full = evaluate(model, tok, bench, edit=edit, reference=ref, **kw)
    t0 = time.perf_counter()
    quant = quantization_check(model, tok, bench, edit, max_examples=args.max_examples)
    t_quant = time.perf_counter() - t0
    print(f"examples per set: {base.n_examples}")
    print(f"Base row alone {t_base:.1f} s | demo edit {t_edit:.1f} s | Base + Edited + Retain rows "
          f"{full.seconds:.1f} s ({', '.join(f'{k} {v.seconds:.1f} s' for k, v in full.rows.items())}) "
          f"| 4-bit check {t_quant:.1f} s")
    pd.set_option("display.width", 200)
    print(full.table().T.round(3).to_string())
    print(quant.T.round(3).to_string())


if __name__ == "__main__":
    main()
