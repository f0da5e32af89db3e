"""Is it really gone? GROM, the gradient baselines and the editors through every attack,
per target (issue 24 item 8, issue 25 item 5): SmolLM2-135M-Instruct on the real-knowledge
benchmark.

    python bench/bench_attack_targets.py --subjects the-solar-system,world-war-ii,the-human-body \
        --methods grom,npo,simnpo --attacks all --threads 1 --json attacks.json
    python bench/bench_attack_targets.py --methods grom,grom:refusal --key-positions prompt \
        --attacks heldout,paraphrase,multi_hop,alias --evaluate      # GROM's keys in the prompt
    python bench/bench_attack_targets.py --model assets/demo-full --preset demo \
        --custom probes.jsonl --methods grom,npo --attacks heldout,quant8   # a check in seconds

For each target: the benchmark split as the studio loads it on SmolLM2 (the known facts
only, `known_only`; the app's seeded sample of 128 retain examples), GROM with `--preset`
(the studio's edit), each baseline of `--methods` at its SmolLM2 starting point
(`grom.methods.starting_point`: lr and epochs; the benchmark's recipe for the rest,
`recipe_for_task`) or at the lr a spec gives ("rmu@1e-3": a grid's pick; --epochs N for
the epochs the grid ran: a method with no SmolLM2 starting point otherwise trains the
recipe's 10), each editor (rome, memit, alphaedit, zerounlearn) as the studio's
Compare runs it (its defaults, on `grom.methods.editors.locate_then_edit.editor_band` of the
target's GROM band: layers 4-8 where GROM's ends at the top layer), LUNAR ("lunar":
upstream's AdamW fit at its defaults, "lunar@LR" at another lr; "lunar-cf": the same
objective solved in closed form; grom.methods.lunar, at its own layer), then
`grom.robustness.run_attacks` on each edit exactly as the "Is it gone?" panel calls it
(components/attack_panel.compute_attacks): the held-out probes (eval_sets["probes"], never
fitted), fitted = the edit's forget questions, holdout = the other targets' held-out answers
(`holdout_of`). Every attack at its default size.

Recorded: each attack's base and edited value (recall; AUC for mia) and seconds, and
each method's own edit/training time. A markdown table per target on stdout (rows =
attacks, columns = base / each method, then the seconds), the whole as JSON with --json.
--tables A.json B.json: the tables of runs made apart (e.g. GROM in one, the baselines in
another), side by side per target. --custom FILE: an uploaded-style benchmark (rows with
split forget / retain / probe) in
place of the real-knowledge targets (the demo model has no probes of its own).
--calibrate-relearn 3e-6,1e-5,2e-5: per target, before the methods, the relearning attack's
lr measured on the unedited model (`grom.robustness.calibration.calibrate_relearn_lr`: the
largest lr that keeps its held-out recall within 0.10 at the suite's steps), printed as a
table and kept in the JSON; the suite itself runs at `relearn_lr(model)`. --relearn-grid:
every edit also relearned at each of those lrs (rows "relearn@LR", their base the unedited
model's curve at that lr), and "relearn, best": the attacker's best lr and step count.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom import PRESETS, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.data.encoding import KEY_POSITIONS  # noqa: E402
from grom.eval.report import evaluate  # noqa: E402
from grom.methods import get_method, recipe_for_task, run_baseline, starting_point  # noqa: E402
from grom.methods.editors.locate_then_edit import EDITORS, EditorConfig, editor_band, run_editor  # noqa: E402
from grom.methods.lunar import LunarConfig, run_lunar  # noqa: E402
from grom.model.arch import num_layers  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.robustness import attack_names, probe_recall, probes_from_examples, run_attacks  # noqa: E402
from grom.robustness.calibration import RELEARN_STEPS, calibrate_relearn_lr, relearn_lr  # noqa: E402
from grom.robustness.membership import holdout_of  # noqa: E402
from grom.robustness.suite import AUC_ATTACKS  # noqa: E402
from grom.robustness.weights import relearn_curve  # noqa: E402
from grom.tasks import get_task  # noqa: E402
from grom.tasks.knowledge import FORGET3  # noqa: E402

GROM = "grom"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def md_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def load_split(args, target: str):
    """The benchmark of one target (or of the --custom file), its retain set cut to the
    app's seeded sample (components.server.validate.retain_subset)."""
    if args.custom:
        bench = load_benchmark("custom", "forget", source=args.custom)
    else:
        bench = load_benchmark("real-knowledge", target, known_only=args.known_only)
    if args.retain_examples and len(bench.retain) > args.retain_examples:
        retain = tuple(random.Random(args.seed).sample(bench.retain, args.retain_examples))
        bench = dataclasses.replace(bench, retain=retain)
    return bench


