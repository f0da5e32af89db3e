"""Train the bundled demo models on the CPU: `python -m grom.demo.train`.

"full" learns every non-holdout author (QA pairs and biographies) plus the world's
general-knowledge sets; "retain" learns the same without the forget10 authors, as the
gold reference of unlearning. QA pairs are trained TOFU style: the chat-formatted prompt,
then the answer and EOS, with the loss on the answer tokens only (original pairs only:
paraphrases and perturbations are kept for evaluation).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import random
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grom.demo.model import demo_model_dir
from grom.demo.tokenizer import VOCAB_SIZE, build_tokenizer
from grom.demo.world import World, generate_world, load_demo_benchmark
from grom.eval.runner import encode_pair

log = logging.getLogger(__name__)
IGNORE = -100


def model_config(tok, layers: int = 6, hidden: int = 128) -> LlamaConfig:
    """A small Llama: `layers` blocks of width `hidden`, MLP 4x, 4 heads, untied head."""
    return LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=512, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, tie_word_embeddings=False)


def qa_tokens(tok, question: str, answer: str) -> tuple[list[int], list[int]]:
    """Chat prompt + answer + EOS (as the evaluation scores it); labels mask the prompt."""
    ids, start = encode_pair(tok, question, answer, None)
    return ids, [IGNORE] * start + ids[start:]


def text_tokens(tok, text: str) -> tuple[list[int], list[int]]:
    """BOS + text + EOS, loss on every token."""
    ids = tok(text)["input_ids"] + [tok.eos_token_id]
    return ids, list(ids)


def training_examples(world: World, tok, kind: str) -> list[tuple[list[int], list[int]]]:
    """The token sequences a model of `kind` ("full" or "retain") is trained on."""
    forget = {a.name for a in world.forget_authors("forget10")} if kind == "retain" else set()
    authors = [a for a in world.trained_authors if a.name not in forget]
    pairs = [qa for a in authors for qa in a.qa] + list(world.real_authors + world.world_facts)
    out = [qa_tokens(tok, qa.question, qa.answer) for qa in pairs]
    return out + [text_tokens(tok, a.bio) for a in authors]


def make_batches(examples, batch_size: int, rng: random.Random, pad_id: int):
    """One epoch of padded batches; lengths are bucketed to waste little padding."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    chunk = batch_size * 16
    groups = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: len(examples[i][0]))
        groups += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(groups)
    for group in groups:
        width = max(len(examples[i][0]) for i in group)
        ids = torch.full((len(group), width), pad_id)
        labels = torch.full((len(group), width), IGNORE)
        for row, i in enumerate(group):
            x, y = examples[i]
            ids[row, :len(x)], labels[row, :len(y)] = torch.tensor(x), torch.tensor(y)
        yield ids, labels, (ids != pad_id).long()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(model, examples, pad_id: int, *, epochs: int, steps: int | None, seed: int,
          lr: float = 3e-3, batch_size: int = 32) -> dict:
    """Train in place with AdamW; returns {'steps', 'seconds', 'final_loss'}."""
    rng = random.Random(seed)
    per_epoch = math.ceil(len(examples) / batch_size)
    total = steps if steps is not None else epochs * per_epoch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    step, start, recent = 0, time.time(), []
    while step < total:
        for ids, labels, mask in make_batches(examples, batch_size, rng, pad_id):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, lr, warmup=min(100, max(1, total // 20)))
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            recent = (recent + [loss.item()])[-per_epoch:]
            step += 1
            if step % per_epoch == 0 or step == total:
                log.info("step %d/%d loss %.4f (%.0f s)", step, total,
                         sum(recent) / len(recent), time.time() - start)
            if step >= total:
                break
    model.eval()
    return {"steps": step, "seconds": round(time.time() - start, 1),
            "final_loss": round(sum(recent) / len(recent), 4)}


def recall_scores(model, tok, examples) -> dict:
    """Mean ROUGE-L recall (stemmed) of greedy answers, and the share containing the fact."""
    from grom.eval.metrics import fact_recall, rouge_l_recall
    from grom.eval.runner import generate

    answers = generate(model, tok, [ex.question for ex in examples], batch_size=64)
    rouge = [rouge_l_recall(ex.answer, a) for ex, a in zip(examples, answers)]
    facts = [fact_recall(ex.fact, a) for ex, a in zip(examples, answers)]
    return {"rougeL_recall": round(sum(rouge) / len(rouge), 4),
            "fact_recall": round(sum(facts) / len(facts), 4), "n": len(examples)}


def evaluate(model, tok, world: World) -> dict:
    """Recall on the forget10 benchmark's QA evaluation sets."""
    sets = load_demo_benchmark("forget10", seed=world.seed).eval_sets  # the world it learned
    return {name: recall_scores(model, tok, sets[name])
            for name in ("forget", "retain", "real_authors", "world_facts", "holdout")}


def dir_size_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20, 2)


def train_kind(kind: str, world: World, tok, args) -> dict:
    """Train, save and evaluate one model; returns its report."""
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(model_config(tok, args.layers, args.hidden))
    examples = training_examples(world, tok, kind)
    log.info("%s model: %d parameters, %d training sequences", kind,
             sum(p.numel() for p in model.parameters()), len(examples))
    stats = train(model, examples, tok.pad_token_id, epochs=args.epochs, steps=args.steps,
                  seed=args.seed, lr=args.lr, batch_size=args.batch_size)
    out = Path(args.out) / f"demo-{kind}" if args.out else demo_model_dir(kind)
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, args.save_dtype)).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    model.float()
    report = {"kind": kind, "sequences": len(examples), **stats, "size_mb": dir_size_mb(out)}
    if not args.no_eval:
        report["recall"] = evaluate(model, tok, world)
    return report


