"""The MUSE task ("muse"): VerbMem (ROUGE-L F1 of the continuation), KnowMem on forget and
retain QA (few-shot, ROUGE-L F1), extraction strength on the VerbMem items, MIA AUC and
PrivLeak, the other attacks' AUCs, the Final Score; inputs, references, budgets and stop
strings as OpenUnlearning's (`grom.eval.upstream`). The benchmarks "muse-news" and
"muse-books"."""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from grom.data import muse as muse_data
from grom.data.loaders import BenchmarkSpec
from grom.eval import metrics as M
from grom.eval import mia
from grom.eval import upstream as U
from grom.eval.results import REFERENCE, Row
from grom.eval.runner import ModelScorer, generate_ids, score_sequences
from grom.eval.shared_rows import attack_aucs, reference_attack
from grom.tasks.base import Task, register_task


def _rouge_frame(inputs, gens: list[str], questions: list[str]) -> tuple[pd.DataFrame, float]:
    """Per-example ROUGE-L F1 of each generation against its upstream reference."""
    refs = [x.reference for x in inputs]
    f1 = np.array([M.rouge_l_f1(r, g) for r, g in zip(refs, gens)])
    return pd.DataFrame({"question": questions, "answer": refs, "generation": gens, "rougeL_f1": f1}), float(f1.mean())


def _long_batch(run: ModelScorer) -> int:
    """Texts of up to 2048 tokens are scored 8 at a time at most (OpenUnlearning's batch
    size for extraction strength and Min-K): the logits of 32 such texts of a 32k-vocab
    model would take 8 GB."""
    return min(run.batch_size, 8)


def _verbmem(run: ModelScorer, ex: tuple, row: Row) -> None:
    """VerbMem (ROUGE-L F1 of 128 greedy new tokens after the prefix, against the true
    continuation's first 2048 tokens) and MUSE's extraction strength on the same items
    (on by default in OpenUnlearning's configs/eval/muse.yaml), as `grom.eval.upstream`
    transcribes them. `max_new_tokens` given to `evaluate` replaces the 128."""
    pairs = [U.verbmem_input(run.tok, e.question, e.answer) for e in ex]
    new = generate_ids(run.model, run.tok, [g.prompt_ids for _, g in pairs],
                       max_new_tokens=run.max_new_tokens or U.VERBMEM_NEW_TOKENS, batch_size=run.batch_size)
    gens = [U.cut_at_stops(U.decode(run.tok, ids), (), U.eos_text(run.tok)) for ids in new]
    df, row.metrics["VerbMem forget"] = _rouge_frame([g for _, g in pairs], gens, [e.question for e in ex])
    scores = score_sequences(run.model, run.tok, [(list(c.ids), c.start) for c, _ in pairs], _long_batch(run))
    df["es"] = [M.extraction_strength(s.predicted, s.labels) for s in scores]  # OpenUnlearning's: last dropped
    row.examples["verbmem_forget"] = df
    row.metrics["Forget ES"] = float(df["es"].mean())


def _knowmem(run: ModelScorer, ex: tuple, icl: tuple) -> tuple[pd.DataFrame, float]:
    """KnowMem: ROUGE-L F1 of 32 greedy new tokens after the few-shot prompt, cut at
    OpenUnlearning's stop strings, against the reference answer (`grom.eval.upstream`)."""
    inputs = [U.knowmem_input(run.tok, icl, e.question, e.answer) for e in ex]
    new = generate_ids(run.model, run.tok, [x.prompt_ids for x in inputs],
                       max_new_tokens=run.max_new_tokens or U.KNOWMEM_NEW_TOKENS, batch_size=run.batch_size)
    gens = [U.cut_at_stops(U.decode(run.tok, ids), U.KNOWMEM_STOPS, U.eos_text(run.tok)) for ids in new]
    return _rouge_frame(inputs, gens, [e.question for e in ex])


def _mia_texts(run: ModelScorer, texts: tuple) -> dict[str, np.ndarray]:
    """Each membership attack's scores of MUSE texts (`grom.eval.mia.attack_scores`) as
    OpenUnlearning's MUSE_MIA reads them: the text's first 2048 tokens after the
    tokenizer's special prefix; Min-K and Min-K++ on all positions but the last. A text with
    no token to score scores 0 (upstream has none)."""
    encs = [U.completion_input(run.tok, "", e.text) for e in texts]
    seqs = [(list(c.ids), c.start) for c in encs if len(c.ids) > c.start]
    scored = score_sequences(run.model, run.tok, seqs, _long_batch(run), True)
    decoded = [run.tok.decode(s.labels.tolist(), skip_special_tokens=True) for s in scored]
    found = mia.attack_scores(scored, decoded) if scored else {}
    keep = np.array([len(c.ids) > c.start for c in encs])
    out = {}
    for attack, values in found.items():
        full = np.zeros(len(encs))
        full[keep] = values
        out[attack] = full
    return out


def _muse_row(run: ModelScorer, sets: dict[str, tuple], only_forget: bool = False) -> Row:
    """MUSE's metrics as OpenUnlearning's configs/eval/muse.yaml computes them (see
    `grom.eval.upstream`): VerbMem, KnowMem forget / retain, extraction strength, Min-K
    (the MIA AUC behind PrivLeak)."""
    row = Row()
    if "verbmem_forget" in sets:
        _verbmem(run, sets["verbmem_forget"], row)
    for name, label in (("knowmem_forget", "KnowMem forget"), ("knowmem_retain", "KnowMem retain")):
        if name not in sets or (only_forget and name == "knowmem_retain"):
            continue
        row.examples[name], row.metrics[label] = _knowmem(run, sets[name], sets.get(f"{name}_icl", ()))
    if "privleak_forget" in sets and "privleak_holdout" in sets:
        for side in ("forget", "holdout"):
            row.raw.update({f"{side}/{k}": v for k, v in _mia_texts(run, sets[f"privleak_{side}"]).items()})
        attack_aucs(row)
    return row


def _muse_relative(rows: dict[str, Row]) -> None:
    """PrivLeak against the retrained (reference) model (without one: against 0.5, the
    AUC of a model that never saw either set, as OpenUnlearning does), then Final score."""
    reference_attack(rows)
    ref = rows.get(REFERENCE)
    for row in rows.values():
        m = row.metrics
        if "MIA AUC" in m:
            ref_auc = ref.metrics.get("MIA AUC", 0.5) if ref else 0.5
            m["Privacy leakage"] = M.privacy_leakage(m["MIA AUC"], ref_auc)
        if all(k in m for k in ("VerbMem forget", "KnowMem forget", "KnowMem retain", "Privacy leakage")):
            m["Final score"] = M.muse_final_score(m["VerbMem forget"], m["KnowMem forget"],
                                                  m["KnowMem retain"], m["Privacy leakage"])


def _muse_spec(corpus: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        f"muse-{corpus}", partial(muse_data.load_muse, corpus), muse_data.SPLITS, aliases={"raw": "forget"},
        label=f"MUSE-{corpus.capitalize()}", hub_id=muse_data.HUB_IDS[corpus],
        description=f"MUSE-{corpus.capitalize()} (Hub {muse_data.HUB_IDS[corpus]}): texts; verbmem, knowmem, privleak",
    )


TASK = register_task(Task(
    "muse", _muse_row, retain_metrics=("KnowMem retain",), headline="Final score", relative=_muse_relative,
    recipe="muse", benchmarks=(_muse_spec("news"), _muse_spec("books"))))
