"""RWKU's name-only setting against fitting the benchmark's own questions (issue 39 item 2):
does what the model writes about a target, given only its name, make a forget set that
forgets the target's facts?

    python bench/name_only.py --subjects the-solar-system,world-war-ii,the-human-body --threads 1 \
        --json name_only.json
    python bench/name_only.py --model assets/demo-full --subjects the-solar-system --passages 2 \
        --questions 2 --neighbours 1 --variants standard,questions     # a check in a minute

Per target: the model writes (`grom.tasks.name_only.write_name_only`, seeded; the rows are
kept in the JSON, and --rows FILE reuses an earlier run's) passages and question/answer
pairs about the target and about --neighbours other targets, as --protocol says: "rwku"
(the default: RWKU's sampling, top-k 50 on the passages, the questions at the model's own
generation config, every question kept) or "project" (this project's earlier writing,
issue 39's table: no top-k, the questions sampled as the passages, filtered and deduplicated).
Then GROM (--preset, the studio's edit on SmolLM2) runs on each variant of the forget and
retain sets:

    standard          the benchmark's own fitted questions and retain pairs (the usual split)
    passages          the model's passages (RWKU's GA/NPO forget corpus); retain: written
    questions         the model's questions and answers about the target; retain: written
    both              questions and passages; retain: written
    questions+bundled the model's questions; retain: the benchmark's own retain pairs
    questions@wr=X    the model's questions, w_r = X (specificity against the neighbours)
    questions@band=A-B the model's questions on layers A..B
    questions@short   the model's questions, each answer cut to its first sentence

and each edit is evaluated as the studio evaluates (answers stage, the known facts only):
"Probe fact recall" on the held-out half of the target's bundled questions (never fitted
in any variant: the fair comparison), "Forget fact recall" on the other half (fitted by
"standard" only), "Kept fact recall", "Forget degenerate" (broken text is no forgetting),
the Knowledge score and the retain cost. A markdown table per target on stdout.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom import PRESETS, run_edit  # noqa: E402
from grom.eval.report import evaluate  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.tasks.knowledge import load_knowledge  # noqa: E402
from grom.tasks.name_only import (  # noqa: E402
    PROTOCOLS,
    from_records,
    name_only_benchmark,
    to_records,
    write_name_only,
    writing_config,
)

METRICS = ("Probe fact recall", "Forget fact recall", "Kept fact recall", "Forget degenerate", "Probe degenerate",
           "Knowledge score", "Retain cost")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def variant_split(spec: str) -> tuple[str, dict]:
    """"questions@wr=10" -> ("questions", {"w_r": 10.0}); "questions@band=20-24" ->
    ("questions", {"band": (20, 24)}); "questions@short": the answers' first sentences;
    modifiers combine: "questions@short@wr=10"."""
    name, *mods = spec.split("@")
    change: dict = {}
    for mod in mods:
        key, _, value = mod.partition("=")
        if mod == "short":
            change["answers"] = "first_sentence"
        elif key in ("wr", "beta"):
            change[{"wr": "w_r", "beta": "beta"}[key]] = float(value)
        elif key == "band":
            lo, _, hi = value.partition("-")
            change["band"] = (int(lo), int(hi))
        else:
            raise SystemExit(f"--variants: {spec!r}: after '@' use short, wr=X, beta=X or band=A-B")
    return name, change


def benchmark_of(name: str, target: str, rows, args, answers: str = "whole"):
    known = dict(known_only=args.known_only)
    if name == "standard":
        return load_knowledge(target, **known)
    use, _, retain = name.partition("+")
    return name_only_benchmark(target, rows, use=use, retain=retain or "written", answers=answers, **known)


def run_target(args, model, tok, target: str, written: dict) -> dict:
    if target in written:
        rows = from_records(written[target])
        _log(f"{target}: {len(rows)} written rows reused")
        seconds = None
    else:
        t0 = time.perf_counter()
        rows = write_name_only(model, tok, target, args.writing, progress=_log)
        seconds = time.perf_counter() - t0
        _log(f"{target}: wrote {len(rows)} rows in {seconds:.0f} s")
    out = {"target": target, "write_seconds": seconds, "rows": to_records(rows), "variants": {},
           "counts": {f"{r}/{k}": sum(x.side == r and x.kind == k for x in rows)
                      for r in ("forget", "retain") for k in ("passage", "qa")}}
    out["coverage"] = coverage(target, rows, args)
    _log(f"{target}: the written forget text states {out['coverage']}")
    base = None
    for spec in args.variants:
        name, change = variant_split(spec)
        bench = benchmark_of(name, target, rows, args, change.pop("answers", "whole"))
        band = change.pop("band", None)
        config = PRESETS[args.preset].replace(prompt_format=bench.prompt_format, seed=args.seed, **change,
                                              **({"layers": tuple(range(band[0], band[1] + 1))} if band else {}))
        t0 = time.perf_counter()
        edit = run_edit(model, tok, bench.forget, bench.retain, config)
        secs = time.perf_counter() - t0
        report = evaluate(model, tok, bench, edit, stage="answers", reuse=base)
        base = report
        table = report.table()
        pick = lambda row: {k: float(table.loc[row, k]) for k in METRICS  # noqa: E731
                            if k in table.columns and not math.isnan(table.loc[row, k])}
        out.setdefault("base", pick("Base"))
        got = pick("Edited")
        out["variants"][spec] = {"metrics": got, "edit_seconds": secs, "band": list(edit.band),
                                 "n_forget": len(bench.forget), "n_retain": len(bench.retain)}
        _log(f"{target}: {spec}: band {list(edit.band)}, {len(bench.forget)} forget, {len(bench.retain)} retain, "
             + ", ".join(f"{k} {v:.3f}" for k, v in got.items()))
    return out


def coverage(target: str, rows, args) -> dict:
    """How many of the target's scored facts (each half, the known ones with --known-only)
    the written forget text states anywhere (`grom.text.contains_phrase`): in the model's
    answers, in its questions, in its passages. A fact it never writes, an edit fitted on
    its writing can only forget by spilling over from what it does write."""
    from grom.text import contains_phrase

    bench = load_knowledge(target, known_only=args.known_only)
    forget = [r for r in rows if r.side == "forget"]
    texts = {"answers": [r.text for r in forget if r.kind == "qa"],
             "questions": [r.prompt for r in forget if r.kind == "qa"],
             "passages": [r.text for r in forget if r.kind == "passage"]}
    out = {}
    for half in ("forget", "probes"):
        facts = [ex.fact for ex in bench.eval_sets[half] if ex.fact]
        out[half] = {"facts": len(facts), **{k: sum(any(contains_phrase(t, f) for t in v) for f in facts)
                                              for k, v in texts.items()},
                     "anywhere": sum(any(contains_phrase(t, f) for v in texts.values() for t in v) for f in facts)}
    return out


def table(res: dict) -> str:
    heads = ["variant", "forget / retain examples", "band", *METRICS, "edit s"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    cell = lambda d, k: f"{d[k]:.2f}" if k in d else "-"  # noqa: E731
    lines.append("| unedited | - | - | " + " | ".join(cell(res["base"], k) for k in METRICS) + " | - |")
    for spec, v in res["variants"].items():
        band = v["band"]
        lines.append(f"| {spec} | {v['n_forget']} / {v['n_retain']} | {band[0]}-{band[-1]} | "
                     + " | ".join(cell(v["metrics"], k) for k in METRICS) + f" | {v['edit_seconds']:.0f} |")
    c = res["counts"]
    said = "; ".join(f"of the {v['facts']} {'fitted-half' if k == 'forget' else 'probe'} facts it states "
                     f"{v['anywhere']} (answers {v['answers']}, questions {v['questions']}, passages {v['passages']})"
                     for k, v in res.get("coverage", {}).items())
    return (f"\n### {res['target']}: written {c['forget/qa']} question/answer pairs and {c['forget/passage']} "
            f"passages about it, {c['retain/qa']} pairs and {c['retain/passage']} passages about its neighbours"
            + (f" ({res['write_seconds']:.0f} s)" if res["write_seconds"] else "")
            + (f"; {said}" if said else "") + "\n\n" + "\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--subjects", "--targets", dest="subjects", default="the-solar-system")
    ap.add_argument("--variants", default="standard,passages,questions,both,questions+bundled")
    ap.add_argument("--protocol", choices=tuple(PROTOCOLS), default="rwku",
                    help="how the model writes: RWKU's sampling and every question kept (rwku), or this "
                         "project's earlier writing (project)")
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--passages", type=int, default=32)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--neighbours", type=int, default=3)
    ap.add_argument("--neighbour-passages", type=int, default=8)
    ap.add_argument("--neighbour-questions", type=int, default=16)
    ap.add_argument("--all-facts", dest="known_only", action="store_false",
                    help="score every bundled question, not only those the unedited model answers")
    ap.add_argument("--rows", default=None, help="an earlier run's --json: reuse what the model wrote there")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.preset not in PRESETS:
        raise SystemExit(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        variant_split(v)
    args.writing = writing_config(args.protocol, passages=args.passages, questions=args.questions,
                                  neighbours=args.neighbours, neighbour_passages=args.neighbour_passages,
                                  neighbour_questions=args.neighbour_questions, seed=args.seed)
    written = {}
    if args.rows:
        written = {r["target"]: r["rows"] for r in json.loads(Path(args.rows).read_text())["targets"]}
    load = os.getloadavg()
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch "
               f"{torch.__version__}, {datetime.date.today()}, load {load[0]:.1f} at start")
    print(f"# {machine}\n# python bench/name_only.py " + " ".join(sys.argv[1:] if argv is None else argv))
    model, tok = load_model(args.model)
    results = []
    for target in [t.strip() for t in args.subjects.split(",") if t.strip()]:
        results.append(run_target(args, model, tok, target, written))
        print(table(results[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": machine, "protocol": args.protocol,
                                                   "writing": dataclasses.asdict(args.writing),
                                                   "preset": args.preset, "targets": results}, indent=1))


if __name__ == "__main__":
    main()
