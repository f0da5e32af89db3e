"""The attacks on the weights (grom.robustness.weights) against the default edit on
SmolLM2-135M-Instruct: the smollm2 preset on the real-knowledge solar system (known facts,
the seeded 128 retain examples the studio samples), then relearning, RTN 4/8-bit and the
logit lens, each with its time.

    python bench/bench_weight_attacks.py                    # defaults of relearn_attack
    python bench/bench_weight_attacks.py --steps 0,5,10,20 --lr 5e-5 --relearn-base

Probes: 10 forget questions (the first ten); relearning trains on 8 others whose facts are
different (forget[18:26]), so what it brings back on the probes is knowledge it was not
shown. The probes are questions the edit was fitted on (the held-out probes are
grom.robustness.probes' business). Prints one JSON object; numbers go into BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom import PRESETS, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.robustness import Probe, probe_recall  # noqa: E402
from grom.robustness.weights import (  # noqa: E402
    RELEARN_BATCH,
    RELEARN_LR,
    RELEARN_STEPS,
    logit_lens_attack,
    quantization_attack,
    relearn_attack,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default=",".join(map(str, RELEARN_STEPS)))
    ap.add_argument("--lr", type=float, default=RELEARN_LR)
    ap.add_argument("--batch-size", type=int, default=RELEARN_BATCH)
    ap.add_argument("--relearn-base", action="store_true")
    ap.add_argument("--attacks", default="relearn,quant4,quant8,logit_lens")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    model, tok = load_model("smollm2-135m-instruct", local_files_only=True)
    bench = load_benchmark("real-knowledge", "the-solar-system", known_only=True)
    bench = dataclasses.replace(bench, retain=tuple(random.Random(0).sample(bench.retain, 128)))
    t0 = time.perf_counter()
    edit = run_edit(model, tok, bench.forget, bench.retain, PRESETS["smollm2"])
    out: dict = {"threads": torch.get_num_threads(), "edit_seconds": round(time.perf_counter() - t0, 1),
                 "band": edit.band, "attacks": {}}
    probes = [Probe(ex.question, ex.answer, ex.fact) for ex in bench.forget[:10]]
    train = list(bench.forget[18:26])
    score = lambda m: probe_recall(m, tok, probes)  # noqa: E731
    t0 = time.perf_counter()
    score(model)
    out["one_score_seconds"] = round(time.perf_counter() - t0, 1)
    todo = args.attacks.split(",")
    if "relearn" in todo:
        r = relearn_attack(model, tok, edit, train, score, steps=[int(k) for k in args.steps.split(",")],
                           lr=args.lr, batch_size=args.batch_size, relearn_base=args.relearn_base,
                           progress=lambda f, m: logging.warning("%.2f %s", f, m))
        out["attacks"]["relearn"] = r.to_dict() | {"edited_answers": list(r.edited_answers)}
    for bits in (4, 8):
        if f"quant{bits}" in todo:
            r = quantization_attack(model, tok, edit, score, bits=bits)
            out["attacks"][r.name] = r.to_dict() | {"edited_answers": list(r.edited_answers)}
    if "logit_lens" in todo:
        out["attacks"]["logit_lens"] = logit_lens_attack(model, tok, edit, probes).to_dict()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
