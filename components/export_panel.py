"""Export panel: the session's edit as files (patch.safetensors + edit.json) and a code
snippet that applies it with the library; and the way back: an uploaded edit.json restores
the benchmark and every setting (with patch.safetensors, the edit itself)."""
from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
from safetensors import SafetensorError

from components.core.benchmarks import read_benchmark, splits_for
from components.core.errors import UserError, shorten, ui_errors
from components.core.files import _bound_disk, _remove_old, export_root
from components.core.form import restore_values
from components.core.history import add_run, restore
from components.core.limits import limit
from components.core.runs import check_run, portable_model_name
from components.core.session import SESSIONS, Session, current_edit, current_model
from components.core.sources import DEMO
from components.core.validate import retain_subset
from components.views import text
from components.views.tables import describe, edit_summary, examples_html, layer_table, norms_figure
from grom import Edit, EditConfig
from grom.arch import num_layers
from grom.edit import META_FILE, PATCH_FILE, read_metadata

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


def snippet(model_name: str, folder: str) -> str:
    code = text.SNIPPET.format(model=model_name, folder=folder)
    if model_name == DEMO:
        code = code.replace("from grom.models import load_model\n", "from grom.demo import load_demo_model\n")
        code = code.replace(f"load_model({model_name!r})", 'load_demo_model("full")')
    return code


@ui_errors
def on_export(session: Session):
    """Save the edit into a fresh folder; returns the two files and the snippet."""
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
        edit.save(folder)
        _bound_disk(root, limit("GROM_EXPORT_MAX_MB") << 20)
    files = [str(folder / "patch.safetensors"), str(folder / "edit.json")]
    session.extra["export"] = (edit, files)
    name = session.edit_for.shown if session.edit_for else DEMO
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    note = (f"Saved {len(edit.patches)} patch(es), {size:.2f} MiB. Download both files into one "
            "folder (here `grom-edit`) and run:")
    return files, note, snippet(name, "grom-edit")


IMPORT_MAX_BYTES = {".json": 4 << 20, ".safetensors": 512 << 20}


def _uploads(files) -> tuple[Path, Path | None]:
    """(edit.json, patch.safetensors or None) among the uploaded files."""
    paths = [Path(f if isinstance(f, str) else getattr(f, "name", f)) for f in (files or [])]
    if isinstance(files, (str, Path)):
        paths = [Path(files)]
    by_kind: dict[str, list[Path]] = {}
    for path in paths:
        by_kind.setdefault(path.suffix.lower(), []).append(path)
    other = [p.name for kind, ps in by_kind.items() if kind not in IMPORT_MAX_BYTES for p in ps]
    if other or len(by_kind.get(".json", [])) != 1 or len(by_kind.get(".safetensors", [])) > 1:
        raise UserError("Upload one edit.json (and, to get the edit itself back, its patch.safetensors)"
                        + (f"; {shorten(', '.join(other))} is neither." if other else "."))
    for kind, ps in by_kind.items():
        if ps[0].stat().st_size > IMPORT_MAX_BYTES[kind]:
            raise UserError(f"{shorten(ps[0].name)} is larger than {IMPORT_MAX_BYTES[kind] >> 20} MB: "
                            "is it an exported edit?")
    patch = by_kind.get(".safetensors", [None])[0]
    return by_kind[".json"][0], patch


