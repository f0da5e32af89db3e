"""Readers of benchmark data (was grom/data/sources.py). Reading benchmark data as plain
records: local files (JSON, JSON lines, CSV, parquet) and Hugging Face Hub datasets.

Files are parsed as data only (`json`, `csv`, `pyarrow.parquet`); nothing is executed or
unpickled, and `trust_remote_code` is never passed. A file is size-checked before it is
read and must be UTF-8. Limits hold before the work they bound: a row cap (`max_rows`)
stops the parse at the first row over it (a parquet file's row count is read from its
footer), a CSV's columns can be checked before its rows, and JSON nested deeper than
`MAX_JSON_DEPTH` is refused before `json` recurses into it. Every problem is a
`BenchmarkError` that says which file (and line or row) and what was expected.

Each row becomes a `Record`: its fields plus where it came from, so the loaders' field
accessors (`Record.text`, `Record.texts`, `Record.index`) can name the place of a bad row.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import operator
import os
import re
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import accumulate, repeat
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

from grom.model.hub import hub_offline

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 200 * 1024 * 1024  # largest file read, local or uploaded
DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
MAX_JSON_DEPTH = 64  # nesting of [ and { in a JSON document; no real data file comes near it

PathLike = Union[str, "os.PathLike[str]"]
ColumnCheck = Callable[[Sequence[str]], None]  # raises BenchmarkError for columns it cannot use


class BenchmarkError(ValueError):
    """Benchmark data could not be loaded; the message says what was expected and found."""


class TooManyRows(BenchmarkError):
    """A file has more rows than the caller's `max_rows`."""


def json_depth(text: str) -> int:
    """How deeply [ and { nest in JSON `text` (the most left open at once, strings skipped).

    Linear time and memory bounded by a chunk, with no parse, so that a deep document
    can be refused before `json` recurses through it (RecursionError near 1000 levels).
    """
    depth = deepest = 0
    in_string = False
    for chunk in _chunks(text):
        if "\\" in chunk:  # \\ and \" hold no quote that opens or closes a string
            chunk = chunk.replace("\\\\", "").replace('\\"', "")
        marks = chunk.encode("utf-8", "surrogatepass").translate(None, _NOT_QUOTE_OR_BRACKET)
        # "" encloses no bracket: dropping it leaves every other mark in or out of strings
        parts = marks.replace(b'""', b"").split(b'"')
        outside = b"".join(parts[in_string::2])  # the brackets outside strings
        in_string ^= len(parts) % 2 == 0
        steps = map(operator.sub, outside.translate(_BRACKET_WEIGHT), repeat(1))  # +1 opens, -1 closes
        deepest = max(deepest, max(accumulate(steps, initial=depth)))
        depth += 2 * (outside.count(b"[") + outside.count(b"{")) - len(outside)
    return deepest


_NOT_QUOTE_OR_BRACKET = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACKET_WEIGHT = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_CHUNK = 1 << 18


def _chunks(text: str) -> Iterator[str]:
    """`text` in pieces of about `_CHUNK` characters, none ending inside an escape."""
    start = 0
    while start < len(text):
        end = min(start + _CHUNK, len(text))
        while end < len(text) and text[end - 1] == "\\":
            end += 1
        yield text[start:end]
        start = end


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
            if json_depth(value) > MAX_JSON_DEPTH:
                raise BenchmarkError(f"{self.where}: field {key!r} is nested more than {MAX_JSON_DEPTH} "
                                     "levels deep; expected a list of texts such as [\"a\", \"b\"]")
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


