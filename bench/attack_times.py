"""Each attack of the "Is it gone?" panel: the seconds it shows before a run (the estimate,
`components.attack_panel.attack_estimates`) against the seconds the attack took, run as
the panel runs it (`attack_once`, one attack at a time, on GROM's edit).

    python bench/attack_times.py                                   # the demo model
    python bench/attack_times.py --model smollm2-135m-instruct --json smol.json
    python bench/attack_times.py --model smollm2-135m-instruct --measured smol.json
    python bench/attack_times.py --model smollm2-135m-instruct --suite --json suite.json
    python bench/attack_times.py --model smollm2-135m-instruct --spread 4 --busy 1

Demo: the bundled demo model (one thread, as the studio runs it on a CPU) on an upload of
demo/forget01 with held-out probe rows (16 forget, 8 probe, 24 retain rows, as
tests/test_app_attacks.py makes it), the `demo` preset. SmolLM2-135M-Instruct (torch's
threads): the real-knowledge benchmark's default split as the studio loads it for that
model (its known facts; the app's seeded sample of 128 retain examples), the `smollm2`
preset. `--measured FILE` prints the table again from a run saved with `--json`, with the
estimate as it is now, running nothing but the tokenizer (SmolLM2's suite is minutes of
CPU). Also counted per attack: the model's forward passes, estimated and seen (a hook on
its first layer; a training step's backward not counted), which says whether a wrong
estimate is the work or its price; and the load average when each attack started.
`--suite`: the attacks in one `run_attacks` call, as `python -m grom attack` runs them (the
suite shares what two attacks both compute: relearning starts from the held-out probes'
recall; the probe attacks answer their questions in one run a side), each attack's seconds the
suite's own (the probe attacks share that run's time by their questions), its CPU seconds and
passes from one "attack i/n" progress call to the next (the shared run counted in the first's).
`--spread N`: nothing run; the model calibrated N times and each calibration's total
estimate printed (with `--busy`, spinning processes from before the first calibration).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def demo_upload(folder: Path) -> Path:
    """demo/forget01 as an upload with probe rows (tests/test_app_attacks.py's)."""
    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    row = lambda ex, split: {"question": ex.question, "answer": ex.answer, "fact": ex.fact,  # noqa: E731
                             "paraphrased_question": ex.paraphrased_question, "split": split}
    rows = [row(ex, "forget") for ex in demo.forget[:16]] + [row(ex, "probe") for ex in demo.forget[16:24]]
    rows += [row(ex, "retain") for ex in demo.retain[:24]]
    path = folder / "probes.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def setup(model: str):
    """(handle, benchmark, preset) as the studio has them after loading both, the model
    calibrated as the server's warm-up calibrates its start model (an estimate that found
    none would calibrate in the background, beside this bench's runs, which take no
    device lock)."""
    from components.server import pace
    from components.server.model_choices import ensure_model, model_key
    from components.studio.benchmarks import default_split, read_benchmark
    from grom.closed_form.config import PRESETS
    from grom.data import load_benchmark

    handle = ensure_model(model_key(model, "cpu", "float32"))
    pace.calibrate(handle)
    if model == "demo":
        bench = load_benchmark("custom", "forget", source=str(demo_upload(Path(tempfile.mkdtemp()))))
        return handle, bench, PRESETS["demo"]
    bench = read_benchmark("real-knowledge", default_split("real-knowledge"), "", None, None, model)
    bench = dataclasses.replace(bench, retain=tuple(random.Random(0).sample(bench.retain, min(128, len(bench.retain)))))
    return handle, bench, PRESETS["smollm2"]


def counted(model):
    """A hook on the first decoder layer counting the model's forward passes (the membership
    attacks call the body without the head); returns (counts, remove)."""
    from grom.model.arch import decoder_layers

    counts = {"passes": 0}

    def hook(_module, _args):
        counts["passes"] += 1

    return counts, decoder_layers(model)[0].register_forward_pre_hook(hook).remove


def estimates(handle, bench, first: int = 0) -> tuple[dict, dict, float]:
    """({attack: seconds}, {attack: forward passes}) estimated for an edit whose first
    changed layer is `first` (as the panel estimates them once an edit is made), and the
    seconds it took."""
    from components.attack_panel import ESTIMATES, attack_estimates
    from components.server.durations import attack_work

    t0 = time.perf_counter()
    seconds = attack_estimates(handle, bench, first=first)
    took = time.perf_counter() - t0
    inputs = ESTIMATES[(handle.key, id(bench))][1]
    return seconds, {n: attack_work(inputs, n, first).passes for n in seconds}, took


def made_edit(handle, bench, preset):
    """(the edit the attacks run on, its seconds, its first changed layer)."""
    from grom import run_edit
    from grom.eval.prefix import first_changed_layer

    t0 = time.perf_counter()
    edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain, preset)
    return edit, round(time.perf_counter() - t0, 2), first_changed_layer(handle.model, edit)


