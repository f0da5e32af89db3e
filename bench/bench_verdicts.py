"""Two of the studio's verdicts checked on SmolLM2-135M-Instruct, on the page's own edit
(real-knowledge the-solar-system with known_only, the app's seeded 128-example retain
sample, preset `smollm2`: beta 65 absolute, w_r 100, rho 0.03, k 5, seed 0).

    python bench/bench_verdicts.py shares   # the influence bars: shares, their sum, and why
    python bench/bench_verdicts.py bands --other-beta 20@130,20@260,25@40
                                            # S_l's sign against what a band of it does

shares: each forget example's ||P - P_-i||_F / ||P||_F (Theorem 2, as the Diagnostics
panel draws it) on every band layer, their sum and sum of squares; and what the sum
means: the changes dP_i as whole matrices, their pairwise cosines, ||sum_i dP_i|| against
||P||, and, for the two most influential examples, removing both at once (re-solved)
against the sum of removing each.

bands: the suggested band (largest mean S_l over 5 layers) against bands of negative S_l
and of near-zero S_l (--negative, --near-zero: their first layers), and bands again at
another beta (--other-beta first@beta), each edit evaluated by `grom.eval.evaluate` on
every example of every set (all known facts).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_knowledge import md_table  # noqa: E402  (bench/ is the script's own folder)

from grom import PRESETS, best_window, run_edit  # noqa: E402
from grom.closed_form.diagnostics import influence  # noqa: E402
from grom.closed_form.influence import example_columns, influence_factors  # noqa: E402
from grom.closed_form.solve import build_system, data_matrix, factor, gram, mu_of  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.eval import evaluate  # noqa: E402
from grom.model.loading import load_model  # noqa: E402

METRICS = ["Forget fact recall", "Forget paraphrase recall", "Forget degenerate", "Kept fact recall",
           "Knowledge score", "Retain cost"]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Page:
    """The model, the page's benchmark and retain sample, and the preset's config."""

    def __init__(self, args):
        self.model, self.tok = load_model(args.model)
        bench = load_benchmark("real-knowledge", args.split, known_only=True)
        retain = tuple(random.Random(args.seed).sample(bench.retain, args.retain_examples))
        self.bench = dataclasses.replace(bench, retain=retain)  # components.server.validate.retain_subset
        self.config = PRESETS[args.preset].replace(prompt_format=bench.prompt_format, seed=args.seed)

    def edit(self, **changes):
        return run_edit(self.model, self.tok, self.bench.forget, self.bench.retain,
                        self.config.replace(**changes))


# ---------------------------------------------------------------- shares

def changes(k, cfg) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """P and every dP_i = L_i R_i^T as whole (m, n) float64 matrices."""
    system = build_system(k.Xf, k.Xr, w_r=cfg.w_r, rho=cfg.rho, w_f=cfg.w_f)
    P = system.update(k.directions.right_product(k.Xf))
    dP = []
    for cols in example_columns(k.forget_example, k.n_forget):
        L, R = influence_factors(system, P, k.Xf, k.directions, cols)
        dP.append(L @ R.T)
    return P, dP


def without(k, cfg, drop: list[int]) -> torch.Tensor:
    """P re-solved without the forget examples `drop`, w_f/s and mu held (Theorem 2's convention)."""
    s, r = k.Xf.shape[1], k.Xr.shape[1]
    Gr = gram(k.Xr)
    mu = mu_of(data_matrix(gram(k.Xf), s, Gr, r, w_r=cfg.w_r, w_f=cfg.w_f), cfg.rho)
    keep = ~torch.isin(k.forget_example.long(), torch.tensor(drop))
    Xk = k.Xf[:, keep]
    A_data = (cfg.w_f / s) * gram(Xk) + (cfg.w_r / r) * Gr
    target = k.directions.subset(keep.nonzero().flatten())
    return factor(A_data, mu, cfg.w_f / s).update(target.right_product(Xk))


def shares(args) -> None:
    page = Page(args)
    edit = page.edit(keep_keys=True)
    cfg = edit.config
    questions = [ex.question for ex in page.bench.forget]
    rows = []
    for record in edit.layers:
        share = influence(edit, record.param_name).numpy() / record.patch_norm  # as the panel draws it
        k = edit.keys[record.param_name]
        P, dP = changes(k, cfg)
        nP = float(torch.linalg.matrix_norm(P))
        flat = torch.stack([d.flatten() for d in dP])  # (N, m n)
        unit = flat / flat.norm(dim=1, keepdim=True)
        cos = unit @ unit.T
        off = cos[~torch.eye(len(dP), dtype=torch.bool)]
        summed = sum(dP)
        total = float(torch.linalg.matrix_norm(summed - P)) / nP
        first = [float(torch.linalg.matrix_norm(d)) / nP for d in dP]
        top = [int(i) for i in torch.argsort(torch.tensor(share), descending=True)[:2]]
        both = P - without(k, cfg, top)
        pair = float(torch.linalg.matrix_norm(both)) / nP
        pair_sum = float(torch.linalg.matrix_norm(dP[top[0]] + dP[top[1]])) / nP
        pair_gap = float(torch.linalg.matrix_norm(both - dP[top[0]] - dP[top[1]]) / torch.linalg.matrix_norm(both))
        _log(f"layer {record.layer}: sum {share.sum():.3f}, max {share.max():.3f}")
        rows.append([str(record.layer), f"{share.max():.3f}", f"{float(torch.tensor(share).median()):.3f}",
                     f"{share.sum():.2f}", f"{(share ** 2).sum():.2f}", f"{float(off.abs().mean()):.3f}",
                     f"{float(off.max()):.3f}", f"{float(torch.linalg.matrix_norm(summed)) / nP:.2f}",
                     f"{total:.2f}", f"{share[top[0]] + share[top[1]]:.3f}", f"{pair_sum:.3f}", f"{pair:.3f}",
                     f"{pair_gap:.3f}"])
        assert max(abs(a - b) for a, b in zip(first, share)) < 1e-4  # the matrices are the panel's
        if record is edit.layers[0]:
            order = sorted(range(len(share)), key=lambda i: -share[i])
            print(f"\n### influence shares on layer {record.layer} (the panel's default matrix), "
                  f"band {edit.band[0]}-{edit.band[-1]}\n")
            print(md_table(["rank", "share of norm(P)", "question"],
                           [[str(r + 1), f"{share[i]:.3f}", questions[i]] for r, i in enumerate(order)]))
    print(f"\n### the shares and their sum, per band layer ({len(questions)} forget examples)\n")
    print(md_table(["layer", "max share", "median share", "sum of shares", "sum of squared shares",
                    "mean abs cos(dP_i, dP_j)", "max cos", "norm(sum_i dP_i) / norm(P)",
                    "norm(sum_i dP_i - P) / norm(P)", "top two: share_i + share_j",
                    "norm(dP_i + dP_j) / norm(P)", "both left out: norm(P - P_-ij) / norm(P)",
                    "norm((P - P_-ij) - (dP_i + dP_j)) / norm(P - P_-ij)"], rows))


# ---------------------------------------------------------------- bands

def windows(S: list[float], k: int) -> list[tuple[float, int]]:
    """(mean S_l, first layer) of every window of width k."""
    return [(sum(S[a:a + k]) / k, a) for a in range(len(S) - k + 1)]


def starts(spec: str) -> list[int]:
    return [int(a) for a in spec.split(",") if a.strip()]


def bands(args) -> None:
    page = Page(args)
    k = page.config.k
    first = page.edit(keep_keys=False)
    S = [float(s) for s in first.scores.S]
    print("\n### S_l per layer\n")
    print(md_table(["layer", *map(str, range(len(S)))], [["S_l", *(f"{s:.2f}" for s in S)]]))
    beta = page.config.beta
    chosen = [("suggested", tuple(best_window(S, k)), beta)]
    chosen += [("negative S_l", tuple(range(a, a + k)), beta) for a in starts(args.negative)]
    chosen += [("near-zero S_l", tuple(range(a, a + k)), beta) for a in starts(args.near_zero)]
    for spec in filter(None, args.other_beta.split(",")):  # "20@130": the band 20..24 at beta 130
        a, b = spec.split("@")
        sign = "negative" if windows(S, k)[int(a)][0] < 0 else "positive"
        chosen.append((f"{sign} S_l, other beta", tuple(range(int(a), int(a) + k)), float(b)))
    base = evaluate(page.model, page.tok, page.bench, max_examples=None, batch_size=args.eval_batch_size)
    known = base.known_facts("Base")
    _log(f"known facts: {known}")
    rows = []
    for label, band, b in chosen:
        t0 = time.perf_counter()
        edit = (first if (band, b) == (tuple(first.band), beta) else
                page.edit(layers=band, beta=b, keep_keys=False))
        m = evaluate(page.model, page.tok, page.bench, edit=edit, reuse=base, max_examples=None,
                     batch_size=args.eval_batch_size).rows["Edited"].metrics
        mean = sum(S[l] for l in band) / len(band)
        lo, hi = min(S[l] for l in band), max(S[l] for l in band)
        rows.append([label, f"{band[0]}-{band[-1]}", f"{b:g}", f"{mean:+.2f}", f"{lo:+.2f} .. {hi:+.2f}",
                     f"{edit.patch_norm():.2f}", *(f"{m[c]:.3g}" if c in m else "-" for c in METRICS),
                     "broken" if m.get("Retain broken") else ""])
        _log(f"{label} {band[0]}-{band[-1]} ({time.perf_counter() - t0:.0f} s): " + " | ".join(rows[-1][6:]))
    print(f"\n### bands ({args.split}, known_only, {len(page.bench.retain)} retain examples, preset "
          f"{args.preset}, seed {args.seed}; every example of every set; known facts {known})\n")
    print(md_table(["band", "layers", "beta", "mean S_l", "S_l range", "norm(P)", *METRICS, "retain"], rows))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["shares", "bands"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--split", default="the-solar-system")
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--negative", default="18,20,16", help="first layers of the negative-S_l bands")
    ap.add_argument("--near-zero", default="3,10", help="first layers of the near-zero-S_l bands")
    ap.add_argument("--other-beta", default="", help="first layer@beta,...: bands again at another beta")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{datetime.date.today()}")
    print("# " + " ".join(["python", "bench/bench_verdicts.py", *(sys.argv[1:] if argv is None else argv)]))
    {"shares": shares, "bands": bands}[args.what](args)


if __name__ == "__main__":
    main()
