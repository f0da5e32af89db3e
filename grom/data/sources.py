"""Reading benchmark data as plain records: local files (JSON, JSON lines, CSV, parquet)
and Hugging Face Hub datasets.

Files are parsed as data only (`json`, `csv`, `pyarrow.parquet`); nothing is executed or
unpickled, and `trust_remote_code` is never passed. A file is size-checked before it is
read and must be UTF-8. Every problem is a `BenchmarkError` that says which file (and
line or row) and what was expected.

Each row becomes a `Record`: its fields plus where it came from, so the loaders' field
accessors (`Record.text`, `Record.texts`, `Record.index`) can name the place of a bad row.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Union
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 200 * 1024 * 1024  # largest file read, local or uploaded
DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
_TRUE = {"1", "ON", "YES", "TRUE"}

PathLike = Union[str, "os.PathLike[str]"]


class BenchmarkError(ValueError):
    """Benchmark data could not be loaded; the message says what was expected and found."""


@dataclass(frozen=True)
class Record:
    """One row of a data file or Hub dataset, and where it came from (for messages)."""

    where: str
    data: Mapping[str, Any]

    def _missing(self, key: str, expected: str) -> BenchmarkError:
        found = ", ".join(sorted(map(str, self.data))) or "none"
        return BenchmarkError(f"{self.where}: expected {expected} field {key!r}; found fields: {found}")

    def text(self, key: str, *, optional: bool = False) -> str | None:
        """The non-empty string field `key` (None if absent/empty and `optional`)."""
        value = self.data.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            if optional:
                return None
            raise self._missing(key, "a non-empty text")
        if not isinstance(value, str):
            raise BenchmarkError(f"{self.where}: field {key!r} should be text, found {type(value).__name__}")
        return value

    def texts(self, key: str, *, optional: bool = False) -> tuple[str, ...]:
        """A list-of-strings field; a single string (or a JSON array in a CSV cell) is accepted."""
        value = self.data.get(key)
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass  # an ordinary string that happens to start with "["
        if isinstance(value, str):
            value = [value]
        if value is None or len(value) == 0:
            if optional:
                return ()
            raise self._missing(key, "a list-of-texts")
        if not all(isinstance(v, str) for v in value):
            raise BenchmarkError(f"{self.where}: field {key!r} should be a list of texts, found {value!r:.100}")
        return tuple(value)

    def index(self, key: str, n: int) -> int:
        """An answer index in [0, n): an int, a digit string, or a letter A, B, C, ..."""
        value = self.data.get(key)
        if value is None:
            raise self._missing(key, "an answer-index")
        if isinstance(value, str):
            value = value.strip()
            if len(value) == 1 and value.isalpha():
                value = ord(value.upper()) - ord("A")
            elif value.lstrip("-").isdigit():
                value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            raise BenchmarkError(
                f"{self.where}: field {key!r} should be an answer index 0..{n - 1} (or a letter), found {value!r}"
            )
        return value


# ----------------------------------------------------------------------------- local files


def check_size(size: int, name: str, max_bytes: int | None = None) -> None:
    limit = MAX_FILE_BYTES if max_bytes is None else max_bytes
    if size > limit:
        mb = 2**20
        raise BenchmarkError(f"{name}: {size / mb:.1f} MB is over the {limit / mb:.0f} MB limit for data files")


def read_rows(path: PathLike, *, max_bytes: int | None = None) -> list[Record]:
    """All rows of a .json / .jsonl / .csv / .parquet file, size-checked before reading."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"{path}: no such file")
    check_size(path.stat().st_size, str(path), max_bytes)
    return parse_rows(path.read_bytes(), str(path), max_bytes=max_bytes)


def parse_rows(data: bytes, name: str, *, max_bytes: int | None = None) -> list[Record]:
    """Parse file contents; the format follows the suffix of `name`."""
    check_size(len(data), name, max_bytes)
    suffix = Path(name).suffix.lower()
    if suffix == ".parquet":
        return _parse_parquet(data, name)
    if suffix not in DATA_SUFFIXES:
        expected = ", ".join(DATA_SUFFIXES)
        raise BenchmarkError(f"{name}: unknown file type {suffix or '(none)'}; expected one of {expected}")
    text = _decode(data, name)
    rows = _parse_csv(text, name) if suffix == ".csv" else _parse_json(text, name)
    return [_record(where, row) for where, row in rows]


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BenchmarkError(
            f"{name}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save the file as UTF-8"
        ) from None


def _record(where: str, row: Any) -> Record:
    if not isinstance(row, dict):
        raise BenchmarkError(f"{where}: expected an object with named fields, found {type(row).__name__}")
    return Record(where, row)


