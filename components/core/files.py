"""Where the server keeps files: gradio's upload folder, the exports inside it, and the
pruning that bounds them on disk."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from gradio.utils import get_upload_folder


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


def _bound_disk(root: Path, max_bytes: int) -> None:
    """Remove the oldest exports until those kept take at most `max_bytes`."""
    folders = sorted(root.glob("grom-edit-*"), key=lambda f: f.stat().st_mtime)
    total = sum(_folder_bytes(f) for f in folders)
    for folder in folders:
        if total <= max_bytes:
            break
        total -= _folder_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _remove_old(root: Path, max_age_s: float = 3600) -> None:
    """Exports are copied into gradio's cache when returned; ours go after an hour."""
    now = time.time()
    for folder in root.glob("grom-edit-*"):
        if now - folder.stat().st_mtime > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)
