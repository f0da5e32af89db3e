"""The second hardening round (issue 20): what a hostile client sends through the app's real
endpoints costs no more memory or time than its size and the host limits allow, and gets
a message that says what is wrong. The server's resident memory is measured around each
request (the app runs in this process).

1. an edit.json whose band, k, seed, split or source the loaded model or the widgets
   cannot hold; 2. request bodies past GROM_MAX_REQUEST_MB; 3. numbers above 64 bits;
5. an API session that never loaded a model; 6. uploads parsed past the row limit;
7. one client's uploads against everyone's; 8. deeply nested JSON.
(4, the memory a baseline run leaves behind, is tested in test_baselines.py.)
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")
from gradio_client import Client, handle_file  # noqa: E402

from components.server.session import REGISTRY  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import QUICK, new_client, weights_hash  # noqa: E402
from tests.test_app_runs import export_to  # noqa: E402

MB = 1 << 20


def rss() -> int:
    """This process's resident memory in bytes (the server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Measured:
    """Resident memory and wall time around a block."""

    def __enter__(self):
        self.rss, self.t0 = rss(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.grew, self.seconds = rss() - self.rss, time.perf_counter() - self.t0
        return False


@pytest.fixture(scope="module")
def exported(url, tmp_path_factory):  # noqa: F811
    """An edit.json (and its patch) exported from a real edit of the demo."""
    c = new_client(url)
    c.predict(api_name="/run_edit", **(QUICK | dict(band_mode="manual", band_text="3-5")))
    meta_file, _ = export_to(c, tmp_path_factory.mktemp("export"))
    return json.loads(meta_file.read_text())


def import_error(client, folder: Path, meta: dict) -> tuple[str, Measured]:
    """The message of importing `meta` as edit.json, and what the request cost."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "edit.json"
    path.write_text(json.dumps(meta))
    with Measured() as cost:
        with pytest.raises(Exception) as err:
            client.predict([handle_file(str(path))], api_name="/import_run")
    return str(err.value), cost


def changed(meta: dict, **run) -> dict:
    out = copy.deepcopy(meta)
    out["run"] |= run
    return out


# ---------------------------------------------------------------- 1 and 3: edit.json

@pytest.mark.parametrize("band, message", [
    ([100, 200, 1_000_000_000], "outside the loaded model"),
    ([0, 1, 30_000_000], "outside the loaded model"),
    ([-3, 4, 5], "outside the loaded model"),
    ([3, "4", 5], "list of layer numbers"),
])
def test_an_imported_band_the_model_lacks_is_refused_at_once(url, exported, tmp_path, band, message):  # noqa: F811
    c = new_client(url)
    before = weights_hash(REGISTRY.current.model)
    text, cost = import_error(c, tmp_path, changed(exported, band=band, band_mode="manual"))
    assert message in text and len(text) < 400
    assert cost.seconds < 5 and cost.grew < 50 * MB, (cost.seconds, cost.grew / MB)
    assert weights_hash(REGISTRY.current.model) == before


@pytest.mark.parametrize("run, message", [
    (dict(k=10**12), "band width k"),
    (dict(seed=2**64), "whole number|seed"),
    (dict(seed=2**40), "seed must be a whole number from 0 to 4,294,967,295"),
    (dict(retain_examples=10**30), "whole number"),
    (dict(split="../../etc"), "not a path"),
    (dict(split="forget99"), "has no split"),
    (dict(source="/etc"), "outside the folders"),
    (dict(benchmark="x" * 5000), "at most 300 characters"),
])
def test_imported_run_values_are_checked_as_the_edit_panel_checks_them(url, exported, tmp_path, run, message):  # noqa: F811
    c = new_client(url)
    text, cost = import_error(c, tmp_path, changed(exported, **run))
    assert any(m in text for m in message.split("|")) and len(text) < 400, text
    assert cost.seconds < 5


@pytest.mark.parametrize("config, message", [
    (dict(seed=2**64), "seed = 1.84467e\\+19 is out of range"),
    (dict(batch_size=10**20), "batch_size"),
    (dict(beta=1e300), "beta = 1e\\+300 is out of range"),
    (dict(layers=[0, 1, 10**15]), "layer numbers"),
])
def test_imported_config_numbers_above_their_bounds_get_a_message(url, exported, tmp_path, config, message):  # noqa: F811
    import re

    c = new_client(url)
    meta = copy.deepcopy(exported)
    meta["settings"] |= config
    text, _ = import_error(c, tmp_path, meta)
    assert re.search(message, text), text
    summary, _, _ = c.predict(api_name="/run_edit", **QUICK)  # the session still works
    assert "Edited" in summary


def test_a_deeply_nested_edit_json_is_named_as_such(url, tmp_path):  # noqa: F811
    c = new_client(url)
    path = tmp_path / "edit.json"
    path.write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(Exception) as err:
        c.predict([handle_file(str(path))], api_name="/import_run")
    assert "nested" in str(err.value) and "RecursionError" not in str(err.value)


# ---------------------------------------------------------------- 2: request bodies

def test_a_declared_huge_body_is_refused_before_it_is_read(url):  # noqa: F811
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    head = (f"POST /gradio_api/queue/join HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {300 * MB}\r\n\r\n{{").encode()
    with Measured() as cost, socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(head)  # 300 MB announced, one byte sent: the answer must not wait for the rest
        answer = b""
        while chunk := sock.recv(65536):  # the server closes after its answer
            answer += chunk
        answer = answer.decode("latin-1")
    assert answer.startswith("HTTP/1.1 413") and "GROM_MAX_REQUEST_MB" in answer
    assert cost.seconds < 2


@pytest.mark.parametrize("route", ["/gradio_api/queue/join", "/gradio_api/call/run_edit",
                                   "/gradio_api/api/run_edit", "/gradio_api/cancel"])
def test_a_chunked_body_is_cut_off_at_the_limit_with_memory_flat(url, route):  # noqa: F811
    sent = 0

    def chunks():  # 64 MB in 1 MB chunks, no Content-Length: read until the server stops
        nonlocal sent
        for _ in range(64):
            sent += MB
            yield b"x" * MB

    with Measured() as cost:
        try:
            r = httpx.post(url.rstrip("/") + route, content=chunks(), timeout=30,
                           headers={"Content-Type": "application/json"})
            status = r.status_code
        except httpx.HTTPError:  # the server answered 413 and closed while we were sending
            status = 413
    assert status == 413
    assert cost.grew < 40 * MB and cost.seconds < 10, (cost.grew / MB, cost.seconds)
    assert Client(url, verbose=False).view_api(print_info=False, return_format="dict")  # still serving


# ---------------------------------------------------------------- 5: API sessions

def test_an_api_session_that_loaded_nothing_works_on_the_start_model_and_split(url):  # noqa: F811
    other = Client(url, verbose=False)  # another visitor loads another benchmark split
    other.predict("demo", "forget01", "", None, None, api_name="/load_benchmark")
    fresh = Client(url, verbose=False)  # no /load_model, no /load_benchmark
    summary, _, _ = fresh.predict(api_name="/run_edit", **QUICK)
    assert "Data: **demo/forget10**" in summary  # the app's start split, as the page shows it


# ---------------------------------------------------------------- 6 and 8: uploaded benchmarks

def upload_benchmark(client, path: Path):
    return client.predict("custom", "forget", "", handle_file(str(path)), None, api_name="/load_benchmark")


def test_an_upload_past_the_row_limit_is_refused_without_reading_it_all(url, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GROM_MAX_UPLOAD_ROWS", "10000")
    path = tmp_path / "million.csv"
    path.write_text("question,answer,split\n" + "q?,a,forget\n" * 700_000)  # 8 MB, under the 10 MB cap
    c = new_client(url)
    with Measured() as cost:
        with pytest.raises(Exception, match="10,000"):
            upload_benchmark(c, path)
    assert cost.grew < 100 * MB and cost.seconds < 5, (cost.grew / MB, cost.seconds)


def test_an_upload_without_a_needed_column_is_refused_at_its_header(url, tmp_path):  # noqa: F811
    path = tmp_path / "nosplit.csv"
    path.write_text("question,answer\n" + "q?,a\n" * 1_000_000)  # 5 MB: one file needs a split column
    c = new_client(url)
    with Measured() as cost:
        with pytest.raises(Exception, match="split"):
            upload_benchmark(c, path)
    assert cost.grew < 100 * MB and cost.seconds < 5, (cost.grew / MB, cost.seconds)


def test_a_deeply_nested_benchmark_file_is_named_as_such(url, tmp_path):  # noqa: F811
    path = tmp_path / "nested.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    c = new_client(url)
    with pytest.raises(Exception) as err:
        upload_benchmark(c, path)
    assert "nested" in str(err.value) and "Something went wrong" not in str(err.value)


# ---------------------------------------------------------------- 7: uploads per client

def test_one_client_cannot_use_up_everyones_uploads(url, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("GROM_UPLOADS_PER_MINUTE", "2")
    small = tmp_path / "small.csv"
    small.write_text("question,answer\nq?,a\n")

    def upload(client_address: str) -> httpx.Response:
        with small.open("rb") as f:
            return httpx.post(url.rstrip("/") + "/gradio_api/upload", files={"files": ("small.csv", f)},
                              headers={"X-Forwarded-For": client_address})

    greedy = [upload("203.0.113.7") for _ in range(4)]
    assert [r.status_code for r in greedy] == [200, 200, 429, 429]
    assert "one visitor" in greedy[-1].text and "GROM_UPLOADS_PER_MINUTE" in greedy[-1].text
    assert upload("198.51.100.2").status_code == 200  # another visitor is not blocked by the first


def test_the_server_wide_upload_rate_is_shared_fairly_with_a_hard_ceiling(monkeypatch):
    """Issue 45, item 6: past the server's rate, a visitor who has had less than an equal
    share still uploads (four addresses' 30 uploads each no longer lock out a fifth); twice
    the server's rate is a ceiling for everyone."""
    from components.server.guard import UploadGuard

    monkeypatch.setenv("GROM_UPLOADS_PER_MINUTE", "30")
    monkeypatch.setenv("GROM_SERVER_UPLOADS_PER_MINUTE", "120")
    guard = UploadGuard(None)
    monkeypatch.setattr("components.server.guard.upload_folder", lambda: Path("/nonexistent-grom-uploads"))
    greedy = [guard._refusal(f"greedy-{i % 4}") for i in range(4 * 30)]
    assert greedy == [None] * 120  # the server's whole minute
    assert guard._refusal("greedy-0") is not None  # its own quota, and its share, used up
    assert guard._refusal("newcomer") is None  # a fifth address still gets one
    monkeypatch.setenv("GROM_UPLOADS_PER_MINUTE", "2")
    monkeypatch.setenv("GROM_SERVER_UPLOADS_PER_MINUTE", "5")
    guard = UploadGuard(None)
    answers = [guard._refusal(f"client-{i}") for i in range(12)]  # twelve visitors, one upload each
    assert answers[:10] == [None] * 10 and all("GROM_SERVER_UPLOADS_PER_MINUTE" in a for a in answers[10:])
    assert guard._refusal("client-0") is not None  # the ceiling (2 x 5) holds for everyone