def measure(handle, bench, edit, names) -> dict:
    """Each attack of `names` run as the panel runs it on `edit`, timed."""
    from components.attack_panel import attack_once

    out = {"attacks": {}}
    for name in names:
        counts, remove = counted(handle.model)
        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            result = attack_once(handle.key, bench, edit, name)[name]
        finally:
            remove()
        out["attacks"][name] = {"seconds": round(time.perf_counter() - t0, 2),
                                "cpu_seconds": round(time.process_time() - c0, 2), "n": result.n,
                                "passes": counts["passes"], "load": round(load, 2)}
        print(f"{name}: {out['attacks'][name]}", file=sys.stderr, flush=True)
    return out


def measure_suite(handle, bench, edit, names) -> dict:
    """The attacks of `names` in one `run_attacks` call (the CLI's way) on `edit`, each
    timed from one progress call to the next."""
    from components.attack_panel import probes_of
    from grom.robustness.membership import holdout_of
    from grom.robustness.suite import run_attacks

    out = {"attacks": {}}
    probes, fitted = probes_of(bench)
    marks = []  # (wall, cpu, load) at each attack's start and at the end
    counts, remove = counted(handle.model)
    passes = []

    def mark():
        marks.append((time.perf_counter(), time.process_time(), os.getloadavg()[0]))
        passes.append(counts["passes"])

    def progress(_fraction, message):
        if message.startswith("attack"):  # "attack i/n: name", "attacks done"; not the answers' count
            mark()
    mark()  # the probe attacks' questions, answered together, count towards the first attack's CPU and passes
    try:
        results = run_attacks(handle.model, handle.tokenizer, edit, probes, fitted=fitted,
                              holdout=holdout_of(bench.eval_sets, bench.retain), attacks=names,
                              fmt=bench.prompt_format, progress=progress)
    finally:
        remove()
    del marks[1], passes[1]  # the first attack's mark: its interval starts with the run
    for i, (name, result) in enumerate(results.items()):
        (_, c0, load), (_, c1, _) = marks[i], marks[i + 1]
        # wall: the suite's own seconds (the probe attacks share their run's time by their questions)
        out["attacks"][name] = {"seconds": round(result.seconds, 2), "cpu_seconds": round(c1 - c0, 2), "n": result.n,
                                "passes": passes[i + 1] - passes[i], "load": round(load, 2)}
        print(f"{name}: {out['attacks'][name]}", file=sys.stderr, flush=True)
    return out


