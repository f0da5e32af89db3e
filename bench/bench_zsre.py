"""ZsRE as the paper reports it: the GROM edit on each of the 10 seed splits (50 facts to
forget, 1,000 disjoint facts to retain), efficacy / generalisation / specificity of the
Base and Edited rows, averaged over the seeds.

    python bench/bench_zsre.py --source data/zsre_mend_eval.json --model smollm2-135m-instruct
    python bench/bench_zsre.py --quick      # the bundled demo model on hand-built records

Prints the per-seed table and the mean and standard deviation over seeds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from grom import PRESETS, EditConfig, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.eval import evaluate  # noqa: E402
from grom.tasks import zsre  # noqa: E402

METRICS = ("Efficacy", "Generalisation", "Specificity")


def zsre_over_seeds(model, tokenizer, source, config: EditConfig = PRESETS["zsre"],
                    seeds: Sequence[int] = zsre.SEEDS, *, batch_size: int = 32,
                    log: Callable[[str], None] = lambda _: None) -> pd.DataFrame:
    """One row per (seed, model row): the ZsRE metrics of Base and Edited on split
    `forget50-seed<seed>`, with the edit computed on that split's forget and retain sets."""
    rows = []
    for seed in seeds:
        t0 = time.perf_counter()
        bench = load_benchmark("zsre", f"forget{zsre.N_FORGET}-seed{seed}", source=source)
        edit = run_edit(model, tokenizer, bench.forget, bench.retain,
                        config.replace(prompt_format=bench.prompt_format))
        table = evaluate(model, tokenizer, bench, edit=edit, batch_size=batch_size).table()
        for name, metrics in table.iterrows():
            rows.append({"seed": seed, "row": name, **{m: metrics.get(m) for m in METRICS}})
        log(f"seed {seed}: {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


def average_over_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds of each metric, per model row:
    columns (metric, "mean" | "std"), one row per model row (Base, Edited)."""
    return per_seed.groupby("row", sort=False)[list(METRICS)].agg(["mean", "std"])


def _quick_records(folder: Path) -> Path:
    """A file of 1,100 hand-built records (enough for 50 + 1000), for a smoke run."""
    records = [{"subject": f"Ann Vell {k}", "src": f"Where did Ann Vell {k} study?",
                "answers": [f"Kell College {k % 7}"], "rephrase": f"Which school did Ann Vell {k} attend?",
                "loc": f"nq question: who wrote book number {k}", "loc_ans": f"Author {k % 5}"}
               for k in range(zsre.N_FORGET + zsre.N_RETAIN + 50)]
    path = folder / zsre.FILE_NAME
    path.write_text(json.dumps(records))
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help=f"the {zsre.FILE_NAME} file or its folder")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--seeds", type=int, default=len(zsre.SEEDS), help="the first N of the 10 seeds")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="the bundled demo model, hand-built records, 2 seeds")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            from grom.demo import load_demo_model

            (model, tok), source = load_demo_model("full"), _quick_records(Path(tmp))
            seeds = zsre.SEEDS[:2]
        else:
            if not args.source:
                ap.error(f"--source is needed: the path of {zsre.FILE_NAME} ({zsre.DATA_URL})")
            from grom.model.loading import load_model

            model, tok = load_model(args.model, device=args.device)
            source, seeds = args.source, zsre.SEEDS[:args.seeds]
        per_seed = zsre_over_seeds(model, tok, source, seeds=seeds, batch_size=args.batch_size, log=print)
    pd.set_option("display.width", 200)
    print(per_seed.round(4).to_string(index=False))
    print(f"# mean and std over {len(seeds)} seeds")
    print(average_over_seeds(per_seed).round(4).to_string())


if __name__ == "__main__":
    main()
