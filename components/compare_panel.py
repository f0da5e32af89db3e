"""Compare panel: the benchmark's metrics before and after the edit (and for the retain
model where there is one), the Final score, and generations side by side with the changed
words highlighted, for forget and retain examples and for a prompt the user types; below
the metrics, the comparison with a gradient baseline (`components.baseline_panel`).

The base model's row and the reference's do not change between edits, so they are
computed once per (model, benchmark, size) and reused: an edit then costs one row.
"""
from __future__ import annotations

import logging
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np

from components.server.device import DEVICE_LOCK, device_progress, on_device
from components.server.durations import generate_s
from components.server.errors import UserError, ui_errors
from components.server.limits import limit
from components.server.session import (
    REGISTRY,
    ModelKey,
    Session,
    current_benchmark,
    current_edit,
    current_model,
    in_turn,
    resident,
)
from components.studio import cards
from components.studio.benchmarks import NAME_ONLY
from components.studio.comparison import FORGET_SETS, RETAIN_SETS, comparison_report, covers_split, examples_per_set
from components.studio.downloads import report_files
from components.studio.wiring import LOCAL, Page, device_queue
from components.views import text
from components.views.card import (
    Times,
    card_html,
    classes_line,
    counts,
    headline,
    pending,
    probe_line,
    retain_advice,
    wrong_values,
)
from components.views.diff import answer_html, generations_html
from components.views.tables import TABLE_LABELS, download_box, empty_table, metrics_frame, styled
from grom.eval import compare_generations
from grom.eval.report import BASE, EDITED
from grom.eval.runner import generate
from grom.tasks.knowledge import split_decoding

log = logging.getLogger(__name__)
SHOWN = 5
SHOWN_CARD = 100  # the forget answers the card chooses its two examples from (`pick_examples`)


def _pick(sets: dict, names) -> str | None:
    return next((n for n in names if n in sets), None)


def generation_rows(report, names, n: int = SHOWN) -> list[dict]:
    """Before/after rows for up to `n` examples of the first of `names` the report has."""
    name = _pick(report.rows[EDITED].examples, names)
    if name is None or name not in report.rows[BASE].examples:
        return []
    before, after = report.examples(BASE, name), report.examples(EDITED, name)
    col = "generation" if "generation" in after else "predicted" if "predicted" in after else None
    if col is None:
        return []
    rows = []
    for i in range(min(n, len(after))):
        pb = before["prob"].iloc[i] if "prob" in before else None
        pa = after["prob"].iloc[i] if "prob" in after else None
        said = str(after[col].iloc[i])
        if "cut" in after and bool(after["cut"].iloc[i]):  # a first verdict's answer not read in full yet
            said = f"{said} … (still being read)"
        row = {"question": str(after["question"].iloc[i]), "answer": str(after["answer"].iloc[i]),
               "before": str(before[col].iloc[i]), "after": said,
               "prob_before": None if pb is None else float(pb),
               "prob_after": None if pa is None else float(pa)}
        if "fact" in after:  # the keyword fact recall looks for
            row["fact"] = str(after["fact"].iloc[i])
        if "fact_recall" in after and "fact_recall" in before:  # did the answer state the fact?
            row["fact_before"] = bool(before["fact_recall"].iloc[i])
            row["fact_after"] = bool(after["fact_recall"].iloc[i])
        if "answer_class" in after:  # what the answer is: kept, a refusal, another fluent one, degenerate
            row["class_after"] = str(after["answer_class"].iloc[i])
        rows.append(row)
    return rows


def summary_md(report, n, whole: bool = False, rho: float | None = None, fitted: bool = True) -> str:
    """The comparison in a paragraph: its size and time, the card's headline lines (the same
    counts: `grom.eval.verdicts.Tally`), the retain set's state (with what to change where
    it broke, `retain_advice` with the edit's `rho`) and the Final score. fitted: see
    `probe_line`."""
    m = report.rows[EDITED].metrics
    size = ("all examples" if n is None else f"up to {n} examples per set"
            + (": every example of the split" if whole else ""))
    head = f"Compared on {report.benchmark}/{report.split} ({size}) in {report.seconds:.1f} s."
    if counts(report) is not None:
        head += f" {headline(report)}."
        probes = probe_line(report, whole, fitted)
        head += f" {probes}" if probes else ""
        extra = classes_line(report)
        head += f" {extra}" if extra else ""
        if m.get("Retain broken"):
            head += f" ⚠ The retain set broke (it lost more than a tenth of what it knew). {retain_advice(rho)}"
    if "Final score" in m:
        base = report.table()["Final score"]
        parts = " · ".join(f"{row} **{v:.3f}**" for row, v in base.items() if not np.isnan(v))
        head += f" Final score: {parts}."
    return head


