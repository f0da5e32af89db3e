"""Benchmark panel: a registered benchmark and split, loaded as soon as either is chosen (the
demo works offline; the Hub ones need the network or a local folder), or uploaded files or
what the model wrote (name only), loaded on their own button; a few forget and retain
examples to read. A load is refused where an example is longer than
GROM_MAX_EXAMPLE_TOKENS or the forget set longer than GROM_MAX_JOB_TOKENS, counted with the
session's model's tokenizer (`components.server.costs`); the session keeps what it had."""
from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from components.server.device import device_progress
from components.server.errors import UserError, shorten, ui_errors
from components.server.session import REGISTRY, Session, current_model, in_turn
from components.studio import form
from components.studio.benchmarks import (
    NAME_ONLY,
    SESSION_DATA,
    benchmark_names,
    check_once,
    default_split,
    fit_note,
    forget_choice,
    note_choice,
    note_load,
    preset_for,
    preset_note,
    read_benchmark,
    retain_warning,
    splits_for,
)
from components.studio.name_only import COLUMNS, MAX_NEIGHBOURS, as_table, write_rows, writing_config
from components.studio.wiring import LOCAL, Page, device_queue
from components.views import text
from components.views.tables import describe, examples_html
from grom.tasks.name_only import USES

USE_LABELS = {"passages": "passages (RWKU's)", "questions": "its answers to its questions (ours)"}


def loads_when_chosen(name: str) -> bool:
    """Whether choosing `name` (or one of its splits) loads it at once: every registered
    benchmark but those whose data the visitor gives (uploaded files; name only: what the
    model wrote), which load on their own button once given."""
    return name in dict((v, v) for _, v in benchmark_names()) and name not in SESSION_DATA


def on_benchmark_change(name: str, asked: int, session: Session):
    """A benchmark chosen: the split box on its choices and default split, the name-only box
    or the files box opened where the data are the visitor's, and (a registered benchmark)
    `asked` bumped, which loads it (`wire`), once per choice. The choice is noted, so that
    Run edit refuses the old data until a load ends (`check_choice`)."""
    split = default_split(name)
    new = note_choice(session, name, split)
    return (gr.Dropdown(choices=splits_for(name), value=split),
            gr.Accordion(visible=name == NAME_ONLY, open=name == NAME_ONLY),
            gr.Accordion(open=True) if name == "custom" else gr.skip(),
            _bumped(asked) if new and loads_when_chosen(name) else gr.skip())


def on_split_change(name: str, split: str, asked: int, session: Session):
    """A split chosen: loaded at once (`asked` bumped) where the benchmark loads when chosen."""
    new = note_choice(session, name, split)
    return _bumped(asked) if new and loads_when_chosen(name) else gr.skip()


def _bumped(asked) -> int:
    """The choice counter after one more choice (a value the page did not set: from 0)."""
    ok = isinstance(asked, (int, float)) and not isinstance(asked, bool) and 0 <= asked < 1 << 30
    return (int(asked) if ok else 0) + 1


@ui_errors
def on_write(split: str, passages, questions, neighbours, session: Session, progress=gr.Progress()):
    """The loaded model writes about the chosen subject and its neighbours (RWKU's
    name-only setting): the table to read and edit, and a line saying what came back."""
    handle = current_model(session)
    subject = (split or "").strip()
    if subject not in splits_for(NAME_ONLY):
        raise UserError(f"Choose one of the bundled subjects as the split (not {shorten(subject)!r}): its "
                        "bundled questions are what the edit is scored on.")
    config = writing_config(passages, questions, neighbours)
    progress(0.0, desc="writing with the model")
    records = write_rows(handle.key, subject, config,
                         device_progress(lambda _f, desc=None: progress(0.5, desc=desc)))
    sides = {side: [r for r in records if r["side"] == side] for side in ("forget", "retain")}
    line = (f"The model wrote {len(sides['forget'])} texts about **{subject}** "
            f"({sum(r['kind'] == 'qa' for r in sides['forget'])} questions it answered itself) and "
            f"{len(sides['retain'])} about {config.neighbours} neighbour{'s' * (config.neighbours != 1)}. "
            "Read them, edit or delete rows (clear a text to drop it), then **Load what was written**.")
    table = as_table(records)
    use = session.extra.get("written", (None, "passages"))[1]
    session.extra["written"] = (kept_written(table), use)  # kept for the load: an API client's too
    return table, line


