"""The four locate-then-edit editors beside GROM on SmolLM2 real-knowledge (issue 25 item 5).

    OMP_NUM_THREADS=1 nice -n 19 python bench/bench_editors.py --threads 1 --known-only \\
        --retain-examples 128 --max-examples 0 --values 25:0.1:0.75,25:0.5:1.5

One run: the studio's split (`bench_knowledge.Run`: --known-only, the app's seeded 128
retain examples), GROM's --preset edit, then each editor of --editors at each value
setting of --values (steps:lr:clamp_norm_factor, the shared per-fact value optimisation,
grom.methods.editors.value_optimisation), each band of --layers ("auto": GROM's automatic band; ROME
edits the band's last layer) and each of --settings (';'-separated sets of EditorConfig
fields, e.g. "w_r=1500;null_threshold=1e-3,l2=1": the editors' own knobs); every other
setting the editor's default, `EditorConfig`. Each editor run is timed alone (its own layer scores and value
optimisation: nothing shared with an earlier row), and evaluated as GROM's row is
(`grom.eval.evaluate`, task "knowledge"). Prints one markdown table; the machine's load
average at the start and the end of the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_knowledge import COLUMNS, Run, cells, log, md_table  # noqa: E402

from grom import PRESETS  # noqa: E402
from grom.methods.editors.locate_then_edit import EDITORS, EditorConfig, run_editor  # noqa: E402
from grom.methods.editors.value_optimisation import ValueSettings  # noqa: E402


def value_settings(spec: str) -> list[ValueSettings]:
    """"25:0.1:0.75,50:0.5:1.5" -> ValueSettings per steps:lr:clamp_norm_factor."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        steps, lr, clamp = part.split(":")
        out.append(ValueSettings(steps=int(steps), lr=float(lr), clamp_norm_factor=float(clamp)))
    return out


NUMERIC = {f.name: (int if f.type in ("int", int) else float) for f in dataclasses.fields(EditorConfig)
           if f.type in ("float", "int", float, int)}


def editor_settings(spec: str) -> list[dict]:
    """"w_r=1500;null_threshold=1e-3,l2=1" -> [{"w_r": 1500.0}, {"null_threshold": 0.001, "l2": 1.0}];
    "" -> [{}] (the defaults). An unknown field fails here, before the model loads."""
    out = []
    for group in (g.strip() for g in spec.split(";")):
        kv = {}
        for pair in filter(None, (p.strip() for p in group.split(","))):
            key, _, value = pair.partition("=")
            if key.strip() not in NUMERIC:
                raise SystemExit(f"--settings: {key.strip()!r} is not a numeric EditorConfig field; use "
                                 + ", ".join(NUMERIC))
            kv[key.strip()] = NUMERIC[key.strip()](float(value))
        out.append(kv)
    return out or [{}]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--splits", default="the-solar-system")
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--editors", default=",".join(EDITORS))
    ap.add_argument("--values", default="25:0.1:0.75", help="steps:lr:clamp settings, comma-separated")
    ap.add_argument("--layers", default="auto", help="bands, ';'-separated: 'auto' (GROM's) or e.g. '4,5,6,7,8'")
    ap.add_argument("--w-r", type=float, default=None, help="the editors' retain weight (default: EditorConfig's)")
    ap.add_argument("--settings", default="", help="';'-separated EditorConfig overrides, e.g. 'w_r=1500;eps=0.1'")
    ap.add_argument("--max-examples", type=int, default=0, help="per evaluation set; 0: all of them")
    ap.add_argument("--known-only", action="store_true")
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    args.max_examples = args.max_examples or None
    grid = editor_settings(args.settings)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {torch.get_num_threads()} threads, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
          f"load {os.getloadavg()[0]:.1f} at start")
    print("# " + " ".join(["python", "bench/bench_editors.py", *(sys.argv[1:] if argv is None else argv)]))
    run = Run(args, args.splits.split(",")[0])
    fmt = run.bench.prompt_format
    edit, secs = run.edit(PRESETS[args.preset].replace(prompt_format=fmt, seed=args.seed))
    rows = [[f"GROM {args.preset}", "-", f"{edit.band[0]}-{edit.band[-1]}", f"{secs:.1f}", "1.0",
             *cells(run.report(edit))]]
    log("row: " + " | ".join(rows[-1]))
    grom_s = secs
    bands = [None if b.strip() == "auto" else tuple(int(x) for x in b.split(",")) for b in args.layers.split(";")]
    for band, vs, over in ((b, v, o) for b in bands for v in value_settings(args.values) for o in grid):
        for name in filter(None, (e.strip() for e in args.editors.split(","))):
            config = EditorConfig(layers=band, values=vs, prompt_format=fmt, seed=args.seed)
            config = dataclasses.replace(config, w_r=args.w_r) if args.w_r else config
            config = dataclasses.replace(config, **over)
            t0 = time.perf_counter()
            e = run_editor(name, run.model, run.tok, run.bench.forget, run.bench.retain, config)
            secs = time.perf_counter() - t0
            layers = f"{e.band[0]}-{e.band[-1]}" if len(e.band) > 1 else str(e.band[0])
            t = e.timings
            label = EDITORS[name].label + "".join(f" {k} {v:g}" for k, v in over.items())
            rows.append([label, f"{vs.steps}:{vs.lr:g}:{vs.clamp_norm_factor:g}", layers, f"{secs:.1f}",
                         f"{secs / grom_s:.1f}", *cells(run.report(e))])
            log("row: " + " | ".join(rows[-1]) + f" (values {t['values']:.1f} s, keys {t['keys']:.1f} s, "
                 f"solve {t['solve']:.1f} s, value steps {e.info['value_steps']})")
    print(f"\n### GROM and the editors ({run.bench.split}; load {os.getloadavg()[0]:.1f} at the end)\n")
    print(md_table(["method", "values steps:lr:clamp", "layers", "edit s", "x GROM", *COLUMNS, "retain"], rows))


if __name__ == "__main__":
    main()
