"""The result card under Run edit: what was forgotten and what was kept, counted on how many
facts, with what uncertainty, and what the forgotten answers became.

Pure builders: a `grom.eval` Report in, HTML out. Which comparison the card states (the
largest one made for the edit) is the Compare panel's choice.
"""
from __future__ import annotations

import html
import math
import re

from grom.eval.report import BASE, EDITED, RETAIN_BROKEN, retain_drops

KEPT_SETS = ("neighbours", "general", "retain")
CLASS_WORDS = {"fluent": "another fluent answer", "refusal": "a refusal", "degenerate": "degenerate text"}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for z = 1.96) of a proportion k/n: what a share
    counted on a sample of n says about the share on all the facts it was drawn from."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def counts(report) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """((forget facts known, still stated), (kept facts known, still stated)) of a knowledge
    report, or None for a task without facts."""
    facts = report.known_facts()
    if "forget" not in facts or not any(s in facts for s in KEPT_SETS):
        return None
    kept = [facts[s] for s in KEPT_SETS if s in facts]
    return facts["forget"], (sum(k for k, _ in kept), sum(s for _, s in kept))


def broken_count(report) -> int:
    """How many forget facts the unedited model knew are now answered with degenerate text
    (loops, punctuation, noise): no longer stated, but broken rather than forgotten. The
    headline counts them apart, as the Knowledge score does (`grom.eval.metrics.knowledge_score`)."""
    classes = report.answer_classes().get("forget") if hasattr(report, "answer_classes") else None
    return int((classes or {}).get("degenerate", 0))


def bold(text: str) -> str:
    """Markdown's **bold** as HTML, the rest escaped."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))


def headline(report) -> str:
    """One sentence a stakeholder reads in five seconds: what was forgotten, what was kept."""
    found = counts(report)
    if found is not None:
        (known, still), (k_known, k_still) = found
        if known == 0:
            return ("The unedited model stated **none** of these forget facts here: there was nothing to "
                    "forget (does this benchmark fit this model?)")
        broken = broken_count(report)
        said = f"Forgot **{known - still - broken} of the {known}** forget facts it knew"
        if broken:
            said += f" · **{broken}** broke into degenerate text"
        return f"{said} · kept **{k_still} of {k_known}** other facts it knew"
    base, after = report.rows[BASE].metrics, report.rows[EDITED].metrics
    pairs = [(k, base[k], after[k]) for k in ("Forget fact recall", "Retain fact recall", "Forget accuracy",
                                               "Utility accuracy", "Efficacy", "Specificity",
                                               "KnowMem forget", "KnowMem retain") if k in after and k in base]
    return " · ".join(f"{k} {b:.2f} → **{a:.2f}**" for k, b, a in pairs[:2]) or "Compared."


def probe_line(report, whole: bool) -> str:
    """The held-out probes (the forget target's questions the edit never saw): how many of
    those the unedited model knew are forgotten, beside the fitted ones; "" without probes.
    A forgetting that holds only on the fitted questions masks the wording, not the fact."""
    facts = report.known_facts()
    if "probes" not in facts:
        return ""
    known, still = facts["probes"]
    if known == 0:
        return "Held-out probes: the unedited model stated none of them, so they tell nothing here."
    share = (known - still) / known
    interval = "" if whole else " (95%: {:.0%}–{:.0%})".format(*wilson(known - still, known))
    fitted = facts.get("forget")
    beside = (f", against {(fitted[0] - fitted[1]) / fitted[0]:.0%} of the fitted ones"
              if fitted and fitted[0] else "")
    return (f"Held-out probes the edit never saw: forgot **{known - still} of the {known}** it knew "
            f"({share:.0%}{interval}{beside}).")


def classes_line(report) -> str:
    """What the forget answers that no longer state their fact became: another fluent answer,
    a refusal or degenerate text (the Knowledge score counts degenerate text as a failure)."""
    classes = report.answer_classes().get("forget") if hasattr(report, "answer_classes") else None
    if not classes:
        return ""
    parts = [f"{classes[c]} {CLASS_WORDS[c]}" for c in ("fluent", "refusal", "degenerate") if classes.get(c)]
    if not parts:
        return ""
    line = "The forget answers now: " + " · ".join(parts) + "."
    if classes.get("degenerate"):
        line += " Degenerate text is not counted as forgetting, here or in the Knowledge score."
    return line


