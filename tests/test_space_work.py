"""Issue 36, item 1: one upload must not hold the model for everyone. The work a request
may ask for is bounded by what it costs (GROM_MAX_EXAMPLE_TOKENS, GROM_MAX_JOB_TOKENS:
components/server/costs.py), refused at load time and again at job time, and every job
stops once it has run GROM_MAX_JOB_SECONDS (components/server/device.py), the model left
unedited. Through the real endpoints, with the server's memory and another visitor's
latency measured around; the limits are lowered with monkeypatch so that each test takes
seconds."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import handle_file  # noqa: E402

from components.server import costs  # noqa: E402
from components.server.session import REGISTRY  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import QUICK, new_client, weights_hash  # noqa: E402
from tests.test_hostile import MB, Measured  # noqa: E402

QUESTION = "Where was Sina Cheithnu born?"


def issue_upload(path, words: int, retain_rows: int = 25):
    """The issue's file, scaled: one forget row of one long text, short retain rows."""
    with path.open("w") as f:
        f.write(json.dumps({"split": "forget", "text": "lorem ipsum dolor sit amet " * (words // 5)}) + "\n")
        for i in range(retain_rows):
            f.write(json.dumps({"split": "retain", "question": f"What is {i} plus one?",
                                "answer": f"It is {i + 1}."}) + "\n")
    return path


def load_upload(client, path):
    return client.predict("custom", "forget", "", handle_file(str(path)), None, api_name="/load_benchmark")


def generate_seconds(client) -> float:
    t0 = time.perf_counter()
    client.predict(QUESTION, api_name="/generate")
    return time.perf_counter() - t0


# ---------------------------------------------------------------- at load time

def test_the_issues_long_forget_row_is_refused_at_load_without_being_tokenised(url, tmp_path, monkeypatch):  # noqa: F811
    c, other = new_client(url), new_client(url)
    monkeypatch.setenv("GROM_MAX_EXAMPLE_TOKENS", "512")
    path = issue_upload(tmp_path / "long.jsonl", words=200_000)  # 1.1 MB, one row
    with Measured() as cost, ThreadPoolExecutor(1) as pool:
        waited = pool.submit(generate_seconds, other)  # another visitor, meanwhile
        with pytest.raises(Exception) as err:
            load_upload(c, path)
        other_s = waited.result(timeout=60)
    message = str(err.value)
    assert "Forget example 1" in message and "lorem ipsum" in message  # which example, its first words
    assert "characters long" in message and "at most 512 tokens" in message  # its size, the limit
    assert "GROM_MAX_EXAMPLE_TOKENS" in message and "shorter rows" in message  # what to do
    assert cost.seconds < 15 and cost.grew < 64 * MB, (cost.seconds, cost.grew / MB)
    assert other_s < 20
    # the session still has the demo: the refused upload changed nothing
    summary, *_ = c.predict(api_name="/run_edit", **QUICK)
    assert "demo/forget10" in summary


def test_an_example_between_its_bounds_is_tokenised_and_its_size_said(url, tmp_path, monkeypatch):  # noqa: F811
    c = new_client(url)  # the demo's longest example: about 300 tokens of this model
    monkeypatch.setenv("GROM_MAX_EXAMPLE_TOKENS", "200")
    path = issue_upload(tmp_path / "middling.jsonl", words=250)  # ~1,350 characters: tokens must be counted
    with pytest.raises(Exception, match=r"Forget example 1 .* is [\d,]+ tokens long.*at most 200 tokens"):
        load_upload(c, path)


def test_a_forget_set_past_the_job_limit_is_refused_at_load(url, tmp_path, monkeypatch):  # noqa: F811
    c = new_client(url)
    monkeypatch.setenv("GROM_MAX_JOB_TOKENS", "1000")
    path = tmp_path / "many.jsonl"
    with path.open("w") as f:
        for i in range(60):  # each short, together past the limit
            f.write(json.dumps({"split": "forget", "question": f"Who wrote book number {i}?",
                                "answer": f"Book number {i} was written by author {i} in the year 19{i % 100:02d}."})
                    + "\n")
        for i in range(60):
            f.write(json.dumps({"split": "retain", "question": f"{i}?", "answer": f"{i}."}) + "\n")
    with pytest.raises(Exception) as err:
        load_upload(c, path)
    message = str(err.value)
    assert "forget 60 examples" in message and "at most 1,000 tokens" in message
    assert "GROM_MAX_JOB_TOKENS" in message


def test_the_bundled_benchmarks_load_with_the_default_limits(url):  # noqa: F811
    c = new_client(url)
    for name, split in (("demo", "forget10"), ("demo", "forget01"), ("real-knowledge", "the-solar-system")):
        info, *_ = c.predict(name, split, "", None, None, api_name="/load_benchmark")
        assert "forget" in info.lower()


# ---------------------------------------------------------------- at job time

def test_every_job_kind_checks_its_tokens_with_the_model_it_runs_on(url, monkeypatch):  # noqa: F811
    """Loaded within the limits; the host then lowers them: each job that reads data is refused
    before any work, saying how much it would read and what to use less of."""
    c = new_client(url)
    c.predict(api_name="/run_edit", **QUICK)
    model = REGISTRY.get(next(k for k in REGISTRY.resident() if k.name == "demo")).model
    before = weights_hash(model)
    monkeypatch.setenv("GROM_MAX_JOB_TOKENS", "20000")
    with pytest.raises(Exception, match=r"This edit would read .*GROM_MAX_JOB_TOKENS.*retain examples"):
        c.predict(api_name="/run_edit", **(QUICK | dict(retain_examples=0)))  # all 3,200 retain examples
    with pytest.raises(Exception, match=r"These layer scores would read .*GROM_MAX_JOB_TOKENS"):
        c.predict(k=3, band_mode="suggested", api_name="/layer_scores", retain_examples=0)
    with pytest.raises(Exception, match=r"This comparison would read .*GROM_MAX_JOB_TOKENS.*fewer examples per set"):
        c.predict(max_examples=200, api_name="/compare")
    with pytest.raises(Exception, match=r"This GA run would read .*GROM_MAX_JOB_TOKENS"):
        c.predict("ga", 1, 1e-3, max_examples=5, api_name="/run_baseline")
    with pytest.raises(Exception, match=r"This sweep would read .*GROM_MAX_JOB_TOKENS"):
        c.predict("beta", "10, 20", api_name="/sweep")
    assert weights_hash(model) == before
    text, *_ = c.predict(max_examples=5, api_name="/compare")  # within the limit: runs
    assert "Final score" in text


def test_counts_are_cached_per_example_and_tokenizer():
    from grom.data import load_benchmark
    from grom.demo import load_demo_model

    _, tok = load_demo_model("full")
    bench = load_benchmark("demo", "forget10")
    first = costs.exact_tokens(tok, bench.retain, costs.KEYS)
    t0 = time.perf_counter()
    again = costs.exact_tokens(tok, bench.retain, costs.KEYS)
    assert again == first and time.perf_counter() - t0 < 0.5
    assert costs.token_chars(tok) >= max(len(tok.decode([i])) for i in range(len(tok)))


# ---------------------------------------------------------------- the wall-time limit

def test_a_job_past_its_wall_time_stops_the_model_unedited_and_others_go_on(url, monkeypatch):  # noqa: F811
    """A baseline of several epochs (tens of seconds on this CPU) under GROM_MAX_JOB_SECONDS = 2:
    it stops at its next forward pass with the message, the model's weights are as they were,
    the memory comes back, and another visitor queued behind it is answered at once."""
    c, other = new_client(url), new_client(url)
    model = REGISTRY.get(next(k for k in REGISTRY.resident() if k.name == "demo")).model
    before = weights_hash(model)
    generate_seconds(other)  # warm
    monkeypatch.setenv("GROM_MAX_JOB_SECONDS", "2")
    with Measured() as cost, ThreadPoolExecutor(1) as pool:
        job = pool.submit(c.predict, "ga", 5, 1e-3, max_examples=5, api_name="/run_baseline")
        time.sleep(1.0)  # the baseline holds the device
        other_s = generate_seconds(other)  # queued behind it
        with pytest.raises(Exception) as err:
            job.result(timeout=120)
    message = str(err.value)
    assert "stopped after" in message and "at most 2 s" in message and "GROM_MAX_JOB_SECONDS" in message
    assert "fewer examples" in message
    assert weights_hash(model) == before  # trained in place, given back bit for bit
    assert cost.seconds < 30, cost.seconds  # the whole baseline would take minutes
    assert other_s < 20, other_s
    assert cost.grew < 200 * MB, cost.grew / MB
    monkeypatch.delenv("GROM_MAX_JOB_SECONDS")
    assert generate_seconds(c) < 20  # the stopped visitor is served on too


def test_the_clock_counts_from_when_the_job_starts_not_from_when_it_queued(url, monkeypatch):  # noqa: F811
    """Two long baselines, each stopped at GROM_MAX_JOB_SECONDS; another visitor's question
    asked meanwhile is answered between their steps (the fair line). Behind a job that holds
    the device longer than the limit without a step to give it up at, a question waits
    longer than the limit and is still answered: its own seconds count from its turn."""
    import threading

    from components.server.device import DEVICE_LOCK

    a, a2, b = new_client(url), new_client(url), new_client(url)
    generate_seconds(b)  # warm
    monkeypatch.setenv("GROM_MAX_JOB_SECONDS", "4")
    with ThreadPoolExecutor(3) as pool:
        long = [pool.submit(x.predict, "ga", 5, 1e-3, max_examples=5, api_name="/run_baseline") for x in (a, a2)]
        time.sleep(0.5)
        between = pool.submit(generate_seconds, b).result(timeout=120)
        for job in long:
            with pytest.raises(Exception, match="GROM_MAX_JOB_SECONDS"):
                job.result(timeout=120)
    held = threading.Event()

    def hold():  # a job with no step boundary: the device is held for 6 s
        with DEVICE_LOCK:
            held.set()
            time.sleep(6)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    waited = generate_seconds(b)
    holder.join()
    assert waited > 4, waited  # it waited longer than the limit, and was not stopped for it
    print(f"answered between two baselines' steps in {between:.1f} s; behind a 6 s hold in {waited:.1f} s")
