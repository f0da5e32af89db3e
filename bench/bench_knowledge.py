"""GROM on a real chat model: SmolLM2-135M-Instruct on the real-knowledge benchmark.

    python bench/bench_knowledge.py sweep --betas 30,65,100,150 --w-r 10,100,1000
    python bench/bench_knowledge.py speed                   # edit time against forward passes
    python bench/bench_knowledge.py compare --known-only --max-examples 0   # the studio's Run edit + comparison
    python bench/bench_knowledge.py answers --betas 65,200,1000  # each answer's class, to read
    python bench/bench_knowledge.py ablate                  # alpha off, early and random bands
    python bench/bench_knowledge.py baselines --epochs 5 --lr ga=1e-5,npo=1e-5 ...
    python bench/bench_knowledge.py influence --sizes 4,8,16,34   # Theorem 2 against forget-set size

Every row is an edit of the model (fetched once by `grom.model.loading.load_model`) evaluated on
the facts it knew before (`grom.eval.evaluate`, task "knowledge"): fact recall on the
forget target(s), its paraphrases, the neighbouring targets and general knowledge, the
headline Knowledge score (harmonic mean of the cleanly forgotten and the kept shares), the
retain cost, and what the model says instead (each answer's class: a refusal, another
fluent answer, or degenerate text; repetition, perplexity under the unedited model). A row
whose retain set broke (lost more than a tenth of its known facts) is marked "broken".
--known-only evaluates the facts SmolLM2 was probed to know, as the studio does;
--max-examples 0 every example of each set.
Prints markdown tables; numbers go into BENCHMARKS.md with the machine.
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

from grom import PRESETS, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.eval import evaluate, quantization_check, quantization_verdict  # noqa: E402
from grom.methods import METHODS, run_baseline  # noqa: E402
from grom.model.loading import load_model  # noqa: E402

COLUMNS = ["Forget fact recall", "Forget clean forgetting", "Forget degenerate", "Forget paraphrase recall",
           "Kept fact recall", "Knowledge score", "Forget prob", "Forget answer perplexity",
           "Forget repetition", "Text perplexity", "Retain cost"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def md_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def cells(metrics: dict) -> list[str]:
    out = [f"{metrics[k]:.3g}" if k in metrics else "-" for k in COLUMNS]
    return out + (["broken"] if metrics.get("Retain broken") else [""])


class Run:
    """The model, one split, and the Base report every row reuses."""

    def __init__(self, args, split: str):
        self.args = args
        self.model, self.tok = load_model(args.model)
        self.bench = load_benchmark("real-knowledge", split, known_only=args.known_only)
        if args.retain_examples:  # the app's seeded retain sample (components.edit_panel.retain_subset)
            retain = tuple(random.Random(args.seed).sample(self.bench.retain, args.retain_examples))
            self.bench = dataclasses.replace(self.bench, retain=retain)
        self.base = None

    def edit(self, config):
        t0 = time.perf_counter()
        edit = run_edit(self.model, self.tok, self.bench.forget, self.bench.retain, config)
        return edit, time.perf_counter() - t0

    def report(self, edit):
        rep = evaluate(self.model, self.tok, self.bench, edit=edit, max_examples=self.args.max_examples,
                       reuse=self.base, batch_size=self.args.eval_batch_size)
        if self.base is None:
            self.base = rep
            facts = rep.known_facts("Base")
            log("known facts (of those evaluated): " + ", ".join(f"{k} {v[0]}/{rep.n_examples[k]}"
                                                                   for k, v in facts.items()))
        return rep.rows["Edited"].metrics


def sweep(args) -> None:
    for split in args.splits.split(","):
        run = Run(args, split)
        rows = []
        for beta in map(float, args.betas.split(",")):
            for w_r in map(float, args.w_r.split(",")):
                edit, secs = run.edit(PRESETS[args.preset].replace(beta=beta, w_r=w_r))
                m = run.report(edit)
                log(f"{split} beta {beta:g} w_r {w_r:g}: {secs:.1f} s, score {m.get('Knowledge score', 0):.3f}")
                rows.append([f"{beta:g}", f"{w_r:g}", "-".join(map(str, (edit.band[0], edit.band[-1]))),
                             f"{secs:.1f}", *cells(m)])
        print(f"\n### {split}, {len(run.bench.retain)} retain examples: GROM sweep from preset {args.preset} "
              f"(evaluation on up to "
              f"{args.max_examples} examples per set; known facts: {run.base.known_facts('Base')})\n")
        print(md_table(["beta", "w_r", "band", "edit s", *COLUMNS, "retain"], rows))


def speed(args) -> None:
    """The edit's time against one forward pass over the same key sequences."""
    from grom.closed_form.collect import forward
    from grom.closed_form.pipeline import prepare

    run = Run(args, args.splits.split(",")[0])
    config = PRESETS[args.preset]
    prep = prepare(run.tok, run.bench.forget, run.bench.retain, config, run.model.config.vocab_size)
    batches = prep.forget + prep.retain
    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                forward(run.model, b)
        times.append(time.perf_counter() - t0)
    fwd = min(times)
    rows = []
    for label, cfg, scores in (("automatic band (scores + keys)", config, None),
                               ("scores given (the app: computed at page load)", config, "reuse"),
                               ("band fixed", config.replace(layers=tuple(range(24, 29))), None)):
        best = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sc = run_edit(run.model, run.tok, run.bench.forget, run.bench.retain, config).scores \
                if scores == "reuse" else None
            t1 = time.perf_counter()
            edit = run_edit(run.model, run.tok, run.bench.forget, run.bench.retain, cfg, scores=sc)
            secs = time.perf_counter() - t1 if scores == "reuse" else time.perf_counter() - t0
            best = min(best or 1e9, secs)
        t = edit.timings
        rows.append([label, f"{best:.2f}", f"{best / fwd:.2f}",
                     *(f"{t.get(k, 0):.2f}" for k in ("scores", "keys", "solve"))])
    print(f"\n### speed: {len(batches)} batches, {tokens} key-sequence tokens; one forward pass "
          f"(model(...) over every batch, best of {args.repeats}) {fwd:.2f} s\n")
    print(md_table(["edit", "seconds (best)", "x one forward pass", "scores s", "keys s", "solve s"], rows))