def _grom_config(args, bench):
    return PRESETS[args.preset].replace(prompt_format=bench.prompt_format, seed=args.seed, **args.override)


def make_edit(method: str, model, tok, bench, args) -> tuple[object, float, dict]:
    """(edit, seconds, settings) of one method on `bench`: GROM with the preset (or its
    refusal target, "grom:refusal"), a baseline at its starting point for this model."""
    t0 = time.perf_counter()
    if method in (GROM, GROM_REFUSAL):
        target = {"target": "refusal"} if method == GROM_REFUSAL else {}
        edit = run_edit(model, tok, bench.forget, bench.retain, _grom_config(args, bench).replace(**target))
        if method == GROM:
            args.grom_band = edit.band
        return edit, time.perf_counter() - t0, {"preset": args.preset, **args.override, **target,
                                                "band": list(edit.band)}
    if method in EDITORS:  # the studio's Compare run: its defaults on `editor_band` of GROM's band
        if args.grom_band is None:
            args.grom_band = run_edit(model, tok, bench.forget, bench.retain, _grom_config(args, bench)).band
        band = editor_band(args.grom_band, num_layers(model))
        edit = run_editor(method, model, tok, bench.forget, bench.retain,
                          EditorConfig(layers=band, prompt_format=bench.prompt_format, seed=args.seed))
        return edit, time.perf_counter() - t0, {"layers": list(band), "grom_band": list(args.grom_band)}
    name, lr = method_spec(method)
    if name in LUNAR_SOLVERS:  # upstream's fit (or its closed form) at its own layer, its defaults
        solver, prompts = LUNAR_SOLVERS[name]
        config = LunarConfig(solver=solver, prompts=prompts, prompt_format=bench.prompt_format, seed=args.seed,
                             **({} if lr is None else {"lr": lr}),
                             **({"rho": args.lunar_rho} if args.lunar_rho else {}))
        edit = run_lunar(model, tok, bench.forget, bench.retain, config)
        return edit, time.perf_counter() - t0, {"solver": config.solver, "prompts": config.prompts, "lr": config.lr,
                                                "epochs": config.epochs, "layer": edit.info["layer"],
                                                "coeff": config.coeff, "rho": config.rho}
    recipe = recipe_for_task(bench.task).name
    point = starting_point(args.model, name, recipe)
    lr = point.lr if lr is None else lr
    epochs = point.epochs if args.epochs is None else args.epochs
    edit = run_baseline(name, model, tok, bench.forget, bench.retain, recipe=recipe, epochs=epochs,
                        lr=lr, seed=args.seed, prompt_format=bench.prompt_format)
    return edit, time.perf_counter() - t0, {"recipe": recipe, "lr": lr, "epochs": epochs}


GROM_REFUSAL = "grom:refusal"  # GROM's refusal target (the preset otherwise)
# name -> (solver, the direction's prompts): "-u" takes the prompts the model cannot verify
LUNAR_SOLVERS = {"lunar": ("adamw", "harmful"), "lunar-cf": ("closed-form", "harmful"),
                 "lunar-u": ("adamw", "unverifiable"), "lunar-cf-u": ("closed-form", "unverifiable")}
LUNAR_LABELS = {"lunar": "LUNAR", "lunar-cf": "LUNAR (closed form)", "lunar-u": "LUNAR (unverifiable prompts)",
                "lunar-cf-u": "LUNAR (closed form, unverifiable prompts)"}


def method_spec(spec: str) -> tuple[str, float | None]:
    """"rmu@1e-3" -> ("rmu", 0.001); "npo" -> ("npo", None): the starting point's lr."""
    name, _, at = spec.partition("@")
    if not at:
        return name, None
    try:
        lr = float(at)
    except ValueError:
        raise SystemExit(f"--methods: {spec!r}: the lr after '@' must be a number, e.g. rmu@1e-3") from None
    if not 0 < lr < 1:
        raise SystemExit(f"--methods: {spec!r}: the lr must be in (0, 1)")
    return name, lr