def on_restore_benchmark(session: Session):
    """After a failed load: the benchmark and split boxes show what the session still has
    loaded (what Run edit will use), and the line under them says so."""
    forget_choice(session)  # the boxes show the loaded data again
    bench = session.benchmark
    if bench is None:
        return gr.skip(), gr.skip(), "⚠ That benchmark did not load (the message says why); none is loaded yet."
    name = session.bench_label.split("/", 1)[0] or bench.name
    return (name, gr.Dropdown(choices=splits_for(name), value=bench.split),
            f"⚠ That benchmark did not load (the message says why). Still loaded, and what Run edit "
            f"uses: {describe(bench)}")


def _tokenizer(session: Session):
    """The tokenizer of the session's model (what its jobs will count with), or None where
    no model is loaded: the load then checks lengths only. Read without the device lock
    (`REGISTRY.peek`): a load behind another visitor's edit waited for its turns (96 s)."""
    if session.model_key is None and REGISTRY.current is not None:
        session.model_key = REGISTRY.current.key
    handle = REGISTRY.peek(session.model_key)
    return handle.tokenizer if handle is not None else None


WRITTEN_MAX_CHARS = 1 << 20
"""The most text of a name-only table a session keeps (what the model writes at
GROM_MAX_WRITTEN texts: about 0.3 MB): the table's change event runs outside the queue, so
this bounds what any request can leave in a session (issue 45, item 2)."""


def kept_written(table) -> str | None:
    """The name-only table as a session keeps it: its columns' texts as one JSON string
    (memory: about a byte a character, whatever the table's shape), None when empty; a
    `UserError` for a table without the written columns or of more than WRITTEN_MAX_CHARS."""
    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table) if table is not None else None
    if frame is None or frame.empty:
        return None
    if list(frame.columns)[:len(COLUMNS)] != list(COLUMNS) or frame.size > WRITTEN_MAX_CHARS // 2:
        raise UserError(f"The written table must have the columns {', '.join(COLUMNS)} and at most "
                        f"{WRITTEN_MAX_CHARS:,} characters: write it again.")
    text = json.dumps(frame[list(COLUMNS)].fillna("").astype(str).values.tolist(), ensure_ascii=False)
    if len(text) > WRITTEN_MAX_CHARS:
        raise UserError(f"The written table holds {len(text):,} characters, more than the {WRITTEN_MAX_CHARS:,} "
                        "a session keeps: delete some rows.")
    return text


def written_frame(kept: str | None) -> pd.DataFrame | None:
    """The table `kept_written` kept."""
    return None if kept is None else pd.DataFrame(json.loads(kept), columns=list(COLUMNS))


@ui_errors
def on_written_edit(table, use: str, session: Session) -> None:
    """The name-only table as it stands (written, then edited) and what of it to fit, kept
    in the session for the load (bounded: `kept_written`): the `load_benchmark`
    endpoint keeps its five inputs. A table or choice it cannot keep leaves the kept one."""
    if use not in USES:
        raise UserError(f"Fit on one of {', '.join(USES)}.")
    session.extra["written"] = (kept_written(table), use)