def _parse_json(text: str, name: str) -> list[tuple[str, Any]]:
    """A JSON array of objects, one object, or JSON lines (TOFU's .json files are JSON lines)."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{name} line {e.lineno}, column {e.colno}: malformed JSON ({e.msg})") from None
        return [(f"{name} item {i + 1}", item) for i, item in enumerate(items)]
    try:
        return [(f"{name} line 1", json.loads(text))] if text.strip() else []
    except json.JSONDecodeError:
        pass  # not one document: read it as JSON lines
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((f"{name} line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise BenchmarkError(
                    f"{name} line {n}, column {e.colno}: malformed JSON ({e.msg}); "
                    "expected a JSON array or one JSON object per line"
                ) from None
    return rows


def _parse_csv(text: str, name: str) -> list[tuple[str, dict]]:
    """Rows of a CSV file with a header; empty cells are treated as absent fields."""
    old_limit = csv.field_size_limit(MAX_FILE_BYTES)  # long documents in one cell
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        if not reader.fieldnames:
            raise BenchmarkError(f"{name}: empty CSV; expected a header row with column names")
        rows = []
        for row in reader:
            if None in row:
                raise BenchmarkError(
                    f"{name} line {reader.line_num}: more values than the header's columns {reader.fieldnames}"
                )
            fields = {k.strip(): v for k, v in row.items() if v not in (None, "")}
            rows.append((f"{name} line {reader.line_num}", fields))
        return rows
    except csv.Error as e:
        raise BenchmarkError(f"{name} near line {reader.line_num + 1}: malformed CSV ({e})") from None
    finally:
        csv.field_size_limit(old_limit)


def _parse_parquet(data: bytes, name: str) -> list[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(io.BytesIO(data)).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BenchmarkError(f"{name}: not a readable parquet file ({e})") from None
    return [Record(f"{name} row {i + 1}", row) for i, row in enumerate(rows)]


def resolve_source(source: PathLike | None, benchmark: str) -> Path | None:
    """The local path of `source` (None stays None: the Hub); it must exist."""
    if source is None:
        return None
    path = Path(source).expanduser()
    if not path.exists():
        raise BenchmarkError(
            f"{benchmark}: source {str(source)!r} is no local file or folder; expected an existing "
            f"path holding the {benchmark} files"
        )
    return path


def find_data_files(folder: Path, stem: str) -> list[Path]:
    """`stem` + a data suffix in `folder`, or Hub-style parquet shards `stem`-*.parquet."""
    for suffix in DATA_SUFFIXES:
        path = folder / f"{stem}{suffix}"
        if path.is_file():
            return [path]
    return sorted(p for p in folder.glob(f"{stem}-*.parquet") if p.is_file())


def read_local(folder: Path, stems: Sequence[str], what: str, *,
               required: bool = True) -> list[Record] | None:
    """The rows of the first of `stems` present in `folder` (all shards of it)."""
    if not folder.is_dir():
        raise BenchmarkError(f"{folder}: expected a folder holding the {what} files, found a file")
    for stem in stems:
        files = find_data_files(folder, stem)
        if files:
            return [r for f in files for r in read_rows(f)]
    names = ", ".join(f"{s}{{{','.join(DATA_SUFFIXES)}}}" for s in stems)
    if required:
        raise BenchmarkError(f"{folder}: no {what} file; expected one of: {names}")
    logger.info("%s: no %s file (%s); skipped", folder, what, names)
    return None


def require_rows(rows: Sequence, what: str) -> None:
    if not rows:
        raise BenchmarkError(f"{what} is empty; expected at least one example")


# ----------------------------------------------------------------------------- the Hub


def hub_offline() -> bool:
    """Whether offline mode is asked for now (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, ...)."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(n, "").upper() in _TRUE for n in names)


_probe: dict[str, tuple[float, bool]] = {}


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face Hub answers a TCP connection (cached for a minute), so that
    no network fails in a second instead of after retries."""
    if hub_offline():
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    now = time.monotonic()
    if host in _probe and now - _probe[host][0] < 60:
        return _probe[host][1]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        ok = True
    except OSError:
        ok = False
    _probe[host] = (now, ok)
    return ok


@contextmanager
def _offline_from_env() -> Iterator[None]:
    """`huggingface_hub` and `datasets` read HF_HUB_OFFLINE once, at import. Honour a value
    set later (by the app or a test) for this call, so that it fails at once instead of
    retrying the network."""
    if not hub_offline():
        yield
        return
    import datasets.config as dconf
    import huggingface_hub.constants as hconst

    saved = (dconf.HF_HUB_OFFLINE, dconf.HF_DATASETS_OFFLINE, hconst.HF_HUB_OFFLINE)
    dconf.HF_HUB_OFFLINE = dconf.HF_DATASETS_OFFLINE = hconst.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dconf.HF_HUB_OFFLINE, dconf.HF_DATASETS_OFFLINE, hconst.HF_HUB_OFFLINE = saved


def load_hub_rows(repo_id: str, config: str | None, split: str) -> list[Record]:
    """The rows of a Hub dataset split (through the `datasets` cache), as records."""
    import datasets
    from huggingface_hub.errors import GatedRepoError

    label = f"{repo_id} ({config + ', ' if config else ''}split {split})"
    local_hint = "give source= a local folder holding the same files instead"
    logger.info("loading %s from the Hugging Face Hub", label)
    try:
        with _offline_from_env():
            ds = datasets.load_dataset(repo_id, config, split=split)
    except ConnectionError as e:
        raise BenchmarkError(f"could not reach the Hugging Face Hub for {label} ({e}); {local_hint}") from e
    except GatedRepoError as e:
        raise BenchmarkError(f"{label} is gated: accept its terms on the Hub and log in, or {local_hint}") from e
    except FileNotFoundError as e:
        raise BenchmarkError(f"{label} was not found on the Hub, or it is gated ({e}); {local_hint}") from e
    except (OSError, ValueError) as e:
        raise BenchmarkError(f"could not load {label} from the Hub ({e}); {local_hint}") from e
    return [Record(f"{label} row {i + 1}", row) for i, row in enumerate(ds)]