def remember(session: Session, edit, report, whole: bool) -> None:
    """Keep the comparison the card states: the largest one made for the session's edit (one
    that holds every example beats any sample, a larger sample a smaller one), so that a
    later, larger evaluation changes the card and a later quick look does not undo it."""
    size = sum(report.n_examples.values())
    held = session.extra.get("card")
    if pending(report) and held is not None and held[0] is edit:
        return  # a first verdict never replaces a card of the same edit
    if (held is None or held[0] is not edit or whole
            or (not held[2] and size >= held[3])):
        session.extra["card"] = (edit, report, whole, size)


def with_wrong_values(rows: list[dict], bench) -> list[dict]:
    """`rows` with each question's wrong values (`wrong_values`: what the benchmark's wrong
    answers put in place of the fact), where the benchmark has wrong answers: an unedited
    answer that names one beside the fact was credited by the keyword alone."""
    examples = {}
    for ex in (e for part in ((bench.eval_sets or {}).values() if bench is not None else ()) for e in part):
        if getattr(ex, "perturbed_answers", None):
            examples.setdefault(ex.question, ex)
    for row in rows:
        ex = examples.get(row["question"])
        if ex is not None:
            row["wrong"] = wrong_values(ex.answer, ex.perturbed_answers)
    return rows


STAGE_WORDS = {"forget": "the forget answers", "answers": "the answers", "full": "the comparison"}
"""What each evaluation stage computed (`grom.eval.evaluate(stage=)`), as the card's times
name it; a stage that built on the one before is named for what it added (`stage_time`)."""


def stage_time(stages: list[dict], report) -> tuple[str, float]:
    """(what, its own seconds) of a stage `report` of the edit whose earlier stages are
    `stages` (dicts of stage, n_examples, seconds). The answers stage after a first verdict
    of the same size decoded only the other answers, and its report's seconds hold the
    first step's as well (`on_card_first` adds them): they are taken off. The comparison
    after an answers stage of the same size added the probabilities and truth ratios."""
    stage, seconds = getattr(report, "stage", "full"), float(getattr(report, "seconds", 0.0))
    before = {s["stage"]: s for s in stages if s["n_examples"] == report.n_examples}
    if stage == "answers" and "forget" in before:
        return "the other answers", max(0.0, seconds - before["forget"]["seconds"])
    if stage == "full" and "answers" in before:
        return "the probabilities and truth ratios", seconds
    if stages and stage == "full":
        return "a larger comparison", seconds  # `remember` keeps the largest
    return STAGE_WORDS.get(stage, "the comparison"), seconds


def card_times(session: Session, edit, report) -> tuple[Times, bool]:
    """The times the card of `edit` states, drawn from `report`, and whether this is the
    edit's first card. Each stage's time is recorded once, the first time its report is
    drawn, and never computed again; the wait is taken at the first card, from the press
    of Run edit that `on_run_edit` recorded (`clicked`; none for an opened or imported
    run), so a later draw adds the later stages and changes nothing shown before. A stage
    of a size already recorded (Compare pressed again) adds nothing."""
    log = session.extra.get("card_times")
    if log is None or log["edit"] is not edit:
        log = session.extra["card_times"] = {"edit": edit, "stages": [], "drawn": [], "first": None}
    stage, size = getattr(report, "stage", "full"), dict(report.n_examples)
    again = any(s["stage"] == stage and s["n_examples"] == size for s in log["stages"])  # the same one, again
    if not again and not any(ref() is report for ref in log["drawn"]):
        what, seconds = stage_time(log["stages"], report)
        log["drawn"].append(weakref.ref(report))
        log["stages"].append({"stage": stage, "n_examples": size, "what": what, "seconds": seconds})
    first = log["first"] is None
    if first:
        clicked = session.extra.get("clicked")  # (edit, start time, pressed): `on_run_edit`
        started = clicked is not None and clicked[0] is edit
        log["first"] = (len(log["stages"]), max(0.0, time.time() - clicked[1]) if started else None,
                        bool(clicked[2]) if started else True)
    n, waited, pressed = log["first"]
    stages = tuple((s["what"], s["seconds"]) for s in log["stages"])
    return Times(float(edit.timings.get("total", 0.0)), stages[:n], waited, pressed, stages[n:]), \
        first and waited is not None


