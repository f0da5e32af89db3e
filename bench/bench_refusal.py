"""GROM's refusal target against suppression on SmolLM2 real-knowledge (issue 25 item 3).

    python bench/bench_refusal.py --betas 65,150,300 --w-r 100 --max-examples 20 --retain-examples 128
    python bench/bench_refusal.py --betas 100 --idk 1e-4@10,3e-4@10   # and IDK-NLL beside it

One suppression edit at the `smollm2` preset (its automatic band), then refusal edits on
the same band (the refusal target scores its band on the forget answers, as suppression
does, so the scores are reused) at each beta and w_r, every other setting the preset's. Each edit
is evaluated on the facts SmolLM2 was probed to know (`known_only`): the share of known
forget facts answered with a refusal, another fluent answer, or degenerate text
(`grom.eval.metrics.answer_class`), the forget answers' perplexity under the unedited
model, kept fact recall and the retain cost; the refusals said on the kept sets (an edit
that refuses everything would show there); and a few forget answers to read.

--idk LR@EPOCHS,...: IDK-NLL (`grom.methods`, the trained counterpart: NLL of a seeded
"I don't know" answer on each forget question plus the retain NLL, OpenUnlearning's
recipe otherwise: batch 8 x 4, AdamW, linear schedule) at each learning rate and number
of epochs, evaluated the same way; its "edit s" is the training time.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom import PRESETS, run_edit  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.eval import evaluate  # noqa: E402
from grom.eval.prefix import PrefixCache  # noqa: E402
from grom.methods import run_baseline  # noqa: E402
from grom.model.loading import load_model  # noqa: E402

COLUMNS = ["Forget fact recall", "Forget refusal", "Forget fluent other", "Forget degenerate",
           "Forget answer perplexity", "Forget paraphrase recall", "Kept fact recall", "Retain cost",
           "Text perplexity", "Knowledge score"]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def md_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--split", default="the-solar-system")
    ap.add_argument("--betas", default="65,150,300", help="the refusal target's strengths")
    ap.add_argument("--w-r", default="100", help="the refusal target's retain weights (the preset's: 100)")
    ap.add_argument("--refusal", default=None, help="one refusal for every question (default: the built-in set)")
    ap.add_argument("--max-examples", type=int, default=20)
    ap.add_argument("--retain-examples", type=int, default=128)
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--show", type=int, default=4, help="forget answers shown per edit")
    ap.add_argument("--idk", default="", help="IDK-NLL runs beside the edits, as LR@EPOCHS,... (e.g. 1e-4@10)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    bench = load_benchmark("real-knowledge", args.split, known_only=True)
    retain = tuple(random.Random(args.seed).sample(bench.retain, min(args.retain_examples, len(bench.retain))))
    bench = dataclasses.replace(bench, retain=retain)
    base_cfg = PRESETS["smollm2"].replace(prompt_format=bench.prompt_format)
    configs = [("suppression", base_cfg)] + [
        ("refusal", base_cfg.replace(target="refusal", beta=b, w_r=w, refusal=args.refusal))
        for w in map(float, args.w_r.split(",")) for b in map(float, args.betas.split(","))]
    base, scores, prefix, stream = None, None, PrefixCache(), {}
    rows, classes, shown = [], [], []
    idk = [tuple(map(float, spec.split("@"))) for spec in args.idk.split(",") if spec.strip()]
    band = None
    for name, cfg in configs + [("IDK-NLL", (lr, epochs)) for lr, epochs in idk]:
        t0 = time.perf_counter()
        if name == "IDK-NLL":
            lr, epochs = cfg
            edit = run_baseline("idknll", model, tok, bench.forget, bench.retain, lr=lr, epochs=epochs,
                                prompt_format=bench.prompt_format, seed=args.seed)
        else:
            edit = run_edit(model, tok, bench.forget, bench.retain, cfg, scores=scores, stream_cache=stream)
            scores, band = scores or edit.scores, band or edit.band
        secs = time.perf_counter() - t0
        rep = evaluate(model, tok, bench, edit=edit, max_examples=args.max_examples, reuse=base, prefix=prefix,
                       batch_size=args.eval_batch_size, record_at=(band[0],))
        base = base or rep
        m = rep.rows["Edited"].metrics
        if name == "IDK-NLL":
            label = [name, f"lr {lr:g}", f"{epochs:g} epochs", "all weights", f"{secs:.1f}"]
        else:
            label = [name, f"{cfg.beta:g}", f"{cfg.w_r:g}", f"{edit.band[0]}-{edit.band[-1]}", f"{secs:.1f}"]
        _log(f"{' '.join(label[:3])}: {secs:.1f} s, refusal {m.get('Forget refusal', 0):.2f}")
        rows.append(label + [f"{m[k]:.3g}" if k in m else "-" for k in COLUMNS])
        for set_name, c in rep.answer_classes().items():
            classes.append(label[:3] + [set_name, *(str(v) for v in c.values())])
        df = rep.examples("Edited", "forget")
        for _, r in df.head(args.show).iterrows():
            shown.append(label[:3] + [r["question"], r["generation"].replace("\n", " ")[:100], r["answer_class"]])
    print(f"\n### refusal against suppression, {args.split}, known facts, {len(retain)} retain examples, "
          f"up to {args.max_examples} evaluated per set; known: {base.known_facts('Base')}\n")
    print(md_table(["target", "beta", "w_r", "band", "edit s", *COLUMNS], rows))
    print("\n" + md_table(["target", "beta", "w_r", "set", "kept", "refusal", "fluent", "degenerate"], classes))
    print("\n" + md_table(["target", "beta", "w_r", "question", "answer", "class"], shown))


if __name__ == "__main__":
    main()
