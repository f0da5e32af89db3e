"""Every wall-time estimate the studio shows before a job, against the job's measured time, on
a quiet CPU and under load (issue 49): the attack quick set (the tab's total line, and each
attack's label), and one epoch of NPO (the baseline's "about N s per epoch"), on the demo
model and on SmolLM2-135M-Instruct, each run as the studio runs it (the demo on one torch
thread, SmolLM2 on torch's threads).

    python bench/bench_estimates.py                              # both models, quiet then loaded
    python bench/bench_estimates.py --models demo --burn 1 --rounds 3 --json demo.json
    python bench/bench_estimates.py --models smollm2-135m-instruct --conditions loaded --rounds 1

Each model is calibrated first (`components.server.pace.calibrate`: what the server's warm-up
does once a model is loaded). Then for each condition, quiet, then loaded (`--burn`
processes each spinning a core, started a few seconds before), `--rounds` rounds of: the
estimate as the panel would show it at that moment, then the job as the app runs it (the
attacks through `compute_attacks`, NPO's training through `paced_training` around
`train_comparator`), which times it into the pace. A condition's first round is estimated
before any job ran in it (a new load seen by the pulse alone); the later ones after a job.
The data are bench/attack_times.py's: the demo on an upload of demo/forget01 with 8
held-out probes, SmolLM2 on the real-knowledge benchmark's default split (its known facts,
the app's seeded sample of 128 retain examples). "quiet" is this machine without the
burners: other work on it shows in the load average printed beside each row.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from attack_times import setup  # noqa: E402

REAL = "smollm2-135m-instruct"
THREADS = torch.get_num_threads()  # torch's own, what the studio runs SmolLM2 on


class Burners:
    """`n` processes each spinning a core, for the block; ended (and reaped) whatever happens."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(5.0)  # the scheduler shares the cores out before the first estimate
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def attack_round(handle, bench, edit) -> list[dict]:
    """The quick set: its estimate (total, each attack) then its run, timed."""
    from components import attack_panel as ap

    names = tuple(n for n in ap.attack_names("all") if n in ap.QUICK)
    load = os.getloadavg()[0]
    seconds = ap.attack_estimates(handle, bench)
    t0 = time.perf_counter()
    results = ap.compute_attacks(handle.key, bench, edit, names, None, None)[ap.GROM]
    took = time.perf_counter() - t0
    rows = [{"job": "attack quick set", "estimate": sum(seconds[n] for n in names), "measured": took, "load": load}]
    rows += [{"job": f"  {n}", "estimate": seconds[n], "measured": results[n].seconds, "load": load} for n in names]
    return rows


def epoch_round(handle, bench) -> list[dict]:
    """One epoch of NPO at the model's default learning rate: its estimate, then its run."""
    from components import baseline_panel as bp

    load = os.getloadavg()[0]
    estimate = bp.training_seconds(handle, bench, "npo", 1)
    lr, _ = bp.defaults_of("npo", handle.key)
    t0 = time.perf_counter()
    with bp.paced_training(handle.key, bench, "npo", 1, None):
        bp.train_comparator(handle.key, bench, "npo", 1, lr, None, None)
    return [{"job": "NPO, one epoch", "estimate": estimate, "measured": time.perf_counter() - t0, "load": load}]


def run_model(model: str, burn: int, rounds: int, jobs: list[str], conditions: list[str]) -> dict:
    """Every round of every condition on `model`."""
    from components.server import pace
    from grom import run_edit

    torch.set_num_threads(1 if model == "demo" else THREADS)
    handle, bench, preset = setup(model)
    calibration = pace.calibrate(handle)
    edit = run_edit(handle.model, handle.tokenizer, bench.forget, bench.retain, preset) if "attacks" in jobs else None
    out = {"model": model, "threads": torch.get_num_threads(), "calibration_s": round(calibration.seconds, 2),
           "rows": []}
    for condition, burners in (("quiet", 0), (f"loaded ({burn} core{'s' * (burn != 1)} burnt)", burn)):
        if condition.split()[0] not in conditions:
            continue
        with Burners(burners):
            for r in range(1, rounds + 1):
                made = (attack_round(handle, bench, edit) if "attacks" in jobs else []) + \
                       (epoch_round(handle, bench) if "epoch" in jobs else [])
                for row in made:
                    row.update(condition=condition, round=r)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                out["rows"] += made
    return out


def table(runs: list[dict]) -> str:
    lines = ["| model | job | condition | round | estimate s | measured s | measured / estimate | load avg |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for row in run["rows"]:
            ratio = row["measured"] / row["estimate"] if row["estimate"] else float("nan")
            lines.append(f"| {run['model']} | {row['job']} | {row['condition']} | {row['round']} | "
                         f"{row['estimate']:.1f} | {row['measured']:.1f} | {ratio:.2f} | {row['load']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=f"demo,{REAL}")
    parser.add_argument("--burn", type=int, default=1, help="processes spinning a core each, when loaded")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", default="attacks,epoch", help="attacks, epoch or both")
    parser.add_argument("--conditions", default="quiet,loaded", help="quiet, loaded or both (in that order)")
    parser.add_argument("--json", help="save the rows here")
    parser.add_argument("--measured", help="a --json file: print its table, run nothing")
    args = parser.parse_args()
    if args.measured:
        saved = json.loads(Path(args.measured).read_text())
    else:
        jobs = args.jobs.split(",")
        saved = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                 "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                            f"torch {torch.__version__}",
                 "runs": [run_model(m, args.burn, args.rounds, jobs, args.conditions.split(","))
                          for m in args.models.split(",")]}
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1))
    print(f"{saved['machine']}, {saved['when']}; " +
          "; ".join(f"{r['model']}: {r['threads']} thread(s), calibrated in {r['calibration_s']} s"
                    for r in saved["runs"]))
    print(table(saved["runs"]))


if __name__ == "__main__":
    main()
