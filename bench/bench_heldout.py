"""Does GROM's forgetting carry to the held-out probes, and what makes it carry? (issue 24
item 8, and the re-tune of the `smollm2` preset after the fitted/probe split.)

    python bench/bench_heldout.py grid --subjects the-solar-system \
        --grid "65/100/0.03/5,100/100/0.03/5,100/30/0.03/5"      # beta/w_r/rho/k
    python bench/bench_heldout.py carry --subjects the-solar-system  # what carries to the probes

Every edit is scored by fact recall (`grom.robustness.probe_recall`: a fact as whole words
in the greedy chat answer, the real-knowledge comparison's measure) on three sets of the
facts SmolLM2 was probed to know: the fitted forget questions (bench.forget), the
held-out probes (eval_sets["probes"], never fitted) and the kept facts (the other
subjects' held-out neighbours + held-out general knowledge). Retain: the app's seeded
sample of 128 examples, as the studio's edit.

grid: the preset's beta, w_r, rho, k varied, on the benchmark's own split (FIT_FRACTION).
carry: on a custom split of the subject's known facts: a fixed third held out as probes
(by the SHA-256 of the ids, the benchmark's hash order reversed so the cut differs from
FIT_FRACTION's), and the edit fitted on 1/3, 2/3 or all of the other two thirds; then
all of them as one text (corpus keys, every token of the answers), and a wider band (10
layers ending where the preset's automatic band ends). Every variant on the band the
preset picks for the benchmark's split (fixed, so no layer scores are recomputed).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_knowledge import md_table  # noqa: E402  (bench/ is the script's own folder)

from grom import PRESETS, best_window, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.data.schema import TextExample  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.robustness import probe_recall, probes_from_examples  # noqa: E402
from grom.tasks.knowledge import FORGET3, knowledge  # noqa: E402


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Subject:
    """One subject's benchmark (known facts, 128 retain) and its three scored sets."""

    def __init__(self, args, model, tok, name: str, base: tuple[str, ...] = ("fitted", "probes", "kept")):
        self.model, self.tok, self.args = model, tok, args
        bench = load_benchmark("real-knowledge", name, known_only=True)
        retain = tuple(random.Random(args.seed).sample(bench.retain, args.retain_examples))
        self.bench = dataclasses.replace(bench, retain=retain)
        self.sets = {"fitted": probes_from_examples(bench.forget),
                     "probes": probes_from_examples(bench.eval_sets["probes"]),
                     "kept": probes_from_examples(bench.eval_sets["neighbours"] + bench.eval_sets["general"])}
        self.base = self.score(None, {k: v for k, v in self.sets.items() if k in base})
        self.scores, self.caches = None, {}

    def score(self, edit, sets=None) -> dict[str, float]:
        sets = sets or self.sets
        out = {}
        for name, probes in sets.items():
            if edit is None:
                out[name] = probe_recall(self.model, self.tok, probes).value
            else:
                with edit.applied(self.model):
                    out[name] = probe_recall(self.model, self.tok, probes).value
        return out

    def edit(self, forget, config, reuse: bool = True):
        """GROM on `forget` with the 128 retain examples; the layer scores and the stream
        into the band reused between edits of the benchmark's own forget set."""
        t0 = time.perf_counter()
        if not reuse:
            return run_edit(self.model, self.tok, forget, self.bench.retain, config), time.perf_counter() - t0
        if self.scores is not None and config.layers is None:  # given scores carry their own k's band
            config = config.replace(layers=tuple(best_window(self.scores.S, config.k, config.candidates)))
        cache = self.caches.setdefault(config.layers, {})
        e = run_edit(self.model, self.tok, forget, self.bench.retain, config, scores=self.scores,
                     stream_cache=cache)
        self.scores = self.scores or e.scores
        return e, time.perf_counter() - t0


def _fmt(d: dict) -> list[str]:
    return [f"{d[k]:.2f}" for k in ("fitted", "probes", "kept")]


