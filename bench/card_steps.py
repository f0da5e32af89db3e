"""The result card's two steps on the default page, timed in the library (issue 37, item 5):
what the server computes between Run edit and the card, on any device, without the app.

    python bench/card_steps.py [--model smollm2-135m-instruct] [--device cpu] [--threads 2] [--runs 3]
    python bench/card_steps.py --model /path/to/SmolLM2 --device cuda --dtype bfloat16 --no-caches

The studio's default page: SmolLM2 on real-knowledge's first split, every known fact
(`known_only`), the "smollm2" preset, 128 seeded retain examples, the band the layer
scores suggest. As the app does off ZeroGPU: the layer scores computed once (the page
load's), the stream into the band and the Base row recorded ahead (the page-load
warm-ups), then per run the edit, the first verdict (`evaluate(stage="forget")`: the
forget questions and the held-out probes) and the whole card (`stage="answers"`, the first
step's answers given). `--no-caches`: as on ZeroGPU, no stream or prefix cache. Each run
times three settings: one never computed (the prefix cache's `Recall` emptied), the same
again (its edited answers held, read as guesses), and a beta 10% higher (the answers
before it held); each checks that its answers are those decoding alone gives. The
browser's view of the same (Gradio and chromium on the machine too): `bench/bench_card.py`.
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
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--no-caches", action="store_true", help="no stream or prefix cache (as on ZeroGPU)")
    ap.add_argument("--profile", action="store_true", help="then profile one more click's two steps (cProfile)")
    ap.add_argument("--parts", action="store_true", help="per run, where the whole card's time goes: each drafted "
                    "pass, the decoding after it, the answer classes' perplexities")
    ap.add_argument("--betas", default="", help="comma-separated betas: for each, the first verdict's "
                    "forget-side count beside the whole card's")
    args = ap.parse_args(argv)
    import torch

    from grom import PRESETS, run_edit
    from grom.data import load_benchmark
    from grom.eval import evaluate
    from grom.eval.prefix import PrefixCache
    from grom.eval.report import record_drafts
    from grom.eval.results import EDITED
    from grom.model.loading import load_model

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    parts = timed_parts() if args.parts else None

    def clock() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    t = clock()
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    bench = load_benchmark("real-knowledge", known_only=True)
    retain = tuple(random.Random(0).sample(bench.retain, min(args.retain_examples, len(bench.retain))))
    config = replace(PRESETS["smollm2"], prompt_format=bench.prompt_format, seed=0)
    device = torch.cuda.get_device_name() if cuda else f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {device}, torch {torch.__version__}, {args.dtype}, "
          f"{args.threads} threads, load {os.getloadavg()[0]:.2f}; model loaded in {clock() - t:.1f} s")
    sizes = {k: len(v) for k, v in bench.eval_sets.items()}
    print(f"# {bench.name}/{bench.split}: {sizes}; caches {'off' if args.no_caches else 'on'}")

    stream = None if args.no_caches else {}
    prefix = None if args.no_caches else PrefixCache(max_bytes=1 << 30)  # the app's PREFIX_CACHE_BYTES
    t = clock()
    warm = run_edit(model, tok, bench.forget, retain, config, stream_cache=stream)  # the page's scores, stream
    band = list(warm.band)
    print(f"page load: scores and a first edit {clock() - t:.1f} s, band {band}")
    t = clock()
    base = evaluate(model, tok, bench, prefix=prefix, record_at=(band[0],))
    print(f"page load: the Base row {clock() - t:.1f} s")
    if prefix is not None:  # as the app's warm-up does after the Base row (components/studio/comparison.py)
        t = clock()
        record_drafts(model, tok, bench, base, prefix, (band[0],))
        print(f"page load: the drafted passes recorded {clock() - t:.1f} s")
    if parts is not None:
        parts.clear()  # the page load's passes: not a click's
    from grom.tasks.knowledge import split_decoding
    print(f"# the app's card: {'two steps (forget verdict, then the rest)' if split_decoding(model) else 'one step'}")
    print("Each run: a setting never computed (no earlier edited answers held), the same setting again "
          "(its answers held: the start page after the warm-up's card, a re-run), and a beta 10% higher "
          "(the answers of the setting before it held: a slider moved).")
    print("| run | setting | edit s | first verdict s (from the click) | whole card s (from the click) | "
          "same answers as decoding alone | first verdict | whole card |")
    print("|---|---|---|---|---|---|---|---|")
    for run in range(args.runs):
        if prefix is not None:
            prefix.recall.clear()
        fresh = None
        for kind, cfg in (("new", config), ("again", config), ("beta +10%", replace(config, beta=config.beta * 1.1))):
            t0 = clock()
            edit = run_edit(model, tok, bench.forget, retain, cfg, scores=warm.scores, stream_cache=stream)
            t_edit = clock()
            first = evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="forget")
            t_first = clock()
            whole = evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="answers", answers=first)
            t_whole = clock()
            lines = list(parts or ())
            if parts is not None:
                parts.clear()
            if kind == "new":
                fresh = same = whole  # decoded: nothing earlier held
            elif kind == "again":
                same = fresh
            else:  # the same edit decoded with nothing earlier held
                same = evaluate(model, tok, bench, edit, reuse=base, prefix=None, stage="answers")
            agree_ = all(whole.examples(EDITED, s)[c].equals(same.examples(EDITED, s)[c])
                         for s in same.rows[EDITED].examples
                         for c in ("generation", "paraphrase_generation") if c in same.examples(EDITED, s))
            f, w = first.known_facts(), whole.known_facts()
            kept = [w[s] for s in ("neighbours", "general") if s in w]
            print(f"| {run + 1} | {kind} | {t_edit - t0:.2f} | {t_first - t0:.2f} | {t_whole - t0:.2f} | {agree_} | "
                  f"forget {f['forget'][0] - f['forget'][1]} of {f['forget'][0]} not stated | "
                  f"kept {sum(s for _, s in kept)} of {sum(k for k, _ in kept)} |")
            if lines:
                print("  parts: " + "; ".join(lines))
            if parts is not None:
                parts.clear()
    if args.betas:
        agree(model, tok, bench, retain, config, warm.scores, stream, prefix, base,
              [float(b) for b in args.betas.split(",")])
    if args.profile:
        import cProfile
        import pstats

        edit = run_edit(model, tok, bench.forget, retain, config, scores=warm.scores, stream_cache=stream)
        with cProfile.Profile() as prof:
            first = evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="forget")
            evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="answers", answers=first)
            clock()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def timed_parts() -> list[str]:
    """Time each drafted pass and the decoding after it (`greedy_answers`) and the answer
    classes' perplexities (the judge's `score_answers`) from now on; returns the list their
    lines go to."""
    import time as clock

    from grom.eval import runner
    from grom.tasks import knowledge

    lines: list[str] = []
    real_answers, real_judge = runner.greedy_answers, knowledge.score_answers

    def answers(model, tokenizer, ids, *args, **kwargs):
        t0, marks, hear = clock.perf_counter(), [], kwargs.get("on_step")

        def on_step(done):
            marks.append((done, clock.perf_counter() - t0))
            if hear is not None:
                hear(done)
        kwargs["on_step"] = on_step
        out = real_answers(model, tokenizer, ids, *args, **kwargs)
        total = clock.perf_counter() - t0
        if kwargs.get("drafts") is None:
            lines.append(f"decoding {ids.shape[0]} rows {total:.1f} s ({len(marks)} steps)")
        else:
            done, first = marks[0] if marks else (0, total)
            lines.append(f"drafted pass of {ids.shape[0]} rows {first:.1f} s ({done} finished in it)"
                         + (f", then {len(marks) - 1} decoding steps {total - first:.1f} s" if len(marks) > 1 else ""))
        return out

    real_guesses = runner.read_guesses

    def guesses(model, fed, live, *args, **kwargs):
        t0 = clock.perf_counter()
        out = real_guesses(model, fed, live, *args, **kwargs)
        whose = "this edit's own" if kwargs.get("same") else "an earlier edit's"
        lines.append(f"{whose} answers read for {len(live)} rows {clock.perf_counter() - t0:.1f} s "
                     f"({len(live) - len(out)} finished on them)")
        return out
    runner.read_guesses = guesses

    def judge(model, tokenizer, pairs, **kwargs):
        t0 = clock.perf_counter()
        out = real_judge(model, tokenizer, pairs, **kwargs)
        lines.append(f"perplexities of {len(pairs)} answers {clock.perf_counter() - t0:.1f} s")
        return out
    runner.greedy_answers, knowledge.score_answers = answers, judge
    return lines


def agree(model, tok, bench, retain, config, scores, stream, prefix, base, betas) -> None:
    """Per beta: the first verdict's forget-side count (facts still stated, final; the rest
    not stated so far: answers cut short, read in full by the whole card) beside the whole
    card's forgot / broke / still, and whether every fact the first verdict called stated
    is stated on the whole card too (it should be: those answers are final)."""
    from grom import run_edit
    from grom.eval import evaluate

    print("# the first verdict (still stated / not stated so far) against the whole card (forgot/broke/still)")
    print("| beta | set | first verdict | whole card | cut answers | first's stated all stated in full |")
    print("|---|---|---|---|---|---|")
    for beta in betas:
        edit = run_edit(model, tok, bench.forget, retain, replace(config, beta=beta), scores=scores,
                        stream_cache=stream)
        first = evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="forget")
        whole = evaluate(model, tok, bench, edit, reuse=base, prefix=prefix, stage="answers", answers=first)
        f, w = first.tallies(), whole.tallies()
        for name in ("forget", "probes"):
            if name in f and name in w:
                a, b = f[name], w[name]
                mine, full = first.examples("Edited", name), whole.examples("Edited", name)
                cut = int(mine["cut"].sum()) if "cut" in mine else 0
                stated = mine["fact_recall"].to_numpy(dtype=bool)
                held = bool(full["fact_recall"].to_numpy(dtype=bool)[stated].all())
                print(f"| {beta:g} | {name} | {a.still} stated, {a.known - a.still} not so far of {a.known} | "
                      f"{b.forgot}/{b.broke}/{b.still} of {b.known} | {cut} of {len(mine)} | "
                      f"{'yes' if held else 'NO'} |")


if __name__ == "__main__":
    main()
