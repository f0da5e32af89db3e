"""Limits that hold before the work they bound: the row cap stops the parse at row
max_rows + 1, a CSV header is checked before its rows, and deep JSON is refused before
`json` recurses into it (a clear message, never a RecursionError)."""
from __future__ import annotations

import csv
import json
import random
import tracemalloc

import pyarrow.parquet as pq
import pytest

from grom.data import get_spec, load_benchmark
from grom.data.readers import (
    MAX_JSON_DEPTH,
    BenchmarkError,
    TooManyRows,
    json_depth,
    parse_rows,
    read_rows,
)
from grom.edit import read_metadata
from grom.tasks.custom import load_custom, load_custom_file
from tests.data_fixtures import write_csv, write_json, write_jsonl, write_parquet

ROWS = [{"question": f"Q{k}?", "answer": f"A{k}"} for k in range(5)]
MILLION = 1_000_000
PEAK_BOUND = 50 * 2**20  # bytes; a full parse of the million-row files below takes 350 MB and more


def peak_bytes(fn) -> tuple[int, BaseException | None]:
    """tracemalloc's peak while `fn()` runs, and what it raised."""
    tracemalloc.start()
    try:
        fn()
        raised = None
    except Exception as err:  # noqa: BLE001 - returned for the caller to check
        raised = err
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, raised


# ----------------------------------------------------------------------------- the row cap


@pytest.mark.parametrize("writer,name", [
    (write_csv, "rows.csv"), (write_jsonl, "rows.jsonl"), (write_json, "rows.json"),
    (write_parquet, "rows.parquet"),
])
def test_exactly_max_rows_are_read_and_one_more_is_refused(tmp_path, writer, name):
    path = writer(tmp_path / name, ROWS)
    assert [dict(r.data) for r in read_rows(path, max_rows=5)] == ROWS
    refused = rf"{name}: (more rows|5 rows, more) than the limit of 4; upload fewer rows"
    with pytest.raises(TooManyRows, match=refused):
        read_rows(path, max_rows=4)
    with pytest.raises(TooManyRows, match=r"limit of 4"):
        parse_rows(path.read_bytes(), f"upload/{name}", max_rows=4)


def test_the_cap_stops_reading_at_the_row_over_it(tmp_path):
    """What follows row max_rows + 1 is never parsed: broken JSON there goes unseen."""
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n{broken\n')
    with pytest.raises(TooManyRows):
        read_rows(lines, max_rows=2)
    array = tmp_path / "rows.json"
    array.write_text('[{"text": "a"}, {"text": "b"}, {"text": "c"}, {broken')
    with pytest.raises(TooManyRows):
        read_rows(array, max_rows=2)
    with pytest.raises(BenchmarkError, match=r"rows.json line 1, column \d+: malformed JSON"):
        read_rows(array, max_rows=3)


def test_parquet_is_refused_from_its_row_count_before_reading_rows(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "rows.parquet", ROWS)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("rows read before the cap"))
    with pytest.raises(TooManyRows, match=r"rows.parquet: 5 rows, more than the limit of 3"):
        read_rows(path, max_rows=3)


def test_a_csv_stopped_early_restores_the_csv_field_limit(tmp_path):
    before = csv.field_size_limit()
    with pytest.raises(TooManyRows):
        read_rows(write_csv(tmp_path / "rows.csv", ROWS), max_rows=1)
    assert csv.field_size_limit() == before


def test_json_arrays_still_say_where_they_are_malformed(tmp_path):
    path = tmp_path / "bad.json"
    for text, where in [('[{"a": 1}\n {"a": 2}]', "line 2, column 2"), ('[{"a": 1}] [', "line 1, column 12"),
                        ('[{"a": 1},\n]', "line 2, column 1"), ("[", "line 1, column 2")]:
        path.write_text(text)
        with pytest.raises(BenchmarkError, match=rf"bad.json {where}: malformed JSON"):
            read_rows(path)
    path.write_text("  [ ]  ")
    assert read_rows(path) == []