def result_card(session: Session) -> str:
    """The plain-language result under Run edit, from the largest comparison of the edit:
    forgotten and kept with the counts behind them, the retain set's state, what the forget
    answers became, two before/after forget answers that stated their fact plainly
    (`pick_examples`), and the times (`card_times`: each stage's, recorded once, and the
    visitor's wait to the first card)."""
    held, edit = session.extra.get("card"), session.edit
    if held is None or edit is None or held[0] is not edit:
        return gr.skip()
    _, report, whole, _ = held
    rows = with_wrong_values(generation_rows(report, FORGET_SETS, n=SHOWN_CARD), session.benchmark)
    held = session.extra.get("attacks")  # (edit, {method: {attack: AttackResult}}) of the "Is it gone?" tab
    attacks = held[1].get("GROM") if held is not None and held[0] is edit else None
    times, first = card_times(session, edit, report)
    rho = getattr(getattr(edit, "config", None), "rho", None)
    fitted = not (session.bench_label or "").startswith(NAME_ONLY + "/")  # name only: the model's text was fitted
    return card_html(report, times.edit_s, whole, rows, attacks, rho=rho, first=first, fitted=fitted, times=times)


def card_key_of(session: Session, edit, n) -> str | None:
    """The key (`cards.card_key`) of `edit`'s card on the session's model and benchmark with
    `n` examples per set; None where the edit records no run or the weights are not known.
    The fingerprint is read under the device lock: another visitor's edit may be applied
    for a moment (it is computed once per model)."""
    handle, bench = REGISTRY.get(session.model_key), session.benchmark
    run = getattr(edit, "run", None)
    if handle is None or bench is None or not run or getattr(edit, "method", "grom") != "grom":
        return None
    weights = cards.fingerprint_of(handle)
    if weights is None:
        return None
    return cards.card_key(weights, handle.key.dtype, bench, cards.config_of(edit.settings.to_dict(), run), run, n)


def keep_card(session: Session, n) -> None:
    """The session's whole card, kept on disk under its key (`cards.keep`) without this visit's
    wait, so that a page asking the same opens with it. Not a first verdict."""
    held, edit = session.extra.get("card"), session.edit
    if held is None or edit is None or held[0] is not edit or pending(held[1]):
        return
    _, report, whole, _ = held
    rows = with_wrong_values(generation_rows(report, FORGET_SETS, n=SHOWN_CARD), session.benchmark)
    fitted = not (session.bench_label or "").startswith(NAME_ONLY + "/")
    html = card_html(report, edit.timings.get("total", 0.0), whole, rows, None,
                     rho=getattr(edit.settings, "rho", None), fitted=fitted)
    session.extra["card_html"] = (edit, html)  # a link to the run keeps it (export_panel.on_make_link)
    key = card_key_of(session, edit, n)
    if key is not None and session.extra.get("keep_card", True):  # False: the warm-up holding answers alone
        cards.keep(key, html, session.model_key.device)


ANSWERS_FIRST = ("knowledge",)
"""The tasks whose card rests on the greedy answers alone (fact recall, answer classes):
after an edit their answers are evaluated first and the card drawn from them
(`on_card_first`), and the comparison that follows adds the teacher-forced scores to
those very answers."""


def _answers(session: Session, bench, edit, n):
    """The answers-stage report made for this edit, benchmark and size, else None."""
    held = session.extra.get("answers")
    return held[3] if held is not None and held[0] is edit and held[1] is bench and held[2] == n else None


