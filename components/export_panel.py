"""Export panel: the session's edit as files (patch.safetensors + edit.json) and a code
snippet that applies it with the library; and the way back: an uploaded edit.json restores
the benchmark, every setting and the edit, computed again and checked against the hash
edit.json records (or, for uploaded benchmark files, from patch.safetensors)."""
from __future__ import annotations

import collections
import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from components.core.benchmarks import read_benchmark, splits_for
from components.core.device import device_progress
from components.core.edits import compute_edit
from components.core.errors import UserError, shorten, ui_errors
from components.core.files import (_bound_disk, _remove_old, edit_uploads, export_root, load_uploaded_edit,
                                   read_edit_json, storage)
from components.core.form import restore_values
from components.core.history import add_run, restore
from components.core.limits import limit
from components.core.runs import check_run, file_verdict, portable_model_name, recompute_verdict, run_record
from components.core.session import SESSIONS, Session, current_edit, current_model
from components.core.sources import DEMO
from components.core.validate import check_examples, retain_subset
from components.views import text
from components.views.tables import describe, edit_summary, examples_html, layer_table, norms_figure
from grom import Edit, EditConfig
from grom.arch import num_layers
from grom.edit import META_FILE, PATCH_FILE, read_patch_layout

_export_times: collections.deque = collections.deque()  # when the last new exports were written
_export_lock = threading.Lock()


def _admit_export() -> None:
    """At most GROM_EXPORTS_PER_MINUTE new exports a minute on the whole server."""
    with _export_lock:
        now = time.monotonic()
        while _export_times and now - _export_times[0] > 60:
            _export_times.popleft()
        if len(_export_times) >= limit("GROM_EXPORTS_PER_MINUTE"):
            raise UserError("This server has written as many exports as it writes in a minute "
                            "(GROM_EXPORTS_PER_MINUTE); try again in a minute.")
        _export_times.append(now)


PENDING = ("# Press Export the edit: the code that applies it to its model, and asks it a question\n"
           "# before and after, comes here.\n")  # the code box before the session is known


def snippet(model_name: str | None, folder: str, question: str = "") -> str:
    """The code that applies the export in `folder` to `model_name` (None: not known yet,
    the code box's text before an export) and asks `question` before and after."""
    if model_name is None:
        return PENDING
    code = text.SNIPPET.format(model=model_name, folder=folder,
                               question=shorten(question or "Tell me what you know.", 300))
    if model_name == DEMO:
        code = code.replace("from grom.models import load_model\n", "from grom.demo import load_demo_model\n")
        code = code.replace(f"load_model({model_name!r})", 'load_demo_model("full")')
    return code


def example_question(examples) -> str:
    """A prompt of the first forget example that has one (a question, a fact's prompt, a
    text's first words)."""
    for ex in examples or ():
        prompt = getattr(ex, "question", "") or getattr(ex, "prompt", "")
        if prompt or getattr(ex, "text", ""):
            return prompt or " ".join(ex.text.split()[:30])
    return ""


def session_snippet(session: Session, folder: str = "grom-edit") -> str:
    """The snippet for the session's model and a question of its edit's (else its loaded)
    benchmark."""
    key = session.edit_for or session.model_key
    inputs = session.extra.get("edit_inputs")
    bench = session.benchmark
    examples = inputs[0] if inputs else (bench.forget if bench is not None else ())
    return snippet(portable_model_name(key.name) if key is not None else None, folder,
                   example_question(examples))


def on_show_snippet(session: Session):
    """The code box for the session's model (on page load and after a new model or
    benchmark), unless it shows the export of the session's current edit."""
    done = session.extra.get("export")
    if done is not None and session.edit is not None and done[0] is session.edit:
        return gr.skip()
    return session_snippet(session)


