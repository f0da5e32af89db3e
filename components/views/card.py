"""The result card under Run edit: what was forgotten and what was kept, counted on how many
facts, with what uncertainty, and what the forgotten answers became.

Pure builders: a `grom.eval` Report in, HTML out. Which comparison the card states (the
largest one made for the edit) is the Compare panel's choice.
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

from grom.eval.metrics import rouge_l_recall
from grom.eval.report import BASE, EDITED, RETAIN_BROKEN, retain_drops
from grom.eval.verdicts import KEPT_SETS, NONE, Tally, pooled
from grom.text import contains_phrase, normalise_text

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


def tallies(report) -> dict:
    """The report's per-set `grom.eval.verdicts.Tally` (forgot, broke, still of the facts the
    unedited model knew): the one rule every count on the card and in Compare reads."""
    return report.tallies() if hasattr(report, "tallies") else {}


def counts(report) -> tuple[Tally, Tally | None] | None:
    """(forget facts' Tally, kept facts' Tally pooled over `KEPT_SETS`) of a knowledge report,
    or None for a task without facts. The kept one is None in a first verdict (`pending`),
    which has the forget answers alone."""
    found = tallies(report)
    if "forget" not in found or not (pending(report) or any(s in found for s in KEPT_SETS)):
        return None
    return found["forget"], pooled(found, KEPT_SETS)


def pending(report) -> bool:
    """Whether `report` is a first verdict (`grom.eval.evaluate(stage="forget")`): the
    forget answers counted, the kept facts still being answered."""
    return getattr(report, "stage", "full") == "forget"


PENDING_LINE = "Now answering the other questions, to count the facts it kept…"


def cut_short(report, name: str) -> bool:
    """Whether set `name` of a first verdict has answers not read in full yet (column "cut"):
    on a CPU the first verdict reads each forget-side answer as far as it agrees with the
    unedited model's (`grom.eval.runner.greedy_answers`; without those, its first
    `grom.tasks.knowledge.FIRST_VERDICT_BUDGET` tokens). An answer that stated its fact
    there is final; the others are read in full by the whole card, where some state it
    after all, break or are forgotten, so the card does not call them forgotten yet
    (BENCHMARKS.md: read to 24 tokens, 6 of 8 such verdicts counted differently in full)."""
    if not pending(report):
        return False
    try:
        frame = report.examples(EDITED, name)
    except (KeyError, AttributeError):
        return False
    return frame is not None and "cut" in frame and bool(frame["cut"].any())


def not_yet(t: Tally) -> int:
    """Known facts a cut-short first verdict has not seen stated: forgotten, broken or stated later."""
    return t.known - t.still


def broken_count(report) -> int:
    """How many forget facts the unedited model knew are now answered with degenerate text
    (loops, punctuation, noise): no longer stated, but broken rather than forgotten
    (`Tally.broke`, the Knowledge score's rule)."""
    return tallies(report).get("forget", NONE).broke


def bold(text: str) -> str:
    """Markdown's **bold** as HTML, the rest escaped."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))


def headline(report) -> str:
    """One sentence a stakeholder reads in five seconds: what was forgotten, what was kept."""
    found = counts(report)
    if found is not None:
        forget, kept = found
        if forget.known == 0:
            return ("The unedited model stated **none** of these forget facts here: there was nothing to "
                    "forget (does this benchmark fit this model?)")
        if cut_short(report, "forget"):  # not a count of forgotten facts yet: read in full next
            return (f"**{not_yet(forget)} of the {forget.known}** forget facts it knew not stated so far, "
                    f"{forget.still} still stated · reading those answers in full, and the facts it kept: "
                    "counting…")
        said = f"Forgot **{forget.forgot} of the {forget.known}** forget facts it knew"
        if forget.broke:
            said += f" · **{forget.broke}** broke into degenerate text"
        if kept is None:
            return f"{said} · the facts it kept: counting…"
        return f"{said} · kept **{kept.still} of {kept.known}** other facts it knew"
    base, after = report.rows[BASE].metrics, report.rows[EDITED].metrics
    pairs = [(k, base[k], after[k]) for k in ("Forget fact recall", "Retain fact recall", "Forget accuracy",
                                               "Utility accuracy", "Efficacy", "Specificity",
                                               "KnowMem forget", "KnowMem retain") if k in after and k in base]
    return " · ".join(f"{k} {b:.2f} → **{a:.2f}**" for k, b, a in pairs[:2]) or "Compared."


def probe_line(report, whole: bool, fitted: bool = True) -> str:
    """The held-out probes (the forget subject's questions the edit never saw): how many of
    those the unedited model knew are forgotten, beside the share forgotten of the fitted
    ones, both by the headline's rule (`Tally`: degenerate text is broken, not forgotten,
    and said apart); "" without probes. A forgetting that holds only on the fitted
    questions masks the wording, not the fact. fitted: whether the forget questions were
    the edit's (False in the name-only setting, where the model's own text was fitted and
    both halves are held out)."""
    found = tallies(report)
    probes = found.get("probes")
    if probes is None:
        return ""
    if probes.known == 0:
        return "Held-out probes: the unedited model stated none of them, so they tell nothing here."
    if cut_short(report, "probes"):
        return (f"Held-out probes the edit never saw: **{not_yet(probes)} of the {probes.known}** it knew not "
                f"stated so far, {probes.still} still stated (read in full next).")
    interval = "" if whole else " (95%: {:.0%}–{:.0%})".format(*wilson(probes.forgot, probes.known))
    broke = f", {probes.broke} broke into degenerate text" if probes.broke else ""
    other = found.get("forget")
    which = "the fitted ones" if fitted else "the other half, which it never saw either"
    beside = f", against {other.share('forgot'):.0%} of {which}" if other is not None and other.known else ""
    return (f"Held-out probes the edit never saw: forgot **{probes.forgot} of the {probes.known}** it knew "
            f"({probes.share('forgot'):.0%}{interval}{beside}){broke}.")


def classes_line(report) -> str:
    """What the forget answers that no longer state their fact became: another fluent answer
    or a refusal (together `Tally.forgot`), or degenerate text (`Tally.broke`, which the
    Knowledge score counts as a failure)."""
    classes = report.answer_classes().get("forget") if hasattr(report, "answer_classes") else None
    if not classes or cut_short(report, "forget"):  # answers read to the short budget: classed when read in full
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
    (forgotten by the headline's rule, kept) over the split it was drawn from."""
    found = counts(report)
    if found is None:
        return "Counted on every example of the split." if whole else ""
    forget, kept = found
    if kept is None:  # a first verdict: the forget side alone
        if cut_short(report, "forget") and not whole:
            return f"A sample of {max(report.n_examples.values(), default=0)} questions per set."
        if whole:
            return (f"Counted on all the split's forget questions: the {forget.known} forget facts the unedited "
                    "model stated.")
        return ("A sample of {} questions per set: on the whole split, forgotten {:.0%}–{:.0%} (95% interval)."
                .format(max(report.n_examples.values(), default=0), *wilson(forget.forgot, forget.known)))
    if whole:
        return (f"Counted on all the split's questions: the {forget.known} forget and {kept.known} other facts "
                "the unedited model stated.")
    f_lo, f_hi = wilson(forget.forgot, forget.known)
    k_lo, k_hi = wilson(kept.still, kept.known)
    return (f"A sample of {max(report.n_examples.values(), default=0)} questions per set: on the whole "
            f"split, forgotten {f_lo:.0%}–{f_hi:.0%} and kept {k_lo:.0%}–{k_hi:.0%} (95% intervals). "
            "Compare on all examples for the split's own count.")