def grid(args, model, tok) -> None:
    base_cfg = PRESETS[args.preset].replace(seed=args.seed)
    for name in args.subjects:
        t = Subject(args, model, tok, name)
        n = {k: len(v) for k, v in t.sets.items()}
        rows = [["base", "-", "-", *_fmt(t.base)]]
        _log(f"{name}: base {t.base} {n}")
        for spec in args.grid.split(","):
            beta, w_r, rho, k = spec.split("/")
            cfg = base_cfg.replace(beta=float(beta), w_r=float(w_r), rho=float(rho), k=int(k))
            e, secs = t.edit(t.bench.forget, cfg)
            s = t.score(e)
            rows.append([spec, f"{e.band[0]}-{e.band[-1]}", f"{secs:.0f}", *_fmt(s)])
            _log(f"{name}: {spec} band {e.band[0]}-{e.band[-1]} {secs:.0f} s: {s}")
        print(f"\n### grid on {name} (beta/w_r/rho/k; recall over known facts: fitted {n['fitted']}, "
              f"probes {n['probes']}, kept {n['kept']})\n")
        print(md_table(["setting", "band", "edit s", "fitted recall", "probe recall", "kept recall"], rows),
              flush=True)


def _rank(ex) -> str:
    return hashlib.sha256(("probe:" + ex.id).encode()).hexdigest()


def carry(args, model, tok) -> None:
    cfg = PRESETS[args.preset].replace(seed=args.seed)
    for name in args.subjects:
        t = Subject(args, model, tok, name, base=("kept",))
        known = knowledge().known
        qa = [ex for ex in knowledge().subjects[name].qa if known.get(ex.id, (False,))[0]]
        order = sorted(qa, key=_rank)
        cut = len(order) // 3
        probes, pool = order[:cut], order[cut:]
        sets = {"probes": probes_from_examples(probes), "kept": t.sets["kept"]}
        base = {**t.score(None, {"probes": sets["probes"]}), "kept": t.base["kept"]}
        rows = [["base", "-", "-", "-", f"{base['probes']:.2f}", f"{base['kept']:.2f}"]]
        _log(f"{name}: carry: {len(probes)} probes, pool {len(pool)}, base {base}")
        first, _ = t.edit(t.bench.forget, cfg)  # the preset's automatic band on the benchmark's split
        band = tuple(first.band)
        wide = tuple(range(max(0, band[-1] - 9), band[-1] + 1))
        cfg = cfg.replace(layers=band)  # every variant on the same band: no layer scores to recompute
        variants = []  # (label, forget examples, the questions they fit, config)
        for frac in (1 / 3, 2 / 3, 1.0):
            m = round(frac * len(pool))
            variants.append((f"{m} questions fitted", tuple(pool[:m]), pool[:m], cfg))
        text = TextExample(" ".join(ex.answer for ex in pool), id=f"{name}/text")
        variants.append((f"one text of the {len(pool)} answers (corpus keys)", (text,), pool, cfg))
        variants.append((f"{len(pool)} questions, band of 10", tuple(pool), pool, cfg.replace(layers=wide)))
        for label, forget, fitted, c in variants:
            e, secs = t.edit(forget, c, reuse=False)
            s = t.score(e, {**sets, "fitted": probes_from_examples(fitted)})
            rows.append([label, f"{e.band[0]}-{e.band[-1]}", f"{secs:.0f}", *_fmt(s)])
            _log(f"{name}: {label}: {secs:.0f} s: {s}")
        print(f"\n### what carries to {len(probes)} held-out probes on {name} (preset {args.preset}; "
              f"{len(t.sets['kept'])} kept facts)\n")
        print(md_table(["fitted on", "band", "edit s", "fitted recall", "probe recall", "kept recall"], rows),
              flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["grid", "carry"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--subjects", "--targets", dest="subjects", default=",".join(FORGET3))
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--grid", default="65/100/0.03/5,100/100/0.03/5,150/100/0.03/5,65/30/0.03/5,"
                                      "100/30/0.03/5,65/100/0.01/5,65/100/0.03/8,100/100/0.03/8")
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    args.subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, {datetime.date.today()}, load {os.getloadavg()[0]:.1f} at start")
    print("# " + " ".join(["python", "bench/bench_heldout.py", *(sys.argv[1:] if argv is None else argv)]))
    model, tok = load_model(args.model)
    {"grid": grid, "carry": carry}[args.what](args, model, tok)


if __name__ == "__main__":
    main()
