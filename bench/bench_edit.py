"""Time a GROM edit: streamed band (hidden states entering the band computed once) against
the replay path (a full forward pass per edited layer), split into keys / solve / apply.

    python bench/bench_edit.py                      # random Llama, CPU, synthetic QA
    python bench/bench_edit.py --layers 16 --hidden 512 --examples 400 --band 11-15
    python bench/bench_edit.py --device cuda --dtype bfloat16 --preset tofu-1b   # paper: 0.5 min on an H100
    python bench/bench_edit.py --device cuda --dtype bfloat16 --preset tofu-7b   # paper: 1.8 min

A preset takes the paper's model shape (randomly initialised: nothing is downloaded), its
band, beta and w_r (grom.PRESETS tofu10 / tofu5) and its forget / retain counts.

Prints a table; numbers go into BENCHMARKS.md with the machine they came from.
"""
from __future__ import annotations

import argparse
import platform
import random
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, not installed
from grom import PRESETS, run_edit  # noqa: E402
from grom.cli import layer_indices  # noqa: E402
from grom.data.prompts import PromptFormat  # noqa: E402
from grom.data.schema import QAExample  # noqa: E402

SHAPES = {  # the paper's models, randomly initialised (nothing is downloaded)
    "tofu-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,  # Llama-3.2-1B
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                    tie_word_embeddings=True),
    "tofu-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,  # Llama-2-7B
                    num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
}
PAPER = {  # preset -> (grom.PRESETS entry, forget QA pairs, retain QA pairs)
    "tofu-1b": ("tofu10", 400, 3600),  # TOFU-10%
    "tofu-7b": ("tofu5", 200, 3800),  # TOFU-5%
}


def peak_memory_gb(device: str) -> float:
    """Peak GPU memory allocated (CUDA), else the process's peak resident set."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


class CharTokenizer:
    """A stand-in tokenizer (one id per character) so the bench needs no files."""

    chat_template = None
    pad_token_id, eos_token_id = 0, 1

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=True, **_):
        ids = [2 + (ord(c) * 7919) % (self.vocab - 2) for c in text]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def synthetic_qa(n: int, seed: int, answer_words: int = 12) -> list[QAExample]:
    rng = random.Random(seed)
    word = lambda: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))  # noqa: E731
    return [QAExample(f"What is known about {word()} {word()}?",
                      " ".join(word() for _ in range(answer_words)) + ".") for _ in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(SHAPES), help="a paper model's shape")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--examples", type=int, help="forget QA pairs (default: the preset's, else 200)")
    p.add_argument("--retain", type=int, help="retain QA pairs (default: the preset's, else 9x forget)")
    p.add_argument("--band", type=layer_indices, help="layers to edit (default: the preset's, else 3-5)")
    p.add_argument("--paths", default="stream,replay", help="stream, replay, or stream,replay")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    paths = [name.strip() for name in args.paths.split(",") if name.strip()]
    if not paths or set(paths) - {"stream", "replay"}:
        p.error(f"--paths takes stream, replay or both comma-separated, not {args.paths!r}")

    shape = SHAPES.get(args.preset) or dict(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                            num_hidden_layers=args.layers, num_attention_heads=8,
                                            num_key_value_heads=4, vocab_size=4096)
    paper, n_forget, n_retain = PAPER.get(args.preset, ("tofu10", 200, None))
    if args.examples:  # a count of one's own: retain 9x unless given
        n_forget, n_retain = args.examples, None
    n_retain = args.retain or n_retain or 9 * n_forget
    recipe = PRESETS[paper]
    band = tuple(args.band) if args.band else (recipe.layers if args.preset else (3, 4, 5))
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    torch.set_default_dtype(dtype)  # built in the target dtype: no float32 copy of a 7B model
    with torch.device(args.device):
        model = LlamaForCausalLM(LlamaConfig(**shape)).eval().requires_grad_(False)
    torch.set_default_dtype(torch.float32)
    built = time.perf_counter() - t0
    tok = CharTokenizer(shape["vocab_size"])
    forget, retain = synthetic_qa(n_forget, 1), synthetic_qa(n_retain, 2)
    base = recipe.replace(layers=band, batch_size=args.batch_size,
                          prompt_format=PromptFormat(kind="template"), keep_keys=False)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else \
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"# {where}, torch {torch.__version__}, {args.dtype}; model built in {built:.1f} s")
    print(f"# model {shape}, {sum(t.numel() for t in model.parameters()) / 1e6:,.0f} M parameters")
    print(f"# forget {len(forget)} / retain {len(retain)} QA pairs, band {list(band)}, beta {base.beta}, "
          f"w_r {base.w_r}, rho {base.rho} (preset {paper})")
    print(f"{'path':>8} {'total s':>8} {'keys s':>8} {'solve s':>8} {'apply s':>8} "
          f"{'forget/retain keys':>19} {'peak GB':>8}")
    for stream in [path == "stream" for path in paths]:
        best = None
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.repeats):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            edit = run_edit(model, tok, forget, retain, base.replace(stream=stream))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            if best is None or wall < best[0]:
                best = (wall, edit.timings, edit.layers)
        wall, t, layers = best
        keys = f"{layers[0].n_forget_keys}/{layers[0].n_retain_keys}"
        print(f"{'stream' if stream else 'replay':>8} {wall:>8.2f} {t['keys']:>8.2f} {t['solve']:>8.2f} "
              f"{t['apply']:>8.3f} {keys:>19} {peak_memory_gb(args.device):>8.2f}", flush=True)


if __name__ == "__main__":
    main()
