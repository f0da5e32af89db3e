"""GROM against the gradient baselines (GA, GradDiff, NPO, SimNPO) on the bundled demo:
time of the update, the Final Score and key TOFU metrics, and the 4-bit check.

    OMP_NUM_THREADS=1 python bench/bench_baselines.py --threads 1      # 10 epochs, every example
    python bench/bench_baselines.py --threads 1 --quant grom,ga,graddiff,npo,simnpo  # 4-bit for all
    python bench/bench_baselines.py --quick --threads 1                # smoke test (~50 s)
    python bench/bench_baselines.py --sweep 1e-5,1e-4,3e-4,1e-3,3e-3 --max-examples 100 --threads 1

Model `load_demo_model("full")`, reference `load_demo_model("retain")`, benchmark
`load_benchmark("demo", "forget10")` (400 forget / 3,200 retain training QA pairs). GROM
runs the split's demo preset (`demo_preset(split)`: `demo` for forget10) with the
benchmark's prompt format; each baseline runs
`run_baseline` with OpenUnlearning's recipe (AdamW, linear warm-up over 1 epoch then
decay, 10 epochs) at batch 8 x grad_accum 4, upstream's effective batch of 32 (it costs
the same as grad_accum 1: the same forward/backward passes, 4x fewer optimizer steps).

Time of the update, the paper's convention: from the start of the edit to the weights
written back, i.e. the `run_edit` / `run_baseline` call alone (no loading, no
evaluation). Both return an `Edit` (patches); `evaluate` applies and reverts it.

Learning rates (`LR`): the recipe's 1e-5 is for 1B-parameter models; on this 1.8M-
parameter model it barely moves the weights in 130 optimizer steps. Per-method defaults
are the best Final Score of a sweep at 10 epochs (`--sweep 1e-5,1e-4,3e-4,1e-3,3e-3
--max-examples 100 --threads 1`, then 2e-4 / 2e-3 to refine; 2026-11-21; evaluation on
100 examples per set). Final Score (Retain ROUGE-L); on the same subsets Base 0.372
(0.999), GROM 0.573 (0.981), Retain model 0.784 (0.991); * the pick, x the model
collapsed (every forget and retain metric 0, Final Score 0.500):

    lr      GA              GradDiff        NPO             SimNPO
    1e-5    0.379 (0.999)   0.375 (0.999)   0.379 (0.999)   0.371 (0.999)
    1e-4    0.647 (0.613) * 0.554 (0.906)   0.602 (0.808)   0.381 (1.000)
    2e-4    0.500 x         0.680 (0.337)   -               -
    3e-4    0.500 x         0.783 (0.467) * 0.783 (0.846)   0.482 (1.000)
    1e-3    0.500 x         0.779 (0.513)   0.791 (0.899) * 0.640 (0.969) *
    2e-3    -               -               -               0.637 (0.841)
    3e-3    0.500 x         0.597 (0.343)   0.724 (0.737)   0.602 (0.763)

The Final Score does not penalise over-forgetting: GradDiff at 3e-4 answers nothing on
the forget set (ROUGE-L 0.001, prob 0.000) and halves Retain ROUGE-L, yet scores as the
retain model does. `--lr 3e-4` sets one value for every method, `--lr ga=1e-3,npo=3e-3`
overrides some. Prints markdown tables; numbers go into BENCHMARKS.md with the machine.
"""
from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom import PRESETS, demo_preset, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.demo import load_demo_model  # noqa: E402
from grom.eval import evaluate, quantization_check  # noqa: E402
from grom.methods import BASELINES, EDITORS, METHODS, EditorConfig, run_baseline, run_editor  # noqa: E402
from grom.methods.trained.starting_points import starting_point  # noqa: E402

# Per-method learning rates, from the sweep in the docstring (best Final Score).
LR: dict[str, float] = {"ga": 1e-4, "graddiff": 3e-4, "npo": 1e-3, "simnpo": 1e-3}

METRICS = ["Final score", "Retain cost", "Retain broken", "Forget ROUGE-L", "Forget fact recall", "Forget prob",
           "Retain ROUGE-L", "Model utility", "Forget quality"]