def read_rows(path: PathLike, *, max_bytes: int | None = None, max_rows: int | None = None,
              check_columns: ColumnCheck | None = None) -> list[Record]:
    """The rows of a .json / .jsonl / .csv / .parquet file, size-checked before reading;
    see `parse_rows` for `max_rows` and `check_columns`."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"{path}: no such file")
    check_size(path.stat().st_size, str(path), max_bytes)
    return parse_rows(path.read_bytes(), str(path), max_bytes=max_bytes, max_rows=max_rows,
                      check_columns=check_columns)


def parse_rows(data: bytes, name: str, *, max_bytes: int | None = None, max_rows: int | None = None,
               check_columns: ColumnCheck | None = None) -> list[Record]:
    """Parse file contents; the format follows the suffix of `name`.

    max_rows: at most this many rows; `TooManyRows` as soon as one more is seen, so the
    time and memory spent are bounded by the cap, not by the file's length.
    check_columns: called with a CSV or parquet file's column names before any row is read.
    """
    check_size(len(data), name, max_bytes)
    suffix = Path(name).suffix.lower()
    if suffix == ".parquet":
        return _parse_parquet(data, name, max_rows, check_columns)
    if suffix not in DATA_SUFFIXES:
        expected = ", ".join(DATA_SUFFIXES)
        raise BenchmarkError(f"{name}: unknown file type {suffix or '(none)'}; expected one of {expected}")
    text = _decode(data, name)
    rows = _csv_rows(text, name, check_columns) if suffix == ".csv" else _json_rows(text, name)
    return _take(rows, name, max_rows)


def _take(rows: Iterator[tuple[str, Any]], name: str, max_rows: int | None) -> list[Record]:
    """The records of `rows`, read no further than row max_rows + 1."""
    records = []
    with closing(rows):  # a parser stopped early restores what it changed now, not at gc
        for where, row in rows:
            if max_rows is not None and len(records) >= max_rows:
                raise _too_many(name, max_rows)
            records.append(_record(where, row))
    return records


def _too_many(name: str, max_rows: int, found: int | None = None) -> TooManyRows:
    rows = "more rows than" if found is None else f"{found} rows, more than"
    return TooManyRows(f"{name}: {rows} the limit of {max_rows}; upload fewer rows (at most {max_rows})")


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


_LINE = re.compile(r"[^\r\n]*(?:\r\n?|\n|\Z)")
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's
_DECODER = json.JSONDecoder()


def _lines(text: str) -> Iterator[str]:
    """The lines of `text` with their endings, one at a time (io.StringIO would first copy
    all of it, four bytes a character)."""
    return (m.group() for m in _LINE.finditer(text) if m.group())


def _json_rows(text: str, name: str) -> Iterator[tuple[str, Any]]:
    """A JSON array of objects, one object, or JSON lines (TOFU's .json files are JSON
    lines), one row at a time."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise BenchmarkError(
            f"{name}: JSON nested {depth} levels deep, more than the {MAX_JSON_DEPTH} a benchmark file "
            'could need; expected a JSON array of objects such as [{"question": "...", "answer": "..."}], '
            "one object, or one object per line"
        )
    start = _WHITESPACE.match(text).end()
    if text.startswith("[", start):
        try:
            for k, item in enumerate(_array_items(text, start), 1):
                yield f"{name} item {k}", item
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{name} line {e.lineno}, column {e.colno}: malformed JSON ({e.msg})") from None
    elif start < len(text):
        one = _one_document(text, start)
        if one is None:
            yield from _json_lines(text, name)  # not one document: read it as JSON lines
        else:
            yield f"{name} line 1", one[0]


def _one_document(text: str, start: int) -> tuple[Any] | None:
    """(the document,) if `text` from `start` on is one JSON document, else None (a
    tuple, so that a file holding just `null` is told apart from JSON lines)."""
    try:
        item, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    return (item,) if _WHITESPACE.match(text, end).end() == len(text) else None


def _array_items(text: str, start: int) -> Iterator[Any]:
    """The items of the JSON array at `start`, parsed one at a time (JSONDecodeError if malformed)."""
    i = _WHITESPACE.match(text, start + 1).end()
    if not text.startswith("]", i):
        while True:
            item, i = _DECODER.raw_decode(text, i)
            yield item
            i = _WHITESPACE.match(text, i).end()
            if not text.startswith(",", i):
                break
            i = _WHITESPACE.match(text, i + 1).end()
        if not text.startswith("]", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
    end = _WHITESPACE.match(text, i + 1).end()
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)


def _json_lines(text: str, name: str) -> Iterator[tuple[str, Any]]:
    for n, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchmarkError(
                f"{name} line {n}, column {e.colno}: malformed JSON ({e.msg}); "
                "expected a JSON array or one JSON object per line"
            ) from None
        yield f"{name} line {n}", row


def _csv_rows(text: str, name: str, check_columns: ColumnCheck | None) -> Iterator[tuple[str, dict]]:
    """Rows of a CSV file with a header; empty cells are treated as absent fields."""
    old_limit = csv.field_size_limit(MAX_FILE_BYTES)  # long documents in one cell
    reader = csv.DictReader(_lines(text), strict=True)
    try:
        if not reader.fieldnames:
            raise BenchmarkError(f"{name}: empty CSV; expected a header row with column names")
        if check_columns is not None:
            check_columns([k.strip() for k in reader.fieldnames])
        for row in reader:
            if None in row:
                raise BenchmarkError(
                    f"{name} line {reader.line_num}: more values than the header's columns {reader.fieldnames}"
                )
            yield f"{name} line {reader.line_num}", {k.strip(): v for k, v in row.items() if v not in (None, "")}
    except csv.Error as e:
        raise BenchmarkError(f"{name} near line {reader.line_num + 1}: malformed CSV ({e})") from None
    finally:
        csv.field_size_limit(old_limit)


def _parse_parquet(data: bytes, name: str, max_rows: int | None,
                   check_columns: ColumnCheck | None) -> list[Record]:
    """The rows of a parquet file; its columns and row count come from the footer, before any row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(io.BytesIO(data))
        columns, n_rows = file.schema_arrow.names, file.metadata.num_rows
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BenchmarkError(f"{name}: not a readable parquet file ({e})") from None
    if check_columns is not None:
        check_columns(columns)
    if max_rows is not None and n_rows > max_rows:
        raise _too_many(name, max_rows, n_rows)
    try:
        rows = file.read().to_pylist()
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
