"""The landscape on the default page (issue 48): how long the 5 x 5 grid takes against 25
Run edits of the same cells, and how often a cell's reading disagrees with the card.

    python bench/bench_landscape.py [--model smollm2-135m-instruct] [--device cpu] [--threads 2] [--cards 25]
    python bench/bench_landscape.py --model /path/to/SmolLM2 --device cuda --dtype bfloat16

As the app does it: SmolLM2 on real knowledge's first split (every known fact), the
"smollm2" preset, 128 seeded retain examples; the page-load work done ahead (the layer
scores and the stream into the band from a first edit, the unedited answers, the card's
drafted passes recorded); the session's edit at the preset's settings. Then:

1. the grid (`grom.landscape.landscape`, the session's edit reused for its own cell), cell
   by cell: its wall time, and each cell's edit and reading;
2. the same 25 cells as 25 Run edits (`run_edit` alone, no reading): what the grid's edits
   cost without it;
3. at `--cards` cells, the card (`evaluate(stage="answers")`, as the app's whole card):
   per fact the unedited model stated, whether the cell's reading (top choice; stated along
   the unedited words) holds it as the card's answer does (still stated), and how many of
   those the card calls broke. Prints the disagreement rate of each reading.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a registry name or a local folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--cards", type=int, default=25, help="cells checked against the card (0: none)")
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    from grom import PRESETS, run_edit
    from grom.data import load_benchmark
    from grom.eval import evaluate
    from grom.eval.prefix import PrefixCache
    from grom.eval.report import record_drafts
    from grom.eval.results import BASE, EDITED
    from grom.landscape import AnswerReader, Grid, landscape
    from grom.model.loading import load_model

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")

    def clock() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    bench = load_benchmark("real-knowledge", known_only=True)
    retain = tuple(random.Random(0).sample(bench.retain, min(args.retain_examples, len(bench.retain))))
    config = replace(PRESETS["smollm2"], prompt_format=bench.prompt_format, seed=0)
    device = torch.cuda.get_device_name() if cuda else f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {device}, torch {torch.__version__}, {args.dtype}, "
          f"{args.threads} threads, load {os.getloadavg()[0]:.2f}")
    stream, prefix = ({}, PrefixCache(max_bytes=1 << 30)) if not cuda else (None, None)
    t = clock()
    current = run_edit(model, tok, bench.forget, retain, config, stream_cache=stream, progress=False)
    band = list(current.band)
    base = evaluate(model, tok, bench, prefix=prefix, record_at=(band[0],), stage="answers")
    if prefix is not None:
        record_drafts(model, tok, bench, base, prefix, (band[0],))
    reader = AnswerReader.from_report(tok, bench, base)
    print(f"page load (scores, first edit, unedited answers, drafts) {clock() - t:.1f} s; band {band}; "
          f"read {reader.sizes}, {reader.tokens} tokens a reading")
    fixed = config.replace(layers=tuple(band))
    grid = Grid.around(fixed)

    t0 = clock()
    cells = []
    for cell in landscape(model, tok, bench.forget, retain, fixed, grid, reader, scores=current.scores,
                          stream_cache=stream, current=current):
        cells.append(cell)
        if len(cells) in (1, 9, 25):
            print(f"  {len(cells)} cells in {clock() - t0:.1f} s")
    grid_s = clock() - t0
    made = [c for c in cells if (c.strength, c.w_r) != (config.beta, config.w_r)]
    print(f"**the grid: {grid.size} cells in {grid_s:.1f} s** (edit {np.mean([c.edit_s for c in made]):.2f} s, "
          f"reading {np.mean([c.read_s for c in cells]):.2f} s a cell on average)")

    t0 = clock()
    edits = {}
    for s, w in grid.order((config.beta, config.w_r)):
        edits[(s, w)] = run_edit(model, tok, bench.forget, retain, grid.config(fixed, s, w), scores=current.scores,
                                 stream_cache=stream, progress=False)
    print(f"**25 Run edits of the same cells (no reading, no card): {clock() - t0:.1f} s**")
    if not args.cards:
        return
    print("| β | w_r | top: differ / facts | stated: differ / facts | card broke | card still | cell top | "
          "words kept (forget side) | card s |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = np.zeros(5, dtype=int)
    for cell in cells[:args.cards]:
        t = clock()
        card = evaluate(model, tok, bench, edits[(cell.strength, cell.w_r)], reuse=base, prefix=prefix,
                        stage="answers")
        card_s = clock() - t
        d_top = d_stated = n = broke = still = 0
        for name, reading in cell.readings.items():
            known = base.examples(BASE, name)["fact_recall"].to_numpy() == 1.0
            df = card.examples(EDITED, name)
            card_still = df["fact_recall"].to_numpy()[known] == 1.0
            cls = df["answer_class"].to_numpy()[known]
            n += len(card_still)
            d_top += int(sum(bool(a) != bool(b) for a, b in zip(reading.top, card_still)))
            d_stated += int(sum(bool(a) != bool(b) for a, b in zip(reading.stated, card_still)))
            broke += int((cls == "degenerate").sum())
            still += int(card_still.sum())
        top = sum(c[2] for c in cell.counts.values())
        totals += (d_top, d_stated, n, broke, 1)
        words = cell.words_kept(("forget", "probes"))
        print(f"| {cell.strength:g} | {cell.w_r:g} | {d_top} / {n} | {d_stated} / {n} | {broke} | {still} | {top} | "
              f"{words:.0%} | {card_s:.1f} |")
    d_top, d_stated, n, broke, k = totals
    print(f"**at {k} cells: the top-choice reading disagrees with the card on {d_top} of {n} facts "
          f"({d_top / n:.1%}), the stated reading on {d_stated} ({d_stated / n:.1%}); the cards called {broke} "
          f"answers broke**")


if __name__ == "__main__":
    main()
