"""The influence audit (Theorem 2): Woodbury from one factorisation against the brute-force
re-solve without each forget example, on a random problem of a realistic shape.

    python bench/bench_influence.py            # n 1024, m 256, 100 examples: about a minute on 2 cores
    python bench/bench_influence.py --quick    # seconds
    python bench/bench_influence.py --n 2048 --m 512 --examples 200 --device cuda

Keys: N forget examples of 10-40 key columns each (answer lengths), Xf (n, s); retain keys
Xr (n, 4s); a dense target D (m, s). Both paths hold w_f/s and mu at the full problem's
values, as the theorem does. Prints the time of each and the largest relative difference
of ||dP_i||_F between them (max_i |woodbury_i - brute_i| / brute_i, and relative to the
largest influence).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, not installed

from grom.closed_form.directions import as_directions  # noqa: E402
from grom.closed_form.influence import example_influence, example_influence_bruteforce, influence_norms  # noqa: E402
from grom.closed_form.solve import build_system  # noqa: E402


def problem(n: int, m: int, examples: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(10, 41, (examples,), generator=g)
    example_index = torch.repeat_interleave(torch.arange(examples), sizes)
    s = int(sizes.sum())
    # keys with a shared mean direction and per-example structure, as real keys have
    mean = torch.randn(n, 1, generator=g)
    per_example = torch.randn(n, examples, generator=g)[:, example_index]
    Xf = (mean + 0.5 * per_example + torch.randn(n, s, generator=g)).to(device)
    Xr = (mean + torch.randn(n, 4 * s, generator=g)).to(device)
    D = torch.randn(m, s, generator=g).to(device)
    return Xf, Xr, D, example_index


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n 128, m 32, 12 examples")
    p.add_argument("--n", type=int, default=1024, help="key dimension (the MLP width for down_proj)")
    p.add_argument("--m", type=int, default=256, help="output dimension (the hidden width)")
    p.add_argument("--examples", type=int, default=100, help="forget examples N")
    p.add_argument("--w-r", type=float, default=100.0)
    p.add_argument("--rho", type=float, default=0.03)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.quick:
        args.n, args.m, args.examples = 128, 32, 12

    Xf, Xr, D, example_index = problem(args.n, args.m, args.examples, args.device)
    kw = dict(w_r=args.w_r, rho=args.rho)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()}" + (" (--quick)" if args.quick else ""))
    print(f"# n {args.n}, m {args.m}, N {args.examples} forget examples, s {Xf.shape[1]} forget keys, "
          f"r {Xr.shape[1]} retain keys, w_r {args.w_r}, rho {args.rho}")

    sync(args.device)
    t0 = time.perf_counter()
    wood = example_influence(Xf, Xr, D, example_index, **kw)
    sync(args.device)
    t_wood = time.perf_counter() - t0

    # the audit alone, given the factor an edit already has
    system = build_system(Xf, Xr, **kw)
    target = as_directions(D)
    P = system.update(target.right_product(Xf))
    sync(args.device)
    t0 = time.perf_counter()
    audit = influence_norms(system, P, Xf, target, example_index)
    sync(args.device)
    t_audit = time.perf_counter() - t0

    t0 = time.perf_counter()
    brute = example_influence_bruteforce(Xf, Xr, D, example_index, **kw)
    sync(args.device)
    t_brute = time.perf_counter() - t0

    rel = ((wood - brute).abs() / brute.abs().clamp_min(1e-300)).max()
    rel_max = (wood - brute).abs().max() / brute.abs().max()
    print(f"{'path':>22} {'seconds':>9} {'per example ms':>15}")
    for name, t in (("woodbury (with factor)", t_wood), ("woodbury (audit only)", t_audit),
                    ("brute-force re-solve", t_brute)):
        print(f"{name:>22} {t:>9.3f} {1000 * t / args.examples:>15.2f}")
    print(f"speed-up (brute / woodbury with factor): {t_brute / t_wood:.1f}x")
    print(f"largest relative difference: {float(rel):.2e} per example, {float(rel_max):.2e} of the largest "
          f"influence; audit-only vs full: {float((audit - wood).abs().max()):.1e}")
    print(f"influence ||dP_i||_F: min {float(brute.min()):.4g}, median {float(brute.median()):.4g}, "
          f"max {float(brute.max()):.4g}")


if __name__ == "__main__":
    main()
