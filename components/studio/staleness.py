"""Results of an earlier edit, said to be so: the moment Run edit starts, and whenever the
Edit form's settings stop being those of the edit on show, every result computed for that
edit (its card, the comparison's summary, table and answers, the question asked before
and after, the attack suite's results, the baseline's comparison, the diagnostics' notes)
carries a line that says which edit it is from and what to press; when the new results
come, they replace it.

A marked text begins with `MARK` (an HTML comment: invisible) naming why: `PREVIOUS` (a
new edit started: it stays until the text is replaced; taken off again where that run
failed and the edit on show is still the session's) or `SETTINGS` (the form changed:
taken off again once the form holds the edit's settings). The tables carry it in their
label (the comparison's metrics, the attacks'); the plots and tables that cannot carry
it (the attack plots, PCA, influence, 4-bit check) are cleared once the new edit is done.

Handlers only: the events are wired in `components.page` (`wire`), the widgets found on
`Page.ui`, so no panel is imported here.
"""
from __future__ import annotations

import html
import math
import re
import weakref
from dataclasses import dataclass

import gradio as gr

from components.server.errors import shorten
from components.server.session import Session
from components.server.validate import parse_band
from components.studio.form import MAX_BAND_LAYERS, NAMES, key_positions_in, widgets
from components.studio.history import history
from components.studio.runs import band_text
from components.studio.wiring import LOCAL, Page
from components.views import plots
from components.views.tables import TABLE_LABELS, empty_table

MARK = "<!--stale:{}-->"
END = "<!--/stale-->"
PREVIOUS, SETTINGS = "previous", "settings"
_MARKED = re.compile(r"<!--stale:(previous:\d+|settings)-->")
STYLE = ("border-left:4px solid #d97706;background:rgba(217,119,6,.10);padding:6px 10px;margin:0 0 8px 0;"
         "border-radius:4px")


@dataclass(frozen=True)
class Shown:
    """A text on the page that shows a result of an edit."""
    panel: str  # Page.ui's attribute
    name: str  # the widget's, on that panel
    html: bool  # an HTML box (else Markdown)
    group: str  # which results ("card", "compare", "asked", "attacks", "baseline", "diagnostics")


SHOWN = (Shown("edit", "card", True, "card"), Shown("compare", "summary", False, "compare"),
         Shown("answers", "forget_html", True, "compare"), Shown("answers", "retain_html", True, "compare"),
         Shown("answers", "prompt_html", True, "asked"), Shown("attack", "summary", False, "attacks"),
         Shown("attack", "answers", True, "attacks"), Shown("baseline", "summary", False, "baseline"),
         Shown("diag", "pca_note", False, "diagnostics"), Shown("diag", "infl_example", False, "diagnostics"),
         Shown("diag", "quant_note", False, "diagnostics"))
AGAIN = {"card": "the new edit's card follows", "compare": "the new edit's comparison follows",
         "asked": "ask again for the new edit's answer", "attacks": "press **Run the attacks** for the new edit",
         "baseline": "its GROM column is that edit's: train the baseline again to set it beside the new one",
         "diagnostics": "press the button again for the new edit"}
"""What brings a group's results for the new edit: the end of its line ("From an earlier edit, ...: <this>")."""
# the tables whose label says which edit their summary is from: (panel, table, `TABLE_LABELS` key, summary's index)
LABELLED = (("compare", "table", "metrics", 1), ("attack", "table", "attacks", 5))
CLEARED = (("attack", "plot"), ("attack", "lens"), ("diag", "pca"), ("diag", "infl_plot"), ("diag", "infl_table"),
           ("diag", "quant_table"))
"""What cannot carry the line: cleared once the new edit is done (`on_run_ended`)."""


def tag_of(text) -> str | None:
    """Why `text` is marked ("previous:<start>" or "settings"), else None."""
    if not isinstance(text, str) or not text.startswith("<!--stale:"):
        return None
    found = _MARKED.match(text)
    return found.group(1) if found and END in text else None


def unmarked(text) -> str:
    """`text` without its line."""
    if tag_of(text) is None:
        return text
    return text[text.index(END) + len(END):].lstrip("\n")


def marked(text: str, why: str, line: str, as_html: bool) -> str:
    """`text` (unmarked) with `line` (Markdown's **bold** allowed) above it, tagged `why`. The
    line is written as HTML in a Markdown box too: after the tag, an HTML comment, Markdown
    reads the whole line as HTML and would show its ** as they are."""
    shown = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(line, quote=False))
    if as_html:
        text = text.replace('class="result-card rc-new"', 'class="result-card"', 1)  # not scrolled to again
        return f'{MARK.format(why)}<div class="stale-note" style="{STYLE}">⚠ {shown}</div>{END}{text}'
    return f"{MARK.format(why)}⚠ {shown}{END}\n\n{text}"


