"""Probe which facts of the real-knowledge benchmark a chat model knows: every question of
every target and of general knowledge, and its paraphrase, answered greedily with the
tokenizer's chat template; a fact is known when the answer holds it (fact recall 1).

    python bench/probe_knowledge.py                                  # SmolLM2-135M-Instruct
    python bench/probe_knowledge.py --subjects harry-potter --dump answers.jsonl
    python bench/probe_knowledge.py --write-known                    # grom/data/knowledge/known.json
    python bench/probe_knowledge.py --subjects world-war-ii --write-known  # refresh those targets only

Prints a markdown table (per target: questions, known, known on the paraphrase); it goes
into grom/data/knowledge/README.md, and --write-known stores the per-pair result that
`load_knowledge(..., known_only=True)` reads.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grom.eval.metrics import fact_recall  # noqa: E402
from grom.eval.runner import generate  # noqa: E402
from grom.model.loading import load_model  # noqa: E402
from grom.tasks.knowledge import BUNDLED, KNOWN, knowledge  # noqa: E402


def probe(model, tok, qa, *, max_new_tokens: int, batch_size: int) -> list[dict]:
    """One row per pair: the greedy answers to the question and to its paraphrase."""
    prompts = [ex.question for ex in qa] + [ex.paraphrased_question for ex in qa]
    gens = generate(model, tok, prompts, prompt_format=None, max_new_tokens=max_new_tokens,
                    batch_size=batch_size)
    n = len(qa)
    return [{"id": ex.id, "subject": ex.subject, "question": ex.question, "fact": ex.fact,
             "answer": gens[i], "known": int(fact_recall(ex.fact, gens[i])),
             "paraphrase": ex.paraphrased_question, "paraphrase_answer": gens[n + i],
             "paraphrase_known": int(fact_recall(ex.fact, gens[n + i]))}
            for i, ex in enumerate(qa)]


def table(groups: dict[str, tuple[str, list[dict]]]) -> str:
    """The markdown table: one line per target (and general), then the total."""
    lines = ["| target | kind | questions | known | known on the paraphrase | both |",
             "|---|---|---:|---:|---:|---:|"]
    total = [0, 0, 0, 0]
    for tid, (kind, rows) in groups.items():
        counts = [len(rows), sum(r["known"] for r in rows), sum(r["paraphrase_known"] for r in rows),
                  sum(r["known"] and r["paraphrase_known"] for r in rows)]
        total = [a + b for a, b in zip(total, counts)]
        lines.append(f"| {tid} | {kind} | " + " | ".join(map(str, counts)) + " |")
    lines.append("| **all** | | " + " | ".join(f"**{c}**" for c in total) + " |")
    return "\n".join(lines)


def merge_known(path: Path, rows: list[dict], ids: list[str]) -> list[dict]:
    """`rows` (the probed targets) over the rows of the existing known.json, in the order
    of `ids` (every bundled pair): the other targets keep what they had."""
    old = json.loads(path.read_text(encoding="utf-8"))["known"] if path.is_file() else {}
    new = {r["id"]: r for r in rows}
    missing = [i for i in ids if i not in new and i not in old]
    if missing:
        raise SystemExit(f"known.json has no entry for {missing[0]!r}: probe its target too")
    return [new.get(i) or {"id": i, "known": old[i][0], "paraphrase_known": old[i][1]} for i in ids]


def write_known(path: Path, model_name: str, max_new_tokens: int, rows: list[dict]) -> None:
    """known.json: per pair id, [question known, paraphrase known], one pair a line."""
    body = ",\n".join(f'    {json.dumps(r["id"])}: [{r["known"]}, {r["paraphrase_known"]}]' for r in rows)
    path.write_text(
        "{\n"
        f'  "model": {json.dumps(model_name)},\n'
        f'  "how": "bench/probe_knowledge.py: greedy answers, chat template, {max_new_tokens} new tokens; '
        'known = fact recall 1 on [question, paraphrase]",\n'
        f'  "known": {{\n{body}\n  }}\n}}\n', encoding="utf-8")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="registry name, folder or Hub id")
    ap.add_argument("--source", default=None, help="a knowledge folder (default: the bundled one)")
    ap.add_argument("--subjects", "--targets", dest="subjects", nargs="*", default=None,
                    help="subject ids (and/or 'general'); default all")
    ap.add_argument("--limit", type=int, default=None, help="at most this many pairs per target")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dump", default=None, help="write every answer to this JSON-lines file")
    ap.add_argument("--table", default=None, help="also write the markdown table to this file")
    ap.add_argument("--write-known", action="store_true", help="write known.json into the knowledge folder")
    args = ap.parse_args(argv)
    if args.write_known and args.limit:
        ap.error("--write-known needs every pair of the probed targets: drop --limit")
    torch.set_num_threads(args.threads)
    know = knowledge(args.source)
    groups = {**know.targets, "general": know.general}
    wanted = args.subjects or list(groups)
    unknown = sorted(set(wanted) - set(groups))
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(groups)}")
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"model {args.model}, {args.max_new_tokens} new tokens", flush=True)
    t0 = time.perf_counter()
    model, tok = load_model(args.model, device=args.device)
    print(f"# model loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    results: dict[str, tuple[str, list[dict]]] = {}
    if args.dump:
        Path(args.dump).write_text("", encoding="utf-8")
    for tid in wanted:
        t0 = time.perf_counter()
        qa = groups[tid].qa[: args.limit]
        rows = probe(model, tok, qa, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
        results[tid] = (groups[tid].kind, rows)
        if args.dump:  # as it goes: a long probe can be read before it ends
            with open(args.dump, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        print(f"# {tid}: {sum(r['known'] for r in rows)}/{len(rows)} known, "
              f"{sum(r['paraphrase_known'] for r in rows)} on the paraphrase "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    md = table(results)
    print(md)
    every = [r for _, rows in results.values() for r in rows]
    if args.table:
        Path(args.table).write_text(md + "\n", encoding="utf-8")
    if args.write_known:
        folder = Path(args.source) if args.source else BUNDLED
        ids = [ex.id for group in groups.values() for ex in group.qa]
        write_known(folder / f"{KNOWN}.json", args.model, args.max_new_tokens,
                    merge_known(folder / f"{KNOWN}.json", every, ids))
        print(f"# wrote {folder / f'{KNOWN}.json'}")


if __name__ == "__main__":
    main()