def ablate(args) -> None:
    run = Run(args, args.splits.split(",")[0])
    config = PRESETS[args.preset]
    edit, secs = run.edit(config)
    band = list(edit.band)
    k = len(band)
    rng = random.Random(args.seed)
    start = rng.randrange(0, run.model.config.num_hidden_layers - k + 1)
    variants = [(f"attribution band {band[0]}-{band[-1]}", config.replace(layers=tuple(band))),
                ("alpha off", config.replace(layers=tuple(band), use_alpha=False)),
                (f"early band 0-{k - 1}", config.replace(layers=tuple(range(k)))),
                (f"random band {start}-{start + k - 1}", config.replace(layers=tuple(range(start, start + k))))]
    rows = []
    for label, cfg in variants:
        e, secs = run.edit(cfg)
        rows.append([label, f"{secs:.1f}", *cells(run.report(e))])
    print(f"\n### ablations ({args.preset}, {run.bench.split})\n")
    print(md_table(["variant", "edit s", *COLUMNS, "retain"], rows))


def baselines(args) -> None:
    run = Run(args, args.splits.split(",")[0])
    rows, edits, secs = [], {}, None
    if not args.skip_grom:
        edit, secs = run.edit(PRESETS[args.preset])
        m = run.report(edit)
        rows = [["GROM " + args.preset, "-", f"{secs:.1f}", "1.0", *cells(m)]]
        log("row: " + " | ".join(rows[-1]))
        edits = {"GROM": edit}
    lrs = dict(p.split("=") for p in args.lr.split(",")) if args.lr else {}
    for spec in args.methods.split(","):  # "npo" (lr from --lr, else the recipe's 1e-5) or "npo@1e-4"
        method, _, at = spec.partition("@")
        lr = float(at or lrs.get(method, 1e-5))
        log(f"{method} lr {lr:g}: training {args.epochs} epochs")
        t0 = time.perf_counter()
        e = run_baseline(method, run.model, run.tok, run.bench.forget, run.bench.retain,
                         epochs=args.epochs, lr=lr, batch_size=8, grad_accum=4, seed=args.seed,
                         prompt_format=run.bench.prompt_format)
        bs = time.perf_counter() - t0
        edits[f"{method} {lr:g}"] = e
        rows.append([method, f"{lr:g}", f"{bs:.1f}", f"{bs / secs:.1f}" if secs else "-", *cells(run.report(e))])
        log("row: " + " | ".join(rows[-1]))  # each row as it comes: a long run can be read early
    print(f"\n### GROM and the gradient baselines ({run.bench.split}; {args.epochs} epochs, batch 8 x 4)\n")
    print(md_table(["method", "lr", "update s", "x GROM", *COLUMNS, "retain"], rows))
    if args.quant:
        qrows = []
        for name, e in edits.items():
            df = quantization_check(run.model, run.tok, run.bench, e, max_examples=args.max_examples,
                                    with_retain=True)
            v = quantization_verdict(df)
            qrows.append([name, *(f"{df[c].iloc[2]:.3f} -> {df[c].iloc[3]:.3f}"
                                  for c in ("Forget fact recall", "Kept fact recall", "Forget prob")),
                          {True: "survives", False: "undone", None: "no verdict"}[v.survives]])
        print("\n4-bit check (RTN, groups of 128): edited model, full precision -> 4-bit\n")
        print(md_table(["edit", "Forget fact recall", "Kept fact recall", "Forget prob", "verdict"], qrows))