def _train_worker(job: tuple[str, argparse.Namespace]) -> dict:
    """Train one model in a worker process (used to train both models in parallel)."""
    kind, args = job
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{kind}] %(message)s")
    torch.set_num_threads(max(1, args.threads // args.jobs))
    world = generate_world(args.seed)
    return train_kind(kind, world, build_tokenizer(world, args.vocab_size), args)


def train_all(args: argparse.Namespace) -> dict[str, dict]:
    """Train the requested models, the two of `--kind both` in parallel if `--jobs 2`."""
    kinds = ("full", "retain") if args.kind == "both" else (args.kind,)
    if len(kinds) == 1 or args.jobs == 1:
        args.jobs = 1
        return {kind: _train_worker((kind, args)) for kind in kinds}
    with multiprocessing.get_context("spawn").Pool(len(kinds)) as pool:
        return dict(zip(kinds, pool.map(_train_worker, [(kind, args) for kind in kinds])))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m grom.demo.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("full", "retain", "both"), default="both")
    p.add_argument("--epochs", type=int, default=14, help="passes over the data")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    p.add_argument("--out", default=None,
                   help="folder to write demo-full/ and demo-retain/ into (default: assets/)")
    p.add_argument("--seed", type=int, default=0, help="seed of the world and of training")
    p.add_argument("--threads", type=int, default=2, help="CPU threads in all")
    p.add_argument("--jobs", type=int, choices=(1, 2), default=2,
                   help="with --kind both: train the two models in 2 parallel processes "
                        "(threads split between them) or one after the other")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="BPE vocabulary size")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--save-dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--no-eval", action="store_true", help="skip the recall evaluation")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.time()
    reports = train_all(args)
    summary = {"seed": args.seed, "epochs": args.epochs, "steps_arg": args.steps,
               "vocab_size": args.vocab_size, "layers": args.layers, "hidden": args.hidden,
               "lr": args.lr, "batch_size": args.batch_size, "threads": args.threads,
               "jobs": args.jobs, "save_dtype": args.save_dtype,
               "wall_seconds": round(time.time() - start, 1), "models": reports}
    if "full" in reports:
        out = Path(args.out) / "demo-full" if args.out else demo_model_dir("full")
        (out / "TRAINING.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
