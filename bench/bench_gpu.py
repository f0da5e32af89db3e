"""GROM at the paper's shapes on a GPU, one command: seconds and peak memory per stage
(load, scores, keys, solve, apply) beside the memory plan's prediction (`grom.closed_form.memory_plan`).

    python bench/bench_gpu.py                             # both workloads, cuda, bfloat16
    python bench/bench_gpu.py --workload tofu-1b          # one of them
    python bench/bench_gpu.py --device cpu --scale 0.05   # scaled down, on this CPU
    python bench/bench_gpu.py --plan-only                 # the plan at full size, nothing run

Workloads (models randomly initialised from the paper's configs: nothing is downloaded;
the seconds and bytes of an edit do not depend on the weights' values):

- tofu-1b: Llama-3.2-1B (hidden 2048, MLP 8192, 16 layers, vocabulary 128256, tied head),
  TOFU-10%: 400 forget and 3600 retain QA pairs of about 40 tokens (15-word question,
  25-word answer; one token per word), the paper's band 11-15, beta 65, w_r 100 (PRESETS
  "tofu10"). The paper: 0.5 minutes on an H100.
- muse-8b: Llama-3.1-8B (hidden 4096, MLP 14336, 32 layers, vocabulary 128256), a
  MUSE-News-sized synthetic corpus: 1M forget and 1M retain tokens in 512-token windows,
  band 28-31 (PRESETS "muse-news"). `--layers N` keeps N layers (the band: the last
  four), for a GPU that cannot hold the whole model.

`--scale S` multiplies the widths (hidden and MLP rounded to 64, vocabulary), and the
token counts by S; the layers and the band stay. Peak memory: torch.cuda.max_memory_allocated
per stage (reset between stages), on the CPU the growth of the resident set's high-water
mark (VmHWM, reset through /proc/self/clear_refs) over the resident set before loading.
The stages: load (the model built on the device), scores (the logit-lens scores over every
layer, `score_prepared`), then within `run_edit` for each band layer: keys (the forward
passes and the Grams summed batch by batch, `LayerSolver.sum_keys`), solve (the factor and the
update), apply (the patch added, the weight kept for restore); seconds from edit.timings,
peaks the largest over the band's layers. The plan's stages: weights, forward, keys, solve.
Record the numbers in BENCHMARKS.md with the device's name.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import random
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, not installed
from bench_scaling import PeakMemory  # noqa: E402  (this folder is on sys.path)

from grom import PRESETS, run_edit  # noqa: E402
from grom.closed_form.layer_solver import LayerSolver  # noqa: E402
from grom.closed_form.memory_plan import GiB, WillNotFit, check_fits, free_bytes, plan_edit  # noqa: E402
from grom.closed_form.pipeline import prepare, score_prepared  # noqa: E402
from grom.data.prompts import PromptFormat  # noqa: E402
from grom.data.schema import QAExample, TextExample  # noqa: E402

log = logging.getLogger("bench_gpu")


@dataclass(frozen=True)
class Workload:
    """A paper model's shape, its data's size and its preset."""

    shape: dict
    preset: str
    n_forget: int  # QA pairs, or corpus tokens
    n_retain: int
    corpus: bool


WORKLOADS = {
    "tofu-1b": Workload(dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
                        "tofu10", 400, 3600, corpus=False),
    "muse-8b": Workload(dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
                        "muse-news", 1_000_000, 1_000_000, corpus=True),
}
WINDOW = 512  # corpus tokens per example (EditConfig.max_length)


class WordTokenizer:
    """One token per word (a seeded hash of it), so token counts are exact and free."""

    chat_template = None
    pad_token_id, eos_token_id = 0, 1

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=True, **_):
        ids = [2 + zlib.crc32(w.encode()) % (self.vocab - 2) for w in text.split()]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def scaled_shape(shape: dict, scale: float) -> dict:
    """Widths and vocabulary times `scale` (64-aligned, head width 64); layers kept."""
    r64 = lambda x: max(64, int(round(x * scale / 64)) * 64)  # noqa: E731
    h = r64(shape["hidden_size"])
    heads = h // 64
    kv = max(1, heads * shape["num_key_value_heads"] // shape["num_attention_heads"])
    return dict(shape, hidden_size=h, intermediate_size=r64(shape["intermediate_size"]), num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=max(512, int(shape["vocab_size"] * scale)))


def synthetic_data(w: Workload, scale: float, seed: int = 0):
    """(forget, retain): QA pairs of ~40 one-word tokens, or 512-word corpus windows."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(50_000)]
    text = lambda n: " ".join(rng.choices(words, k=n))  # noqa: E731
    nf, nr = max(2, int(w.n_forget * scale)), max(2, int(w.n_retain * scale))
    if w.corpus:
        windows = lambda tokens: [TextExample(text(WINDOW - 1)) for _ in range(max(1, tokens // WINDOW))]  # noqa: E731
        return windows(nf), windows(nr)
    qa = lambda n: [QAExample(text(15) + "?", text(25) + ".") for _ in range(n)]  # noqa: E731
    return qa(nf), qa(nr)


class StagePeaks:
    """Peak memory per stage: `mark(stage)` records the peak since the last mark (the
    largest of repeated stages) and starts the next."""

    def __init__(self, device: str):
        self.cuda, self.peaks = device.startswith("cuda"), {}
        self.base = 0 if self.cuda else PeakMemory.proc_status("VmRSS")
        self._reset()

    def _reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def mark(self, stage: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = PeakMemory.proc_status("VmHWM") - self.base
        self.peaks[stage] = max(self.peaks.get(stage, 0), peak)
        self._reset()


@contextlib.contextmanager
def marking_edit_stages(peaks: StagePeaks):
    """Marks keys / solve / apply inside `run_edit` by wrapping LayerSolver's steps (restored
    after): `sum_keys` (keys: forward passes and Grams), the system's `update` (solve), the
    rest of `solve_layer` (apply)."""
    sums, solve_layer = LayerSolver.sum_keys, LayerSolver.solve_layer

    def _sums(self, *args, **kwargs):
        out = sums(self, *args, **kwargs)
        peaks.mark("keys")
        sums_obj = out[0]
        system_of = sums_obj.system

        def system(*a, **k):  # the factor, then its update: the solve stage
            s = system_of(*a, **k)
            update = s.update

            def marked_update(*ua, **uk):
                P = update(*ua, **uk)
                peaks.mark("solve")
                return P
            s.update = marked_update
            return s
        sums_obj.system = system
        return out

    def _solve_layer(self, *args, **kwargs):
        out = solve_layer(self, *args, **kwargs)
        peaks.mark("apply")
        return out

    LayerSolver.sum_keys, LayerSolver.solve_layer = _sums, _solve_layer
    try:
        yield
    finally:
        LayerSolver.sum_keys, LayerSolver.solve_layer = sums, solve_layer


def run_workload(name: str, device: str, dtype: str, scale: float, layers: int | None,
                 plan_only: bool = False) -> dict:
    """One workload: the plan, then (unless plan_only) each stage timed and metered.
    Returns the seconds, peaks and the plan's stages (bytes)."""
    w = WORKLOADS[name]
    shape = scaled_shape(w.shape, scale) if scale != 1 else dict(w.shape)
    config = PRESETS[w.preset].replace(prompt_format=PromptFormat(kind="template"), keep_keys=False,
                                       max_length=WINDOW)
    if layers is not None:
        shape["num_hidden_layers"] = layers
        k = len(config.layers)
        config = config.replace(layers=tuple(range(layers - k, layers)))
    cfg = LlamaConfig(**shape, max_position_embeddings=2 * WINDOW)
    tok = WordTokenizer(cfg.vocab_size)
    forget, retain = synthetic_data(w, scale)
    plan = plan_edit(cfg, tok, forget, retain, config, dtype)
    print(f"\n## {name}: {shape}, band {list(config.layers)}, {len(forget)} forget / {len(retain)} retain "
          f"examples, {plan.settings['n_forget_tokens']:,} + {plan.settings['n_retain_tokens']:,} tokens, {dtype}")
    if plan_only:
        print(plan.describe())
        print(f"peak: {plan.peak / GiB:.2f} GiB at stage {plan.peak_stage!r}")
        return dict(plan=plan.stages)
    try:
        check_fits(plan, free_bytes(device), cfg, config)
    except WillNotFit as err:
        print(f"skipped: {err}")
        return {}
    peaks, seconds = StagePeaks(device), {}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=getattr(torch, dtype))
    model.eval().requires_grad_(False)
    seconds["load"] = time.perf_counter() - t0
    peaks.mark("load")
    t0 = time.perf_counter()
    scores = score_prepared(model, prepare(tok, forget, retain, config, cfg.vocab_size), config)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds["scores"] = time.perf_counter() - t0
    peaks.mark("scores")
    with marking_edit_stages(peaks):
        edit = run_edit(model, tok, forget, retain, config, scores=scores)
    seconds.update({k: edit.timings[k] for k in ("keys", "solve", "apply")}, total=edit.timings["total"])
    predicted = {"load": plan.stages["weights"], "scores": plan.stages["forward"], "keys": plan.stages["keys"],
                 "solve": plan.stages["solve"]}
    print(f"{'stage':<8} {'seconds':>8} {'peak GiB':>9} {'plan GiB':>9} {'ratio':>6}")
    for stage in ("load", "scores", "keys", "solve", "apply"):
        got, want = peaks.peaks.get(stage, 0), predicted.get(stage)
        ratio = f"{got / want:>6.2f}" if want else f"{'-':>6}"
        print(f"{stage:<8} {seconds[stage]:>8.2f} {got / GiB:>9.3f} "
              f"{(want / GiB if want else float('nan')):>9.3f} {ratio}")
    print(f"edit (tokenize, keys, solve, apply; scores given): {seconds['total']:.2f} s; "
          f"patch norm {edit.patch_norm():.3g}")
    return dict(seconds=seconds, peaks=peaks.peaks, plan=plan.stages)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--scale", type=float, default=1.0, help="widths and tokens times S (e.g. 0.05 on a CPU)")
    p.add_argument("--layers", type=int, help="keep N layers (the band: the last ones)")
    p.add_argument("--threads", type=int, help="torch threads (CPU)")
    p.add_argument("--plan-only", action="store_true", help="print the memory plan of each workload, run nothing")
    args = p.parse_args(argv)
    if args.plan_only:
        dtype = args.dtype or "bfloat16"
        return {n: run_workload(n, args.device, dtype, args.scale, args.layers, True)
                for n in (list(WORKLOADS) if args.workload == "all" else [args.workload])}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run with --device cpu --scale 0.05 (scaled down), or on a machine with CUDA")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else (platform.processor() or
                                                                                  platform.machine())
    print(f"# {name}, torch {torch.__version__}, device {args.device}, {dtype}, scale {args.scale}, "
          f"threads {torch.get_num_threads()}")
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    if args.device == "cpu" and (len(names) > 1 or os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536"):
        # the resident set measures only in a fresh process (no heap left by an earlier workload)
        # whose glibc hands large frees straight back (else freed buffers stay counted; tests/test_plan.py)
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        for n in names:
            rest = [a for a in (argv if argv is not None else sys.argv[1:])]
            done = subprocess.run([sys.executable, __file__, *rest, "--workload", n], env=env, text=True,
                                  capture_output=True)
            print(done.stdout.split("\n", 1)[1] if done.returncode == 0 else done.stdout, end="")
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
        return {}
    return {n: run_workload(n, args.device, dtype, args.scale, args.layers) for n in names}


if __name__ == "__main__":
    main()