def _read_meta(path: Path) -> dict:
    try:
        return read_metadata(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{shorten(path.name)} is not a text file: upload the edit.json an export wrote.") from None
    except ValueError as err:
        raise UserError(str(err)) from None


def _load_edit(meta_file: Path, patch_file: Path, model):
    """The uploaded Edit, checked to fit `model` (every patched matrix exists, same shape)."""


    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(meta_file, Path(tmp) / META_FILE)
        shutil.copy(patch_file, Path(tmp) / PATCH_FILE)
        try:
            edit = Edit.load(tmp)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise UserError(f"{shorten(patch_file.name)} is not a readable safetensors file ({shorten(err)}).") from None
    params = dict(model.named_parameters())
    for name, P in edit.patches.items():
        W = params.get(name)
        if W is None or tuple(W.shape) != tuple(P.shape):
            raise UserError(f"patch.safetensors does not fit the loaded model: {shorten(name)} "
                            f"{'is not one of its matrices' if W is None else f'has shape {tuple(P.shape)}, the model {tuple(W.shape)}'}.")
        if not P.is_floating_point() or not bool(P.isfinite().all()):
            raise UserError(f"patch.safetensors: {shorten(name)} is not a finite float patch.")
    return edit


@ui_errors
def on_import_run(files, session: Session):
    """Restore an exported run: the benchmark, every setting of the Edit panel and the band
    (and, with its patch.safetensors, the edit). Nothing changes unless all of it fits."""
    meta_file, patch_file = _uploads(files)
    meta = _read_meta(meta_file)
    run = check_run(meta.get("run"))
    config = EditConfig.from_dict(meta["config"])
    handle = current_model(session)
    loaded = portable_model_name(handle.key.name)
    if run["model"] != loaded:
        raise UserError(f"This run was made with the model {shorten(run['model'])}, and {loaded} is loaded: "
                        f"load {shorten(run['model'])} in the Model panel, then load the run again.")
    try:  # every value as the Edit panel would take it, before anything is changed or loaded
        restore_values(config.to_dict(), run, num_layers(handle.model))
    except UserError as err:
        raise UserError(f"{shorten(meta_file.name)}: {err}") from None
    custom = run["benchmark"] == "custom"
    if not custom and run["split"] not in splits_for(run["benchmark"]):
        raise UserError(f"{shorten(meta_file.name)}: the benchmark {shorten(run['benchmark'])} has no split "
                        f"{shorten(run['split'])!r} (its splits: {', '.join(splits_for(run['benchmark'])) or 'none'}).")
    bench = None if custom else read_benchmark(run["benchmark"], run["split"], run.get("source", ""),
                                               None, None, handle.key.name)
    edit = _load_edit(meta_file, patch_file, handle.model) if patch_file is not None else None
    if edit is not None and custom and session.benchmark is None:
        raise UserError("This run used uploaded files (benchmark custom): load them in the Benchmark "
                        "panel first, then load the run again.")
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
    values = restore(config.to_dict(), run, session, f"the run of {meta_file.name}")
    note = values[-1] + (" Its benchmark was uploaded files (custom): load them in the Benchmark panel."
                         if custom else "")
    result = [gr.skip()] * 3
    if edit is not None:
        b = session.benchmark
        session.edit, session.edit_for, session.dropped = edit, handle.key, ""
        SESSIONS.touch(session)  # counted among the sessions holding an edit
        session.extra["edit_inputs"] = (b.forget, retain_subset(b.retain, run["retain_examples"], run["seed"]))
        session.report = session.report_for = session.influence = None
        add_run(session, edit, source="import")
        note += (" The edit itself is loaded: Compare and Export use it (the diagnostics need its keys: "
                 "run it again for those).")
        result = [f"**Loaded** from {shorten(patch_file.name)}. " + edit_summary(edit), layer_table(edit),
                  norms_figure(edit)]
    return values[:-1] + bench_out + result + [note]


def build_export_panel() -> SimpleNamespace:
    text.md(text.EXPORT, elem_classes="panel-intro")
    button = gr.Button("Export the edit", variant="secondary")
    files = gr.File(label="patch.safetensors and edit.json", file_count="multiple", interactive=False)
    note = gr.Markdown("")
    code = gr.Code(language="python", label="Apply it with the library", interactive=False,
                   value=snippet(DEMO, "grom-edit"))
    text.md(text.IMPORT, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        uploads = gr.File(label="edit.json (and patch.safetensors)", file_count="multiple",
                          file_types=[".json", ".safetensors"], height=110, elem_id="import-files", scale=3)
        load = gr.Button("Load the run", scale=1, min_width=120, elem_id="import-button")
    load_note = gr.Markdown("", elem_id="import-note")
    return SimpleNamespace(button=button, files=files, note=note, code=code, uploads=uploads, load=load,
                           load_note=load_note)