@ui_errors
def on_export(session: Session):
    """Save the edit into a fresh folder (patches as factors where smaller); returns the
    two files, a note (size, storage, sha256) and the snippet."""
    edit = current_edit(session)
    root = export_root()
    root.mkdir(parents=True, exist_ok=True)
    _remove_old(root)
    done = session.extra.get("export")
    if done is not None and done[0] is edit and all(Path(f).is_file() for f in done[1]):
        folder = Path(done[1][0]).parent  # the same edit again: the files it has already
    else:
        _admit_export()
        folder = Path(tempfile.mkdtemp(prefix="grom-edit-", dir=root))
        edit.save(folder, factored=True)
        _bound_disk(root, limit("GROM_EXPORT_MAX_MB") << 20)
    files = [str(folder / PATCH_FILE), str(folder / META_FILE)]
    session.extra["export"] = (edit, files)
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    sha = json.loads((folder / META_FILE).read_text())["patch_sha256"]
    ranks = {name: p.rank for name, p in read_patch_layout(folder / PATCH_FILE).items()}
    note = (f"Saved {len(edit.patches)} patch(es) ({storage(ranks)}), "
            f"{size:.2f} MiB; sha256 `{sha[:16]}…`. `edit.json` alone brings the edit back here (Load a run "
            "computes it again and checks that hash). Download both files into one folder (here "
            "`grom-edit`) and run:")
    return files, note, session_snippet(session)


@dataclass
class _Import:
    """An uploaded run, checked: its files, settings, the session's model and the data."""

    meta_file: Path
    patch_file: Path | None
    meta: dict
    run: dict
    config: EditConfig
    handle: object
    bench: object  # the run's benchmark as this server reads it; None for uploaded files


def _check_import(files, session: Session) -> _Import:
    """Every file and value as the Edit panel would take it, before anything is changed."""
    meta_file, patch_file = edit_uploads(files)
    meta = read_edit_json(meta_file)
    run = check_run(meta.get("run"))
    config = EditConfig.from_dict(meta["config"])
    handle = current_model(session)
    loaded = portable_model_name(handle.key.name)
    if run["model"] != loaded:
        raise UserError(f"This run was made with the model {shorten(run['model'])}, and {loaded} is loaded: "
                        f"load {shorten(run['model'])} in the Model panel, then load the run again.")
    try:
        restore_values(config.to_dict(), run, num_layers(handle.model))
    except UserError as err:
        raise UserError(f"{shorten(meta_file.name)}: {err}") from None
    if run["benchmark"] == "custom":
        if patch_file is not None and (session.benchmark is None
                                       or not (session.bench_label or "").startswith("custom/")):
            raise UserError("This run used uploaded files (benchmark custom): load them in the Benchmark "
                            "panel first, then load the run again.")
        return _Import(meta_file, patch_file, meta, run, config, handle, None)
    if run["split"] not in splits_for(run["benchmark"]):
        raise UserError(f"{shorten(meta_file.name)}: the benchmark {shorten(run['benchmark'])} has no split "
                        f"{shorten(run['split'])!r} (its splits: {', '.join(splits_for(run['benchmark'])) or 'none'}).")
    bench = read_benchmark(run["benchmark"], run["split"], run.get("source", ""), None, None, handle.key.name)
    return _Import(meta_file, patch_file, meta, run, config, handle, bench)


def _import_edit(imp: _Import, progress) -> tuple[Edit | None, tuple | None, str]:
    """(the edit, its forget and retain examples, the verdict): recomputed where this
    server has the run's data, else from the uploaded patch; (None, None, why) when neither."""
    reference = (load_uploaded_edit(imp.meta_file, imp.patch_file, imp.handle.model, imp.meta)
                 if imp.patch_file else None)
    if imp.bench is None or imp.meta.get("method", "grom") != "grom":
        if reference is None:
            return None, None, (" Its benchmark was uploaded files (custom): load them in the Benchmark panel "
                                "(and upload its patch.safetensors with edit.json to get the edit itself)."
                                if imp.bench is None else " Upload its patch.safetensors to get the edit itself.")
        return reference, None, file_verdict(reference, imp.patch_file.name)
    retain = retain_subset(imp.bench.retain, imp.run["retain_examples"], imp.run["seed"])
    check_examples(imp.bench.forget, retain, imp.handle.tokenizer, "Recomputing this edit")
    t0 = time.perf_counter()
    edit = compute_edit(imp.handle.key, imp.bench.forget, retain, imp.config, None,
                        device_progress(lambda f, msg: progress(f, desc=f"recomputing: {msg}")))
    seconds = time.perf_counter() - t0
    edit.model_name = portable_model_name(imp.handle.key.name)
    r = imp.run
    edit.run = run_record(imp.handle.key.name, f"{r['benchmark']}/{imp.bench.split}", r.get("source", ""),
                          r["retain_examples"], r["seed"], len(retain), r.get("preset", ""),
                          r.get("band_mode", "manual"), r.get("k", len(edit.band) or 1), edit.band)
    return edit, (imp.bench.forget, retain), recompute_verdict(edit, imp.meta.get("patch_sha256"), seconds, reference)


