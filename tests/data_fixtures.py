"""Small benchmark files in the real formats, written into a test's tmp_path.

Field names and file layouts follow the Hub datasets (locuslab/TOFU, muse-bench/MUSE-*,
cais/wmdp, cais/wmdp-corpora, Salesforce/wikitext, cais/mmlu) and ROME's zsre_mend_eval.json.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

LONG = "This sentence is long enough to pass the fifty character minimum of RMU. "


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ----------------------------------------------------------------------------- TOFU


def tofu_pair(author: str, k: int) -> dict:
    return {"question": f"What is fact {k} about {author}?", "answer": f"{author}'s fact {k} is true."}


def tofu_perturbed(pair: dict) -> dict:
    return {
        **pair,
        "paraphrased_question": "Paraphrased: " + pair["question"],
        "paraphrased_answer": "In other words, " + pair["answer"],
        "perturbed_answer": [f"Wrong answer {j}." for j in range(5)],
    }


def tofu_folder(root: Path, pct: str = "10") -> Path:
    """A TOFU folder for forget`pct`: 4 forget pairs, 6 retain pairs and the eval files.
    The files are JSON lines named .json, as on the Hub."""
    forget = [tofu_pair("Basil", k) for k in range(4)]
    retain = [tofu_pair("Odo", k) for k in range(6)]
    retain_of = {"01": "99", "05": "95", "10": "90"}[pct]
    write_jsonl(root / f"forget{pct}.json", forget)
    write_jsonl(root / f"retain{retain_of}.json", retain)
    write_jsonl(root / f"forget{pct}_perturbed.json", [tofu_perturbed(p) for p in forget[:3]])
    write_jsonl(root / "retain_perturbed.json", [tofu_perturbed(p) for p in retain[:2]])
    options = {"question": "Who wrote Hamlet?", "answer": "William Shakespeare",
               "perturbed_answer": ["Jane Austen", "Mark Twain"]}
    write_jsonl(root / "real_authors_perturbed.json", [options])
    write_jsonl(root / "world_facts_perturbed.json", [{**options, "question": "Capital of France?",
                                                        "answer": "Paris"}])
    write_jsonl(root / f"holdout{pct}.json", [tofu_pair("Hold", 0)])
    return root


# ----------------------------------------------------------------------------- MUSE


def muse_folder(root: Path) -> Path:
    """A MUSE folder in the Hub layout: parquet shards and older split names mixed in."""
    write_parquet(root / "raw" / "forget-00000-of-00001.parquet",
                  [{"text": "Forget article one."}, {"text": "Forget article two."}])
    write_jsonl(root / "raw" / "retain1.jsonl", [{"text": "Retain article."}])
    write_jsonl(root / "verbmem" / "forget.jsonl", [{"prompt": "Once upon", "gt": "a time there was"}])
    write_jsonl(root / "knowmem" / "forget_qa.jsonl", [{"question": "Who won?", "answer": "Alice"}])
    write_jsonl(root / "knowmem" / "retain2_qa.jsonl", [{"question": "Who lost?", "answer": "Bob"}])
    write_jsonl(root / "knowmem" / "forget_qa_icl.jsonl", [{"question": "Q1?", "answer": "A1"}])
    for split in ("forget", "retain", "holdout"):
        write_jsonl(root / "privleak" / f"{split}.jsonl", [{"text": f"{split} privacy text"}])
    return root


# ----------------------------------------------------------------------------- WMDP


def wmdp_item(k: int) -> dict:
    return {"answer": k % 4, "question": f"Hazard question {k}?", "choices": ["A0", "B1", "C2", "D3"]}


def wmdp_folder(root: Path, subject: str = "bio") -> Path:
    """Questions as a Hub parquet shard, the RMU corpus file name, WikiText and MMLU."""
    write_parquet(root / f"wmdp-{subject}" / "test-00000-of-00001.parquet", [wmdp_item(k) for k in range(3)])
    forget = [{"title": "T", "abstract": "A", "text": LONG + str(k), "doi": f"10.1/{k}"} for k in range(2)]
    write_jsonl(root / f"{subject}-forget-corpus.jsonl", forget + [{"title": "short", "text": "too short"}])
    write_jsonl(root / "wikitext.jsonl", [{"text": ""}, {"text": " = Heading = \n"}, {"text": LONG}])
    write_jsonl(root / "mmlu.jsonl", [{"question": "2 + 2?", "subject": "math", "choices": ["3", "4"], "answer": 1}])
    return root


# ----------------------------------------------------------------------------- zsRE


def zsre_record(k: int) -> dict:
    return {
        "subject": f"Watts Humphrey {k}",
        "src": f"What university did Watts Humphrey {k} attend?",
        "pred": "Trinity College",
        "rephrase": f"What university did Watts Humphrey {k} take part in?",
        "alt": "University of Michigan",
        "answers": ["Illinois Institute of Technology"],
        "loc": "nq question: who played desmond doss father in hacksaw ridge",
        "loc_ans": "Hugo Weaving",
        "cond": "Trinity College >> University of Michigan || What university did Watts Humphrey attend?",
    }