QUANT_METRICS = ["Forget ROUGE-L", "Forget fact recall", "Forget prob"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_metric(v, key: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if key == "Forget quality":
        return f"{v:.3g}" if v >= 1e-3 else f"{v:.1e}"
    return f"{v:.3f}"


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def parse_lr(text: str | None, methods: list[str]) -> dict[str, float]:
    """--lr: one value for every method, or method=value pairs over the defaults."""
    lrs = {m: LR[m] if m in LR else starting_point("demo", m).lr for m in methods}
    if not text:
        return lrs
    if "=" not in text:
        return {m: float(text) for m in methods}
    for part in text.split(","):
        name, value = part.split("=")
        if name.strip() not in METHODS:
            raise SystemExit(f"--lr: unknown method {name!r}; use {', '.join(METHODS)}")
        lrs[name.strip()] = float(value)
    return lrs


class Bench:
    def __init__(self, args):
        self.args = args
        self.model, self.tok = load_demo_model("full", device=args.device)
        self.ref, _ = load_demo_model("retain", device=args.device)
        self.bench = load_benchmark("demo", args.split)
        self.fmt = self.bench.prompt_format

    def _sync(self):
        if self.args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def grom(self):
        self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        edit = run_edit(self.model, self.tok, self.bench.forget, self.bench.retain,
                        PRESETS[demo_preset(self.args.split)].replace(prompt_format=self.fmt))
        self._sync()
        return edit, (time.perf_counter() - t0, time.process_time() - c0)

    def baseline(self, method: str, lr: float, **extra):
        """`extra`: more run_baseline keywords (e.g. RMU's method_args and params)."""
        a = self.args
        self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        edit = run_baseline(method, self.model, self.tok, self.bench.forget, self.bench.retain,
                            epochs=a.epochs, lr=lr, batch_size=a.batch_size, grad_accum=a.grad_accum,
                            prompt_format=self.fmt, seed=a.seed, **extra)
        self._sync()
        return edit, (time.perf_counter() - t0, time.process_time() - c0)

    def editor(self, name: str):
        """A locate-then-edit editor (grom.methods.EDITORS) at its defaults, with its own
        value optimisation (so its time includes it); the split must carry subjects."""
        self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        edit = run_editor(name, self.model, self.tok, self.bench.forget, self.bench.retain,
                          EditorConfig(prompt_format=self.fmt, seed=self.args.seed))
        self._sync()
        return edit, (time.perf_counter() - t0, time.process_time() - c0)

    def evaluate(self, edit, include_base: bool, reuse=None):
        """Edited and Retain-model rows (and Base); `reuse` takes the unedited rows of an
        earlier report instead of computing them again."""
        return evaluate(self.model, self.tok, self.bench, edit=edit, reference=self.ref,
                        include_base=include_base, max_examples=self.args.max_examples,
                        batch_size=self.args.eval_batch_size, reuse=reuse)


def run_sweep(b: Bench, methods: list[str], lrs: list[float]) -> None:
    a = b.args
    log("sweep: GROM and the Base / Retain rows on the same subsets")
    edit, secs = b.grom()
    rep = b.evaluate(edit, include_base=True)
    rows, best = [], {}
    for name, label in (("Base", "Base"), ("Edited", "GROM"), ("Retain model", "Retain model")):
        met = rep.rows[name].metrics
        rows.append([label, "", "", f"{secs[0]:.1f}" if label == "GROM" else "",
                     *[fmt_metric(met.get(k), k) for k in METRICS], ""])
    for m in methods:
        for lr in lrs:
            log(f"sweep {m} lr {lr:g}: training")
            edit, secs = b.baseline(m, lr)
            met = b.evaluate(edit, include_base=True, reuse=rep).rows["Edited"].metrics
            log(f"sweep {m} lr {lr:g}: {secs[0]:.1f} s, final {met['Final score']:.3f}")
            rows.append([m, f"{lr:g}", edit.info["steps"], f"{secs[0]:.1f}",
                         *[fmt_metric(met.get(k), k) for k in METRICS],
                         f"{edit.info['final']['forget_nll']:.3g}"])
            if m not in best or met["Final score"] > best[m][1]:
                best[m] = (lr, met["Final score"])
    print(f"\n### lr sweep ({a.epochs:g} epochs, batch {a.batch_size} x grad_accum {a.grad_accum}, "
          f"evaluation on {a.max_examples or 'every'} examples per set)\n")
    print(md_table(["method", "lr", "steps", "update s", *METRICS, "last forget NLL"], rows))
    print("\nbest lr: " + ", ".join(f"{m} {lr:g} (Final {s:.3f})" for m, (lr, s) in best.items()))


def run_bench(b: Bench, methods: list[str], lrs: dict[str, float]) -> None:
    a = b.args
    log("GROM: editing")
    edits, secs = {}, {}
    edits["grom"], secs["grom"] = b.grom()
    log(f"GROM: {secs['grom'][0]:.1f} s; evaluating")
    reports = {"grom": b.evaluate(edits["grom"], include_base=True)}
    for m in methods:
        if m in EDITORS:
            log(f"{m}: editing")
            edits[m], secs[m] = b.editor(m)
        else:
            log(f"{m} lr {lrs[m]:g}: training")
            edits[m], secs[m] = b.baseline(m, lrs[m])
        log(f"{m}: {secs[m][0]:.1f} s; evaluating")
        # include_base with reuse: the Base row is taken, not recomputed, and gives the retain cost
        reports[m] = b.evaluate(edits[m], include_base=True, reuse=reports["grom"])
    quant = {}
    for m in [q for q in a.quant.split(",") if q and q in edits]:
        log(f"4-bit check: {m}")
        quant[m] = quantization_check(b.model, b.tok, b.bench, edits[m], max_examples=a.max_examples,
                                      batch_size=a.eval_batch_size)
    log("done")

    g = reports["grom"]
    print(f"\nexamples per set: {g.n_examples}; baselines: {a.epochs:g} epochs, batch {a.batch_size} x "
          f"grad_accum {a.grad_accum} (effective {a.batch_size * a.grad_accum}), seed {a.seed}\n")
    names = {m: f"GROM (preset {demo_preset(a.split)})" if m == "grom" else m for m in ["grom", *methods]}
    g_wall, g_cpu = secs["grom"]
    trows = []
    for m in ["grom", *methods]:
        wall, cpu = secs[m]
        lr = f"{lrs[m]:g}" if m in lrs else "-"
        steps = edits[m].info.get("steps", "-") if m in lrs else "-"
        trows.append([names[m], lr, steps, f"{wall:.1f}", f"{wall / g_wall:.1f}", f"{cpu:.1f}",
                      f"{cpu / g_cpu:.1f}"])
    print("Time of the update (the run_edit / run_baseline call):\n")
    print(md_table(["method", "lr", "optimizer steps", "wall s", "wall / GROM", "CPU s", "CPU / GROM"],
                   trows))
    print("\nMetrics (evaluate(..., edit=..., reference=retain model)):\n")
    rows = [["Base (full model)", *[fmt_metric(g.rows["Base"].metrics.get(k), k) for k in METRICS]]]
    for m in ["grom", *methods]:
        met = reports[m].rows["Edited"].metrics
        rows.append([names[m], *[fmt_metric(met.get(k), k) for k in METRICS]])
    rows.append(["Retain model", *[fmt_metric(g.rows["Retain model"].metrics.get(k), k) for k in METRICS]])
    print(md_table(["model", *METRICS], rows))

    if quant:
        attrs = next(iter(quant.values())).attrs
        how = "NF4" if attrs.get("method") == "nf4" else \
            f"round-to-nearest, groups of {attrs.get('group_size')}, LM head kept"
        print(f"\n4-bit check (forget set; full precision -> 4-bit, {how}):\n")
        qrows = []
        for m, df in quant.items():
            idx = list(df.index)
            pairs = [("Base", idx[0], idx[1])] if not qrows else []
            pairs.append(("GROM" if m == "grom" else m, idx[2], idx[3]))
            for name, full, q4 in pairs:
                qrows.append([name, *[f"{df.loc[full, k]:.3f} -> {df.loc[q4, k]:.3f}"
                                      for k in QUANT_METRICS]])
        print(md_table(["model", *QUANT_METRICS], qrows))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="forget10")
    ap.add_argument("--methods", default=",".join(BASELINES),
                    help=f"baselines, comma-separated (default: the four built-in ones; any of "
                         f"{', '.join(METHODS)}, or an editor: {', '.join(EDITORS)})")
    ap.add_argument("--epochs", type=float, default=10)
    ap.add_argument("--lr", default=None, help="one lr for all, or method=lr pairs (default: LR)")
    ap.add_argument("--batch-size", type=int, default=8, help="baselines' per-step batch")
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-examples", type=int, default=None, help="per evaluation set (None: all)")
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--quant", default="grom,simnpo", help="methods for the 4-bit check ('' for none)")
    ap.add_argument("--sweep", default=None, help="comma-separated lrs: sweep them instead")
    ap.add_argument("--quick", action="store_true",
                    help="a quarter epoch (4 steps), 20 examples per set: a smoke test")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.max_examples = 0.25, args.max_examples or 20
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS and m not in EDITORS]
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; use {', '.join(METHODS)} or an editor "
                         f"({', '.join(EDITORS)})")
    if args.sweep and any(m in EDITORS for m in methods):
        raise SystemExit("--sweep: the editors have no learning rate; run them without --sweep")
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"device {args.device}, {datetime.date.today()}")
    print("# " + " ".join(["python", "bench/bench_baselines.py", *(sys.argv[1:] if argv is None else argv)]))
    b = Bench(args)
    if args.sweep:
        run_sweep(b, methods, [float(x) for x in args.sweep.split(",")])
    else:
        run_bench(b, methods, parse_lr(args.lr, [m for m in methods if m in METHODS]))


if __name__ == "__main__":
    main()