def run_target(args, model, tok, target: str) -> dict:
    bench = load_split(args, target)
    held = [ex for ex in bench.eval_sets.get("probes", ()) if getattr(ex, "fact", None)]
    if not held:
        raise SystemExit(f"{bench.name}/{bench.split} has no held-out probes with a fact")
    probes = probes_from_examples(held)
    fitted = tuple(bench.forget)
    holdout = holdout_of(bench.eval_sets, bench.retain)
    _log(f"{target}: {len(fitted)} fitted, {len(probes)} probes, {len(bench.retain)} retain, "
         f"{len(holdout)} holdout")
    out = {"target": target, "n_fitted": len(fitted), "n_probes": len(probes), "n_retain": len(bench.retain),
           "n_holdout": len(holdout), "methods": {}}
    if args.calibrate_relearn:
        out["relearn_calibration"] = calibration(args, model, tok, bench, probes, target)
    reference = None
    if args.reference:
        reference, _ = load_model(args.reference, device="cpu", dtype="float32")
    args.grom_band = None  # the target's GROM band, which places the editors (`editor_band`)
    args.base_report = None  # --evaluate: the target's Base row, computed once
    for method in args.methods:
        _log(f"{target}: {method}: edit")
        edit, secs, settings = make_edit(method, model, tok, bench, args)
        _log(f"{target}: {method}: edit {secs:.1f} s; attacks")
        t0 = time.perf_counter()
        results = run_attacks(model, tok, edit, probes, fitted=fitted, holdout=holdout, attacks=args.attacks,
                              fmt=bench.prompt_format, reference=reference)
        attacks = {k: {**r.to_dict(), "edited_answers": list(r.edited_answers), "base_answers": list(r.base_answers)}
                   for k, r in results.items()}
        if args.relearn_grid:
            attacks |= relearn_grid(args, model, tok, bench, probes, edit, out["relearn_calibration"])
        suite = time.perf_counter() - t0
        out["methods"][method] = {"edit_seconds": secs, "suite_seconds": suite, "settings": settings,
                                  "attacks": attacks}
        if args.evaluate:
            out["methods"][method]["evaluation"] = evaluation(args, model, tok, bench, edit, out)
        _log(f"{target}: {method}: suite {suite:.1f} s: " + ", ".join(
            f"{k} {r.base:.2f}->{r.edited:.2f}" for k, r in results.items()))
        del edit
        if args.json:  # each method as it comes: a long run can be read early
            _save(args, out)
    return out


EVAL_METRICS = ("Forget fact recall", "Kept fact recall", "Retain fact recall", "Forget refusal",
                "Forget fluent other", "Forget degenerate", "Knowledge score", "Retain cost")