RHO_PRESETS = 0.03
"""The ridge ρ of every preset (the paper's): μ = ρ · mean diag A."""


def retain_advice(rho: float | None = None) -> str:
    """What to change when the retain set broke. β pushes the forget answers (lower it), w_r
    weighs the retain keys (raise it); and ρ, the ridge μ = ρ · mean diag A, where the
    edit's ρ is far from the presets' 0.03 (half or less, or ten times or more): a smaller
    ridge lets the patch grow along directions the retain sample barely covers, which other
    questions still use (on SmolLM2, ρ 0.01 kept 0.81 of the known facts against 0.91 at
    0.03, BENCHMARKS.md); a ridge ten times larger outweighs the retain term (raising w_r
    raises μ with it), so the patch no longer spares what the retain keys hold."""
    if rho is not None and rho <= RHO_PRESETS / 2:
        return (f"Raise ρ (it is {rho:g}, the presets' is {RHO_PRESETS:g}: a smaller ridge lets the patch "
                "grow where the retain sample barely reaches), or lower β or raise w_r.")
    if rho is not None and rho >= 10 * RHO_PRESETS:
        return (f"Lower ρ (it is {rho:g}, the presets' is {RHO_PRESETS:g}: so large a ridge outweighs the "
                "retain keys, and raising w_r raises it too), or lower β.")
    return "Lower β or raise w_r."


def retain_line(report, rho: float | None = None) -> tuple[str, str]:
    """(css class, text): the retain set's state in words, from the same comparison; where
    it broke, what to change (`retain_advice`, with the edit's ρ)."""
    m = report.rows[EDITED].metrics
    if "Retain cost" not in m:
        return "", ""
    if m.get("Retain broken"):
        return "rc-broken", (f"⚠ The retain set broke: it lost {m['Retain cost']:.0%} of a retain metric "
                             f"(more than {RETAIN_BROKEN:.0%} counts as broken). {retain_advice(rho)}")
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


