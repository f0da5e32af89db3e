"""Where the server keeps files: gradio's upload folder, the exports inside it, and the
pruning that bounds them on disk; and the uploaded edit's files (edit.json and
patch.safetensors), read and checked before anything is built from them.

An uploaded patch is bounded by what it may expand to, from its header and edit.json
before any tensor is read (`check_patch_layout`): every factored patch of rank at most
GROM_MAX_PATCH_RANK, and only matrices its method may change on the loaded model
(`grom.patch_policy.check_stored_patches`: GROM and the editors their matrix kind in their band,
a trained method any weight, at most the model's parameter count in all). Loaded, it stays
as its file held it (factors stay factors: a session holds them, not a copy of the
weights), and every patch, whatever method made it, is checked finite and of the norm its
edit.json records."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from gradio.utils import get_upload_folder
from safetensors import SafetensorError

from components.server.errors import UserError, shorten
from components.server.limits import check, limit
from grom import Edit
from grom.edit import META_FILE, PATCH_FILE, read_metadata, read_patch_layout
from grom.eval.openunlearning import EVAL_FILE, SUMMARY_FILE
from grom.patch_policy import check_stored_patches


def upload_folder() -> Path:
    return Path(get_upload_folder())


def prune(folder: Path, max_bytes: int, skip: tuple[str, ...] = (), min_age_s: float = 0.0) -> int:
    """Remove the oldest files under `folder` (not under the subfolders named in `skip`,
    none younger than `min_age_s`) until at most `max_bytes` remain; the bytes left."""
    files = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not any(part in skip for part in path.relative_to(folder).parts):
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        except OSError:
            continue
    total = sum(size for _, size, _ in files)
    now = time.time()
    for mtime, size, path in sorted(files):
        if total <= max_bytes or now - mtime < min_age_s:
            break
        try:
            path.unlink()
            total -= size
        except OSError:
            pass
    return total


EXPORT_FOLDER = "grom-studio-exports"


def export_root() -> Path:
    """Where exports are written: inside gradio's cache folder, so that gradio serves them
    without a second copy, and the bound on them (GROM_EXPORT_MAX_MB) bounds everything."""
    return Path(get_upload_folder()) / EXPORT_FOLDER


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*") if f.is_file())


def bound_disk(root: Path, max_bytes: int) -> None:
    """Remove the oldest exports until those kept take at most `max_bytes`."""
    folders = sorted(root.glob("grom-edit-*"), key=lambda f: f.stat().st_mtime)
    total = sum(_folder_bytes(f) for f in folders)
    for folder in folders:
        if total <= max_bytes:
            break
        total -= _folder_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def remove_old(root: Path, max_age_s: float = 3600) -> None:
    """Exports are copied into gradio's cache when returned; ours go after an hour."""
    now = time.time()
    for folder in root.glob("grom-edit-*"):
        if now - folder.stat().st_mtime > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- an uploaded edit

def storage(ranks: dict) -> str:
    """How patch.safetensors holds the patches, from {name: rank of its factors or None
    (full)}: "5 as rank-142 factors", "3 full"."""
    low = sorted(r for r in ranks.values() if r is not None)
    full = len(ranks) - len(low)
    kinds = [f"{len(low)} as rank-{low[0]}{'' if low[0] == low[-1] else f'-{low[-1]}'} factors"] if low else []
    return ", ".join(kinds + ([f"{full} full"] if full else []))


IMPORT_KINDS = (".json", ".safetensors")
OPENUNLEARNING_FILES = (EVAL_FILE, SUMMARY_FILE)
"""The files an export adds after a TOFU comparison (`grom.eval.openunlearning`), left
aside when a whole export is uploaded back."""
IMPORT_MAX_BYTES = {".json": 4 << 20}  # patch.safetensors: GROM_MAX_PATCH_MB


def _max_bytes(kind: str) -> int:
    return IMPORT_MAX_BYTES.get(kind) or limit("GROM_MAX_PATCH_MB") << 20


