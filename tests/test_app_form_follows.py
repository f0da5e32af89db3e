"""Issue 49, items 5 and 6: every box of the Edit form follows the model, the split and the
preset chosen, and choosing a benchmark or split loads it.

A page opened on SmolLM2 had Retain examples at SmolLM2's 128; loading the demo model and
the demo benchmark left it there, and the demo preset then broke its retain set (retain cost
0.34 instead of 0.04). Here the page's handlers, as wired, bring every box to the values a
page opened on the demo is built with; the pinned numbers of that form are in
tests/test_app.py (`test_the_demo_preset_keeps_its_retain_set_on_the_page_s_boxes`). No model
is loaded: the layout and the handlers read only names and the bundled data.
"""
from __future__ import annotations

import gradio as gr
import pytest

import app
from components import benchmark_panel, edit_panel
from components.server.allowed_sources import DEMO, REAL
from components.server.errors import UserError
from components.server.session import ModelKey, Session
from components.studio import form
from components.studio.benchmarks import check_choice, note_choice, note_load, read_benchmark


def page(start_model: str):
    """(blocks, ui) of a page built for `start_model`, wired as app.py wires it."""
    with gr.Blocks() as blocks:
        ui = app.build_layout(start_model)
        app.wire_panels(blocks, ui, None)
    return blocks, ui


def boxes(ui) -> dict:
    """The Edit form's values as the page was built, by field name."""
    return {name: w.value for name, w in zip(form.NAMES, form.widgets(ui.edit, ui.layers))}


def fn_named(blocks, name: str):
    found = [f for f in blocks.fns.values() if getattr(f.fn, "__name__", "") == name]
    assert len(found) == 1, f"{len(found)} events run {name}"
    return found[0]


def ids(components) -> set:
    return {c._id for c in components}


def test_a_demo_model_loaded_on_a_smollm2_page_gives_the_demo_page_s_form():
    """The page opened on SmolLM2 (Retain examples 128, batch 16), then the demo model
    loaded with the demo's forget10: the handlers the page runs (a new model: the preset and
    the run settings that fit it; the preset: its values) give every box the value a page
    opened on the demo starts with."""
    _, on_real = page(REAL)
    _, on_demo = page(DEMO)
    values, wanted = boxes(on_real), boxes(on_demo)
    assert values["retain_examples"] == 128 and wanted["retain_examples"] == 1600
    assert wanted["preset"] == "demo" and wanted["batch_size"] == 32

    session = Session()
    session.model_key = ModelKey(DEMO, "cpu", "float32")
    session.benchmark, session.bench_label = read_benchmark("demo", "forget10", "", None, None, DEMO), "demo/forget10"
    _, preset, *run = benchmark_panel.on_model_loaded(session)  # Load model's success
    values["preset"] = preset
    values |= dict(zip(form.RUN_DEFAULTED, run))
    filled = edit_panel.on_preset(preset)  # the preset box changed
    values |= {name: v for name, v in zip(form.PRESET_FILLED, filled) if name in form.NAMES and v is not None}
    values |= dict(zip(form.RUN_DEFAULTED, edit_panel.on_run_defaults(preset)))  # the data's load, after
    assert values == wanted


def test_the_page_wires_the_defaults_to_every_box():
    """The handlers above are wired to every box they set: a model loaded (the preset and the
    run settings), data loaded (the run settings, after the load set the preset), a preset
    chosen (those it sets, and the run settings)."""
    blocks, ui = page(REAL)
    run_boxes = ids(form.widgets(ui.edit, ui.layers, form.RUN_DEFAULTED))
    loaded = fn_named(blocks, "on_model_loaded")
    assert ids([ui.edit.preset]) | run_boxes <= ids(loaded.outputs)
    after_load = fn_named(blocks, "on_run_defaults")
    load = [f for f in blocks.fns.values() if f.api_name == "load_benchmark"]
    assert len(load) == 1 and after_load.trigger_after == load[0]._id and after_load.trigger_only_on_success
    assert ids(after_load.inputs) == ids([ui.edit.preset]) and ids(after_load.outputs) == run_boxes
    chosen = fn_named(blocks, "on_preset_chosen")
    assert chosen.targets == [(ui.edit.preset._id, "input")] and ids(chosen.outputs) == run_boxes
    fill = fn_named(blocks, "on_preset")
    assert ids(fill.outputs) == ids(form.widgets(ui.edit, ui.layers, form.PRESET_FILLED))


def test_choosing_a_benchmark_or_a_split_loads_it():
    """One event loads data (public `load_benchmark`): the Load buttons, Enter in the folder
    box, and a choice of benchmark or split in the boxes; the choice loads at once for a
    registered benchmark, not for uploaded files or name only (their data come first)."""
    blocks, ui = page(DEMO)
    b = ui.bench
    load = next(f for f in blocks.fns.values() if f.api_name == "load_benchmark")
    assert set(load.targets) == {(b.load._id, "click"), (b.load_written._id, "click"), (b.source._id, "submit"),
                                 (b.asked._id, "change")}
    assert fn_named(blocks, "on_benchmark_change").targets == [(b.name._id, "input")]
    assert fn_named(blocks, "on_split_change").targets == [(b.split._id, "input")]
    session = Session()
    split, _, _, asked = benchmark_panel.on_benchmark_change("tofu", 3, session)
    assert split.value == "forget01" and asked == 4  # loaded, on its default split
    assert benchmark_panel.on_split_change("demo", "forget05", 4, session) == 5
    for own in ("custom", "name-only"):
        *_, asked = benchmark_panel.on_benchmark_change(own, 5, session)
        assert not isinstance(asked, int)  # gr.skip(): its files or written table come first
        assert not isinstance(benchmark_panel.on_split_change(own, "forget", 5, session), int)
    _, _, files, _ = benchmark_panel.on_benchmark_change("custom", 5, session)
    assert files.open is True  # where the files go


def test_run_edit_refuses_data_other_than_the_boxes_show():
    """Chosen but not loaded yet (your own files before Load benchmark, or a benchmark whose
    load has not ended): Run edit says so instead of editing the old data. Any load ends it."""
    session = Session()
    session.benchmark, session.bench_label = read_benchmark("demo", "forget10", "", None, None, DEMO), "demo/forget10"
    check_choice(session)  # nothing chosen: the page shows what is loaded
    note_choice(session, "custom", "forget")
    with pytest.raises(UserError, match="show custom/forget, but the data loaded are demo/forget10: upload"):
        check_choice(session)
    note_choice(session, "demo", "forget10")  # chosen back
    check_choice(session)
    note_choice(session, "demo", "forget05")
    with pytest.raises(UserError, match="wait for it to load"):
        check_choice(session)
    # forget01 chosen while forget05 loads: forget05's load ends first, forget01's comes next
    note_choice(session, "demo", "forget01")
    session.benchmark, session.bench_label = read_benchmark("demo", "forget05", "", None, None, DEMO), "demo/forget05"
    note_load(session)
    with pytest.raises(UserError, match="show demo/forget01, but the data loaded are demo/forget05"):
        check_choice(session)
    session.benchmark, session.bench_label = read_benchmark("demo", "forget01", "", None, None, DEMO), "demo/forget01"
    note_load(session)
    check_choice(session)  # loaded
    note_choice(session, "name-only", "the-solar-system")
    session.benchmark = read_benchmark("demo", "forget10", "", None, None, DEMO)  # a link's load, the boxes with it
    session.bench_label = "demo/forget10"
    check_choice(session)
