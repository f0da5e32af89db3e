"""Visitors of a public Space (issue 36, items 2 and 5, and item 1's reuse of uploaded
paths): a visitor is an address the client cannot make up, jobs count per visitor over all
the session ids it invents, a job nobody listens for is dropped, and a file one visitor
uploaded is not another's input. Through the app's real routes (gradio_client and raw
httpx against the app launched in this process), with the server's memory and another
visitor's latency measured around the hostile requests.

The visitors are told apart as on a Space: GROM_PROXY_HOPS=1, each request carrying the
X-Forwarded-For address "the proxy" appended last (uvicorn, trusting the 127.0.0.1 peer,
takes the same address as the peer, so both rules agree here).
"""
from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")
from gradio_client import Client  # noqa: E402

from components.server import guard, limits  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_hostile import Measured  # noqa: E402

MB = 1 << 20


@pytest.fixture(autouse=True)
def behind_one_proxy(monkeypatch):
    monkeypatch.setenv("GROM_PROXY_HOPS", "1")


def visitor_client(url: str, address: str) -> Client:  # noqa: F811
    """A page of the visitor at `address`, on the demo model and split."""
    c = Client(url, verbose=False, headers={"X-Forwarded-For": f"192.0.2.1, {address}"})
    c.predict("demo", "auto", "auto", api_name="/load_model")
    c.predict("demo", "forget10", "", None, None, api_name="/load_benchmark")
    return c


def upload(url: str, path: Path, forwarded: str, http=httpx) -> httpx.Response:  # noqa: F811
    with path.open("rb") as f:
        return http.post(url.rstrip("/") + "/gradio_api/upload", files={"files": (path.name, f)},
                         headers={"X-Forwarded-For": forwarded}, timeout=30)


def endpoint_data(url: str, api_name: str, values: dict) -> tuple[int, list]:  # noqa: F811
    """The fn_index of `api_name` and the full data list of a queue/join for it (its State
    inputs as null, the others from `values` or their defaults), as a browser sends it."""
    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    dep = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
    kinds = {c["id"]: c["type"] for c in config["components"]}
    params = iter(Client(url, verbose=False).view_api(print_info=False, return_format="dict")
                  ["named_endpoints"][f"/{api_name}"]["parameters"])
    data = []
    for component in dep["inputs"]:
        if kinds[component] == "state":
            data.append(None)
        else:
            p = next(params)
            data.append(values.get(p["parameter_name"], p["parameter_default"]))
    return dep["id"], data


# ---------------------------------------------------------------- who a visitor is

def scope(peer: str, *forwarded: str) -> dict:
    return {"client": (peer, 5555), "headers": [(b"x-forwarded-for", v.encode()) for v in forwarded]}


