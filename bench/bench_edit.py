"""Time a GROM edit: streamed band (hidden states entering the band computed once) against
the replay path (a full forward pass per edited layer), split into keys / solve / apply.

    python bench/bench_edit.py                      # random Llama, CPU, synthetic QA
    python bench/bench_edit.py --layers 16 --hidden 512 --examples 400 --band 11-15
    python bench/bench_edit.py --device cuda --dtype bfloat16 --preset tofu-1b

Prints a table; numbers go into BENCHMARKS.md with the machine they came from.
"""
from __future__ import annotations

import argparse
import platform
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grom import EditConfig, run_edit
from grom.cli import _ints
from grom.data.prompts import PromptFormat
from grom.data.schema import QAExample

SHAPES = {  # the paper's models, randomly initialised (nothing is downloaded)
    "tofu-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "tofu-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
}


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
    p.add_argument("--examples", type=int, default=200, help="forget QA pairs (retain: 9x)")
    p.add_argument("--band", type=_ints, default=(3, 4, 5))
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    shape = SHAPES.get(args.preset) or dict(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                            num_hidden_layers=args.layers, num_attention_heads=8,
                                            num_key_value_heads=4, vocab_size=4096)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        model = LlamaForCausalLM(LlamaConfig(**shape)).to(dtype).eval().requires_grad_(False)
    tok = CharTokenizer(shape["vocab_size"])
    forget, retain = synthetic_qa(args.examples, 1), synthetic_qa(9 * args.examples, 2)
    base = EditConfig(layers=tuple(args.band), beta=65.0, w_r=100.0, batch_size=args.batch_size,
                      prompt_format=PromptFormat(kind="template"), keep_keys=False)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"device {args.device}, {args.dtype}, threads {torch.get_num_threads()}")
    print(f"# model {shape}, forget {len(forget)} / retain {len(retain)} QA pairs, band {list(args.band)}")
    print(f"{'path':>8} {'total s':>8} {'keys s':>8} {'solve s':>8} {'apply s':>8} {'fwd/keys':>9}")
    for stream in (True, False):
        best = None
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
        print(f"{'stream' if stream else 'replay':>8} {wall:>8.2f} {t['keys']:>8.2f} {t['solve']:>8.2f} "
              f"{t['apply']:>8.3f} {layers[0].n_forget_keys:>5}/{layers[0].n_retain_keys}")


if __name__ == "__main__":
    main()
