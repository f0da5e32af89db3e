"""The paper's comparison on the bundled demo (issue 25 item 5): GROM against every
registered trained method, each over a small lr grid, and the locate-then-edit editors;
per method the setting that forgets most at a bounded retain cost; the relearning attack
on each pick.

    OMP_NUM_THREADS=1 python bench/bench_compare.py --threads 1 --epochs 5 --max-examples 100
    python bench/bench_compare.py --threads 1 --quick --methods ga,rmu --editors rome   # smoke test

Model, reference and split as bench/bench_baselines.py (its `Bench`): demo forget10, 400
forget / 3,200 retain QA pairs, OpenUnlearning's TOFU recipe (8 x 4, warm-up then linear
decay) for the trained methods, GROM's `demo` preset.

lr grid (`lr_grid`): the method's demo starting point (grom.methods.trained.starting_points) divided and
multiplied by 3; a method with no demo row (the recipe's 1e-5 does not move this 1.8M-
parameter model, BENCHMARKS.md) is centred on 3e-4, the middle of the four measured demo
picks (1e-4 .. 1e-3). RMU's defaults name layers 5-7 of a 32-layer model; the demo has 6,
so it steers layer 2 and trains layers 0-2's down_proj (`DEMO_ARGS`), the same "last of
three early layers" shape.

The pick (`pick_setting`): among the settings whose retain cost (relative drop of Model
retain metric against Base: Model utility, Retain fact recall) is at most --max-cost (0.10,
the studio's "broken" line), the one
with the lowest forget fact recall (then forget ROUGE-L); if none is within it, the
cheapest. The editors (ROME, MEMIT, AlphaEdit, ZeroUnlearn) run once at their defaults
but for the band (--editor-layers) and the value optimisation (--editor-values).
A method registered later (AltPO, RKLD) is in the default --methods with no change here.
"npo@3.3e-4" in --methods runs that lr in place of the grid (several such specs of one
method: those lrs), e.g. a grid's picks again at more epochs or another seed.

GROM is tuned as the trained methods are (`grom_grid`): the preset's beta x 1, 2, 4 at its
w_r x 1 and 3 (six settings; --grom-grid "beta:w_r,..." for others), picked by the same rule.

Relearning (`relearn_row`, grom.robustness.weights.relearn_curve): every parameter of the
edited model fine-tuned on the even-indexed forget pairs (--relearn-train of them), fact
recall of greedy answers scored on odd-indexed forget questions (--relearn-probes), so
what comes back was never trained on again. Its lr is calibrated first (--relearn-lr
auto, `grom.robustness.calibration.calibrate_relearn_lr` over --relearn-grid): the
largest lr at which the UNEDITED model, relearned the same way, keeps its recall within
0.10 at every step count (at 1e-3 it falls 0.98 -> 0.45 in 30 steps: a fine-tune that
damages answering says nothing about an edit). That unedited curve is printed beside the
edits' as their control. --relearn-best also relearns each pick at every lr of the grid
and gives the attacker's best (the highest recall over lrs and step counts) beside the
unedited model's at the same lr and step. --editors '' leaves the editors out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_attack_targets import method_spec  # noqa: E402
from bench_baselines import Bench, fmt_metric, log, md_table  # noqa: E402

from grom import PRESETS, demo_preset, run_edit  # noqa: E402
from grom.methods import EDITORS, METHODS, get_method  # noqa: E402
from grom.methods.editors.locate_then_edit import EditorConfig, run_editor  # noqa: E402
from grom.methods.editors.value_optimisation import ValueSettings  # noqa: E402
from grom.methods.trained.starting_points import model_defaults_for  # noqa: E402
from grom.robustness import probe_recall, probes_from_examples  # noqa: E402
from grom.robustness.calibration import calibrate_relearn_lr  # noqa: E402
from grom.robustness.weights import relearn_curve  # noqa: E402

CENTRE = 3e-4  # lr grid centre of a method with no demo starting point
DEMO_ARGS = {"rmu": {"method_args": {"layer": 2.0}, "params": [f".layers.{i}.mlp.down_proj" for i in (0, 1, 2)]}}
COLS = ["Forget fact recall", "Forget ROUGE-L", "Forget prob", "Retain cost", "Retain ROUGE-L", "Model utility",
        "Final score"]


def lr_grid(method: str, factor: float = 3.0) -> tuple[float, float, float]:
    """(lr / factor, lr, lr * factor) around the method's demo starting point, else CENTRE."""
    row = model_defaults_for("demo")
    lr = row.methods[method].lr if row is not None and method in row.methods else CENTRE
    return (lr / factor, lr, lr * factor)