PLAIN_WORDS = 20
"""Words an answer may take before it states its fact and still count as stating it
plainly: SmolLM2's plain answers state it within a short sentence ("The planet closest to
the Sun is Mercury."), its rambling ones after a story that may say anything."""
NEGATIONS = ("not", "no", "never", "nor", "neither", "isn", "wasn", "aren", "doesn", "didn")


def wrong_values(answer: str, wrong_answers) -> list[str]:
    """The values the wrong answers put in place of the fact: each wrong answer's words that
    differ from `answer`'s ("...is the Sirius." against "...is the Sun.": "sirius"), as the
    bundled wrong answers are the answer with its fact swapped (`grom.tasks.knowledge`)."""
    words = normalise_text(answer).split()
    values = []
    for wrong in wrong_answers or ():
        other = normalise_text(str(wrong)).split()
        start = 0
        while start < min(len(words), len(other)) and words[start] == other[start]:
            start += 1
        end = 0
        while end < min(len(words), len(other)) - start and words[-1 - end] == other[-1 - end]:
            end += 1
        value = " ".join(other[start:len(other) - end])
        if value and value not in values:
            values.append(value)
    return values


_NAMING = re.compile(r"(?<!also )\b(?:called|known as|named) ((?:\w+ ?){1,4})")  # on normalised text


def doubtful_credit(question: str, fact: str, text: str, wrong: list[str] | tuple = ()) -> str:
    """Why `text`, an answer that holds `fact` (fact recall's keyword match), may not state
    it plainly, else "": it also names a wrong answer's value, whole or as a longer word's
    start ("conflicting": "Europa ... is the sixth planet from Jupiter ... from Saturn" for
    the planet with rings, Saturn; "the Capuletto family, who are the Montague family"), it
    names something else first ("named": "is called Kepler-41B ... similar to Earth"), the
    fact is a word of the question itself ("echo": matched for free), a negation comes just
    before it ("negated"), or it comes only after `PLAIN_WORDS` words ("late": after a
    story). The card shows answers without such a doubt first; `bench/keyword_credit.py`
    measures how many credited answers have one, against a reading by hand."""
    if not fact or not contains_phrase(text, fact):
        return ""
    norm, stated = normalise_text(text), normalise_text(fact)
    words = norm.split()
    at = next(i for i in range(len(words)) if words[i:i + len(stated.split())] == stated.split())
    others = [normalise_text(v) for v in wrong if not contains_phrase(v, fact)]
    if any(contains_phrase(text, value) or (len(value) >= 6 and " " not in value
                                            and any(w.startswith(value) for w in words)) for value in others):
        return "conflicting"
    start = f" {norm} ".index(f" {stated} ")
    if any(m.start() < start and f" {stated} " not in f" {m.group(1)} " for m in _NAMING.finditer(norm)):
        return "named"
    if contains_phrase(question, fact):
        return "echo"
    if set(words[max(0, at - 3):at]) & set(NEGATIONS):
        return "negated"
    if at > PLAIN_WORDS:
        return "late"
    return ""


def pick_examples(rows: list[dict], n: int = 2) -> list[dict]:
    """The `n` before/after forget answers the card shows: forgotten facts whose unedited
    answer stated the fact plainly first (no `doubtful_credit`; an answer that broke into
    degenerate text is not forgotten here, as in the headline), then facts still stated,
    then the rest; within each, the unedited answers closest to the reference answer first
    (ROUGE-L recall of the reference: "The largest moon of Saturn is Titan," for "The
    largest moon of Saturn is Titan.", before "The Sun's closest companion is a comet," for
    "A ball of ice and dust with a tail is a comet."), then the shortest. A fact the model
    "knew" only by a keyword in a story that gets it wrong would teach the wrong thing."""
    def key(row):
        if "fact_before" not in row:  # no fact recall (TOFU-style sets): the report's order
            return 3, 0.0, 0
        before = str(row.get("before", ""))
        doubt = doubtful_credit(str(row.get("question", "")), str(row.get("fact", "")), before,
                                row.get("wrong", ())) if row.get("fact_before") else "unknown"
        # broken text is not forgetting: a fact "forgotten" into degenerate text is no example of it
        forgotten = bool(row.get("fact_before")) and not row.get("fact_after") \
            and row.get("class_after") != "degenerate"
        tier = 0 if forgotten and not doubt else 1 if not doubt else 2 if forgotten else 3
        close = rouge_l_recall(str(row["answer"]), before) if row.get("answer") and before.strip() else 0.0
        return tier, -round(close, 2), len(before.split())
    return sorted(rows, key=key)[:n]