def edit_words(session: Session, edit) -> str:
    """"run #3 (β 10, w_r 100, ρ 0.03, band 3-5)": the edit's number in the history, where
    it has one, and the settings a visitor changes between runs."""
    c = edit.settings
    band = band_text(getattr(edit, "band", ()) or ()) or getattr(c, "matrix", "")
    settings = (f"β {c.beta:g}{' rel.' if c.beta_relative else ''}, w_r {c.w_r:g}, ρ {c.rho:g}, band {band}")
    n = next((r["n"] for r in reversed(history(session)) if r["edit"]() is edit), None)
    return f"run #{n} ({settings})" if n is not None else f"the edit at {settings}"


WORDS = {"target": "target", "beta": "β", "beta_relative": "β relative", "w_r": "w_r", "rho": "ρ", "c": "c",
         "matrix": "matrix", "use_alpha": "α", "seed": "seed", "forget_budget": "forget key budget",
         "retain_budget": "retain key budget", "retain_examples": "retain examples", "key_positions": "key positions"}


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    try:
        return math.isclose(float(a or 0), float(b or 0), rel_tol=1e-6, abs_tol=1e-12)
    except (TypeError, ValueError, OverflowError):
        return a == b


def _value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (int, float)):
        return f"{v:g}"
    return shorten(v, 24)


def _layers(text) -> tuple[int, ...] | None:
    try:
        return parse_band(str(text)[:200], MAX_BAND_LAYERS)
    except Exception:  # noqa: BLE001  (not a band: a difference)
        return None


def differences(values: dict, edit) -> list[str]:
    """The Edit form's `values` (by field name) that are not `edit`'s settings, in words
    ("β 10 → 150"); [] where the form holds the edit's settings (the preset's name and the
    batch size, which change no patch, aside)."""
    config, run = edit.settings.to_dict(), getattr(edit, "run", None) or {}
    had = {name: config.get(name) for name in WORDS if name in config}
    had |= {"seed": run.get("seed", config.get("seed", 0)), "retain_examples": run.get("retain_examples")}
    if "key_mode" in config:  # a GROM edit: where its keys were
        had["key_positions"] = key_positions_in(config)
    out = []
    for name, was in had.items():
        if was is None and name == "retain_examples" or name == "c" and "corruption" not in (
                had.get("target"), values.get("target")):
            continue
        if not _same(values.get(name), was):
            out.append(f"{WORDS[name]} {_value(was)} → {_value(values.get(name))}")
    if had.get("matrix") != "lm_head":
        band = tuple(getattr(edit, "band", ()) or ())
        if values.get("band_mode") == "manual":
            now = _layers(values.get("band_text"))
            if now != band:
                shown = band_text(now) if now else shorten(values.get("band_text"), 24)
                out.append(f"band {band_text(band)} → {shown}")
        elif run.get("band_mode", "manual") == "manual":
            out.append(f"band {band_text(band)} → the suggested one")
        elif not _same(values.get("k"), run.get("k", len(band))):
            out.append(f"k {_value(run.get('k', len(band)))} → {_value(values.get('k'))}")
    return out


def _has_rows(table) -> bool:
    frame = getattr(table, "columns", None)
    return frame is not None and "GROM" in list(frame) and len(table) > 0


def shows_edit(shown: Shown, text: str, session: Session, edit, baseline_table) -> bool:
    """Whether `text` (unmarked) shows a result of `edit`: the card and the attacks the ones
    the session keeps for it, the comparison the session's last one of it, the baseline's
    table a GROM column, any other text that is not empty."""
    if not isinstance(text, str) or not text.strip():
        return False
    if shown.group == "card":
        held = session.extra.get("card")
        return held is not None and held[0] is edit
    if shown.group == "compare":
        return session.report is not None and session.report_for is not None and session.report_for[1] is edit
    if shown.group == "attacks":
        held = session.extra.get("attacks")
        return held is not None and held[0] is edit
    if shown.group == "baseline":
        return _has_rows(baseline_table)
    return True


def _labels(texts: list) -> list:
    """The tables' labels, each from its summary's state: the summary's line, else its own."""
    out = []
    for _, _, kind, i in LABELLED:
        if tag_of(texts[i]) is None:
            out.append(gr.Dataframe(label=TABLE_LABELS[kind]))
            continue
        line = texts[i][texts[i].index("⚠ ") + 2:texts[i].index(END)].replace("**", "")
        out.append(gr.Dataframe(label=f"⚠ {line}"))
    return out


def _changed(before: list, after: list) -> list:
    return [gr.skip() if a == b else b for a, b in zip(before, after)]


def on_run_started(session: Session, baseline_table, *texts):
    """Run edit pressed: every result of the edit on show marked as the previous edit's
    (`PREVIOUS`, numbered by this start), until the new results replace it."""
    edit = session.edit
    if edit is None:
        return [gr.skip()] * (len(SHOWN) + len(LABELLED))
    start = int(session.extra.get("stale_starts", 0)) + 1
    session.extra["stale_starts"] = start
    session.extra["stale_run"] = (weakref.ref(edit), start)
    words = edit_words(session, edit)
    after = list(texts)
    for i, (shown, text) in enumerate(zip(SHOWN, texts)):
        if (tag_of(text) or "").startswith(PREVIOUS):
            continue  # an earlier edit's already
        plain = unmarked(text)
        if shows_edit(shown, plain, session, edit, baseline_table):
            after[i] = marked(plain, f"{PREVIOUS}:{start}", f"From an earlier edit, {words}: "
                              f"{AGAIN[shown.group]}.", shown.html)
    return _changed(list(texts), after) + _labels(after)