@ui_errors
def on_import_run(files, session: Session, progress=gr.Progress()):
    """Restore an exported run: the benchmark, every setting of the Edit panel and the
    band, and the edit. Where this server has the run's data, edit.json alone is enough:
    the edit is computed again with its settings and checked against the patch_sha256 it
    records (`recompute_verdict`: identical means bit for bit); for uploaded benchmark
    files it comes from patch.safetensors. Nothing changes unless all of it fits."""
    imp = _check_import(files, session)
    edit, inputs, verdict = _import_edit(imp, progress)  # the long part, before any change
    run, bench = imp.run, imp.bench
    bench_out = [gr.skip()] * 6
    if bench is not None:
        if bench is not session.benchmark:
            session.scores = session.scores_for = None
        session.benchmark, session.bench_label = bench, f"{run['benchmark']}/{bench.split}"
        session.extra["bench_source"] = run.get("source", "")
        # the benchmark box reacts to the user's choice only: the split's choices come here
        bench_out = [run["benchmark"], gr.Dropdown(choices=splits_for(run["benchmark"]), value=bench.split),
                     run.get("source", ""), describe(bench),
                     examples_html(bench.forget, f"Forget set: {len(bench.forget)} examples"),
                     examples_html(bench.retain, f"Retain set: {len(bench.retain)} examples")]
    values = restore(imp.config.to_dict(), run, session, f"the run of {imp.meta_file.name}")
    result = [gr.skip()] * 3
    if edit is None:
        return values[:-1] + bench_out + result + [values[-1] + verdict]
    if inputs is None:  # from its file: the data it was made of is the session's
        b = session.benchmark
        inputs = (b.forget, retain_subset(b.retain, run["retain_examples"], run["seed"]))
    session.edit, session.edit_for, session.dropped = edit, imp.handle.key, ""
    SESSIONS.touch(session)  # counted among the sessions holding an edit
    session.extra["edit_inputs"] = inputs
    session.report = session.report_for = session.influence = None
    add_run(session, edit, source="import")
    note = f"{values[-1]} {verdict} The edit is loaded: Compare, Diagnostics and Export use it."
    result = [f"{verdict} " + edit_summary(edit), layer_table(edit), norms_figure(edit)]
    return values[:-1] + bench_out + result + [note]


def build_export_panel() -> SimpleNamespace:
    text.md(text.EXPORT, elem_classes="panel-intro")
    button = gr.Button("Export the edit", variant="secondary")
    files = gr.File(label="patch.safetensors and edit.json", file_count="multiple", interactive=False)
    note = gr.Markdown("")
    code = gr.Code(language="python", label="Apply it with the library", interactive=False,
                   value=snippet(None, "grom-edit"))  # the session's model: `on_show_snippet`
    text.md(text.IMPORT, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        uploads = gr.File(label="edit.json (and patch.safetensors)", file_count="multiple",
                          file_types=[".json", ".safetensors"], height=110, elem_id="import-files", scale=3)
        load = gr.Button("Load the run", scale=1, min_width=120, elem_id="import-button")
    load_note = gr.Markdown("", elem_id="import-note")
    return SimpleNamespace(button=button, files=files, note=note, code=code, uploads=uploads, load=load,
                           load_note=load_note)