@ui_errors
def on_load_benchmark(name: str, split: str, source: str, forget_file, retain_file, session: Session):
    """Load the chosen benchmark into the session; returns its description, a few forget
    and retain examples, and the suggested preset. Benchmark name-only: the session's
    written table (`on_written_edit`)."""
    model_name = session.model_key.name if session.model_key else None
    written, use = session.extra.get("written", (None, "passages"))
    bench = read_benchmark(name, split, source, forget_file, retain_file, model_name, written_frame(written), use)
    # every job checks again, with the model it runs on; a shared benchmark once per model
    check_once(bench, _tokenizer(session), session.model_key)
    session.benchmark = bench
    session.bench_label = f"{name}/{bench.split}"
    session.extra["bench_source"] = (source or "").strip()  # the run's record (components.runs)
    session.scores = session.scores_for = None
    note_load(session)
    preset = preset_for(name, bench.split, model_name)
    warning = retain_warning(bench) + fit_note(name, model_name)
    if warning:
        gr.Warning(warning.strip())
    info = describe(bench) + preset_note(name, bench.split) + warning
    return (info, examples_html(bench.forget, f"Forget set: {len(bench.forget)} examples"),
            examples_html(bench.retain, f"Retain set: {len(bench.retain)} examples"), preset)


def on_model_loaded(session: Session):
    """A new model: the benchmark line says whether this model can know its facts, and the
    Edit panel takes the preset that fits the model for the loaded benchmark, with the run's
    settings that preset has defaults for (`form.RUN_DEFAULTED`: SmolLM2's 128 retain
    examples are not the demo's 1600)."""
    bench = session.benchmark
    if bench is None or session.model_key is None:
        return [gr.skip()] * (2 + len(form.RUN_DEFAULTED))
    name, model = session.bench_label.split("/", 1)[0], session.model_key.name
    note = fit_note(name, model)
    if note:
        gr.Warning(note.strip())
    info = describe(bench) + preset_note(name, bench.split) + retain_warning(bench) + note
    preset = preset_for(name, bench.split, model)
    return [info, preset, *form.run_defaults(preset)]


def build_benchmark_panel(start: str = "demo", start_split: str = "forget10") -> SimpleNamespace:
    """The benchmark and split boxes (choosing either loads it), the loaded data's line, and
    folded: a local folder or your own files, with their Load benchmark button."""
    with gr.Row(equal_height=True):
        name = gr.Dropdown(benchmark_names(), value=start, label="Benchmark", scale=3, min_width=200)
        split = gr.Dropdown(splits_for(start), value=start_split, label="Split", scale=2, min_width=120,
                            allow_custom_value=True)
    info = gr.Markdown("", elem_classes="status-line", elem_id="bench-info")
    with gr.Accordion("A local folder, or your own files", open=False) as files_box:
        text.md(text.BENCHMARK, elem_classes="panel-intro")
        source = gr.Textbox(label="Local folder (instead of the Hub)",
                            placeholder="a folder under data/ in the benchmark's format; Enter loads it")
        gr.Markdown("Your own sets (benchmark **custom**): JSON, JSON lines or CSV rows with "
                    "`question` and `answer` (or `text`); one file with a `split` column of "
                    "forget/retain, or one file each.")
        with gr.Row():
            forget_file = gr.File(label="Forget file", file_types=[".json", ".jsonl", ".csv"], height=110)
            retain_file = gr.File(label="Retain file (optional)", file_types=[".json", ".jsonl", ".csv"],
                                  height=110)
        load = gr.Button("Load benchmark", size="sm", elem_id="load-benchmark")
    asked = gr.State(0)  # bumped by a choice that loads at once (`on_benchmark_change`)
    w = build_written(start == NAME_ONLY)
    return SimpleNamespace(name=name, split=split, source=source, forget_file=forget_file,
                           retain_file=retain_file, load=load, info=info, files_box=files_box, asked=asked,
                           **vars(w))