def evaluation(args, model, tok, bench, edit, out: dict) -> dict:
    """--evaluate: the studio's evaluation of the split, answers stage (greedy answers: fact
    recall of the forget and kept facts, the answer classes, the Knowledge score and the
    retain cost), Base once per target (kept in `out`) and Edited per method."""
    t0 = time.perf_counter()
    stage = "answers" if "answers" in get_task(bench.task).stages else "full"  # a custom file: every metric
    report = evaluate(model, tok, bench, edit, stage=stage, reuse=args.base_report)
    args.base_report = report
    rows = report.table()
    pick = lambda row: {k: float(v) for k, v in rows.loc[row].items()  # noqa: E731
                        if isinstance(v, (int, float)) and not math.isnan(v)}
    out.setdefault("base_evaluation", pick("Base"))
    got = pick("Edited") | {"seconds": time.perf_counter() - t0}
    _log("evaluation: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items() if k in EVAL_METRICS))
    return got


def calibration(args, model, tok, bench, probes, target: str) -> dict:
    """The relearning lr on the unedited model (--calibrate-relearn's lrs), as the suite
    relearns: the fitted questions, the held-out probes' recall, RELEARN_STEPS."""
    lrs = [float(x) for x in args.calibrate_relearn.split(",")]
    _log(f"{target}: calibrating the relearning lr over {lrs}")
    cal = calibrate_relearn_lr(model, tok, tuple(bench.forget),
                               lambda m: probe_recall(m, tok, probes, fmt=bench.prompt_format), lrs,
                               steps=RELEARN_STEPS, fmt=bench.prompt_format, seed=args.seed)
    print(f"\n### {target}: the relearning lr, the unedited model relearned on {len(bench.forget)} fitted "
          f"questions (tolerance {cal.tolerance:g}, {cal.seconds:.0f} s; the suite runs at "
          f"{relearn_lr(model).lr:g})\n\n" + md_table(["lr", *(f"step {s}" for s in cal.steps), "damage", ""],
                                                       cal.rows()), flush=True)
    return {"picked": cal.lr, "start": cal.start, "steps": list(cal.steps), "tolerance": cal.tolerance,
            "curves": {f"{lr:g}": list(c) for lr, c in cal.curves.items()}, "seconds": cal.seconds}


def relearn_grid(args, model, tok, bench, probes, edit, cal: dict) -> dict:
    """The edit relearned at each calibrated lr as the suite relearns ("relearn@LR": recall
    after the last step; base: the calibration's unedited curve at that lr, the control),
    and "relearn, best": the attacker's pick, the highest recall over every lr and step
    count after 0, beside the control at the same lr and step."""
    score = lambda m: probe_recall(m, tok, probes, fmt=bench.prompt_format)  # noqa: E731
    out, best = {}, None
    for key, control in cal["curves"].items():
        t0 = time.perf_counter()
        curve, _ = relearn_curve(model, tok, edit, tuple(bench.forget), score, cal["steps"], lr=float(key),
                                 fmt=bench.prompt_format, seed=args.seed)
        recall = [r.value for r in curve]
        out[f"relearn@{key}"] = {"name": f"relearn@{key}", "base": control[-1], "edited": recall[-1],
                                 "seconds": time.perf_counter() - t0, "n": len(probes), "steps": cal["steps"],
                                 "recall": recall, "base_recall": control, "lr": float(key),
                                 "edited_answers": list(curve[-1].answers), "base_answers": []}
        for i in range(1, len(recall)):
            if best is None or recall[i] > best["edited"]:
                best = {"name": "relearn, best", "base": control[i], "edited": recall[i], "seconds": 0.0,
                        "n": len(probes), "lr": float(key), "step": cal["steps"][i]}
    return out | ({"relearn, best": best} if best else {})


def _label(method: str) -> str:
    if method in (GROM, GROM_REFUSAL) or method in EDITORS:
        return {GROM: "GROM", GROM_REFUSAL: "GROM (refusal target)"}.get(method) or EDITORS[method].label
    name, lr = method_spec(method)
    if name in LUNAR_SOLVERS:
        return LUNAR_LABELS[name] + ("" if lr is None else f" {lr:g}")
    return get_method(name).label + ("" if lr is None else f" {lr:g}")


def _cell(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def target_table(res: dict) -> str:
    methods = list(res["methods"])
    first = res["methods"][methods[0]]["attacks"]
    rows = []
    for name in first:
        row = [name + (" (AUC)" if name in AUC_ATTACKS else ""), _cell(first[name]["base"])]
        got = [res["methods"][m]["attacks"].get(name) for m in methods]  # a method run on fewer attacks: "-"
        row += [_cell(g["edited"]) if g else "-" for g in got]
        row += [f"{g['seconds']:.0f}" if g else "-" for g in got]
        rows.append(row)
    for k in EVAL_METRICS:  # --evaluate: the studio's evaluation, base and each edit
        got = [res["methods"][m].get("evaluation", {}).get(k) for m in methods]
        if any(g is not None for g in got):
            rows.append([k, _cell(res.get("base_evaluation", {}).get(k)), *(_cell(g) for g in got)]
                        + [""] * len(methods))
    times = [["edit / training s", ""] + [f"{res['methods'][m]['edit_seconds']:.0f}" for m in methods]
             + [""] * len(methods),
             ["whole suite s", ""] + [""] * len(methods)
             + [f"{res['methods'][m]['suite_seconds']:.0f}" for m in methods]]
    heads = ["attack", "base", *(_label(m) for m in methods),
             *(f"{m} s" for m in methods)]
    return (f"\n### {res['target']}: {res['n_fitted']} fitted, {res['n_probes']} held-out probes, "
            f"{res['n_holdout']} holdout answers\n\n" + md_table(heads, rows + times))


def merged(paths) -> list[dict]:
    """The targets of several --json files, each target's methods from every file that ran
    it (a later file's method replaces an earlier one's), in the order first seen."""
    out: dict[str, dict] = {}
    for path in paths:
        for res in json.loads(Path(path).read_text())["results"]:
            have = out.setdefault(res["target"], {**res, "methods": {}})
            have["methods"].update(res["methods"])
    for res in out.values():  # GROM first, then the baselines
        res["methods"] = dict(sorted(res["methods"].items(), key=lambda kv: kv[0] != GROM))
    return list(out.values())


def _save(args, current: dict) -> None:
    done = [r for r in args.results if r["target"] != current["target"]] + [current]
    Path(args.json).write_text(json.dumps({"machine": args.machine, "results": done}, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--subjects", "--targets", dest="subjects", default=",".join(FORGET3))
    ap.add_argument("--methods", default="grom,npo,simnpo")
    ap.add_argument("--attacks", default="all")
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--set", default="", help="the preset's settings changed, e.g. beta=100,k=8")
    ap.add_argument("--key-positions", choices=tuple(KEY_POSITIONS), default=None,
                    help="where GROM's forget keys are (grom.data.encoding.KEY_POSITIONS; default the preset's, "
                         "the answer tokens), the retain keys to match")
    ap.add_argument("--custom", default=None, help="a file with split forget/retain/probe rows, instead of targets")
    ap.add_argument("--retain-examples", type=int, default=128, help="the app's seeded retain sample (0: all)")
    ap.add_argument("--all-facts", dest="known_only", action="store_false",
                    help="every fact, not only those SmolLM2 was probed to know (the studio's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--epochs", type=float, default=None,
                    help="every trained method's epochs (default: its starting point's, else the recipe's 10): "
                         "give the epochs its grid was run at, or the attacks meet another model than the pick")
    ap.add_argument("--calibrate-relearn", default="", metavar="LRS",
                    help="per target, the relearning lr measured on the unedited model over these lrs")
    ap.add_argument("--relearn-grid", action="store_true",
                    help="also relearn every edit at each --calibrate-relearn lr, and report the attacker's best")
    ap.add_argument("--lunar-rho", type=float, default=None,
                    help="the ridge of LUNAR's closed form (lunar-cf), relative as GROM's rho (default: LunarConfig's)")
    ap.add_argument("--evaluate", action="store_true",
                    help="also the studio's evaluation of each edit (answers stage): forget and kept fact recall, "
                         "refusals, degenerate answers, Knowledge score, retain cost")
    ap.add_argument("--reference", default=None,
                    help="a retain model (never trained on the forget set): the depth attack reports UDS against it")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tables", nargs="+", default=None, metavar="JSON",
                    help="no run: the tables of earlier --json files, their methods side by side per target")
    args = ap.parse_args(argv)
    if args.tables:
        for res in merged(args.tables):
            print(target_table(res))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.override = {k.strip(): (int(v) if k.strip() == "k" else float(v))
                     for k, v in (p.split("=") for p in args.set.split(",") if p.strip())}
    if args.key_positions:
        args.override.update(zip(("key_mode", "retain_key_mode"), KEY_POSITIONS[args.key_positions]))
    args.methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    for m in args.methods:
        if m not in (GROM, GROM_REFUSAL) and m not in EDITORS and method_spec(m)[0] not in LUNAR_SOLVERS:
            get_method(method_spec(m)[0])  # an unknown method or a bad lr fails here, before the model loads
    attack_names(args.attacks)
    if args.relearn_grid and not args.calibrate_relearn:
        raise SystemExit("--relearn-grid relearns at the --calibrate-relearn lrs: give them")
    if args.preset not in PRESETS:
        raise SystemExit(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
    targets = ["custom"] if args.custom else [t.strip() for t in args.subjects.split(",") if t.strip()]
    load = os.getloadavg()
    args.machine = (f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch "
                    f"{torch.__version__}, {datetime.date.today()}, load {load[0]:.1f} at start")
    print(f"# {args.machine}\n# " + " ".join(["python", "bench/bench_attack_targets.py",
                                             *(sys.argv[1:] if argv is None else argv)]))
    model, tok = load_model(args.model)
    args.results = []
    for target in targets:
        res = run_target(args, model, tok, target)
        res["load_at_end"] = os.getloadavg()[0]
        args.results.append(res)
        if args.json:
            _save(args, res)
        print(target_table(res), flush=True)


if __name__ == "__main__":
    main()
