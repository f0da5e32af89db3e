"""What each long job may hold: the memory it keeps between its turns on the device (what it
reserves in GROM_JOBS_MEMORY_MB, components/server/memory_budget.py) and the seconds of GPU its
calls ask for on ZeroGPU (components/server/durations.py), on the studio's default data.

    python bench/job_holds.py [--model smollm2-135m-instruct] [--methods simnpo,ga,npo,rmu,rome,lunar]

Prints a Markdown table (BENCHMARKS.md, "Hostile visitors"). The numbers are the estimators'
own, read from the loaded model's shape; what real runs held beside them is in the same
section, from bench/bench_hostile.py.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.baseline_panel import defaults_of  # noqa: E402
from components.server.allowed_sources import REAL  # noqa: E402
from components.server.durations import (  # noqa: E402
    attack_memory,
    attack_s,
    baseline_memory,
    edit_s,
    report_s,
    train_call_s,
    write_s,
)
from components.server.memory_budget import budget_bytes  # noqa: E402
from components.server.model_choices import ensure_model, model_key  # noqa: E402
from components.studio.benchmarks import default_split, preset_for  # noqa: E402
from components.studio.name_only import writing_config  # noqa: E402
from grom import PRESETS  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.robustness.suite import attack_names  # noqa: E402

GiB = float(1 << 30)


def rows(model: str, methods: list[str]) -> list[tuple[str, float, int]]:
    """(job, GiB held between turns, GPU seconds asked) for each long job on `model`."""
    handle = ensure_model(model_key(model, "cpu", "float32"))
    key = handle.key
    bench_name = "real-knowledge" if model == REAL else "demo"
    bench = load_benchmark(bench_name, default_split(bench_name))
    config = PRESETS[preset_for(bench_name, bench.split, model) or "demo"]
    out = [("Run edit (GROM)", 0.0, edit_s(key, bench.forget, bench.retain, config)),
           ("Compare, all examples", 0.0, report_s(key, bench, None, None))]
    for name in methods:
        _, epochs = defaults_of(name, key)  # what the Baselines panel starts from
        out.append((f"baseline {name}, {epochs:g} epochs (or steps)", baseline_memory(key, bench, name, epochs) / GiB,
                    train_call_s(key, bench, name, epochs)))
    names = attack_names("all")
    out.append(("attack suite, every attack", attack_memory(key, bench, names, None) / GiB,
                sum(attack_s(key, bench, None, n) for n in names)))
    config = writing_config(8, 16, 2)
    out.append(("name-only writing (8 passages, 16 questions, 2 neighbours)", 0.0,
                write_s(key, "the-solar-system", config)))
    return out


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=REAL)
    p.add_argument("--methods", default="simnpo,ga,npo,rmu,rome,lunar")
    args = p.parse_args()
    table = rows(args.model, [m.strip() for m in args.methods.split(",") if m.strip()])
    print(f"{args.model}; GROM_JOBS_MEMORY_MB default here: {budget_bytes('cpu') / GiB:.1f} GB\n")
    print("| job | held between turns (GB) | GPU seconds asked (ZeroGPU) |\n|---|---|---|")
    for job, held, seconds in table:
        print(f"| {job} | {held:.2f} | {seconds} |")


if __name__ == "__main__":
    main()