@pytest.mark.parametrize("name,text", [
    ("big.csv", "question,answer\n" + "q,a\n" * MILLION),
    ("big.jsonl", '{"t":1}\n' * MILLION),
    ("big.json", "[" + ",".join(['{"t":1}'] * MILLION) + "]"),
])
def test_a_million_rows_cost_no_more_than_the_cap(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    del text
    peak, raised = peak_bytes(lambda: read_rows(path, max_rows=10_000))
    assert isinstance(raised, TooManyRows) and "limit of 10000" in str(raised)
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MB"


# ----------------------------------------------------------------------------- custom files


def test_a_huge_csv_without_a_split_column_is_refused_from_its_header(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("question,answer\n" + "q,a\n" * MILLION)
    peak, raised = peak_bytes(lambda: load_custom(source=path))
    assert isinstance(raised, BenchmarkError) and "has no 'split' column" in str(raised)
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MB"


def test_a_csv_header_without_the_needed_columns_is_refused(tmp_path):
    path = write_csv(tmp_path / "odd.csv", [{"prompt": "P", "completion": "C"}])
    with pytest.raises(BenchmarkError, match=r"odd.csv: expected 'question' and 'answer' columns, or a "
                                             r"'text' column; found columns: prompt, completion"):
        load_custom_file(path)
    with pytest.raises(BenchmarkError, match="found columns: question"):
        load_custom_file(b"question\nQ?\n", name="upload.csv")


def test_the_cap_counts_forget_and_retain_rows_together(tmp_path):
    forget = write_csv(tmp_path / "f.csv", ROWS[:3])
    retain = write_jsonl(tmp_path / "r.jsonl", [{"text": "kept"}, {"text": "also kept"}])
    source = {"forget": forget, "retain": retain}
    bench = load_custom(source=source, max_rows=5)
    assert (len(bench.forget), len(bench.retain)) == (3, 2)
    with pytest.raises(TooManyRows, match=r"r.jsonl: with the forget file's 3 rows, more than the limit "
                                          r"of 4 rows in all; upload fewer rows"):
        load_custom(source=source, max_rows=4)
    with pytest.raises(TooManyRows, match=r"f.csv: more rows than the limit of 2"):
        load_custom(source=source, max_rows=2)
    with pytest.raises(TooManyRows, match=r"f.csv: .*limit of 1"):
        load_custom_file(forget, max_rows=1)


def test_the_cap_holds_for_one_file_with_a_split_column(tmp_path):
    rows = [{"split": "forget", **ROWS[0]}, {"split": "retain", **ROWS[1]}, {"split": "retain", "text": "t"}]
    path = write_csv(tmp_path / "mine.csv", rows)
    assert len(load_custom(source=path, max_rows=3).retain) == 2
    with pytest.raises(TooManyRows, match=r"mine.csv: more rows than the limit of 2"):
        load_custom(source=path, max_rows=2)


@pytest.mark.skipif("max_rows" not in get_spec("custom").options,
                    reason="grom/data/loaders.py does not pass max_rows to the custom loader yet")
def test_load_benchmark_passes_the_cap_to_custom_files(tmp_path):
    source = {"forget": write_csv(tmp_path / "f.csv", ROWS[:3]), "retain": write_csv(tmp_path / "r.csv", ROWS[3:])}
    assert len(load_benchmark("custom", source=source, max_rows=5).retain) == 2
    with pytest.raises(TooManyRows, match="limit of 4"):
        load_benchmark("custom", source=source, max_rows=4)


# ----------------------------------------------------------------------------- nesting


def nested(depth: int) -> str:
    """An object `depth` levels deep, each level an object or an array."""
    return "".join('{"a": ' if k % 2 else "[" for k in range(depth - 1)) + "{}" + "".join(
        "}" if k % 2 else "]" for k in reversed(range(depth - 1)))


def reference_depth(text: str) -> int:
    """The deepest nesting, one character at a time (an independent reference)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def random_json(rng: random.Random, level: int = 0):
    tricky = ["[", "]}", '"', "\\", '\\"[', "x\\\\", "{[", "é[", "\u2028"]
    r = rng.random()
    if level > 7 or r < 0.3:
        return rng.choice([1, None, *tricky])
    if r < 0.65:
        return [random_json(rng, level + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(tricky): random_json(rng, level + 1) for _ in range(rng.randint(0, 2))}


@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 18])
def test_json_depth_agrees_with_a_character_by_character_count(monkeypatch, chunk):
    from grom.data import readers

    monkeypatch.setattr(readers, "_CHUNK", chunk)  # pieces that end anywhere: in strings, escapes
    rng = random.Random(chunk)
    for _ in range(300):
        text = json.dumps(random_json(rng), ensure_ascii=rng.random() < 0.5)
        assert json_depth(text) == reference_depth(text), text
    assert json_depth(nested(50)) == 50 and json_depth("") == 0 and json_depth('"[[["') == 0


def test_json_at_the_depth_limit_is_read_and_one_deeper_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(f'[{{"text": "t", "extra": {nested(MAX_JSON_DEPTH - 2)}}}]')
    assert read_rows(path)[0].data["text"] == "t"
    path.write_text(f'[{{"text": "t", "extra": {nested(MAX_JSON_DEPTH - 1)}}}]')
    with pytest.raises(BenchmarkError, match=rf"deep.json: JSON nested {MAX_JSON_DEPTH + 1} levels deep"):
        read_rows(path)


@pytest.mark.parametrize("name,text", [
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("deep.json", '{"a":' * 100_000 + "1" + "}" * 100_000),
    ("deep.jsonl", '{"text": "ok"}\n' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "\n"),
    ("deep.json", "[" * 100_000),
])
def test_deeply_nested_benchmark_files_say_so(name, text):
    with pytest.raises(BenchmarkError, match=rf"{name}: JSON nested \d+ levels deep, more than the "
                                             rf"{MAX_JSON_DEPTH} a benchmark file could need; expected a JSON array"):
        load_custom_file(text.encode(), name=name)


def test_a_deeply_nested_csv_cell_says_so():
    cell = '"' + "[" * 100_000 + "]" * 100_000 + '"'
    data = f"question,answer,perturbed_answer\nQ?,A,{cell}\n".encode()
    too_deep = rf"line 2: field 'perturbed_answer' is nested more than {MAX_JSON_DEPTH} levels"
    with pytest.raises(BenchmarkError, match=too_deep):
        load_custom_file(data, name="upload.csv")


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000, '{"config": ' + '{"a":' * 100_000 + "}" * 100_001,
])
def test_a_deeply_nested_edit_json_says_so(text):
    with pytest.raises(ValueError, match=r"edit.json is nested \d+ levels deep, too deep to be an edit.json"):
        read_metadata(text)