def table(run: dict, seconds: dict, passes: dict) -> str:
    """Markdown: per attack the estimate, the wall and CPU seconds measured (CPU: the
    process's, every thread's; on one thread under load, nearer a quiet machine's wall time
    than the wall time is), their ratio, the passes and the load average."""
    lines = ["| attack | probes | estimate s | measured s | CPU s | measured / estimate | passes est. / seen | load |",
             "|---|---|---|---|---|---|---|---|"]
    total_e = total_m = total_c = 0.0
    for name, m in run["attacks"].items():
        e, cpu = seconds[name], m.get("cpu_seconds", float("nan"))
        total_e, total_m, total_c = total_e + e, total_m + m["seconds"], total_c + cpu
        ratio = f"{m['seconds'] / e:.2f}" if e > 0.05 else ""
        lines.append(f"| {name} | {m['n']} | {e:.1f} | {m['seconds']:.1f} | {cpu:.1f} | {ratio} | "
                     f"{passes[name]:.0f} / {m['passes']} | {m['load']:.1f} |")
    lines.append(f"| **all** | | **{total_e:.0f}** | **{total_m:.0f}** | {total_c:.0f} | "
                 f"{total_m / max(total_e, 1e-9):.2f} | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="demo or smollm2-135m-instruct")
    ap.add_argument("--attacks", default="all", help="a comma list (default: every attack)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: 1 for the demo, as the studio; torch's otherwise)")
    ap.add_argument("--json", help="save the run (measured seconds) here")
    ap.add_argument("--measured", help="a run saved with --json: print it against the estimate, run nothing")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N other processes keep a core busy each, started once the model is loaded and calibrated "
                         "(a server calibrated quiet, then loaded): the estimates and the run both see them")
    ap.add_argument("--spread", type=int, default=0, metavar="N",
                    help="run nothing: calibrate the model N times (with --busy N, beside the spinning processes "
                         "from before the first) and print each calibration's total estimate, the pulse it was "
                         "measured at and the pulse now: how much the estimate varies from one calibration to the next")
    ap.add_argument("--suite", action="store_true",
                    help="run the attacks in one suite call, as python -m grom attack does (default: one call each, "
                         "as the panel runs them)")
    args = ap.parse_args()
    threads = args.threads or (1 if args.model == "demo" else None)
    if threads:
        torch.set_num_threads(threads)
    handle, bench, preset = setup(args.model)
    if args.spread:
        spread(handle, bench, args.spread, args.busy)
        return
    burners = busy(0 if args.measured else args.busy)  # --measured runs nothing: nothing to load
    try:
        report(args, handle, bench, preset)
    finally:
        for b in burners:
            b.terminate()


def spread(handle, bench, runs: int, burners: int) -> None:
    """Calibrate `runs` times (beside `burners` spinning processes) and print each total
    estimate of every attack with the pulses it rests on."""
    from components.attack_panel import ESTIMATES, attack_estimates
    from components.server import pace

    procs = busy(burners)
    try:
        print(f"# {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='minutes')} {platform.machine()}, "
              f"{os.cpu_count()} cores, {burners} busy process(es); {handle.key.shown}")
        for i in range(runs):
            cal = pace.calibrate(handle)
            time.sleep(1.0)
            ESTIMATES.clear()
            total = sum(attack_estimates(handle, bench).values())
            print(f"calibration {i + 1}: {cal.seconds:.1f} s, pulse {1e3 * cal.pulse:.2f} ms; pulse now "
                  f"{1e3 * pace.pulse():.2f} ms; every attack estimated at {total:.0f} s", flush=True)
    finally:
        for p in procs:
            p.terminate()


def _spin() -> None:
    while True:
        pass


def busy(n: int) -> list:
    """`n` processes that each keep a core busy, given a few seconds to show in the CPU's
    pulse (`components.server.pace`) before anything is estimated."""
    import multiprocessing

    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    if procs:
        time.sleep(5.0)
    return procs


def report(args, handle, bench, preset) -> None:
    """Estimate, then measure (or read --measured), and print the table."""
    from grom.robustness.suite import attack_names

    if args.measured:
        run = json.loads(Path(args.measured).read_text())
        seconds, passes, took = estimates(handle, bench, run.get("first", 0))  # older runs: the most work
    else:
        edit, edit_s, first = made_edit(handle, bench, preset)  # the estimate before the run, for its edit
        seconds, passes, took = estimates(handle, bench, first)
        run = {"model": args.model, "benchmark": f"{bench.name}/{bench.split}", "threads": torch.get_num_threads(),
               "busy": args.busy,
               "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
               "how": "one suite call" if args.suite else "one call per attack", "edit_s": edit_s, "first": first,
               **(measure_suite if args.suite else measure)(handle, bench, edit, attack_names(args.attacks))}
        if args.json:
            Path(args.json).write_text(json.dumps(run, indent=1))
    print(f"{run['model']} on {run['benchmark']}, {run['threads']} thread(s), {run.get('busy', 0)} busy "
          f"process(es) beside it, {run['machine']}, {run['when']}; "
          f"edit {run['edit_s']} s; the estimates took {took:.2f} s")
    print(table(run, seconds, passes))


if __name__ == "__main__":
    main()