def settings_line(session: Session, texts: list, values: dict, baseline_table, start: int | None = None) -> list:
    """`texts` with the `SETTINGS` line where they show the session's edit and the form's
    `values` are not its settings, without it where they are; the `PREVIOUS` lines of the
    run `start` (one that failed: the edit on show is still the session's) taken off."""
    edit, after = session.edit, list(texts)
    if edit is None:
        return after
    diffs = differences(values, edit)
    words = edit_words(session, edit)
    for i, (shown, text) in enumerate(zip(SHOWN, texts)):
        why = tag_of(text) or ""
        if why.startswith(PREVIOUS) and why != f"{PREVIOUS}:{start}":
            continue  # an earlier edit's: it stays until replaced
        plain = unmarked(text)
        if diffs and shows_edit(shown, plain, session, edit, baseline_table):
            after[i] = marked(plain, SETTINGS, f"These results are of {words}; the form now says "
                              f"{', '.join(diffs)}: press **Run edit** for those settings.", shown.html)
        else:
            after[i] = plain
    return after


def on_settings_changed(*args):
    """A setting of the Edit form changed (typed, dragged, a preset, a restore): the results
    of the edit on show say so where the form no longer holds its settings, and stop saying
    so where it holds them again. Nothing while a new edit runs (its start marked them)."""
    values, session, baseline_table, texts = _split(args)
    if session.edit is None or session.extra.get("stale_run") is not None:
        return [gr.skip()] * (len(SHOWN) + len(LABELLED))
    after = settings_line(session, texts, values, baseline_table)
    return _changed(texts, after) + _labels(after)


def on_run_ended(*args):
    """Run edit ended. Done: what cannot carry the line is cleared (the marked texts stay
    until replaced; the card is the new edit's to draw). Failed or refused: the edit on show
    is still the session's, so this start's lines come off again (the form's line where the
    form is not its settings)."""
    values, session, baseline_table, texts = _split(args)
    held = session.extra.pop("stale_run", None)
    skip = [gr.skip()] * (len(SHOWN) + len(LABELLED))
    if held is None:
        return skip + [gr.skip()] * len(CLEARED)
    edit, start = held[0](), held[1]
    if edit is not None and edit is session.edit:
        after = settings_line(session, texts, values, baseline_table, start)
        return _changed(texts, after) + _labels(after) + [gr.skip()] * len(CLEARED)
    cleared = [plots.empty_figure("Cleared: it showed an earlier edit. Run the attacks for this one."),
               plots.empty_figure("Cleared: it showed an earlier edit. Tick the logit lens and run the attacks."),
               plots.empty_figure("Cleared: it showed an earlier edit. Press Draw for this one."),
               plots.empty_figure("Cleared: it showed an earlier edit. Press Influence for this one."),
               empty_table("influence"), empty_table("quantization")]
    return skip + cleared


def _split(args) -> tuple[dict, Session, object, list]:
    """(form values by name, session, the baseline's table, texts) of a handler's inputs
    (`inputs`: the form's widgets, the session, the baseline's table, then `SHOWN`)."""
    values = dict(zip(NAMES, args[:len(NAMES)]))
    session, baseline_table, *texts = args[len(NAMES):]
    return values, session, baseline_table, list(texts)


def shown_widgets(page: Page) -> list:
    return [getattr(getattr(page.ui, s.panel), s.name) for s in SHOWN]


def label_of(kind: str):
    """The handler giving table `kind` its own label back (`TABLE_LABELS`): its new rows are
    the edit's on show (a label-only update does not change its rows)."""
    def on_table_changed():
        return gr.Dataframe(label=TABLE_LABELS[kind])
    return on_table_changed


def wire(page: Page) -> None:
    """Run edit pressed, every setting of the form changed, the run ended: the lines above;
    a table's new rows: its own label."""
    ui, s = page.ui, page.session
    texts = shown_widgets(page)
    tables = [getattr(getattr(ui, panel), name) for panel, name, _, _ in LABELLED]
    form = widgets(ui.edit, ui.layers)
    inputs = form + [s, ui.baseline.table] + texts
    ui.edit.run.click(on_run_started, [s, ui.baseline.table] + texts, texts + tables, show_progress="hidden",
                      **LOCAL)
    gr.on([w.change for w in form], on_settings_changed, inputs, texts + tables, trigger_mode="always_last",
          show_progress="hidden", **LOCAL)
    for table, (_, _, kind, _) in zip(tables, LABELLED):  # new rows: the table's own label again
        table.change(label_of(kind), None, table, show_progress="hidden", **LOCAL)
    page.edit_run.then(on_run_ended, inputs, texts + tables + [getattr(getattr(ui, p), n) for p, n in CLEARED],
                       show_progress="hidden", **LOCAL)
