"""Export panel: the session's edit as files (patch.safetensors + edit.json) and a code
snippet that applies it with the library."""
from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from components import text
from components.errors import ui_errors
from components.limits import limit
from components.session import DEMO, Session, UserError, current_edit

EXPORT_FOLDER = "grom-studio-exports"
_export_times: collections.deque = collections.deque()  # when the last new exports were written
_export_lock = threading.Lock()


def export_root() -> Path:
    """Where exports are written: inside gradio's cache folder, so that gradio serves them
    without a second copy, and the bound on them (GROM_EXPORT_MAX_MB) bounds everything."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()) / EXPORT_FOLDER


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


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*") if f.is_file())


def _bound_disk(root: Path, max_bytes: int) -> None:
    """Remove the oldest exports until those kept take at most `max_bytes`."""
    folders = sorted(root.glob("grom-edit-*"), key=lambda f: f.stat().st_mtime)
    total = sum(_folder_bytes(f) for f in folders)
    for folder in folders:
        if total <= max_bytes:
            break
        total -= _folder_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def snippet(model_name: str, folder: str) -> str:
    code = text.SNIPPET.format(model=model_name, folder=folder)
    if model_name == DEMO:
        code = code.replace("from grom.models import load_model\n", "from grom.demo import load_demo_model\n")
        code = code.replace(f"load_model({model_name!r})", 'load_demo_model("full")')
    return code


def _remove_old(root: Path, max_age_s: float = 3600) -> None:
    """Exports are copied into gradio's cache when returned; ours go after an hour."""
    now = time.time()
    for folder in root.glob("grom-edit-*"):
        if now - folder.stat().st_mtime > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)


@ui_errors
def export(session: Session):
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


def build_export_panel() -> SimpleNamespace:
    text.md(text.EXPORT, elem_classes="panel-intro")
    button = gr.Button("Export the edit", variant="secondary")
    files = gr.File(label="patch.safetensors and edit.json", file_count="multiple", interactive=False)
    note = gr.Markdown("")
    code = gr.Code(language="python", label="Apply it with the library", interactive=False,
                   value=snippet(DEMO, "grom-edit"))
    return SimpleNamespace(button=button, files=files, note=note, code=code)
