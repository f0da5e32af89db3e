"""The paper's Time column at a paper shape: GROM's edit beside every trained method's update
and every editor, on one device, under the paper's runtime protocol.

    python bench/bench_gpu_methods.py                                   # tofu-1b, cuda, bfloat16
    python bench/bench_gpu_methods.py --device cpu --scale 0.05 --steps 3   # scaled down, on this CPU
    python bench/bench_gpu_methods.py --methods grom,npo,simnpo,rome    # some of them

The paper's protocol (appendix "Runtime protocol"): wall-clock of the update alone, no model
loading, no evaluation. For GROM: keys, normal equations, solve and the write-back
(`run_edit`'s total, the layer scores given), and the layer scores themselves beside it. For
a trained method: the optimisation loop (`timings["train"]`, which holds the one-off work
before the first step: the unedited model's log-probabilities, a reference copy of the
weights) with the recipe's budget, TOFU's: 10 epochs at an effective batch of 32 (8 x 4
accumulation), 130 optimizer steps for 400 forget questions; RMU's own recipe where it has
one. Running every method to its end would take the device time of many sessions, so each
runs `--steps` optimizer steps and the rest is extrapolated at the median pace of the steps
after the first (the first carries the allocator's warm-up): full = measured loop + (N -
steps) x step. AltPO's model-written alternates (5 per question, up to 64 new tokens) are
timed on `--alt-questions` questions and scaled to the forget set; its training then runs on
5 alternates per question (5 x the rows, as upstream's AltPO data). The editors run whole:
one shared value optimisation (`optimise_values`, timed once) and each rule on the studio's
editor band (`editor_band`: upstream's layers 4-8, since GROM's 11-15 ends at the top).

The model: the workload's shape from bench_gpu (Llama-3.2-1B for tofu-1b), randomly
initialised; the seconds of an update do not depend on the weights' values, except where a
method stops early or generates (AltPO's alternates run to their token budget here, an upper
bound). The data: TOFU-shaped synthetic QA written from real words of the tokenizer's
vocabulary (a real tokenizer, `--tokenizer`, SmolLM2's by default: the editors need offsets
and a chat template), 20 questions per author as TOFU's forget splits, the author's name in
each question (the editors' subject), a 15-word question and a 25-word answer.
Record the numbers in BENCHMARKS.md with the device's name.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere, not installed
from bench_gpu import WORKLOADS, scaled_shape  # noqa: E402  (this folder is on sys.path)

from grom import PRESETS, run_edit  # noqa: E402
from grom.closed_form.pipeline import prepare, score_prepared  # noqa: E402
from grom.data.encoding import pad_id  # noqa: E402
from grom.data.prompts import PromptFormat  # noqa: E402
from grom.data.schema import QAExample  # noqa: E402
from grom.methods import EDITORS, METHODS, EditorConfig, generate_alternates, get_method, run_baseline  # noqa: E402
from grom.methods.editors.locate_then_edit import editor_band, run_editor  # noqa: E402
from grom.methods.editors.value_optimisation import ValueSettings, encode_fact, optimise_values  # noqa: E402
from grom.methods.trained.settings import resolve_settings  # noqa: E402
from grom.methods.trained.training_loop import planned_steps  # noqa: E402

PER_AUTHOR = 20  # TOFU: 20 questions per author, forget splits are whole authors
ALTERNATES = 5  # AltPO: alternates per question (upstream's)


def vocabulary_words(tokenizer, n: int = 4000) -> list[str]:
    """Real lower-case words that the tokenizer reads as one token after a space."""
    words = []
    for piece in tokenizer.get_vocab():
        w = piece[1:] if piece[:1] in ("\u0120", "\u2581") else None
        if w and w.isalpha() and w.islower() and 4 <= len(w) <= 10:
            words.append(w)
    words.sort()
    return random.Random(0).sample(words, min(n, len(words)))


def synthetic_tofu(tokenizer, n_forget: int, n_retain: int, seed: int = 0) -> tuple[list, list]:
    """TOFU-shaped QA pairs: authors of 20 questions each; each question names its author."""
    rng = random.Random(seed)
    words = vocabulary_words(tokenizer)
    text = lambda k: " ".join(rng.choices(words, k=k))  # noqa: E731

    def split(n: int, tag: str) -> list[QAExample]:
        out = []
        for i in range(n):
            if i % PER_AUTHOR == 0:
                author = " ".join(w.capitalize() for w in rng.sample(words, 2))
            fact = rng.choice(words)
            answer = f"{text(12)} {fact} {text(12)}."
            out.append(QAExample(f"What did {author} say about {text(10)}?", answer, fact=fact, subject=author,
                                 id=f"{tag}{i}"))
        return out
    return split(n_forget, "f"), split(n_retain, "r")


def synced(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class StepClock:
    """The times at which a run's optimizer steps end (from `progress`)."""

    def __init__(self):
        self.ends: list[float] = []

    def __call__(self, fraction: float, message: str) -> None:
        if ": loss" in message:  # the message after a whole optimizer step
            self.ends.append(time.perf_counter())