def edit_uploads(files) -> tuple[Path, Path | None]:
    """(edit.json, patch.safetensors or None) among the uploaded files."""
    paths = [Path(f if isinstance(f, str) else getattr(f, "name", f)) for f in (files or [])]
    if isinstance(files, (str, Path)):
        paths = [Path(files)]
    # an export's OpenUnlearning log (TOFU_EVAL.json, TOFU_SUMMARY.json) uploaded with it: not the edit
    paths = [p for p in paths if p.name not in OPENUNLEARNING_FILES] or paths
    by_kind: dict[str, list[Path]] = {}
    for path in paths:
        by_kind.setdefault(path.suffix.lower(), []).append(path)
    other = [p.name for kind, ps in by_kind.items() if kind not in IMPORT_KINDS for p in ps]
    if other or len(by_kind.get(".json", [])) != 1 or len(by_kind.get(".safetensors", [])) > 1:
        raise UserError("Upload one edit.json (and, for an edit of uploaded benchmark files, its "
                        "patch.safetensors)" + (f"; {shorten(', '.join(other))} is neither." if other else "."))
    for kind, ps in by_kind.items():
        size = ps[0].stat().st_size
        if size > _max_bytes(kind):
            raise UserError(f"{shorten(ps[0].name)} is {size / 2**20:.1f} MB, more than the "
                            f"{_max_bytes(kind) >> 20} MB this server takes"
                            + (" (GROM_MAX_PATCH_MB). edit.json alone brings back an edit of a benchmark "
                               "this server has: it is computed again." if kind == ".safetensors" else
                               ": is it an exported edit.json?"))
    patch = by_kind.get(".safetensors", [None])[0]
    return by_kind[".json"][0], patch


def read_edit_json(path: Path) -> dict:
    try:
        return read_metadata(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{shorten(path.name)} is not a text file: upload the edit.json an export wrote.") from None
    except ValueError as err:
        raise UserError(str(err)) from None


def check_patch_layout(patch_file: Path, model, meta: dict) -> None:
    """The file's patches (read from its header: nothing is built yet) are ones the edit
    `meta` describes may hold on `model` (`check_stored_patches`: its weights, with their
    shapes, of the kind its method changes), each factored one of rank at most
    GROM_MAX_PATCH_RANK."""
    try:
        layout = read_patch_layout(patch_file)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise UserError(f"{shorten(patch_file.name)} is not a readable safetensors file ({shorten(err)}).") from None
    except ValueError as err:
        raise UserError(str(err)) from None
    for name, stored in layout.items():
        if stored.rank is not None:
            named = shorten(name).replace("{", "{{").replace("}", "}}")  # `over` formats the phrase
            check(f"{PATCH_FILE} stores {named} as factors of rank {{n}}", stored.rank, "GROM_MAX_PATCH_RANK")
    try:
        check_stored_patches(layout, model, meta)
    except ValueError as err:
        raise UserError(shorten(str(err), 600)) from None


def load_uploaded_edit(meta_file: Path, patch_file: Path, model, meta: dict | None = None) -> Edit:
    """The uploaded Edit, checked to fit `model` (`check_patch_layout`, before any tensor
    is read) and to be the patch its edit.json describes (`Edit.load`: the hash, every
    patch's norm), every patch finite; factored patches stay factored."""
    check_patch_layout(patch_file, model, read_edit_json(meta_file) if meta is None else meta)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(meta_file, Path(tmp) / META_FILE)
        shutil.copy(patch_file, Path(tmp) / PATCH_FILE)
        try:
            edit = Edit.load(tmp)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise UserError(f"{shorten(patch_file.name)} is not a readable safetensors file "
                            f"({shorten(err)}).") from None
        except ValueError as err:
            raise UserError(str(err)) from None
    held = edit.held
    for name in held:
        if not held.is_float(name) or not held.finite(name):
            raise UserError(f"patch.safetensors: {shorten(name)} is not a finite float patch.")
    return edit
