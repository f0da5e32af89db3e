"""How GROM's cost grows: the closed-form solve against the key dimension n and the number
of keys, and key collection against the number of tokens, with peak memory.

    python bench/bench_scaling.py                 # ten minutes on a 2-core CPU
    python bench/bench_scaling.py --quick         # seconds
    python bench/bench_scaling.py --device cuda   # the solve on the GPU, bigger sizes
    python bench/bench_scaling.py --plan          # only 4: the memory plan against the peak

1. solve vs n: random keys Xf (n, s), Xr (n, 2s), dense target D (m = n/4, s) as for a
   down_proj (n = MLP width, m = hidden width); split into the Gram matrices + Cholesky
   factor (`grom.closed_form.solve.build_system`) and the update P = (w_f/s) D Xf^T A^-1.
2. solve vs keys: the same at a fixed n, s growing.
3. keys vs tokens: `run_edit` of one down_proj layer of a random tiny Llama on synthetic QA
   (one token per character), its `timings["keys"]` against the tokens run through it.
4. the memory plan (`grom.closed_form.memory_plan.plan_edit`) against the peak `run_edit` adds, at the scaled
   shapes of `PLAN_SHAPES` (CPU; each in a fresh process, one thread, glibc told to hand
   buffers over 64 KiB straight back: `MALLOC_MMAP_THRESHOLD_=65536`, see tests/test_plan.py).

Peak memory is the growth of the process's resident set over the step (Linux: VmHWM after
resetting it through /proc/self/clear_refs, with freed memory handed back by malloc_trim
first; else ru_maxrss, a process-wide high-water mark that never goes down), or
torch.cuda.max_memory_allocated on a GPU. The inputs (keys, model) exist before the step
and are not counted. Prints tables; numbers
go into BENCHMARKS.md with the machine they came from.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, not installed

from bench_edit import CharTokenizer, synthetic_qa  # noqa: E402  (this folder is on sys.path)

from grom import EditConfig, run_edit  # noqa: E402
from grom.closed_form.directions import as_directions  # noqa: E402
from grom.closed_form.solve import build_system  # noqa: E402
from grom.data.encoding import encode_examples  # noqa: E402
from grom.data.prompts import PromptFormat  # noqa: E402

HOW = {"rss": "VmHWM - VmRSS", "maxrss": "ru_maxrss (a process high-water mark)",
       "cuda": "torch.cuda.max_memory_allocated"}


class PeakMemory:
    """Peak memory growth over a `with` block, in MiB (`.mib`), and how it was measured."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    @staticmethod
    def proc_status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    @staticmethod
    def _trim() -> None:
        """Hand memory freed by earlier rows back to the OS (glibc), so RSS starts low."""
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def __enter__(self) -> "PeakMemory":
        self._trim()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.how, self.base = "cuda", torch.cuda.memory_allocated()
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.how, self.base = "rss", self.proc_status("VmRSS")
        except OSError:
            self.how, self.base = "maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.how == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        elif self.how == "rss":
            peak = self.proc_status("VmHWM")
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.mib = max(0, peak - self.base) / 2**20


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_solve(n: int, s: int, device: str, seed: int = 0) -> dict:
    """Gram + factor, and update, for random keys; seconds and peak MiB."""
    g = torch.Generator().manual_seed(seed)
    m, r = max(1, n // 4), 2 * s
    Xf = torch.randn(n, s, generator=g).to(device)
    Xr = torch.randn(n, r, generator=g).to(device)
    D = as_directions(torch.randn(m, s, generator=g).to(device))
    sync(device)
    with PeakMemory(device) as mem:
        t0 = time.perf_counter()
        system = build_system(Xf, Xr, w_r=100.0, rho=0.03)
        sync(device)
        t1 = time.perf_counter()
        P = system.update(D.right_product(Xf))
        sync(device)
        t2 = time.perf_counter()
    assert torch.isfinite(P).all()
    return dict(n=n, m=m, s=s, r=r, factor=t1 - t0, update=t2 - t1, total=t2 - t0, mib=mem.mib,
                how=mem.how)


def time_keys(model, tok, n_forget: int, device: str, batch_size: int) -> dict:
    forget, retain = synthetic_qa(n_forget, 1, 8), synthetic_qa(2 * n_forget, 2, 8)
    fmt = PromptFormat(kind="template")
    tokens = sum(len(e.input_ids) for e in encode_examples(tok, forget + retain, fmt=fmt))
    cfg = EditConfig(layers=(model.config.num_hidden_layers // 2,), batch_size=batch_size,
                     prompt_format=fmt, keep_keys=False, forget_budget=None, retain_budget=None)
    sync(device)
    with PeakMemory(device) as mem:
        edit = run_edit(model, tok, forget, retain, cfg)
        sync(device)
    rec = edit.layers[0]
    t = edit.timings
    return dict(examples=3 * n_forget, tokens=tokens, keys_n=rec.n_forget_keys + rec.n_retain_keys,
                keys=t["keys"], solve=t["solve"], total=t["total"], mib=mem.mib)


# (hidden, MLP width, layers, band, keep_keys, forget QA, retain QA): the first two are the
# shapes tests/test_plan.py checks; the third a wider model with a band of three layers and
# more data, where the hidden-state cache and the key pass count too.
PLAN_SHAPES = ((64, 2048, 2, (1,), False, 32, 64), (128, 3072, 2, (0, 1), False, 32, 64),
               (128, 3072, 2, (0, 1), True, 32, 64), (256, 4096, 4, (1, 2, 3), False, 150, 300))
QUICK_PLAN_SHAPES = ((32, 256, 2, (1,), False, 4, 8),)


def measure_plan(shape: tuple) -> dict:
    """In this process (fresh, one thread): the VmHWM growth of a second `run_edit` (the
    first pays one-off allocations) against the plan less the weights (loaded before)."""
    h, inter, layers, band, keep, nf, nr = shape
    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab = 1024
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter,
                                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, tie_word_embeddings=False))
    model.eval().requires_grad_(False)
    tok, fmt = CharTokenizer(vocab), PromptFormat(kind="template")
    forget, retain = synthetic_qa(nf, 1, 8), synthetic_qa(nr, 2, 8)
    cfg = EditConfig(layers=tuple(band), beta=5.0, w_r=10.0, keep_keys=keep, prompt_format=fmt)
    run_edit(model, tok, forget, retain, cfg)
    with PeakMemory("cpu") as mem:
        t0 = time.perf_counter()
        run_edit(model, tok, forget, retain, cfg)
        seconds = time.perf_counter() - t0
    from grom.closed_form.memory_plan import plan_edit

    p = plan_edit(model.config, tok, forget, retain, cfg)
    return dict(shape=list(shape), measured=mem.mib, planned=(p.peak - p.parts["weights"]) / 2**20,
                stage=p.peak_stage, tokens=p.settings["n_forget_tokens"] + p.settings["n_retain_tokens"],
                seconds=seconds, how=mem.how)


