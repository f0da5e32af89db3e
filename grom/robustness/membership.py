"""Membership inference on an edit: can an attacker who reads the model's likelihoods tell
the forget answers from held-out answers of the same kind, before and after the edit?

    result = membership_attack(model, tokenizer, edit, fitted, probes, holdout)
    result.edited                      # Min-K AUC, fitted forget answers vs the holdout
    result.details["auc"]["probes"]    # every attack's AUC, held-out probes vs the holdout

The attacks are OpenUnlearning's LOSS, zlib, Min-K and Min-K++ (`grom.eval.mia`, sign
convention included: AUC 1 = every forget answer likelier than every holdout answer,
0.5 = the attack cannot tell them apart, 0 = every forget answer LESS likely), on the same
teacher-forced scores the report reads (`grom.eval.runner.score_answers`: the answer's
tokens and its EOS after the formatted question; Min-K/Min-K++ without the last).

Which texts, and why. Real knowledge has no never-seen text: the base model learnt every
fact in pre-training. The "held-out text of the same kind" is therefore the answers to
questions about other subjects that the edit neither fitted nor aimed at (the
real-knowledge benchmark's "neighbours"; an upload's retain-like rows): facts the model
knows as well as the forget facts, untouched by the edit. So the base model's AUC is near
0.5 (both sides are known facts) and is the reference. After an edit:
- an AUC that stays near the base's: the forget answers' likelihoods did not move apart
  from the holdout's; the attacker cannot single them out;
- an AUC far BELOW 0.5: the forget answers became conspicuously unlikely; an attacker
  picks out which facts were unlearned (MUSE's "over-unlearning" side of PrivLeak; what
  a reviewer calls the Streisand effect of unlearning);
- an AUC far ABOVE 0.5: the forget answers are still likelier than comparable known facts.
`details["leak"]` = |AUC - 0.5| per side (0 is ideal, 0.5 the worst), and `base`, `edited`
are the headline Min-K AUC (OpenUnlearning's default MIA) of the FITTED forget answers.
The held-out probes (never fitted) are scored as a second member side: the question is
then whether the edit's change reached them too.
"""
from __future__ import annotations

import math
from typing import Sequence

from torch import nn

from grom.data.prompts import PromptFormat
from grom.eval import mia
from grom.eval.runner import score_answers
from grom.robustness.result import AttackResult, BelowTheEdit
from grom.turns import Between, Held, give, inside

HEADLINE = "min_k"
MIN_SIDE = 2  # an AUC needs at least two texts a side to mean anything


def _pairs(rows) -> list[tuple[str, str]]:
    return [(r.question, r.answer) for r in rows]


def _scores(model: nn.Module, tokenizer, pairs: list[tuple[str, str]], fmt: PromptFormat | None,
            between: Between | None = None) -> dict:
    """Each attack's per-text scores (n,) of `pairs` under `model` as it is now."""
    if not pairs:
        return {}
    scored = score_answers(model, tokenizer, pairs, prompt_format=fmt, moments=True, between=between)
    texts = [tokenizer.decode(s.labels.tolist(), skip_special_tokens=True) for s in scored]
    return mia.attack_scores(scored, texts)


def _aucs(members: dict, holdout: dict) -> dict[str, float]:
    return {a: mia.mia_auc(members[a], holdout[a]) for a in members if a in holdout}


def membership_attack(model: nn.Module, tokenizer, edit, fitted: Sequence, probes: Sequence,
                      holdout: Sequence, *, fmt: PromptFormat | None = None,
                      between: Between | None = None) -> AttackResult:
    """Name "mia": the membership attacks' AUCs, forget answers (the `fitted` forget pairs,
    and the held-out `probes` as a second side) against `holdout` answers, for the base
    model and for `edit` applied. Rows need `.question` and `.answer` (QAExample, Probe).

    base / edited: the Min-K AUC of the fitted side (NaN where a side has fewer than two
    texts: `details["skipped"]` says why). details: "auc" -> side ("fitted", "probes") ->
    attack ("loss", "zlib", "min_k", "min_k++") -> {"base", "edited"}; "leak" -> side ->
    {"base", "edited"}: |Min-K AUC - 0.5|; "n_fitted", "n_probes", "n_holdout"; "measure":
    "auc". The model comes back unedited (the edit is applied in a `with`). between: a step
    boundary (`grom.turns`) between the teacher-forced batches, the edit reverted there.
    The edited model's passes replay the layers below the edit from the unedited model's
    (`BelowTheEdit`): the same scores."""
    sides = {"fitted": _pairs(fitted), "probes": _pairs(probes)}
    sides = {k: v for k, v in sides.items() if len(v) >= MIN_SIDE}
    hold = _pairs(holdout)
    counts = {"n_fitted": len(fitted), "n_probes": len(probes), "n_holdout": len(holdout), "measure": "auc"}
    if len(hold) < MIN_SIDE or "fitted" not in sides:
        why = ("no held-out answers of the same kind to compare with (the real-knowledge benchmark's "
               "neighbours, or rows of the other subjects)" if len(hold) < MIN_SIDE
               else "fewer than two fitted forget answers")
        return AttackResult("mia", math.nan, math.nan, 0.0, len(fitted), details={"skipped": why, **counts})
    every = [p for pairs in sides.values() for p in pairs] + hold

    def measure(turn: Between | None) -> dict[str, dict[str, float]]:
        scores = _scores(model, tokenizer, every, fmt, turn)
        at, out = 0, {}
        split = {}
        for side, pairs in sides.items():
            split[side] = {a: v[at:at + len(pairs)] for a, v in scores.items()}
            at += len(pairs)
        held = {a: v[at:] for a, v in scores.items()}
        for side in sides:
            out[side] = _aucs(split[side], held)
        return out

    model.eval()
    below = BelowTheEdit(model, edit)  # the edited model's passes run only the layers the edit changed
    with Held(below.recording) as held:
        base = measure(inside(between, held.left))
    give(between)
    with Held(lambda: edit.applied(model), below.replaying) as held:
        edited = measure(inside(between, held.left))
    auc = {side: {a: {"base": base[side][a], "edited": edited[side][a]} for a in base[side]} for side in sides}
    leak = {side: {k: abs(auc[side][HEADLINE][k] - 0.5) for k in ("base", "edited")} for side in sides}
    return AttackResult("mia", auc["fitted"][HEADLINE]["base"], auc["fitted"][HEADLINE]["edited"], 0.0,
                        len(fitted), details={"auc": auc, "leak": leak, **counts})


HOLDOUT_SETS = ("neighbours", "general")
"""The eval sets read as holdout, first found first: the real-knowledge benchmark's
held-out questions of the other subjects, then its general-knowledge questions."""


def holdout_of(eval_sets: dict, retain: Sequence = ()) -> tuple:
    """The holdout side for `membership_attack` from a benchmark's eval sets: the first of
    `HOLDOUT_SETS` it has, else its `retain` rows with an answer (kept by the edit's
    retain term, so a holdout that the edit protects rather than ignores: a weaker
    reference, used only where the data has nothing else)."""
    for name in HOLDOUT_SETS:
        rows = tuple(r for r in (eval_sets or {}).get(name, ()) if getattr(r, "answer", None))
        if rows:
            return rows
    return tuple(r for r in retain if getattr(r, "answer", None))