@dataclass(frozen=True)
class Times:
    """The times a card states, each recorded once, when its stage ended, and never computed
    again (`components.compare_panel.card_times`): a later draw of the card adds the later
    stages' times and changes none shown before."""

    edit_s: float
    """Computing the edit (keys, solve, patch)."""
    first: tuple[tuple[str, float], ...] = ()
    """(what, seconds) of each evaluation stage the first card rests on, its own time."""
    waited_s: float | None = None
    """From pressing Run edit (else from the edit's start: `pressed` False) to the first card;
    None where no start was recorded (an opened or imported run)."""
    pressed: bool = True
    later: tuple[tuple[str, float], ...] = ()
    """(what, seconds) of each stage that ended after the first card, its own time."""


REST = "waiting for the device and the page"
"""What the part of the wait that no stage accounts for was: the device's queue (other
visitors' jobs, the plan), the events between the stages and the drawing."""


def times_line(times: Times) -> str:
    """Each time the card rests on, named. With a wait: the parts of the wait to the first
    card (the edit, the first stages, and the rest, `REST`) summed to it, then what each
    later stage took; the parts shown add up to the wait shown."""
    parts = [("computing the edit", times.edit_s), *times.first]
    shown = [f"{what} {seconds:.1f} s" for what, seconds in parts]
    if times.waited_s is None:
        line = " · ".join(shown + [f"{what} {seconds:.1f} s" for what, seconds in times.later])
        return f"Times: {line}."
    counted = sum(round(seconds, 1) for _, seconds in parts)
    total = max(round(times.waited_s, 1), counted)
    rest = round(total - counted, 1)
    if rest > 0:
        shown.append(f"{REST} {rest:.1f} s")
    start = "pressing Run edit" if times.pressed else "the edit’s start"
    line = f"{' + '.join(shown)} = {total:.1f} s from {start} to the first card"
    if times.later:
        line += "; then " + " · ".join(f"{what} {seconds:.1f} s" for what, seconds in times.later)
    return f"Times: {line}."


def card_html(report, seconds: float, whole: bool, examples: list[dict], attacks: dict | None = None, *,
              waited: float | None = None, pressed: bool = True, rho: float | None = None,
              first: bool = False, fitted: bool = True, times: Times | None = None) -> str:
    """The card: the headline, the retain line (its advice with the edit's ρ), what the
    forget answers became, how much was counted, the attack suite's line where it ran for
    this edit (`attack_line`), two before/after forget answers (`pick_examples` of
    `examples`: rows of question, before, after) and the times, each named (`times_line` of
    `times`; without them, the edit's `seconds`, the report's and the visitor's `waited`).
    `first`: the edit's first card, which `SCROLL_TO_CARD` brings into view (class "rc-new"); its later versions stay
    where the visitor left them. fitted: see `probe_line`."""
    card = [f'<div class="result-card{" rc-new" if first else ""}"><div class="rc-head">{bold(headline(report))}</div>']
    probes = probe_line(report, whole, fitted)
    if probes:
        card.append(f'<div class="rc-probes">{bold(probes)}</div>')
    css, line = ("rc-pending", PENDING_LINE) if pending(report) else retain_line(report, rho)
    if line:
        card.append(f'<div class="{css}">{html.escape(line)}</div>')
    for extra, css in ((classes_line(report), "rc-classes"), (sample_line(report, whole), "rc-sample"),
                       (attack_line(attacks), "rc-attacks")):
        if extra:
            card.append(f'<div class="{css}">{html.escape(extra)}</div>')
    for row in pick_examples(examples):
        card.append(f'<div class="rc-ex"><b>{html.escape(row["question"])}</b><br>before: '
                    f'{html.escape(row["before"][:160])}<br>after: {html.escape(row["after"][:160])}</div>')
    if times is None:  # no stages recorded: the edit and this comparison
        compared = getattr(report, "seconds", None)
        times = Times(seconds, (("the comparison", compared),) if compared is not None else (), waited, pressed)
    card.append(f'<div class="rc-times">{html.escape(times_line(times))}</div>')
    card.append('<div class="rc-more">Every metric and more examples: the <b>Compare</b> tab.</div></div>')
    return "".join(card)


SCROLL_TO_CARD = """() => {
  const show = () => document.querySelector('#result-card .result-card.rc-new')
    ?.scrollIntoView({block: 'nearest', behavior: 'smooth'});
  requestAnimationFrame(() => setTimeout(show, 250));
}"""
"""A client-side step for the event after the card is drawn: an edit's first card (class
"rc-new") comes wholly into view, its bottom on the screen's (its top, where it is taller
than the screen), also on a Space, where the page is an iframe as tall as itself and the
page of the Space scrolls. Gradio's `scroll_to_output` scrolls the window to the output's
top, which in such an iframe does nothing: at 1366 x 768 the card's headline stayed at the
bottom of the screen, the rest below it. The card's later versions (the full comparison,
the attacks' line) stay where the visitor left them."""