def influence_vs_size(args) -> None:
    """Theorem 2 on the real model as the forget set grows: for the first s forget
    examples (band fixed to the preset's automatic band on the whole split), each
    example's ||P - P_-i||_F on the first band layer by Woodbury from one factorisation
    and by re-solving without it (the reference), their largest relative difference, the
    times, and the share of ||P|| the most and the median influential example carries."""
    from grom.closed_form.diagnostics import layer_keys
    from grom.closed_form.influence import example_influence_bruteforce, influence_norms
    from grom.closed_form.solve import build_system

    run = Run(args, args.splits.split(",")[0])
    config = PRESETS[args.preset]
    band = tuple(run_edit(run.model, run.tok, run.bench.forget, run.bench.retain,
                          config.replace(keep_keys=False)).band)
    rows = []
    for size in map(int, args.sizes.split(",")):
        forget = run.bench.forget[:size]
        edit = run_edit(run.model, run.tok, forget, run.bench.retain, config.replace(layers=band))
        name, k = layer_keys(edit, None)
        cfg = edit.config
        t0 = time.perf_counter()
        system = build_system(k.Xf, k.Xr, w_r=cfg.w_r, rho=cfg.rho, w_f=cfg.w_f)
        P = system.update(k.directions.right_product(k.Xf))
        wood = influence_norms(system, P, k.Xf, k.directions, k.forget_example, k.n_forget)
        tw = time.perf_counter() - t0
        t0 = time.perf_counter()
        brute = example_influence_bruteforce(k.Xf, k.Xr, k.directions, k.forget_example,
                                             w_r=cfg.w_r, rho=cfg.rho, w_f=cfg.w_f)
        tb = time.perf_counter() - t0
        share = wood / float(torch.linalg.matrix_norm(P))
        err = float(((wood - brute).abs() / brute.clamp_min(1e-300)).max())
        log(f"{size} examples: Woodbury {tw:.2f} s, re-solve {tb:.2f} s, max rel diff {err:.1e}")
        rows.append([str(size), str(k.Xf.shape[1]), f"{tw:.2f}", f"{tb:.2f}", f"{err:.1e}",
                     f"{float(share.max()):.3f}", f"{float(share.median()):.3f}",
                     f"{float(share.median()) * size:.2f}"])
    print(f"\n### influence against forget-set size ({run.bench.split}, band {band[0]}-{band[-1]}, "
          f"first band layer, {len(run.bench.retain)} retain examples)\n")
    print(md_table(["forget examples", "forget keys", "Woodbury s", "re-solve s", "max rel. diff",
                    "max share of ||P||", "median share", "median share x examples"], rows))


def compare(args) -> None:
    """The studio's Run edit and first comparison: the edit with the layer scores given and
    the stream entering the band kept (as after the page's warm-up), then the Edited row at
    --max-examples per set, every layer run against the layers below the band replayed
    (`grom.eval.prefix`, recorded by the Base row as the app's warm-up does)."""
    from grom.closed_form.pipeline import warm_stream
    from grom.eval.prefix import PrefixCache

    args.retain_examples = args.retain_examples or 128  # the app's default sample
    run = Run(args, args.splits.split(",")[0])
    config = PRESETS[args.preset].replace(prompt_format=run.bench.prompt_format, seed=args.seed)
    first = run_edit(run.model, run.tok, run.bench.forget, run.bench.retain, config)
    stream: dict = {}
    warm_stream(run.model, run.tok, run.bench.forget, run.bench.retain, config, first.band, stream)
    cache = PrefixCache()
    base = evaluate(run.model, run.tok, run.bench, max_examples=args.max_examples, prefix=cache,
                    record_at=(first.band[0],), batch_size=args.eval_batch_size)
    times: dict[str, list[float]] = {"edit": [], "every layer": [], "replayed": []}
    row_s: dict[str, list[float]] = {"every layer": [], "replayed": []}
    reports = {}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        edit = run_edit(run.model, run.tok, run.bench.forget, run.bench.retain, config,
                        scores=first.scores, stream_cache=stream)
        times["edit"].append(time.perf_counter() - t0)
        for label, prefix in (("every layer", None), ("replayed", cache)):
            t0 = time.perf_counter()
            reports[label] = evaluate(run.model, run.tok, run.bench, edit=edit, reuse=base, prefix=prefix,
                                      max_examples=args.max_examples, batch_size=args.eval_batch_size)
            times[label].append(time.perf_counter() - t0)
            row_s[label].append(reports[label].rows["Edited"].seconds)
    same = reports["every layer"].table().equals(reports["replayed"].table())
    e, full, fast = (min(times[k]) for k in ("edit", "every layer", "replayed"))
    facts = base.known_facts("Base")
    print(f"\n### compare: band {first.band[0]}-{first.band[-1]}, {args.max_examples or 'all'} examples per set "
          f"({base.n_examples}; known facts {facts}), best of {args.repeats}; prefix cache {len(cache)} "
          f"entries, {cache.nbytes / 2**20:.0f} MB; same numbers: {same}\n")
    print(md_table(["Edited row", "edit s", "Edited row s", "comparison s", "edit + comparison s"],
                   [[label, f"{e:.2f}", f"{min(row_s[key]):.2f}", f"{t:.2f}", f"{e + t:.2f}"]
                    for label, key, t in (("every layer", "every layer", full),
                                          ("layers below the band replayed", "replayed", fast))]))
    m = reports["replayed"].rows["Edited"].metrics
    print("\n" + md_table(["metric", "Edited"], [[k, f"{v:.3g}"] for k, v in m.items()]))