@ui_errors
def on_card_first(max_examples: int, full_set: bool, session: Session, progress=gr.Progress()):
    """Right after an edit, on a benchmark in `ANSWERS_FIRST`, the card, on a CPU in two
    steps (a generator: gradio sends each as it comes; `grom.tasks.knowledge.split_decoding`).
    First the forget verdict, from the answers to the forget questions and the held-out
    probes alone (`stage="forget"`); then the whole card, from the answers of every other
    set (the forget set's paraphrases, the kept facts: `stage="answers"`, the first step's
    answers given; on a GPU every answer, in one step), before the
    comparison's probabilities and truth ratios (about a third of its time on SmolLM2).
    The Base row is reused where this process has it. Elsewhere nothing: the comparison
    draws the card."""
    bench = current_benchmark(session)
    if bench.task not in ANSWERS_FIRST:
        yield gr.skip()
        return
    handle, edit = current_model(session), current_edit(session)
    n = examples_per_set(max_examples, full_set, bench)
    first = None
    if split_decoding(handle.model):  # on a CPU: the forget verdict first (on a GPU it would cost time)
        first = comparison_report(handle, bench, edit, n,
                                  device_progress(lambda f, m: progress(f, desc=f"the forget answers: {m}")),
                                  stage="forget")
        remember(session, edit, first, covers_split(bench, n))
        yield result_card(session)
    report = comparison_report(handle, bench, edit, n,
                               device_progress(lambda f, m: progress(f, desc=f"the other answers: {m}"
                                                                     if first else f"the answers: {m}")),
                               stage="answers", answers=first)
    if first is not None:
        report.seconds += first.seconds  # the card's answers took both steps
    session.extra["answers"] = (edit, bench, n, report)
    remember(session, edit, report, covers_split(bench, n))
    keep_card(session, n)
    yield result_card(session)


@ui_errors
def on_compare(max_examples: int, full_set: bool, session: Session, progress=gr.Progress()):
    """Metrics before/after (+ retain model) and generations for forget and retain examples
    (the answers of `on_card_first` where it ran for this edit and size: not decoded again)."""
    handle = current_model(session)
    edit = current_edit(session)
    bench = current_benchmark(session)
    n = examples_per_set(max_examples, full_set, bench)
    report = comparison_report(handle, bench, edit, n, device_progress(lambda f, m: progress(f, desc=m)),
                               answers=_answers(session, bench, edit, n))
    session.report, session.report_for = report, (bench, edit, n)
    whole = covers_split(bench, n)
    remember(session, edit, report, whole)
    keep_card(session, n)
    forget = generation_rows(report, FORGET_SETS)
    retain = generation_rows(report, RETAIN_SETS)
    rho = getattr(getattr(edit, "config", None), "rho", None)
    fitted = not (session.bench_label or "").startswith(NAME_ONLY + "/")
    return (summary_md(report, n, whole, rho, fitted), styled(metrics_frame(report)),
            generations_html(forget, "Forget examples: the answers should stop stating the fact, in words",
                             kind="forget"),
            generations_html(retain, "Retain examples: the answers should stay", kind="retain"))


@on_device(duration=generate_s)
def _generate(key: ModelKey, prompt: str, edit, fmt) -> list[dict]:
    """The prompt's greedy answer before and after `edit` (None: the original model's only)."""
    with DEVICE_LOCK:
        handle = resident(key, "request")
        if edit is None:
            answer = generate(handle.model, handle.tokenizer, [prompt], prompt_format=fmt,
                              max_new_tokens=limit("GROM_MAX_NEW_TOKENS"))[0]
            return [{"question": prompt, "before": answer}]
        return compare_generations(handle.model, handle.tokenizer, [prompt], edit,
                                   prompt_format=fmt, max_new_tokens=limit("GROM_MAX_NEW_TOKENS"))