def time_method(name: str, model, tok, forget, retain, fmt, steps: int, epochs: float, device: str,
                alt_questions: int) -> dict:
    """One trained method: `steps` optimizer steps measured, the recipe's run extrapolated."""
    row = get_method(name)
    extra, alt_seconds = {}, 0.0
    if name == "altpo":  # its alternates are model-written: timed here, given to the training
        k = min(alt_questions, len(forget))
        synced(device)
        t0 = time.perf_counter()
        generate_alternates(model, tok, forget[:k], n=ALTERNATES, prompt_format=fmt)
        synced(device)
        alt_seconds = (time.perf_counter() - t0) * len(forget) / k
        extra["alternates"] = [[f"{ex.answer.split('.')[0]} alt {j}." for j in range(ALTERNATES)] for ex in forget]
    s = resolve_settings(name, epochs=epochs)
    rows = len(forget) * (ALTERNATES if name == "altpo" else 1)
    full_steps, _ = planned_steps(s, rows)
    clock = StepClock()
    reset_peak(device)
    edit = run_baseline(name, model, tok, forget, retain, prompt_format=fmt, epochs=epochs,
                        max_steps=min(steps, full_steps), progress=clock, **extra)
    synced(device)
    loop = edit.timings["train"]
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    step = statistics.median(gaps) if gaps else loop / max(1, len(clock.ends))
    done = len(clock.ends)
    full = loop + max(0, full_steps - done) * step + alt_seconds
    return dict(method=name, label=row.label, measured_steps=done, loop_s=loop, step_s=step,
                recipe_steps=full_steps, alternates_s=alt_seconds, full_s=full, peak_gib=peak_gib(device),
                lr=s.lr, schedule=s.schedule, trained=s.params or "all")


def time_grom(model, tok, forget, retain, config, device: str) -> dict:
    reset_peak(device)
    synced(device)
    t0 = time.perf_counter()
    scores = score_prepared(model, prepare(tok, forget, retain, config, model.config.vocab_size), config)
    synced(device)
    t_scores = time.perf_counter() - t0
    edit = run_edit(model, tok, forget, retain, config, scores=scores)
    synced(device)
    return dict(method="grom", label="GROM", scores_s=t_scores, full_s=edit.timings["total"],
                keys_s=edit.timings.get("keys"), solve_s=edit.timings.get("solve"), peak_gib=peak_gib(device),
                band=list(config.layers))


