"""How often fact recall's keyword match credits a wrong answer (issue 37, item 4).

    python bench/keyword_credit.py                          # generate once (kept in /tmp), then classify
    python bench/keyword_credit.py --answers answers.jsonl  # the answers in (or into) that file
    python bench/keyword_credit.py --show                   # and every credited answer, as read

A fact counts as known, and later as forgotten, by a keyword match: the answer holds the
fact's words (`grom.eval.metrics.fact_recall`). This script takes the unedited model's
greedy answers on every question of the default split's QA sets (forget, probes,
neighbours, general; the whole sets, not only the facts known.json marks), exactly as the
studio's comparison decodes them (`grom.eval.evaluate`, the "answers" stage: the chat
template, one budget, each answer stopped once it states its fact), and prints, on every
question and on the studio's sets (the pairs known.json marks known, what the studio
evaluates on SmolLM2):

- the share of answers the keyword match credits;
- of those, the share that read by hand (`WRONG`, `GARBLED`: all 103 credited answers
  were read) give another answer or several conflicting ones ("wrong"), or name the fact
  without stating it as the answer ("garbled");
- the share the card's rule doubts (`components.views.card.doubtful_credit`: a wrong
  answer's value named too, something else named first, the fact a word of the question,
  a negation before it, or the fact only after a story), and how it agrees with the
  reading;
- a markdown table of these, for BENCHMARKS.md.

The answers are written to `--answers` (JSON lines) the first time, so that the one slow
generation pass (SmolLM2 on 2 CPU cores: minutes on a quiet machine, 22 minutes on a loaded
one) is not repeated.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.views.card import doubtful_credit, wilson, wrong_values  # noqa: E402
from grom.data import load_benchmark  # noqa: E402
from grom.tasks.knowledge import knowledge  # noqa: E402

SETS = ("forget", "probes", "neighbours", "general")

WRONG = ("the-solar-system/04", "the-solar-system/07", "albert-einstein/09", "ancient-egypt/20", "japan/18",
         "the-human-body/46", "william-shakespeare/27", "world-war-ii/02", "world-war-ii/38")
"""Credited answers that, read by hand (2026-11-27, all 103 credited answers of the default
split), give another answer or several conflicting ones beside the keyword: "The planet
known as Europa is indeed famous for its beautiful rings ... from Saturn", "The planet we
live on is called Kepler-41B ... similar to Earth", "around 1954 ... possibly in 1955", "the
Capuletto family, who are the Montague family", "a global catastrophe that lasted from
1945 to", "The German occupation of Germany ... led by ... the Soviet Union"."""
GARBLED = ("the-solar-system/06", "the-solar-system/09", "the-solar-system/25", "the-solar-system/38",
           "ancient-egypt/02", "ancient-egypt/22", "the-beatles/09", "the-human-body/03", "the-human-body/09",
           "the-human-body/39")
"""Credited answers that name the fact but do not state it as the answer: a false claim
around it ("The planet closest to Earth is Jupiter" for the Great Red Spot, "Egypt is a
continent ... of North Africa"), the question echoed ("The American Space Shuttle
Programme"), or a sentence that answers something else ("one of the most iconic organs is
the human lungs"). Every other credited answer states its fact as the answer (a side
detail may be off: "born on January 4, 1879" for the year)."""


def generate_answers(split: str, path: Path) -> list[dict]:
    """The unedited model's answers on every QA question of `split`, as the studio decodes
    them, one row per question, written to `path`."""
    import torch

    from grom.eval import evaluate
    from grom.model.loading import load_model

    torch.manual_seed(0)
    bench = load_benchmark("real-knowledge", split)
    model, tok = load_model("smollm2-135m-instruct", local_files_only=True)
    report = evaluate(model, tok, bench, stage="answers")
    rows = []
    for name in SETS:
        frame = report.examples("Base", name)
        for ex, (_, r) in zip(bench.eval_sets[name], frame.iterrows()):
            assert ex.question == r["question"]
            rows.append({"set": name, "id": ex.id, "question": ex.question, "fact": ex.fact,
                         "answer": ex.answer, "wrong": wrong_values(ex.answer, ex.perturbed_answers),
                         "generation": r["generation"], "credited": bool(r["fact_recall"]),
                         "class": r.get("answer_class", "")})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} answers in {report.seconds:.0f} s, written to {path}")
    return rows