def sample_line(report, whole: bool) -> str:
    """How many facts the verdict counted, and, for a sample, the 95% interval of each share
    over the split it was drawn from."""
    found = counts(report)
    if found is None:
        return "Counted on every example of the split." if whole else ""
    (known, still), (k_known, k_still) = found
    if whole:
        return (f"Counted on all the split's questions: the {known} forget and {k_known} other facts the "
                "unedited model stated.")
    f_lo, f_hi = wilson(known - still, known)
    k_lo, k_hi = wilson(k_still, k_known)
    return (f"A sample of {max(report.n_examples.values(), default=0)} questions per set: on the whole "
            f"split, forgotten {f_lo:.0%}–{f_hi:.0%} and kept {k_lo:.0%}–{k_hi:.0%} (95% intervals). "
            "Compare on all examples for the split's own count.")


def retain_line(report) -> tuple[str, str]:
    """(css class, text): the retain set's state in words, from the same comparison."""
    m = report.rows[EDITED].metrics
    if "Retain cost" not in m:
        return "", ""
    if m.get("Retain broken"):
        return "rc-broken", (f"⚠ The retain set broke: it lost {m['Retain cost']:.0%} of a retain metric "
                             f"(more than {RETAIN_BROKEN:.0%} counts as broken). Lower β or raise w_r.")
    if m["Retain cost"] <= 0:
        return "rc-ok", "Retain set intact: no retain metric fell."
    base = report.rows[BASE].metrics if BASE in report.rows else {}
    drops = retain_drops(base, m, report.task)
    worst = max(drops, key=drops.get) if drops else "a retain metric"
    return "rc-ok", (f"Retain set held: {worst} fell {m['Retain cost']:.0%} "
                     f"(more than {RETAIN_BROKEN:.0%} counts as broken).")


def attack_line(results: dict | None) -> str:
    """One line from the attack suite ("Is it gone?"): recall on the held-out probes, and the
    attack under which the edited model states most facts (its worst), each beside the base
    model's; "" before the suite ran. `results`: attack name -> AttackResult (GROM's)."""
    if not results:
        return ""
    ran = {k: r for k, r in results.items() if not math.isnan(r.edited)}
    parts = []
    held = ran.get("heldout")
    if held is not None:
        parts.append(f"Held-out probes: recall {held.edited:.2f} (base {held.base:.2f}, {held.n} questions the "
                     "edit never saw)")
    others = {k: r for k, r in ran.items() if k != "heldout" and k != "mia"}  # mia is an AUC, not a recall
    if others:
        name, worst = max(others.items(), key=lambda kv: kv[1].edited)
        parts.append(f"worst attack: {name.replace('_', ' ')}, recall {worst.edited:.2f} (base {worst.base:.2f})")
    return " · ".join(parts) + "." if parts else ""


def card_html(report, seconds: float, whole: bool, examples: list[dict], attacks: dict | None = None) -> str:
    """The card: the headline and the edit's time, the retain line, what the forget answers
    became, how much was counted, the attack suite's line where it ran for this edit
    (`attack_line`), and two before/after forget answers (`examples`: rows of question,
    before, after)."""
    card = [f'<div class="result-card"><div class="rc-head">{bold(headline(report))} · {seconds:.1f} s</div>']
    probes = probe_line(report, whole)
    if probes:
        card.append(f'<div class="rc-probes">{bold(probes)}</div>')
    css, line = retain_line(report)
    if line:
        card.append(f'<div class="{css}">{html.escape(line)}</div>')
    for extra, css in ((classes_line(report), "rc-classes"), (sample_line(report, whole), "rc-sample"),
                       (attack_line(attacks), "rc-attacks")):
        if extra:
            card.append(f'<div class="{css}">{html.escape(extra)}</div>')
    for row in examples[:2]:
        card.append(f'<div class="rc-ex"><b>{html.escape(row["question"])}</b><br>before: '
                    f'{html.escape(row["before"][:160])}<br>after: {html.escape(row["after"][:160])}</div>')
    card.append('<div class="rc-more">Every metric and more examples: <b>5 · Compare</b>.</div></div>')
    return "".join(card)