def time_editors(names, model, tok, forget, retain, fmt, layers, device: str) -> list[dict]:
    """The shared value optimisation once, then each rule (run_editor reusing it)."""
    # stop_loss 0: every value optimisation runs its 25 steps, the upper bound (on a random model
    # the answer is improbable already and the early stop would end it at the first step)
    config = EditorConfig(layers=tuple(layers), prompt_format=fmt, values=ValueSettings(stop_loss=0.0))
    facts = [encode_fact(tok, ex, fmt, config.max_length) for ex in forget]
    synced(device)
    t0 = time.perf_counter()
    values = optimise_values(model, facts, layers[-1], pad_id(tok), config.values)
    synced(device)
    t_values = time.perf_counter() - t0
    out = []
    for name in names:
        reset_peak(device)
        edit = run_editor(name, model, tok, forget, retain, config, values=values)
        synced(device)
        rule = edit.timings["total"] - edit.timings.get("values", 0.0)
        out.append(dict(method=name, label=EDITORS[name].label, values_s=t_values, rule_s=rule,
                        full_s=t_values + rule, value_steps=values.steps, peak_gib=peak_gib(device)))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["tofu-1b"], default="tofu-1b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--scale", type=float, default=1.0, help="widths and example counts times S")
    p.add_argument("--tokenizer", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    p.add_argument("--methods", default="all", help="comma-separated: grom, trained methods, editors; or all")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps measured per trained method")
    p.add_argument("--epochs", type=float, default=10.0, help="the recipe's epochs (TOFU: 10)")
    p.add_argument("--alt-questions", type=int, default=16, help="questions AltPO's alternates are timed on")
    p.add_argument("--budget", type=float, default=float("inf"), help="seconds: skip what is left after")
    p.add_argument("--json", help="write the rows here as they come")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run with --device cpu --scale 0.05, or on a machine with CUDA")
    logging.basicConfig(level=logging.WARNING)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    w = WORKLOADS[args.workload]
    shape = scaled_shape(w.shape, args.scale) if args.scale != 1 else dict(w.shape)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    shape["vocab_size"] = max(shape["vocab_size"], len(tok))  # every token id an embedding row (scaled down)
    n_f = max(PER_AUTHOR, int(w.n_forget * args.scale) // PER_AUTHOR * PER_AUTHOR)
    forget, retain = synthetic_tofu(tok, n_f, max(PER_AUTHOR, int(w.n_retain * args.scale)))
    fmt = PromptFormat(kind="template")
    config = PRESETS[w.preset].replace(prompt_format=fmt, keep_keys=False)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else (platform.processor() or
                                                                                  platform.machine())
    every = ["grom", *METHODS, *EDITORS]
    chosen = every if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        raise SystemExit(f"unknown method {unknown[0]!r}: choose from {', '.join(every)}")
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM._from_config(LlamaConfig(**shape, max_position_embeddings=1024),
                                              dtype=getattr(torch, dtype))
    model.eval().requires_grad_(False)
    print(f"# {name}, torch {torch.__version__}, {args.device}, {dtype}, {args.workload} {shape}, "
          f"{len(forget)} forget / {len(retain)} retain, band {list(config.layers)}", flush=True)
    rows, t_start = [], time.perf_counter()

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))

    editors = [m for m in chosen if m in EDITORS]
    for m in chosen:
        if time.perf_counter() - t_start > args.budget:
            print(f"# budget spent: {m} and the rest skipped", flush=True)
            break
        try:
            if m == "grom":
                record(time_grom(model, tok, forget, retain, config, args.device))
            elif m in METHODS:
                record(time_method(m, model, tok, forget, retain, fmt, args.steps, args.epochs, args.device,
                                   args.alt_questions))
            elif m == editors[0]:  # the studio's band for them: below the top (GROM's tofu10 band ends there)
                band = editor_band(config.layers, shape["num_hidden_layers"])
                for row in time_editors(editors, model, tok, forget, retain, fmt, list(band), args.device):
                    record(row)
        except Exception as err:  # one method's failure must not lose the others' rows
            record(dict(method=m, error=f"{type(err).__name__}: {err}"[:400]))
    grom = next((r["full_s"] for r in rows if r.get("method") == "grom" and "full_s" in r), None)
    print(f"\n{'method':<12} {'steps':>9} {'s/step':>7} {'update s':>9} {'min':>6} {'x GROM':>7} {'peak GiB':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['method']:<12} error: {r['error'][:100]}")
            continue
        steps = f"{r['measured_steps']}/{r['recipe_steps']}" if "recipe_steps" in r else "-"
        step = f"{r['step_s']:.3f}" if "step_s" in r else "-"
        ratio = f"{r['full_s'] / grom:.0f}" if grom else "-"
        print(f"{r['method']:<12} {steps:>9} {step:>7} {r['full_s']:>9.1f} {r['full_s'] / 60:>6.2f} {ratio:>7} "
              f"{r['peak_gib']:>8.2f}")
    return rows


if __name__ == "__main__":
    main()
