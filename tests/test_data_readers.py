"""Reading data files: formats, locations in messages, and every kind of bad input."""
from __future__ import annotations

import time

import pytest

from grom.data import readers
from grom.data.readers import BenchmarkError, Record, load_hub_rows, parse_rows, read_local, read_rows
from tests.data_fixtures import write_csv, write_json, write_jsonl, write_parquet

ROWS = [{"question": "Q1?", "answer": "A1"}, {"question": "Q2?", "answer": "A2"}]


@pytest.mark.parametrize("writer,name", [
    (write_jsonl, "rows.jsonl"), (write_jsonl, "rows.json"), (write_json, "rows.json"),
    (write_csv, "rows.csv"), (write_parquet, "rows.parquet"),
])
def test_every_format_reads_the_same_rows(tmp_path, writer, name):
    records = read_rows(writer(tmp_path / name, ROWS))
    assert [dict(r.data) for r in records] == ROWS
    assert name in records[1].where


def test_a_single_json_object_is_one_row(tmp_path):
    path = tmp_path / "one.json"
    path.write_text('{\n  "text": "hello"\n}\n')
    assert [dict(r.data) for r in read_rows(path)] == [{"text": "hello"}]


def test_utf8_with_bom_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufefftext\nhéllo\n".encode("utf-8"))
    assert read_rows(path)[0].data == {"text": "héllo"}


def test_malformed_json_lines_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": \n')
    with pytest.raises(BenchmarkError, match=r"bad.jsonl line 3.*malformed JSON"):
        read_rows(path)


def test_malformed_json_array_names_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n {"a": 1},\n {"a": }\n]')
    with pytest.raises(BenchmarkError, match=r"bad.json line 3, column \d+: malformed JSON"):
        read_rows(path)


def test_rows_must_be_objects(tmp_path):
    path = write_json(tmp_path / "list.json", [["not", "an", "object"]])
    with pytest.raises(BenchmarkError, match=r"item 1: expected an object with named fields, found list"):
        read_rows(path)


def test_non_utf8_is_refused_with_the_offset(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("question,answer\nCafé?,Oui\n".encode("latin-1"))
    with pytest.raises(BenchmarkError, match=r"latin1.csv: not UTF-8 text \(byte 0xe9 at offset 19\)"):
        read_rows(path)


def test_oversized_file_is_refused_before_reading(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "big.jsonl", ROWS * 10)
    monkeypatch.setattr(readers, "MAX_FILE_BYTES", 100)
    monkeypatch.setattr(type(path), "read_bytes", lambda self: pytest.fail("read before the size check"))
    with pytest.raises(BenchmarkError, match=r"big.jsonl: .* MB is over the 0 MB limit"):
        read_rows(path)


def test_oversized_upload_is_refused():
    with pytest.raises(BenchmarkError, match="over the"):
        parse_rows(b"x" * 50, "upload.csv", max_bytes=10)


def test_csv_with_extra_values_names_the_line(tmp_path):
    path = tmp_path / "extra.csv"
    path.write_text("question,answer\nQ1?,A1\nQ2?,A2,surplus\n")
    with pytest.raises(BenchmarkError, match=r"extra.csv line 3: more values than the header"):
        read_rows(path)


def test_csv_with_broken_quotes_is_malformed(tmp_path):
    path = tmp_path / "quotes.csv"
    path.write_text('question,answer\n"Q1?" oops,A1\n')
    with pytest.raises(BenchmarkError, match=r"quotes.csv near line 2: malformed CSV"):
        read_rows(path)


def test_empty_csv_asks_for_a_header(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(BenchmarkError, match="expected a header row"):
        read_rows(path)


def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "data.xml").write_text("<a/>")
    with pytest.raises(BenchmarkError, match=r"unknown file type .xml"):
        read_rows(tmp_path / "data.xml")
    with pytest.raises(BenchmarkError, match="no such file"):
        read_rows(tmp_path / "absent.json")


def test_garbage_parquet_is_refused(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(BenchmarkError, match="not a readable parquet file"):
        read_rows(path)


def test_record_accessors_say_what_was_expected_and_found():
    rec = Record("f.jsonl line 7", {"question": "Q?", "answer": 3, "choices": '["x", "y"]', "gold": "B"})
    with pytest.raises(BenchmarkError, match=r"f.jsonl line 7: expected a non-empty text field 'text'; "
                                             r"found fields: answer, choices, gold, question"):
        rec.text("text")
    with pytest.raises(BenchmarkError, match=r"field 'answer' should be text, found int"):
        rec.text("answer")
    assert rec.text("absent", optional=True) is None
    assert rec.texts("choices") == ("x", "y")  # a JSON array in a CSV cell
    assert rec.texts("question") == ("Q?",)
    assert rec.index("gold", 4) == 1 and rec.index("answer", 4) == 3
    with pytest.raises(BenchmarkError, match=r"answer index 0..2"):
        rec.index("answer", 3)


def test_read_local_lists_the_expected_files(tmp_path):
    with pytest.raises(BenchmarkError,
                       match=r"no TOFU forget10 file; expected one of: forget10\{.json,.jsonl,.csv,.parquet\}"):
        read_local(tmp_path, ["forget10"], "TOFU forget10")
    assert read_local(tmp_path, ["forget10"], "TOFU forget10", required=False) is None


def test_read_local_joins_parquet_shards(tmp_path):
    write_parquet(tmp_path / "raw" / "forget-00000-of-00002.parquet", [{"text": "a"}])
    write_parquet(tmp_path / "raw" / "forget-00001-of-00002.parquet", [{"text": "b"}])
    rows = read_local(tmp_path, ["raw/forget"], "forget")
    assert [r.data["text"] for r in rows] == ["a", "b"]


def test_hub_without_network_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(BenchmarkError, match=r"could not reach the Hugging Face Hub .*locuslab/TOFU.*source="):
        load_hub_rows("locuslab/TOFU", "forget10", "train")
    assert time.monotonic() - start < 30


def test_line_endings_of_every_kind_and_newlines_in_quoted_cells(tmp_path):
    lines = tmp_path / "crlf.jsonl"
    lines.write_bytes('{"text": "a\u2028b"}\r\n{"text": "c"}\r\n'.encode("utf-8"))  # U+2028 ends no JSON line
    assert [r.data["text"] for r in read_rows(lines)] == ["a\u2028b", "c"]
    for ending in ("\n", "\r\n", "\r"):
        path = tmp_path / "rows.csv"
        path.write_bytes(f'question,answer{ending}"Q1?","two{ending}lines"{ending}Q2?,A2'.encode())
        rows = read_rows(path)
        assert [dict(r.data) for r in rows] == [{"question": "Q1?", "answer": f"two{ending}lines"},
                                               {"question": "Q2?", "answer": "A2"}]
        assert rows[1].where.endswith("line 4")
