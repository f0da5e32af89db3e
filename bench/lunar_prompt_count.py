"""LUNAR as upstream runs it (issue 47 item 4): how the refusal direction moves with the
number of refusal prompts, and what training in bfloat16 (upstream's dtype) changes.

    python bench/lunar_prompt_count.py --threads 1 directions        # the cosine analysis
    python bench/lunar_prompt_count.py --threads 1 fits              # bfloat16 vs float32 AdamW
    python bench/lunar_prompt_count.py --threads 1 edits --variants bfloat16:120,float32:120,bfloat16:24

SmolLM2-135M-Instruct (float32) on the real-knowledge split of `--target` as the studio loads
it (the known facts, the seeded sample of 128 retain pairs: bench/bench_attack_targets.py's
`load_split`), LUNAR's block (`lunar_layer`: 21 of 30).

- directions: the residual after that block at each prompt's last token, for the forget
  prompts and for every bundled refusal prompt of both kinds (120 each; the first 24 are the
  set before issue 47). For n in --sizes, --draws random subsets of n prompts: the cosine of
  their direction (mean over the subset minus the forget mean, upstream's `get_mean_diff`) to
  the all-24 and to the all-120 direction, and the norm ratio. Then two disjoint halves of the
  120, and a sampling model: with the refusal prompts drawn independently from one population
  (covariance S around the mean), a direction from n of them has E|d_n - d|^2 = tr(S)/n, so
  cos(d_n, d) ~ (1 + tr(S) / (n |d|^2))^-1/2; S and d estimated from the 120.
- fits: the rows and direction of the default LunarConfig, AdamW in bfloat16 and in float32
  (same shuffles), and for scale float32 at another shuffle seed and without weight decay:
  each epoch's loss, the objective in float64 after the fit, the relative difference
  |P_a - P_b| / |P_b| and the cosine of two updates, the seconds.
- edits: a LUNAR edit per variant (DTYPE:N_PROMPTS[:SEED], SEED the AdamW shuffle's, --seed
  by default; --seed also draws the retain sample), then the held-out probe recall
  (`run_attacks(..., "heldout")`) and the studio's evaluation (answers stage), as
  bench_attack_targets.py --evaluate reports them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom.data.encoding import pad_id  # noqa: E402
from grom.methods.lunar import (  # noqa: E402
    LunarConfig,
    encode_instructions,
    lunar_layer,
    read_activations,
    refusal_prompts,
    run_lunar,
)
from grom.model.arch import num_layers  # noqa: E402
from grom.model.loading import load_model  # noqa: E402

OLD = 24  # the bundled set before issue 47 item 4


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_split(args):
    from bench.bench_attack_targets import load_split as studio_split
    return studio_split(SimpleNamespace(custom=None, known_only=True, retain_examples=128, seed=args.seed),
                        args.target)


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def subset_stats(refusal_last, forget_mean, sizes, draws, reference, rng) -> list[dict]:
    """For each n: the cosine of `draws` random n-subsets' directions to `reference`, and
    their norm over its norm (min / mean / max)."""
    out = []
    for n in sizes:
        cs, ns = [], []
        for _ in range(draws):
            idx = rng.sample(range(refusal_last.shape[0]), n)
            d = refusal_last[idx].mean(0) - forget_mean
            cs.append(cos(d, reference))
            ns.append(float(d.norm() / reference.norm()))
        out.append({"n": n, "cos_min": min(cs), "cos_mean": sum(cs) / len(cs), "cos_max": max(cs),
                    "norm_ratio_mean": sum(ns) / len(ns)})
    return out


def directions(args, model, tok, bench) -> dict:
    layer = lunar_layer(num_layers(model))
    enc = lambda xs: encode_instructions(tok, xs, bench.prompt_format)  # noqa: E731
    forget = read_activations(model, enc(bench.forget), layer, pad_id(tok), keys=False).last
    fmean = forget.mean(0)
    out = {"layer": layer, "n_forget": forget.shape[0], "kinds": {}}
    full = {}
    for kind in ("harmful", "unverifiable"):
        last = read_activations(model, enc(refusal_prompts(kind)), layer, pad_id(tok), keys=False).last
        rng = random.Random(args.seed)
        d_old, d_all = last[:OLD].mean(0) - fmean, last.mean(0) - fmean
        full[kind] = d_all
        sizes_old = [n for n in args.sizes if n <= OLD]
        sizes_all = sorted({*args.sizes, 48, 60, 96, last.shape[0]} - {0})
        centred = last - last.mean(0)
        tr = float((centred ** 2).sum() / (last.shape[0] - 1))  # tr(S), unbiased
        model_cos = {n: (1 + tr / (n * float(d_all.norm()) ** 2)) ** -0.5 for n in (4, 8, 12, 16, 20, 24, 120, 199,
                                                                                     260)}
        half = list(range(last.shape[0]))
        halves = []
        for _ in range(args.draws):
            rng.shuffle(half)
            a, b = half[:len(half) // 2], half[len(half) // 2:]
            halves.append(cos(last[a].mean(0) - fmean, last[b].mean(0) - fmean))
        out["kinds"][kind] = {
            "n_prompts": last.shape[0], "norm_all": float(d_all.norm()), "norm_old": float(d_old.norm()),
            "cos_old_vs_all": cos(d_old, d_all),
            "cos_rest_vs_old": cos(last[OLD:].mean(0) - fmean, d_old),
            "subsets_of_old_vs_old": subset_stats(last[:OLD], fmean, sizes_old, args.draws, d_old, rng),
            "subsets_of_all_vs_all": subset_stats(last, fmean, sizes_all, args.draws, d_all, rng),
            "disjoint_halves_cos": {"min": min(halves), "mean": sum(halves) / len(halves), "max": max(halves)},
            "trace_cov": tr, "model_cos_to_population": model_cos}
    out["cos_harmful_vs_unverifiable"] = cos(full["harmful"], full["unverifiable"])
    return out


FITS = {"bfloat16": ("bfloat16", 0, 0.01), "float32": ("float32", 0, 0.01), "float32, seed 1": ("float32", 1, 0.01),
        "bfloat16, seed 1": ("bfloat16", 1, 0.01), "float32, no weight decay": ("float32", 0, 0.0)}
"""The fits compared: (dtype, the shuffle's seed, weight decay)."""


def fits(args, model, tok, bench) -> dict:
    """The default LunarConfig's rows read once, then AdamW per FITS entry; the updates
    compared pairwise (bfloat16 against float32, and against float32 at another shuffle: the
    spread the minibatch order alone makes)."""
    from grom.methods.lunar import fit_adamw, mse, training_rows
    from grom.methods.lunar.run import DTYPES, reach, rows_and_direction
    from grom.model.arch import edited_matrix, residual_gain

    config = LunarConfig(prompt_format=bench.prompt_format, seed=args.seed)
    layer, gain = lunar_layer(num_layers(model)), residual_gain(model, "down_proj")
    f, r, direction = rows_and_direction(model, tok, bench.forget, bench.retain, config, layer, pad_id(tok))
    rows = training_rows(f.keys, f.outputs, r.keys, r.outputs, direction, config.coeff, gain)
    t = edited_matrix(model, "down_proj", layer)
    W0 = t.from_param(model.get_parameter(t.param_name).detach()).cpu()
    res, patches = {"rows": rows.X.shape[0], "forget_rows": rows.n_forget, "loss_before": mse(W0, rows, gain)}, {}
    for name, (dtype, seed, wd) in FITS.items():
        t0 = time.perf_counter()
        W, losses = fit_adamw(W0, rows, lr=config.lr, epochs=config.epochs, batch_size=config.batch_size,
                              gamma=config.gamma, weight_decay=wd, gain=gain, seed=seed, dtype=DTYPES[dtype])
        secs = time.perf_counter() - t0
        P = W.double() - W0.to(W.dtype).double()
        patches[name] = P
        res[name] = {"epoch_losses": losses, "objective_after": mse(W0.double() + P, rows, gain),
                     "update_norm": float(P.norm()), "fit_s": secs,
                     **reach(P, f.keys, r.keys, direction, config.coeff, gain)}
        _log(f"fit {name}: last epoch loss {losses[-1]:.5g}, objective {res[name]['objective_after']:.6g}, "
             f"{secs:.1f} s")
    pairs = [("bfloat16", "float32"), ("float32, seed 1", "float32"), ("bfloat16, seed 1", "bfloat16"),
             ("float32, no weight decay", "float32")]
    res["pairs"] = {f"{a} vs {b}": {"rel_diff": float((patches[a] - patches[b]).norm() / patches[b].norm()),
                                    "cos": cos(patches[a].flatten(), patches[b].flatten())} for a, b in pairs}
    return res


def edits(args, model, tok, bench) -> dict:
    from bench.bench_attack_targets import evaluation
    from grom.robustness import probes_from_examples, run_attacks
    from grom.robustness.membership import holdout_of

    held = [ex for ex in bench.eval_sets.get("probes", ()) if getattr(ex, "fact", None)]
    probes, holdout = probes_from_examples(held), holdout_of(bench.eval_sets, bench.retain)
    ev_args, out = SimpleNamespace(base_report=None), {}
    for variant in args.variants:
        dtype, n, seed = (variant.split(":") + ["", ""])[:3]
        config = LunarConfig(prompt_format=bench.prompt_format, seed=int(seed) if seed else args.seed, dtype=dtype,
                             n_prompts=int(n) if n else None)
        t0 = time.perf_counter()
        edit = run_lunar(model, tok, bench.forget, bench.retain, config)
        secs = time.perf_counter() - t0
        held_res = run_attacks(model, tok, edit, probes, fitted=tuple(bench.forget), holdout=holdout,
                               attacks="heldout", fmt=bench.prompt_format)["heldout"]
        got = {"edit_s": secs, "heldout_base": held_res.base, "heldout": held_res.edited,
               "direction_norm": edit.info["direction_norm"], "forget_reach": edit.info["forget_reach"],
               "loss_after": edit.info["loss_after"],
               "evaluation": evaluation(ev_args, model, tok, bench, edit, out)}
        out[variant] = got
        _log(f"{variant}: heldout {held_res.base:.2f} -> {held_res.edited:.2f}, edit {secs:.0f} s")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("directions", "fits", "edits"))
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="the-solar-system")
    ap.add_argument("--sizes", default="4,8,12,16,20,24")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--variants", default="bfloat16:120,float32:120,bfloat16:24")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch "
               f"{torch.__version__}, load {load:.1f} at start")
    print(f"# {machine}\n# python bench/lunar_prompt_count.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    model, tok = load_model(args.model)
    bench = load_split(args)
    _log(f"{args.target}: {len(bench.forget)} forget, {len(bench.retain)} retain")
    t0 = time.perf_counter()
    res = {"directions": directions, "fits": fits, "edits": edits}[args.what](args, model, tok, bench)
    res = {"machine": machine, "seconds": time.perf_counter() - t0, "target": args.target, args.what: res}
    text = json.dumps(res, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x))
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
