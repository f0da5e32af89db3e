"""Export panel: the session's edit as files (patch.safetensors + edit.json) and a code
snippet that applies it with the library."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from components import text
from components.errors import ui_errors
from components.session import DEMO, Session, current_edit

EXPORT_ROOT = Path(tempfile.gettempdir()) / "grom-studio-exports"


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
    EXPORT_ROOT.mkdir(parents=True, exist_ok=True)
    _remove_old(EXPORT_ROOT)
    folder = Path(tempfile.mkdtemp(prefix="grom-edit-", dir=EXPORT_ROOT))
    edit.save(folder)
    files = [str(folder / "patch.safetensors"), str(folder / "edit.json")]
    name = session.edit_for.name if session.edit_for else DEMO
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