def method_grids(spec: str) -> dict[str, tuple[float, ...]]:
    """"ga,npo@3e-4,npo@1e-3" -> {"ga": lr_grid("ga"), "npo": (3e-4, 1e-3)}, in the order
    given; an unknown method or a bad lr fails here, before any model loads."""
    out: dict[str, list[float]] = {}
    for part in filter(None, (p.strip().lower() for p in spec.split(","))):
        name, lr = method_spec(part)
        if name not in METHODS:
            raise SystemExit(f"unknown method {name!r}; methods: {', '.join(METHODS)}")
        out.setdefault(name, []).extend([] if lr is None else [lr])
    return {m: tuple(lrs) if lrs else lr_grid(m) for m, lrs in out.items()}


def pick_setting(runs: list[dict], max_cost: float) -> dict:
    """The run that forgets most (lowest forget fact recall, then ROUGE-L) among those with
    retain cost <= max_cost, else the one with the least retain cost. runs: dicts with a
    "metrics" dict."""
    def cost(r):
        return r["metrics"].get("Retain cost", float("inf"))
    within = [r for r in runs if cost(r) <= max_cost]
    if within:
        return min(within, key=lambda r: (r["metrics"]["Forget fact recall"], r["metrics"]["Forget ROUGE-L"]))
    return min(runs, key=cost)


def grom_grid(split: str, spec: str | None = None) -> list[tuple[float, float]]:
    """GROM's (beta, w_r) settings: `spec` "beta:w_r,..." as given, else the split's demo
    preset's beta x 1, 2, 4 at its w_r x 1 and 3."""
    if spec:
        try:
            return [(float(b), float(w)) for b, w in (p.split(":") for p in spec.split(",") if p.strip())]
        except ValueError:
            raise SystemExit(f"--grom-grid: {spec!r}: write beta:w_r pairs, e.g. 150:100,600:300") from None
    cfg = PRESETS[demo_preset(split)]
    return [(cfg.beta * f, cfg.w_r * g) for g in (1, 3) for f in (1, 2, 4)]


def relearn_sets(b: Bench):
    """(training pairs, scoring function) of the relearning attack: the even-indexed forget
    pairs, and fact recall on the odd-indexed forget questions."""
    a, forget = b.args, b.bench.forget
    probes = probes_from_examples(forget[1::2][:a.relearn_probes])
    return tuple(forget[0::2][:a.relearn_train]), lambda model: probe_recall(model, b.tok, probes, fmt=b.fmt)


def relearn_steps(b: Bench) -> list[int]:
    return sorted({0, *(int(s) for s in b.args.relearn_steps.split(","))})


def calibrate(b: Bench) -> None:
    """Sets b.args.relearn_lr (from --relearn-lr, or calibrated where it says auto) and
    b.relearn_base (the unedited model's curve at that lr, the control), printing the
    calibration's table."""
    a = b.args
    train, score = relearn_sets(b)
    lrs = [float(x) for x in a.relearn_grid.split(",")] if a.relearn_lr == "auto" else [float(a.relearn_lr)]
    log(f"relearning: the unedited model at lr {', '.join(f'{lr:g}' for lr in lrs)}")
    cal = calibrate_relearn_lr(b.model, b.tok, train, score, lrs, steps=relearn_steps(b), fmt=b.fmt, seed=a.seed,
                               tolerance=a.relearn_tol if a.relearn_lr == "auto" else float("inf"))
    print(f"\n### the relearning attack's lr: the unedited model relearned ({len(train)} pairs, recall on "
          f"{a.relearn_probes} held-apart questions; tolerance {cal.tolerance:g}; {cal.seconds:.0f} s)\n")
    print(md_table(["lr", *(f"step {s}" for s in cal.steps), "damage", ""], cal.rows()))
    if cal.lr is None:
        raise SystemExit("every lr of --relearn-grid damages the unedited model: give smaller ones")
    a.relearn_lr, b.relearn_base, b.relearn_controls = cal.lr, list(cal.curves[cal.lr]), dict(cal.curves)


def relearn_row(b: Bench, edit) -> dict:
    """The relearning attack on `edit`: recall of the held-apart forget questions at each
    step count (0: the edit as it is); the unedited model's, relearned the same way, is
    b.relearn_base (`calibrate`)."""
    t0, steps = time.perf_counter(), relearn_steps(b)
    train, score = relearn_sets(b)
    curves = {}
    for lr in (b.relearn_controls if b.args.relearn_best else [b.args.relearn_lr]):
        curve, _ = relearn_curve(b.model, b.tok, edit, train, score, steps, lr=lr, fmt=b.fmt, seed=b.args.seed)
        curves[lr] = [r.value for r in curve]
    row = {"curve": curves[b.args.relearn_lr], "steps": steps, "seconds": time.perf_counter() - t0}
    if b.args.relearn_best:  # the attacker's pick: the highest recall over every lr and step count after 0
        lr, i = max(((lr, i) for lr in curves for i in range(1, len(steps))), key=lambda li: curves[li[0]][li[1]])
        row["best"] = (curves[lr][i], lr, steps[i], b.relearn_controls[lr][i])
    return row