def plan_rows(shapes=PLAN_SHAPES) -> list[dict]:
    """`measure_plan` of each shape in its own process (a clean heap and high-water mark)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    rows = []
    for shape in shapes:
        out = subprocess.run([sys.executable, __file__, "--measure-plan", json.dumps(shape)], env=env,
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def print_plan(rows: list[dict]) -> None:
    print("\n## the memory plan against the measured peak of run_edit (less the weights)")
    print(f"{'hidden':>6} {'MLP':>5} {'band':>9} {'keep':>5} {'tokens':>7} {'measured MiB':>12} "
          f"{'planned MiB':>11} {'ratio':>6} {'stage':>6} {'s':>6}")
    for r in rows:
        h, inter, _, band, keep, *_ = r["shape"]
        print(f"{h:>6} {inter:>5} {str(list(band)):>9} {str(keep):>5} {r['tokens']:>7} {r['measured']:>12.1f} "
              f"{r['planned']:>11.1f} {r['measured'] / r['planned']:>6.2f} {r['stage']:>6} {r['seconds']:>6.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, seconds")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="of the tiny Llama (the solve is float64)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--plan", action="store_true", help="only the memory plan against the measured peak")
    p.add_argument("--measure-plan", help=argparse.SUPPRESS)  # one shape, in a child process
    args = p.parse_args()
    if args.measure_plan:
        print(json.dumps(measure_plan(tuple(json.loads(args.measure_plan)))))
        return
    plan_shapes = QUICK_PLAN_SHAPES if args.quick else PLAN_SHAPES
    if args.plan:
        print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, cpu, 1 thread")
        print_plan(plan_rows(plan_shapes))
        return

    if args.quick:
        ns, s_fixed, n_fixed = (64, 128, 256), 500, 128
        ss, forgets = (200, 800, 3200), (10, 40)
        shape = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, vocab_size=512)
    else:
        ns, s_fixed, n_fixed = (256, 512, 1024, 2048, 4096), 4000, 1024
        ss, forgets = (1000, 4000, 16000, 64000), (25, 100, 400)
        shape = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, vocab_size=2048)
    if args.device.startswith("cuda") and not args.quick:
        ns, ss = ns + (8192,), ss + (256000,)

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()}" + (" (--quick)" if args.quick else ""))

    time_solve(32, 64, args.device)  # warm-up: first-call allocations of the linear algebra
    print(f"\n## solve vs key dimension n (s = {s_fixed} forget, r = {2 * s_fixed} retain keys, m = n/4)")
    print(f"{'n':>6} {'m':>5} {'gram+chol s':>11} {'update s':>9} {'total s':>8} {'peak MiB':>9}")
    for n in ns:
        row = time_solve(n, s_fixed, args.device)
        print(f"{row['n']:>6} {row['m']:>5} {row['factor']:>11.3f} {row['update']:>9.3f} {row['total']:>8.3f} "
              f"{row['mib']:>9.1f}")

    print(f"\n## solve vs number of keys (n = {n_fixed}, r = 2s)")
    print(f"{'s':>7} {'r':>7} {'gram+chol s':>11} {'update s':>9} {'total s':>8} {'peak MiB':>9}")
    for s in ss:
        row = time_solve(n_fixed, s, args.device)
        print(f"{row['s']:>7} {row['r']:>7} {row['factor']:>11.3f} {row['update']:>9.3f} {row['total']:>8.3f} "
              f"{row['mib']:>9.1f}")

    torch.manual_seed(0)
    full = dict(shape, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    with torch.device(args.device):
        model = LlamaForCausalLM(LlamaConfig(**full)).to(getattr(torch, args.dtype))
    model.eval().requires_grad_(False)
    tok = CharTokenizer(shape["vocab_size"])
    print(f"\n## key collection vs tokens (random Llama {shape}, one down_proj layer, retain = 2x forget)")
    print(f"{'examples':>8} {'tokens':>7} {'keys':>6} {'keys s':>7} {'tok/s':>8} {'solve s':>8} "
          f"{'total s':>8} {'peak MiB':>9}")
    for nf in forgets:
        row = time_keys(model, tok, nf, args.device, args.batch_size)
        print(f"{row['examples']:>8} {row['tokens']:>7} {row['keys_n']:>6} {row['keys']:>7.3f} "
              f"{row['tokens'] / max(row['keys'], 1e-9):>8.0f} {row['solve']:>8.3f} {row['total']:>8.3f} "
              f"{row['mib']:>9.1f}")
    if args.device == "cpu":
        print_plan(plan_rows(plan_shapes))
    with PeakMemory(args.device) as mem:
        pass
    print(f"\n# peak MiB: growth over each row, by {HOW[mem.how]}")


if __name__ == "__main__":
    main()