@pytest.mark.parametrize("hops, forwarded, visitor", [
    ("0", ["198.51.100.1"], "10.16.3.80"),  # no proxy trusted: the header is ignored
    ("1", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  # what the client wrote first never counts
    ("2", ["6.6.6.6, 198.51.100.1, 10.0.0.2"], "198.51.100.1"),
    ("2", ["6.6.6.6, 198.51.100.1", "10.0.0.2"], "198.51.100.1"),  # two header lines are one list
    ("3", ["198.51.100.1, 10.0.0.2"], "198.51.100.1"),  # fewer than the hops: the first address
    ("1", [], "10.16.3.80"),  # no header: the peer
])
def test_the_visitor_is_the_address_the_trusted_proxies_appended(monkeypatch, hops, forwarded, visitor):
    monkeypatch.setenv("GROM_PROXY_HOPS", hops)
    assert guard.client_of(scope("10.16.3.80", *forwarded)) == visitor


def test_proxy_hops_default_to_one_on_a_space_and_zero_elsewhere(monkeypatch):
    monkeypatch.delenv("GROM_PROXY_HOPS")
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert limits.proxy_hops() == 0
    monkeypatch.setenv("SPACE_ID", "someone/grom-studio")
    assert limits.proxy_hops() == limits.SPACE_PROXY_HOPS == 1
    monkeypatch.setenv("GROM_PROXY_HOPS", "0")  # a host may trust no proxy, on a Space too
    assert limits.proxy_hops() == 0
    for bad in ("-1", "1.5", "many"):
        monkeypatch.setenv("GROM_PROXY_HOPS", bad)
        with pytest.raises(ValueError, match="GROM_PROXY_HOPS"):
            limits.proxy_hops()


# ---------------------------------------------------------------- item 5: uploads per visitor

def test_made_up_forwarded_addresses_do_not_use_up_everyones_uploads(url, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("GROM_UPLOADS_PER_MINUTE", "3")
    monkeypatch.setenv("GROM_SERVER_UPLOADS_PER_MINUTE", "30")
    small = tmp_path / "small.csv"
    small.write_text("question,answer\nq?,a\n")
    http = httpx.Client()  # one client: the server's memory is this process's, the client's too
    assert upload(url, small, "203.0.113.49", http).status_code == 200  # the route's first use allocates
    with Measured() as cost:  # 40 uploads, each with a different first address, one proxy-appended one
        greedy = [upload(url, small, f"198.18.{i}.1, 203.0.113.50", http) for i in range(40)]
    http.close()
    codes = [r.status_code for r in greedy]
    print(f"40 uploads with made-up first addresses: {codes.count(200)} taken, {codes.count(429)} refused, "
          f"{cost.seconds:.2f} s, memory {cost.grew / MB:+.1f} MB")
    assert codes == [200] * 3 + [429] * 37
    assert "one visitor" in greedy[-1].text and "GROM_UPLOADS_PER_MINUTE" in greedy[-1].text
    other = upload(url, small, "203.0.113.50, 198.51.100.50")  # another visitor, who names the first
    assert other.status_code == 200, other.text
    assert cost.grew < 50 * MB


# ---------------------------------------------------------------- item 1: another visitor's upload

def test_a_file_one_visitor_uploaded_is_not_another_visitors_input(url, tmp_path):  # noqa: F811
    mine = tmp_path / "mine.csv"
    rows = [f"Q{i}?,A{i},{'forget' if i < 8 else 'retain'}" for i in range(20)]
    mine.write_text("question,answer,split\n" + "\n".join(rows) + "\n")
    owner, stranger = "203.0.113.60", "198.51.100.60"
    path = upload(url, mine, f"192.0.2.1, {owner}").json()[0]
    base = url.rstrip("/") + "/gradio_api/call/load_benchmark"

    def load(forwarded: str, file: dict) -> httpx.Response:
        data = ["custom", "forget", "", file, None]
        return httpx.post(base, json={"data": data}, headers={"X-Forwarded-For": forwarded}, timeout=30)

    file_data = {"path": path, "orig_name": "mine.csv", "meta": {"_type": "gradio.FileData"}}
    relative = os.path.relpath(path)  # from the server's working folder
    spellings = [file_data, file_data | {"path": "/" + "/".join(["."] * 3) + path},  # the same file, written
                 {"path": relative, "meta": {"_type": "gradio.FileData"}},  # otherwise
                 {"url": f"{url.rstrip('/')}/gradio_api/file={path}", "path": "x.csv",
                  "meta": {"_type": "gradio.FileData"}}]
    for file in spellings:
        refused = load(f"192.0.2.1, {stranger}", file)
        assert refused.status_code == 422, (file, refused.text)
        assert "another visitor uploaded" in refused.text

    direct = httpx.post(url.rstrip("/") + "/gradio_api/api/load_benchmark", timeout=30,  # outside the queue
                        json={"data": ["custom", "forget", "", file_data, None]},
                        headers={"X-Forwarded-For": f"192.0.2.1, {stranger}"})
    assert direct.status_code == 422 and "another visitor uploaded" in direct.text, direct.text

    accepted = load(f"192.0.2.9, {owner}", file_data)  # its uploader may use it, from any page
    assert accepted.status_code == 200, accepted.text
    event = accepted.json()["event_id"]
    with httpx.stream("GET", f"{base}/{event}", headers={"X-Forwarded-For": f"192.0.2.9, {owner}"},
                      timeout=60) as stream:
        answer = "".join(stream.iter_text())
    assert "event: complete" in answer, answer[-500:]  # the uploader's own file was read

    assert upload(url, mine, f"192.0.2.1, {stranger}").json()[0] == path  # the same file uploaded again
    assert load(f"192.0.2.1, {stranger}", file_data).status_code == 200  # is the stranger's own now


# ---------------------------------------------------------------- item 2: jobs per visitor, unheard jobs

def test_made_up_sessions_share_their_visitors_share_and_unheard_jobs_go(url, monkeypatch):  # noqa: F811
    from components.server.device import DEVICE_LOCK

    monkeypatch.setenv("GROM_MAX_QUEUED_PER_VISITOR", "3")
    monkeypatch.setenv("GROM_LISTEN_SECONDS", "3")
    other = visitor_client(url, "198.51.100.70")
    with Measured() as alone:
        other.predict("Where was Zorvath Quill born?", api_name="/generate")

    fn_index, data = endpoint_data(url, "run_baseline", dict(method="simnpo", epochs=10, lr=1e-3,
                                                            max_examples=5, full_set=False))
    join = url.rstrip("/") + "/gradio_api/queue/join"

    def attack(i: int) -> httpx.Response:  # a fresh session each time, never listened to
        body = {"data": data, "fn_index": fn_index, "trigger_id": None, "event_data": None,
                "session_hash": uuid.uuid4().hex}
        return httpx.post(join, json=body, headers={"X-Forwarded-For": f"198.18.{i}.1, 203.0.113.70"},
                          timeout=30)

    with Measured() as burst, ThreadPoolExecutor(8) as pool:  # all at once
        answers = list(pool.map(attack, range(8)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 3 + [422] * 5, [r.text for r in answers]
    assert all("GROM_MAX_QUEUED_PER_VISITOR" in r.text for r in answers if r.status_code == 422)
    ran = False  # the first 10-epoch baseline (about 100 s) starts; two wait behind it
    for _ in range(10):  # (on a loaded machine it may start late: the check below does not need it)
        if not DEVICE_LOCK.is_free():
            ran = True
            break
        time.sleep(0.25)

    with Measured() as behind:  # another visitor asks at once: it waits for the unheard jobs to go
        answer = other.predict("Where was Zorvath Quill born?", api_name="/generate")
    print(f"8 joins with made-up sessions: {codes.count(200)} taken, {codes.count(422)} refused, memory "
          f"{burst.grew / MB:+.1f} MB; another visitor's generate: {alone.seconds:.2f} s alone, "
          f"{behind.seconds:.2f} s behind the abandoned jobs (GROM_LISTEN_SECONDS=3; one seen running: {ran})")
    assert answer and behind.seconds < 20  # three 10-epoch baselines would hold it for minutes
    assert burst.grew < 50 * MB
    deadline = time.time() + 10
    while (again := attack(9)).status_code != 200 and time.time() < deadline:  # the visitor's share is free again
        time.sleep(0.5)
    assert again.status_code == 200, again.text


def test_listened_jobs_are_not_dropped(url, monkeypatch):  # noqa: F811
    """Jobs whose page listens outlive GROM_LISTEN_SECONDS, running and waiting."""
    monkeypatch.setenv("GROM_LISTEN_SECONDS", "1")
    c = visitor_client(url, "198.51.100.80")
    start = time.perf_counter()
    running = c.submit("simnpo", 1, 1e-3, 5, False, api_name="/run_baseline")
    waiting = c.submit("Where was Zorvath Quill born?", api_name="/generate")  # behind it, on the one device
    summary, _ = running.result(timeout=120)
    answer = waiting.result(timeout=60)
    took = time.perf_counter() - start
    print(f"a listened baseline and a generate behind it: {took:.1f} s")
    assert took > 1 and summary and answer


def test_gradios_deep_link_route_writes_nothing(url):  # noqa: F811
    """gradio's /gradio_api/deep_link writes a live session's component values into the
    upload folder on every GET (no bound of its own): closed (`guard.NoDeepLinks`)."""
    import urllib.error
    import urllib.request

    from components.server.files import upload_folder

    c = Client(url, verbose=False)
    c.predict("Where was Zorvath Quill born?", api_name="/generate")  # a live session
    folder = Path(upload_folder()) / "deep_links"
    before = set(folder.rglob("*")) if folder.exists() else set()
    for _ in range(3):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url.rstrip('/')}/gradio_api/deep_link?session_hash={c.session_hash}")
        assert err.value.code == 404
    after = set(folder.rglob("*")) if folder.exists() else set()
    assert after == before
