"""Changed words between two generations, as HTML (difflib on word tokens)."""
from __future__ import annotations

import difflib
import html
import re
from typing import Sequence

_TOKENS = re.compile(r"\s*\S+")


def _tokens(text: str) -> list[str]:
    """Words with their leading whitespace; trailing whitespace is dropped."""
    return _TOKENS.findall(text or "")


def word_diff(before: str, after: str) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """Both texts as (piece, tag) lists: a run of words only in `before` is one "del"
    piece, a run only in `after` one "ins" piece (words compared without their
    whitespace); shared words are untagged."""
    a, b = _tokens(before), _tokens(after)
    matcher = difflib.SequenceMatcher(a=[t.strip() for t in a], b=[t.strip() for t in b], autojunk=False)
    left: list[tuple[str, str | None]] = []
    right: list[tuple[str, str | None]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        for side, words, tag in ((left, a[i1:i2], "del"), (right, b[j1:j2], "ins")):
            if not words:
                continue
            if op == "equal":
                side += [(w, None) for w in words]
                continue
            run = "".join(words)
            core = run.lstrip()
            if len(core) < len(run):  # the space before the run stays outside the mark
                side.append((run[: len(run) - len(core)], None))
            side.append((core, tag))
    return left, right


def _render(pieces: Sequence[tuple[str, str | None]]) -> str:
    out = []
    for text, tag in pieces:
        esc = html.escape(text)
        out.append(f'<span class="w-{tag}">{esc}</span>' if tag else esc)
    return "".join(out) or '<span class="w-empty">(empty)</span>'


def _prob(p) -> str:
    return "" if p is None else f'<span class="gen-prob" title="p(gold answer)">p={p:.2f}</span>'


# (kind, fact before, fact after) -> the row's verdict: a forgotten forget fact is the goal,
# a lost retain fact is damage; each gets its own mark.
VERDICTS = {("forget", True, False): ("forgotten", "v-good"), ("forget", True, True): ("still stated", "v-warn"),
            ("retain", True, False): ("fact lost", "v-bad"), ("retain", True, True): ("kept", "v-good")}
LEGEND = {
    "forget": ("forgotten: the unedited model stated the fact and the edited one answers otherwise, in "
               "language (another answer or a refusal) · degenerate text: it no longer states the fact but "
               "loops or writes noise, which is breaking, not forgetting · still stated: it still does · not "
               "known before: the unedited model did not state it either, so there was nothing to forget"),
    "retain": ("kept: the fact is still stated · fact lost: this answer no longer states a fact the "
               "unedited model stated (one answer; the set counts as broken only when its kept-fact "
               "recall falls by more than 10%) · not known before: nothing to keep"),
}


BROKEN = ("degenerate text", "v-bad")  # a known forget fact no longer stated, the answer loops or is noise


def _verdict(r: dict, kind: str | None) -> str:
    if kind is None or "fact_before" not in r:
        return ""
    label, cls = VERDICTS.get((kind, r["fact_before"], r["fact_after"]), ("not known before", "v-none"))
    if kind == "forget" and label == "forgotten" and r.get("class_after") == "degenerate":
        label, cls = BROKEN  # broken text is not forgetting: never the success mark
    return f'<span class="verdict {cls}">{label}</span>'


def generations_html(rows: Sequence[dict], title: str = "", kind: str | None = None) -> str:
    """A before/after table; each row a dict with question, answer (may be None), before,
    after, prob_before, prob_after (may be None), and optionally fact_before / fact_after
    (whether each answer states the fact). Changed words are highlighted; with `kind`
    ("forget" or "retain") each row is marked forgotten / still stated, or kept / lost."""
    body = []
    for r in rows:
        left, right = word_diff(r.get("before", ""), r.get("after", ""))
        gold = r.get("answer")
        gold_html = f'<div class="gen-gold">gold: {html.escape(gold)}</div>' if gold else ""
        same = " gen-same" if r.get("before", "") == r.get("after", "") else ""
        body.append(
            f'<tr class="gen-row{same}"><td class="gen-q">{html.escape(r.get("question", ""))}{gold_html}</td>'
            f'<td class="gen-before">{_render(left)} {_prob(r.get("prob_before"))}</td>'
            f'<td class="gen-after">{_render(right)} {_prob(r.get("prob_after"))} {_verdict(r, kind)}</td></tr>')
    head = f'<div class="gen-title">{html.escape(title)}</div>' if title else ""
    if kind in LEGEND and any("fact_before" in r for r in rows):
        head += f'<div class="gen-legend">{html.escape(LEGEND[kind])}</div>'
    return (f'<div class="gen-table">{head}<table><thead><tr><th>question</th><th>before the edit</th>'
            f'<th>after the edit</th></tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def answer_html(question: str, answer: str, note: str = "") -> str:
    """One model's answer to one question (no edit to compare with), with a note."""
    note_html = f'<div class="gen-title">{html.escape(note)}</div>' if note else ""
    return (f'<div class="gen-table">{note_html}<table><thead><tr><th>question</th><th>the original '
            f'model</th></tr></thead><tbody><tr class="gen-row"><td class="gen-q">{html.escape(question)}'
            f'</td><td class="gen-before">{html.escape(answer)}</td></tr></tbody></table></div>')