def grom_rows(b: Bench, grid: list[tuple[float, float]]) -> tuple[list[list], dict, object]:
    """GROM at each (beta, w_r) of `grid`: table rows, its pick with the relearning curve
    (as `grid_rows` for a trained method), and the first run's report, whose Base rows
    every later row reuses."""
    rows, runs, base_report = [], [], None
    cfg = PRESETS[demo_preset(b.args.split)].replace(prompt_format=b.fmt, seed=b.args.seed)
    for beta, w_r in grid:
        log(f"GROM beta {beta:g} w_r {w_r:g}: editing")
        t0 = time.perf_counter()
        edit = run_edit(b.model, b.tok, b.bench.forget, b.bench.retain, cfg.replace(beta=beta, w_r=w_r))
        secs = time.perf_counter() - t0
        if base_report is None:
            base_report = b.evaluate(edit, include_base=True)
        met = evaluated(b, edit, base_report)
        setting = f"beta {beta:g}, w_r {w_r:g}"
        runs.append({"edit": edit, "metrics": met, "lr": None, "setting": setting, "secs": secs})
        rows.append(["GROM", setting, f"{secs:.1f}", *[fmt_metric(met.get(k), k) for k in COLS]])
        log("row: " + " | ".join(rows[-1]))
    pick = pick_setting(runs, b.args.max_cost)
    with_relearn(b, "GROM", pick)
    return rows, pick, base_report


def evaluated(b: Bench, edit, base_report) -> dict:
    """The Edited row's metrics; the Base row comes from `base_report` (not recomputed) so
    that the report has the retain cost, which is measured against it."""
    return b.evaluate(edit, include_base=True, reuse=base_report).rows["Edited"].metrics


def grid_rows(b: Bench, methods: dict[str, tuple[float, ...]], base_report) -> tuple[list[list], dict]:
    """Every (method, lr) run: table rows, and per method its pick (edit, metrics, lr, secs)
    with its relearning curve, computed as soon as the method's grid is done (a run cut
    short still has the methods it finished in its log)."""
    rows, picks = [], {}
    for m, grid in methods.items():
        runs = []
        for lr in grid:
            log(f"{m} lr {lr:.2g}: training")
            edit, secs = b.baseline(m, lr, **DEMO_ARGS.get(m, {}))
            met = evaluated(b, edit, base_report)
            runs.append({"edit": edit, "metrics": met, "lr": lr, "setting": f"{lr:.2g}", "secs": secs[0]})
            rows.append([get_method(m).label, f"{lr:.2g}", f"{secs[0]:.1f}",
                         *[fmt_metric(met.get(k), k) for k in COLS]])
            log("row: " + " | ".join(rows[-1]))  # each row as it comes: a long run can be read early
        pick = picks[get_method(m).label] = pick_setting(runs, b.args.max_cost)
        with_relearn(b, get_method(m).label, pick)
    return rows, picks


def with_relearn(b: Bench, name: str, pick: dict) -> None:
    """Adds the relearning curve to `pick` and logs it."""
    pick["relearn"] = relearn_row(b, pick["edit"])
    log(f"relearn: {name} ({pick.get('setting', '-')}): " + " ".join(f"{v:.2f}" for v in pick["relearn"]["curve"])
         + f" ({pick['relearn']['seconds']:.0f} s)")