@ui_errors
def on_generate(prompt: str, session: Session):
    """The typed prompt answered before and after the session's edit, changed words
    highlighted; with no edit (none yet, or Reset), the original model's answer alone."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise UserError("Type a question first.")
    if len(prompt) > 2000:
        raise UserError("The prompt is longer than 2000 characters; shorten it.")
    handle = current_model(session)
    edit = current_edit(session) if session.edit is not None else None
    fmt = session.benchmark.prompt_format if session.benchmark is not None else None
    rows = _generate(handle.key, prompt, edit, fmt)
    if edit is None:
        return answer_html(rows[0]["question"], rows[0]["before"],
                           "No edit: this is the original model's answer. Run an edit to compare.")
    return generations_html(rows)


def on_compare_files(session: Session):
    """The last comparison as files: its metrics, every answer of every row and set, and the
    whole report as JSON. Written once per comparison (the table's change event runs outside
    the queue and may be called any number of times: the same files are given again while
    they are on disk)."""
    report = session.report
    if report is None:
        return None
    done = session.extra.get("report_files")
    if done is not None and done[0] is report and all(Path(p).is_file() for p in done[1]):
        return done[1]
    paths = report_files(report, f"{report.benchmark}-{report.split}")
    session.extra["report_files"] = (report, paths)
    return paths


def ask_box(session: Session):
    """The question box's example: a forget question of the loaded benchmark (the demo's
    authors mean nothing to SmolLM2, nor the solar system to the demo)."""
    bench = session.benchmark
    question = next((getattr(ex, "question", "") for ex in (bench.forget if bench is not None else ())
                     if getattr(ex, "question", "")), "")
    hint = f"e.g. {question}  (Enter to ask)" if question else "a question for the model  (Enter to ask)"
    return gr.Textbox(placeholder=hint[:200])


def build_compare_panel(examples: int = 20) -> SimpleNamespace:
    text.md(text.COMPARE, elem_classes="panel-intro")
    with gr.Row(equal_height=False):
        max_examples = gr.Slider(5, 200, value=examples, step=5, label="Examples per evaluation set",
                                 info="a quick look; tick 'all examples' for the paper's numbers",
                                 scale=4, buttons=[])
        with gr.Column(scale=1, min_width=140):
            full_set = gr.Checkbox(value=False, label="all examples")
            run = gr.Button("Compare", size="sm", elem_id="compare-button")
    summary = gr.Markdown("Run an edit: the comparison follows.", elem_id="compare-summary")
    table = gr.Dataframe(empty_table("metrics"), label=TABLE_LABELS["metrics"], interactive=False,
                         wrap=True,
                         max_height=420, elem_id="metrics-table")
    files = download_box("the comparison (metrics, every answer)")
    with gr.Accordion("What the metrics mean", open=False, elem_id="metrics-glossary"):
        gr.Markdown(text.GLOSSARY, elem_classes="glossary")
    return SimpleNamespace(max_examples=max_examples, full_set=full_set, run=run, summary=summary,
                           table=table, files=files)


def build_answers_panel() -> SimpleNamespace:
    """Below the metrics (and the baseline, which app.py places between): the forget and
    retain answers before and after, and a question of the user's own."""
    forget_html = gr.HTML(elem_id="forget-generations")
    retain_html = gr.HTML(elem_id="retain-generations")
    with gr.Row(equal_height=False, elem_classes="ask-row"):
        prompt = gr.Textbox(label="Ask your own question", scale=4,
                            placeholder="a question for the model  (Enter to ask)")
        ask = gr.Button("Ask before and after", scale=1, min_width=150, size="sm")
    prompt_html = gr.HTML()
    return SimpleNamespace(forget_html=forget_html, retain_html=retain_html, prompt=prompt, ask=ask,
                           prompt_html=prompt_html)


def wire_compare(c: SimpleNamespace, page: Page) -> None:
    """After an edit (`page.edit_done`): its first card, then the comparison and the whole card
    (private; sets `page.edit_compared`); Compare (public `compare`; sets `page.compared`) and the
    attack suite change the card too; the comparison's files under its table."""
    s, e, a = page.session, page.ui.edit, page.ui.answers
    compare_io = ([c.max_examples, c.full_set, s], [c.summary, c.table, a.forget_html, a.retain_html])
    card = page.edit_done.success(in_turn(on_card_first), compare_io[0], e.card, api_name="card_after_edit",
                                  api_visibility="private", show_progress_on=[e.status], scroll_to_output=True,
                                  **device_queue())
    page.edit_compared = card.success(in_turn(on_compare), *compare_io, api_name="compare_after_edit",
                                      api_visibility="private", show_progress_on=[c.summary], **device_queue()) \
                             .success(result_card, s, e.card, scroll_to_output=True, **LOCAL)
    page.compared = c.run.click(in_turn(on_compare), *compare_io, api_name="compare", **device_queue())
    page.compared.success(result_card, s, e.card, **LOCAL)  # a larger evaluation changes the card
    page.attacked.success(result_card, s, e.card, **LOCAL)  # the card gains the held-out line
    c.table.change(on_compare_files, s, c.files, **LOCAL)  # the comparison: metrics and every answer


def wire_answers(a: SimpleNamespace, page: Page) -> None:
    """Ask (public `generate`, and Enter in the box); new data or an opened run: an example
    question of it in the box."""
    s = page.session
    a.ask.click(in_turn(on_generate), [a.prompt, s], a.prompt_html, api_name="generate", **device_queue())
    a.prompt.submit(in_turn(on_generate), [a.prompt, s], a.prompt_html, api_visibility="private", **device_queue())
    for done in (page.data_loaded, *page.run_opened):
        done.success(ask_box, s, a.prompt, **LOCAL)