def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.0%} (95%: {lo:.0%}-{hi:.0%})" if n else "0/0"


def doubt(r: dict) -> str:
    return doubtful_credit(r["question"], r["fact"], r["generation"], r["wrong"])


def reading(r: dict) -> str:
    """The reading by hand of a credited answer: "wrong", "garbled" or "right"."""
    return "wrong" if r["id"] in WRONG else "garbled" if r["id"] in GARBLED else "right"


def measure(rows: list[dict], known: dict | None) -> None:
    """Print the shares (see the module's docstring) on every question and on the studio's
    sets (the pairs known.json marks known: what the studio evaluates on SmolLM2), then a
    markdown table of them."""
    table = ["| questions | answers | credited by the keyword | of those, wrong or conflicting | "
             "garbled (the fact named, not stated) | doubted by the card's rule | rule: wrong or garbled caught | "
             "rule: right ones doubted |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    studio = [r for r in rows if known and known.get(r["id"], (0,))[0]]
    for what, chosen in (("every question", rows), ("the studio's sets (known.json)", studio)):
        credited = [r for r in chosen if r["credited"]]
        doubts = Counter(doubt(r) for r in credited)
        flagged = [r for r in credited if doubt(r)]
        wrong = [r for r in credited if reading(r) == "wrong"]
        garbled = [r for r in credited if reading(r) == "garbled"]
        bad = [r for r in credited if reading(r) != "right"]
        caught = [r for r in flagged if reading(r) != "right"]
        print(f"\n{what}: {len(chosen)} answers; credited by the keyword match: {share(len(credited), len(chosen))}")
        print(f"  read by hand, wrong or conflicting: {share(len(wrong), len(credited))}; garbled: "
              f"{share(len(garbled), len(credited))}; either: {share(len(bad), len(credited))}")
        print(f"  doubted by the card's rule: {share(len(flagged), len(credited))} "
              f"({', '.join(f'{k} {v}' for k, v in sorted(doubts.items()) if k) or 'none'}); it catches "
              f"{len(caught)} of the {len(bad)} wrong or garbled ({sum(reading(r) == 'wrong' for r in caught)} of the "
              f"{len(wrong)} wrong) and doubts {len(flagged) - len(caught)} of the {len(credited) - len(bad)} right")
        for name in SETS:
            mine = [r for r in credited if r["set"] == name]
            print(f"  {name}: {len([r for r in chosen if r['set'] == name])} answers, {len(mine)} credited, "
                  f"{sum(reading(r) == 'wrong' for r in mine)} wrong, {sum(reading(r) == 'garbled' for r in mine)} "
                  f"garbled, {sum(bool(doubt(r)) for r in mine)} doubted")
        n = len(credited)
        table.append(f"| {what} | {len(chosen)} | {len(credited)} ({len(credited) / len(chosen):.0%}) | "
                     f"{len(wrong)} ({len(wrong) / n:.0%}) | {len(garbled)} ({len(garbled) / n:.0%}) | "
                     f"{len(flagged)} ({len(flagged) / n:.0%}) | {len(caught)} of {len(bad)} | "
                     f"{len(flagged) - len(caught)} of {n - len(bad)} |")
    print("\n" + "\n".join(table))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="the-solar-system")
    ap.add_argument("--answers", type=Path, default=Path(tempfile.gettempdir()) / "keyword_credit_answers.jsonl",
                    help="JSON lines of the answers: read where it exists, else generated and written")
    ap.add_argument("--show", action="store_true", help="print every credited answer, its rule's verdict")
    args = ap.parse_args(argv)
    if args.answers.exists():
        rows = [json.loads(line) for line in args.answers.read_text(encoding="utf-8").splitlines() if line]
    else:
        rows = generate_answers(args.split, args.answers)
    if args.show:
        for r in rows:
            if r["credited"]:
                print(f"[{r['id']}] {doubt(r) or 'plain'} {reading(r)} | {r['question']} -> "
                      f"{r['generation']!r} (fact {r['fact']!r}; wrong {r['wrong']})")
    measure(rows, knowledge().known)


if __name__ == "__main__":
    main()