def editor_run(b: Bench, name: str):
    """The editor `name` at its defaults but for --editor-layers and --editor-values
    (steps:lr:clamp_norm_factor), with its own value optimisation (so its time includes
    it): (edit, seconds)."""
    a = b.args
    steps, lr, clamp = a.editor_values.split(":")
    layers = tuple(int(x) for x in a.editor_layers.split(",")) if a.editor_layers != "auto" else None
    config = EditorConfig(layers=layers, prompt_format=b.fmt, seed=a.seed,
                          values=ValueSettings(steps=int(steps), lr=float(lr), clamp_norm_factor=float(clamp)))
    t0 = time.perf_counter()
    edit = run_editor(name, b.model, b.tok, b.bench.forget, b.bench.retain, config)
    return edit, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="forget10")
    ap.add_argument("--methods", default=",".join(METHODS), help="trained methods (default: every registered)")
    ap.add_argument("--editors", default=",".join(EDITORS), help="editors ('' for none)")
    ap.add_argument("--editor-layers", default="auto", help="the editors' band ('auto': GROM's), e.g. 1,2,3")
    ap.add_argument("--editor-values", default="25:0.1:0.75", help="the value optimisation's steps:lr:clamp")
    ap.add_argument("--epochs", type=float, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-examples", type=int, default=100, help="per evaluation set (0: all)")
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--max-cost", type=float, default=0.10)
    ap.add_argument("--relearn-train", type=int, default=40)
    ap.add_argument("--relearn-probes", type=int, default=60)
    ap.add_argument("--relearn-steps", default="10,30")
    ap.add_argument("--relearn-lr", default="auto", help="a number, or auto: calibrated over --relearn-grid")
    ap.add_argument("--relearn-grid", default="1e-4,3e-4,1e-3")
    ap.add_argument("--relearn-tol", type=float, default=0.10,
                    help="how far the unedited model's recall may fall at the lr picked")
    ap.add_argument("--relearn-best", action="store_true",
                    help="also relearn each pick at every --relearn-grid lr: the attacker's best lr and step")
    ap.add_argument("--grom-grid", default=None, help="GROM's beta:w_r settings (default: the preset's beta x 1, "
                                                      "2, 4 at w_r x 1, 3)")
    ap.add_argument("--quick", action="store_true", help="a quarter epoch, 20 examples per set")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.max_examples = 0.25, 20
    args.max_examples = args.max_examples or None
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = method_grids(args.methods)
    g_grid = grom_grid(args.split, args.grom_grid)
    editors = [e.strip().lower() for e in args.editors.split(",") if e.strip()]
    bad = [e for e in editors if e not in EDITORS]
    if bad:
        raise SystemExit(f"unknown {bad}; methods: {', '.join(METHODS)}; editors: {', '.join(EDITORS)}")
    print(f"# {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f} at start")
    print("# " + " ".join(["python", "bench/bench_compare.py", *(sys.argv[1:] if argv is None else argv)]))
    b = Bench(args)
    calibrate(b)
    g_rows, g_pick, rep = grom_rows(b, g_grid)
    picks = {"GROM": g_pick}
    rows, trained = grid_rows(b, methods, rep)
    rows = g_rows + rows
    picks.update(trained)
    for e in editors:
        log(f"{e}: editing")
        edit, secs = editor_run(b, e)
        picks[EDITORS[e].label] = {"edit": edit, "metrics": evaluated(b, edit, rep), "lr": None, "secs": secs,
                                   "setting": f"values {args.editor_values}"}
        log(f"row: {e} | {secs:.1f} | " + " | ".join(fmt_metric(picks[EDITORS[e].label]["metrics"].get(k), k)
                                                       for k in COLS) + f" | band {edit.band} | {edit.timings}")
        with_relearn(b, EDITORS[e].label, picks[EDITORS[e].label])
    load = os.getloadavg()
    print(f"\n### every setting ({args.epochs:g} epochs, batch {args.batch_size} x {args.grad_accum}, "
          f"evaluation on {args.max_examples or 'every'} examples per set; load {load[0]:.1f} at the end)\n")
    print(md_table(["method", "setting", "update s", *COLS], rows))
    base = rep.rows["Base"].metrics
    steps = relearn_steps(b)
    def best(r):
        return ([f"{r['best'][0]:.2f} ({r['best'][1]:g}, {r['best'][2]}; unedited {r['best'][3]:.2f})"]
                if args.relearn_best else [])
    out = [["Base", "-", "-", *[fmt_metric(base.get(k), k) for k in COLS], *[f"{v:.2f}" for v in b.relearn_base],
            *(["-"] if args.relearn_best else [])]]
    for name, p in picks.items():
        out.append([name, p.get("setting", "-"), f"{p['secs']:.1f}",
                    *[fmt_metric(p["metrics"].get(k), k) for k in COLS],
                    *[f"{v:.2f}" for v in p["relearn"]["curve"]], *best(p["relearn"])])
    print(f"\n### the picks (retain cost <= {args.max_cost:g}, else the cheapest) and relearning "
          f"(lr {args.relearn_lr:g}, batch 4, {args.relearn_train} even-indexed forget pairs; recall on "
          f"{args.relearn_probes} odd-indexed forget questions; the Base row: the unedited model relearned "
          f"the same way)\n")
    print(md_table(["method", "setting", "update s", *COLS, *(f"relearn {s}" for s in steps),
                    *(["relearn, best (lr, step)"] if args.relearn_best else [])], out))


if __name__ == "__main__":
    main()