def build_written(shown: bool) -> SimpleNamespace:
    """The name-only box: how much the model writes, the button, and the table it fills."""
    with gr.Accordion("Name only (RWKU): the model writes what to forget", open=shown, visible=shown,
                      elem_id="name-only") as box:
        text.md(text.NAME_ONLY, elem_classes="panel-intro")
        text.md(text.NAME_ONLY_TIME, elem_classes="panel-intro")
        with gr.Row(equal_height=True):
            passages = gr.Slider(0, 32, value=8, step=1, label="Passages about the subject", min_width=160)
            questions = gr.Slider(0, 48, value=16, step=1, label="Questions about the subject", min_width=160)
            neighbours = gr.Slider(0, MAX_NEIGHBOURS, value=2, step=1, label="Neighbouring subjects (kept)",
                                   min_width=160)
        with gr.Row(equal_height=True):
            # RWKU's GA/NPO fit the passages (its default here); the model's own answers to its questions are ours
            use = gr.Radio([(USE_LABELS.get(u, u), u) for u in USES], value="passages", label="Fit on", scale=2,
                           min_width=200)
            write = gr.Button("Write with the model", scale=1, min_width=180)
        written_info = gr.Markdown("", elem_classes="status-line")
        written = gr.Dataframe(headers=list(COLUMNS), datatype=["str"] * len(COLUMNS), interactive=True,
                               wrap=True, max_height=420, label="What the model wrote (editable)",
                               column_widths=["46%", "24%", "10%", "9%", "11%"])
        load_written = gr.Button("Load what was written", size="sm")
    return SimpleNamespace(written_box=box, passages=passages, questions=questions, neighbours=neighbours,
                           use=use, write=write, written_info=written_info, written=written,
                           load_written=load_written)


def build_examples_panel() -> SimpleNamespace:
    """The browsing view: a few forget and retain examples of the loaded benchmark."""
    gr.Markdown("The first few examples of the loaded benchmark: the forget set (to unlearn) "
                "and the retain set (to keep).", elem_classes="panel-intro")
    forget_df = gr.HTML(elem_id="forget-examples")
    retain_df = gr.HTML(elem_id="retain-examples")
    return SimpleNamespace(forget_df=forget_df, retain_df=retain_df)


def wire(b: SimpleNamespace, page: Page) -> None:
    """Choosing a benchmark or split loads it (public `load_benchmark`, as Load benchmark
    does for a folder or files, and Load what was written for name only; sets
    `page.data_loaded`), then the Data tab; a failed load restores the widgets to the
    session's data; a new model: a preset that fits it, with its run settings."""
    s, ui = page.session, page.ui
    # the user's choices (`.input`: not a restore, which sets the boxes to data already loaded); queued,
    # though cheap: gradio tells the page that a State changed only at the end of a queued event, once every
    # output (the split box's new value) is on the page, so that the load reads the split chosen
    chose = dict(api_visibility="private", show_progress="hidden")
    b.name.input(on_benchmark_change, [b.name, b.asked, s], [b.split, b.written_box, b.files_box, b.asked],
                 **chose)
    b.split.input(on_split_change, [b.name, b.split, b.asked, s], b.asked, **chose)
    b.write.click(in_turn(on_write), [b.split, b.passages, b.questions, b.neighbours, s],
                  [b.written, b.written_info], api_name="write_name_only", **device_queue())
    for changed in (b.written.change, b.use.change):  # what was written (and edited), kept for the load
        changed(on_written_edit, [b.written, b.use, s], None, **LOCAL)
    # not the device queue: reading data never waits for anyone's edit
    bench = gr.on([b.load.click, b.load_written.click, b.source.submit, b.asked.change], on_load_benchmark,
                  [b.name, b.split, b.source, b.forget_file, b.retain_file, s],
                  [b.info, ui.data.forget_df, ui.data.retain_df, ui.edit.preset], api_name="load_benchmark",
                  trigger_mode="always_last")  # choices in a row: loaded in turn, the last one last
    bench.success(lambda: gr.Tabs(selected="data"), None, page.tabs, **LOCAL)
    bench.failure(on_restore_benchmark, s, [b.name, b.split, b.info], **LOCAL)
    page.model_loaded.success(on_model_loaded, s, [b.info, ui.edit.preset,  # a preset that fits it
                                                   *form.widgets(ui.edit, ui.layers, form.RUN_DEFAULTED)], **LOCAL)
    page.data_loaded = bench