def answers(args) -> None:
    """Every known fact's answer after GROM edits at each of --betas, with its class
    (`grom.eval.metrics.answer_class`), repetition and perplexity under the unedited model:
    what the thresholds of "degenerate" were calibrated on. A table of class counts per beta,
    then up to --show answers of each class."""
    run = Run(args, args.splits.split(",")[0])
    counts, shown = [], {}
    for beta in map(float, args.betas.split(",")):
        edit, _ = run.edit(PRESETS[args.preset].replace(beta=beta, prompt_format=run.bench.prompt_format))
        rep = evaluate(run.model, run.tok, run.bench, edit=edit, max_examples=args.max_examples, reuse=run.base,
                       batch_size=args.eval_batch_size)
        run.base = run.base or rep
        for name, c in rep.answer_classes().items():
            counts.append([f"{beta:g}", name, *(str(c[k]) for k in c),
                           f"{rep.rows['Edited'].metrics['Knowledge score']:.3f}"])
            df = rep.examples("Edited", name)
            for cls in c:
                for _, r in df[df["answer_class"] == cls].head(args.show).iterrows():
                    shown.setdefault((cls, f"{beta:g}"), []).append(
                        [name, r["question"], r["generation"].replace("\n", " ")[:120], f"{r['repetition']:.2f}",
                         f"{r['answer_perplexity']:.0f}"])
    print(f"\n### answer classes of the known facts ({run.bench.split})\n")
    print(md_table(["beta", "set", "kept", "refusal", "fluent", "degenerate", "Knowledge score"], counts))
    for (cls, beta), rows in sorted(shown.items()):
        print(f"\n#### {cls}, beta {beta}\n")
        print(md_table(["set", "question", "answer", "repetition", "perplexity"], rows))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["sweep", "speed", "compare", "ablate", "baselines", "influence", "answers"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--splits", default="the-solar-system")
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--betas", default="30,65,100")
    ap.add_argument("--w-r", default="30,100,300")
    ap.add_argument("--max-examples", type=int, default=40, help="per evaluation set; 0: all of them")
    ap.add_argument("--known-only", action="store_true",
                    help="only the facts SmolLM2 was probed to know (the studio's benchmark on SmolLM2)")
    ap.add_argument("--retain-examples", type=int, default=None,
                    help="a seeded sample of the retain set gives the keys (the app's default: 128)")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--lr", default=None, help="method=lr pairs (default 1e-5, the recipe's)")
    ap.add_argument("--epochs", type=float, default=5)
    ap.add_argument("--skip-grom", action="store_true", help="baselines only (no GROM row): a cheaper lr grid")
    ap.add_argument("--quant", action="store_true", help="the 4-bit check for every edit")
    ap.add_argument("--sizes", default="4,8,16,34", help="forget-set sizes for influence")
    ap.add_argument("--show", type=int, default=3, help="answers shown per class (answers)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    args.max_examples = args.max_examples or None
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{datetime.date.today()}")
    print("# " + " ".join(["python", "bench/bench_knowledge.py", *(sys.argv[1:] if argv is None else argv)]))
    {"sweep": sweep, "speed": speed, "compare": compare, "ablate": ablate, "baselines": baselines,
     "influence": influence_vs_size, "answers": answers}[args.what](args)


if __name__ == "__main__":
    main()
