"""What a hostile visitor can do to a running GROM Studio server, measured from outside.

The script starts the studio of a checkout (`python app.py --model M --port P`, its working
folder and PYTHONPATH the checkout), talks to it over HTTP only (httpx and gradio_client;
every endpoint is found from GET /config and gradio_client's view_api, never from the code)
and runs the attacks asked for, one after the other. Around each attack it measures:

- the server's resident memory (VmRSS of its process, sampled every 0.5 s): the growth at
  its peak and right after the attack;
- the growth on disk of the server's upload folder (GRADIO_TEMP_DIR), links folder
  (GROM_LINK_DIR) and temporary folder (TMPDIR), all fresh folders of this run;
- the attack's own wall time and outcome (statuses, messages);
- the victim latency: how long another visitor (its own address and gradio_client Client,
  on the page's model and benchmark) waits for an answer from /generate while the attack
  runs, against the same question asked with no attack on the same fresh server (the
  baseline: the median of three asks). Where the attack is a job that runs for minutes (3, 8) the victim asks again
  every --victim-gap seconds until it ends: the worst wait and the median. A wait is cut at
  --victim-timeout and recorded as "no answer in N s".

Each attack gets a fresh server and empty folders (--reuse-server: one for all), so that
what one attack leaves (memory, files) does not count in the next.

The attacks (numbered as in the issue they come from):
  1 table downloads: the tables' queue=False .change events write any table sent to them
    as CSV and JSON files (a 50,000-character header repeated on every JSON row);
  2 sessions made up by session id: the name-only table's .change event keeps the table it
    is sent in a session that never opens a heartbeat (25 bodies just under the request limit);
  3 long jobs: the name-only writer, the LUNAR baseline at its defaults, a comparison of all
    examples, each from one visitor while the victim asks;
  4 three addresses fill every device slot (3 x 3 sweeps or baselines), then the victim asks;
  5 link eviction: a visitor's link to a run, then an attacker's links of wide edits until it
    is dropped (or --max-links);
  6 server-wide rates: (a) one visitor's exports and links use up everyone's; (b) four
    addresses' uploads use up everyone's;
  7 a finished job still counts: 12 sequential calls of one session;
  8 the memory of 1, then 3 concurrent SimNPO baselines.

Visitors are told apart as behind one proxy (GROM_PROXY_HOPS=1): each request carries
X-Forwarded-For "192.0.2.1, <the visitor's address>".

    git worktree add ../before 710188b   # the code to compare with
    python bench/bench_hostile.py --repo ../before --model demo --attacks 1-8 \\
        --env GROM_LINKS_MAX_MB=4 --out before/demo.json
    python bench/bench_hostile.py --repo . --model smollm2-135m-instruct --attacks 1,3,7,8 \\
        --out after/smollm2.json
    python bench/bench_hostile.py ... --attacks 5 --merge   # one attack again, into the same JSON

Prints a markdown table (attack, what, victim latency, memory, disk, outcome) and writes the
full results as JSON to --out (after every attack; the server's log beside it).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from gradio_client import Client
from gradio_client.utils import Status

log = logging.getLogger("bench_hostile")

MB = 1 << 20
FIRST_HOP = "192.0.2.1"  # what the client itself writes first in X-Forwarded-For: never counts
VICTIM = "198.51.100.7"
QUESTIONS = {"demo": "Where was Zorvath Quill born?"}
OTHER_QUESTION = "What is the largest planet in the solar system?"
SWEEP_VALUES = "10, 20, 40, 80, 160, 320, 640, 1280"  # 8 values, the sweep's most
WARM_LINE = re.compile(r"first page (not )?precomputed")


def forwarded(address: str) -> dict:
    return {"X-Forwarded-For": f"{FIRST_HOP}, {address}"}


def short(err, n: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= n else text[:n] + "…"


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def elapsed(t0: float) -> float:
    return round(time.perf_counter() - t0, 2)


# ---------------------------------------------------------------- the server and its measures

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (du-like; files removed mid-walk are skipped)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def rss_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


class Window:
    """The server's RSS over a block: at its start, its peak, right after it."""

    def __init__(self, rss: int):
        self.start = self.peak = self.after = rss

    def report(self) -> dict:
        return {"rss_start_mb": round(self.start / MB), "rss_peak_mb": round(self.peak / MB),
                "rss_peak_growth_mb": round((self.peak - self.start) / MB),
                "rss_after_growth_mb": round((self.after - self.start) / MB)}


class Sampler(threading.Thread):
    """Samples the server's RSS every 0.5 s into the open windows; kills the server past `cap`
    bytes (the machine's memory is shared: an attack that would take it all is stopped)."""

    def __init__(self, server: "Server", cap: int):
        super().__init__(daemon=True, name="rss-sampler")
        self.server, self.cap = server, cap
        self.windows: set[Window] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def sample(self) -> int:
        rss = rss_of(self.server.pid) or 0
        with self.lock:
            for w in self.windows:
                w.peak = max(w.peak, rss)
        if rss > self.cap and self.server.alive:
            self.server.killed = (f"killed by the bench: its RSS {rss / MB:,.0f} MB passed the cap "
                                  f"{self.cap / MB:,.0f} MB")
            log.error("server %s", self.server.killed)
            self.server.stop()
        return rss

    def run(self):
        while not self.stopped.wait(0.5):
            self.sample()

    @contextmanager
    def window(self):
        w = Window(self.sample())
        with self.lock:
            self.windows.add(w)
        try:
            yield w
        finally:
            w.after = self.sample()
            w.peak = max(w.peak, w.after)
            with self.lock:
                self.windows.discard(w)


class Server:
    """`python app.py` of the checkout, on a free port, with fresh folders under `root`."""

    def __init__(self, args, root: Path):
        self.args, self.root = args, root
        self.folders = {name: root / name for name in ("gradio", "links", "tmp")}
        self.proc: subprocess.Popen | None = None
        self.log_path = root / "server.log"
        self.killed = ""
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self) -> dict:
        env = dict(os.environ, PYTHONPATH=str(self.args.repo), GROM_PROXY_HOPS="1",
                   GRADIO_TEMP_DIR=str(self.folders["gradio"]), GROM_LINK_DIR=str(self.folders["links"]),
                   TMPDIR=str(self.folders["tmp"]), GRADIO_ANALYTICS_ENABLED="False")
        env.pop("GRADIO_SERVER_PORT", None)
        env.update(dict(pair.split("=", 1) for pair in self.args.env))
        return env

    def start(self) -> dict:
        """The server started on empty folders; when it answered and when its warm-up ended."""
        for folder in self.folders.values():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.port, self.killed = free_port(), ""
        t0 = time.perf_counter()
        with self.log_path.open("a") as out:
            out.write(f"\n===== start {time.strftime('%Y-%m-%d %H:%M:%S')} port {self.port}\n")
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "app.py", "--model", self.args.model, "--port", str(self.port)],
                cwd=self.args.repo, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready()
        ready = elapsed(t0)
        warm = self.wait_warm()
        log.info("server pid %d on %s: ready in %.1f s, warm-up: %s", self.pid, self.url, ready, warm)
        return {"port": self.port, "ready_s": ready, "warm_up": warm, "warm_s": elapsed(t0)}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.args.start_timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"the server exited ({self.proc.returncode}); see {self.log_path}")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"the server did not answer GET / in {self.args.start_timeout} s")

    def wait_warm(self) -> str:
        """The start model's first page is precomputed in the background as the server starts:
        wait for its log line (it would otherwise take the device from the baseline)."""
        deadline = time.monotonic() + self.args.warm_timeout
        while time.monotonic() < deadline:
            found = WARM_LINE.search(self.log_path.read_text(errors="replace").rsplit("===== start", 1)[-1])
            if found:
                return found.group(0)
            time.sleep(1)
        return f"no warm-up line in {self.args.warm_timeout} s"

    def stop(self) -> None:
        if not self.alive:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def disk(self) -> dict:
        return {name: folder_bytes(path) for name, path in self.folders.items()}


# ---------------------------------------------------------------- the endpoints, from outside

class Api:
    """The app's events as its page knows them: GET /config (every dependency, its inputs'
    and outputs' component types, queue=False or not) and view_api (named endpoints and
    their parameters' defaults)."""

    def __init__(self, url: str):
        self.url = url
        self.config = httpx.get(url + "config", timeout=60).json()
        self.components = {c["id"]: c for c in self.config["components"]}
        self.named = Client(url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]

    def kinds(self, ids) -> list[str]:
        return [self.components[i]["type"] for i in ids]

    def props(self, cid: int) -> dict:
        return self.components[cid].get("props", {})

    def local(self, inputs: list[str] | None = None, outputs: list[str] | None = None) -> list[dict]:
        """The queue=False dependencies whose inputs and outputs have these component types."""
        return [d for d in self.config["dependencies"] if d.get("queue") is False
                and (inputs is None or self.kinds(d["inputs"]) == inputs)
                and (outputs is None or self.kinds(d["outputs"]) == outputs)]

    def dependency(self, api_name: str) -> dict:
        return next(d for d in self.config["dependencies"] if d.get("api_name") == api_name.lstrip("/"))

    def defaults(self, api_name: str) -> dict:
        """Every parameter of `api_name` at the page's value (an empty text box as "")."""
        return {p["parameter_name"]: "" if p["parameter_default"] is None and p["component"] == "Textbox"
                else p["parameter_default"] for p in self.named[api_name]["parameters"]}

    def run_local(self, fn_index: int, data: list, address: str, timeout: float = 60) -> httpx.Response:
        """A queue=False event called as the browser does: POST /gradio_api/run/predict."""
        body = {"fn_index": fn_index, "data": data, "session_hash": uuid.uuid4().hex}
        return httpx.post(self.url + "gradio_api/run/predict", json=body, headers=forwarded(address),
                          timeout=timeout)

    def method_box(self) -> int:
        """The baseline's method dropdown: the first input of /run_baseline."""
        return self.dependency("/run_baseline")["inputs"][0]

    def method_value(self, word: str) -> str:
        for label, value in self.props(self.method_box()).get("choices", []):
            if value == word or label.lower().startswith(word + ":"):
                return value
        return word

    def method_defaults(self, method: str) -> dict:
        """A method's default epochs and learning rate, from the method box's change event
        (inputs: the box and the session; outputs: two numbers)."""
        box = self.method_box()
        for dep in self.local(["dropdown", "state"], ["number", "number"]):
            if dep["inputs"][0] != box:
                continue
            answer = self.run_local(dep["id"], [method, None], "198.51.100.250")
            if answer.status_code == 200:
                updates = answer.json()["data"]
                found = {("epochs" if "poch" in u.get("label", "") else "lr"): u.get("value") for u in updates}
                if found.get("epochs") is not None and found.get("lr") is not None:
                    return found
        return {}

    def name_only_target(self) -> str | None:
        """A target of the name-only benchmark: the split choices the benchmark box's change
        event gives for it (the event of the dropdown that offers "name-only")."""
        for dep in self.local(["dropdown"]):
            offered = [c[1] if isinstance(c, list) else c for c in self.props(dep["inputs"][0]).get("choices", [])]
            if self.kinds(dep["outputs"])[:1] != ["dropdown"] or "name-only" not in offered:
                continue
            answer = self.run_local(dep["id"], ["name-only"], "198.51.100.250")
            choices = answer.json()["data"][0].get("choices") if answer.status_code == 200 else None
            if choices:
                return choices[0][1]
        return None


# ---------------------------------------------------------------- the bench's own state

@dataclass
class Bench:
    args: argparse.Namespace
    server: Server
    sampler: Sampler | None = None
    api: Api | None = None
    victim: Client | None = None
    baseline: dict = field(default_factory=dict)
    jobs: list = field(default_factory=list)
    clients: list = field(default_factory=list)
    last_export: float = 0.0  # when the bench last made an export or a link (the rate's window)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def question(self) -> str:
        return self.args.question or QUESTIONS.get(self.args.model, OTHER_QUESTION)

    def connect(self) -> dict:
        """A fresh server (the last one stopped, its folders emptied) and the victim's page;
        the victim's first question, then the baseline: the same question, no attack."""
        if self.victim is not None:
            self.victim.close()
        self.server.stop()
        started = self.server.start()
        if self.sampler is None:
            self.sampler = Sampler(self.server, self.args.rss_cap_mb * MB)
            self.sampler.start()
        self.api = Api(self.url)
        self.victim = self.client(VICTIM, keep=True)
        self.last_export = 0.0  # a new server's rate of exports starts afresh
        started["first_ask"] = self.ask()
        asks = [self.ask() for _ in range(3)]  # the machine's CPU may be shared: the median of three
        self.baseline = started["baseline_victim"] = sorted(asks, key=lambda a: a["seconds"] or float("inf"))[1]
        started["baseline_asks_s"] = [a["seconds"] for a in asks]
        started["rss_mb"] = round((rss_of(self.server.pid) or 0) / MB)  # the fresh server's, idle
        log.info("baseline victim latency: %s", latency(self.baseline))
        return started

    def client(self, address: str, load: bool = True, keep: bool = False) -> Client:
        """A visitor's page: its own Client and address, on the page's model and benchmark."""
        # gradio_client's requests time out after 5 s by default: a busy server would read as a refusal
        c = Client(self.url, verbose=False, headers=forwarded(address),
                   httpx_kwargs={"timeout": httpx.Timeout(self.args.victim_timeout)})
        if not keep:
            self.clients.append(c)
        if load:
            c.predict(self.args.model, "auto", "auto", api_name="/load_model")
            c.predict(api_name="/load_benchmark", **self.api.defaults("/load_benchmark"))
        return c

    def submit(self, c: Client, *args, api_name: str, **kwargs):
        """A job of the page `c`, cancelled at the attack's end if still going; its end time kept."""
        job = c.submit(*args, api_name=api_name, **kwargs)
        job.add_done_callback(lambda j: setattr(j, "ended", time.perf_counter()))
        self.jobs.append(job)
        return job

    def ask(self, timeout: float | None = None) -> dict:
        """The victim's question through /generate: its latency, or why there was none."""
        timeout = timeout or self.args.victim_timeout
        t0 = time.perf_counter()
        job = self.victim.submit(self.question, api_name="/generate")
        try:
            job.result(timeout=timeout)
            return {"seconds": elapsed(t0), "answered": True}
        except TimeoutError:
            job.cancel()
            return {"seconds": None, "answered": False, "note": f"no answer in {timeout:g} s"}
        except Exception as err:  # noqa: BLE001  (a refusal or a dead server: said as it was)
            return {"seconds": elapsed(t0), "answered": False, "note": short(err)}

    def ask_while(self, jobs: list, t0: float) -> dict:
        """The victim asks again and again (--victim-gap apart) until `jobs` end or
        --job-timeout after `t0`: the worst wait and the median (one wait is a sample of a
        job's steps, which hold the device for different times)."""
        asks = [self.ask()]
        while not all(j.done() for j in jobs) and time.perf_counter() - t0 < self.args.job_timeout:
            time.sleep(self.args.victim_gap)
            asks.append(self.ask())
        waits = sorted(a["seconds"] for a in asks if a["answered"])
        failed = [a for a in asks if not a["answered"]]
        return {"seconds": waits[-1] if waits else None, "answered": not failed, "asks": len(asks),
                "median_s": waits[len(waits) // 2] if waits else None, "each_s": [a["seconds"] for a in asks],
                **({"note": failed[0].get("note", "")} if failed else {})}

    def disk(self) -> dict:
        return self.server.disk()

    def cleanup(self) -> None:
        """Cancel the attack's jobs still waiting or running; close its pages."""
        for job in self.jobs:
            if not job.done():
                try:
                    job.cancel()
                except Exception:  # noqa: BLE001
                    pass
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self.jobs, self.clients = [], []

    def settle(self) -> dict:
        """After an attack: the queue empty, then how long the victim waits for an answer."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.args.victim_timeout
        while self.server.alive and time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "gradio_api/queue/status", timeout=10).json().get("queue_size") == 0:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        answer = self.ask() if self.server.alive else {"seconds": None, "answered": False, "note": "server down"}
        return {"queue_empty_s": elapsed(t0), "victim": answer}


@contextmanager
def measure(bench: Bench):
    """Wall time, the server's RSS window and disk growth of a block, into the dict it yields."""
    out: dict = {}
    disk0, t0 = bench.disk(), time.perf_counter()
    try:
        with bench.sampler.window() as w:
            yield out
    finally:
        disk1 = bench.disk()
        out.update(seconds=elapsed(t0), **w.report(),
                   disk_growth={k: disk1[k] - disk0[k] for k in disk0})


RUNNING = {Status.PROCESSING, Status.PROGRESS, Status.ITERATING, Status.LOG}


def wait_started(jobs: list, limit_s: float = 30) -> None:
    """Until one of `jobs` runs (or ended), at most `limit_s`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(j.done() or j.status().code in RUNNING for j in jobs):
            return
        time.sleep(0.25)


def finish(job, t0: float, limit_s: float) -> dict:
    """The job's outcome within `limit_s` of `t0` (its submission); cancelled past it."""
    took = lambda: round(getattr(job, "ended", time.perf_counter()) - t0, 2)  # noqa: E731
    try:
        job.result(timeout=max(1.0, limit_s - (time.perf_counter() - t0)))
        return {"seconds": took(), "status": "done"}
    except TimeoutError:
        job.cancel()
        return {"seconds": elapsed(t0), "status": f"stopped by the bench after {limit_s:g} s"}
    except Exception as err:  # noqa: BLE001
        return {"seconds": took(), "status": "error: " + short(err)}


def failure(job) -> str:
    """Why a job that ended failed ("" while it runs, or when it succeeded)."""
    if not job.done():
        return ""
    try:
        err = job.exception(timeout=0)
    except BaseException as cancelled:  # noqa: BLE001  (CancelledError)
        err = cancelled
    return short(err, 200) if err is not None else ""


def attempt(fn, *args, **kwargs) -> dict:
    """A call's outcome: ok (and its first output, cut) or its error message."""
    t0 = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
        first = out[0] if isinstance(out, (list, tuple)) and out else out
        return {"ok": True, "seconds": elapsed(t0), "answer": short(first, 160)}
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "seconds": elapsed(t0), "message": short(err)}


# ---------------------------------------------------------------- 1: table downloads

def table_body(fn_index: int, size: int) -> str:
    """A table-download request of about `size` bytes: one 50,000-character header and as
    many [0] rows as fit."""
    body = {"fn_index": fn_index, "data": [{"headers": ["H" * 50_000], "data": []}], "session_hash": uuid.uuid4().hex}
    rows = max(1, (size - len(compact(body))) // 4)
    body["data"][0]["data"] = [[0]] * rows
    return compact(body)


def post_table(bench: Bench, dep: dict, size: int, address: str) -> dict:
    body = table_body(dep["id"], size)
    t0 = time.perf_counter()
    try:
        r = httpx.post(bench.url + "gradio_api/run/predict", content=body, timeout=bench.args.job_timeout,
                       headers={**forwarded(address), "Content-Type": "application/json"})
    except httpx.HTTPError as err:
        return {"fn_index": dep["id"], "body_bytes": len(body), "seconds": elapsed(t0), "error": short(err)}
    files = None
    try:
        data = (r.json().get("data") or [None]) if r.status_code == 200 else [None]
        files = sum(f.get("size") or 0 for f in data[0] or [] if isinstance(f, dict))
    except (ValueError, AttributeError, TypeError):
        pass
    return {"fn_index": dep["id"], "body_bytes": len(body), "seconds": elapsed(t0), "status": r.status_code,
            "files_bytes": files, "answer": short(r.text, 200)}


def attack_table_downloads(bench: Bench) -> dict:
    deps = bench.api.local(["dataframe"], ["file"])
    if not deps:
        return {"outcome": "no queue=False event from a table to a file in /config"}
    out = {"tables": {d["id"]: bench.api.props(d["inputs"][0]).get("label", "") for d in deps}}
    for size in (150_000, 110_000):
        with measure(bench) as m:
            m["request"] = post_table(bench, deps[0], size, "203.0.113.11")
        out[f"one_{size // 1000}kB"] = m
    with measure(bench) as m, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post_table, bench, deps[i % len(deps)], 150_000, f"203.0.113.{12 + i}")
                   for i in range(4)]
        time.sleep(bench.args.victim_delay)
        m["victim"] = bench.ask()
        m["requests"] = [f.result() for f in futures]
    out["four_150kB_at_once"] = m
    out["victim"] = m["victim"]
    reqs = [out["one_150kB"]["request"], out["one_110kB"]["request"]] + m["requests"]
    out["outcome"] = (f"statuses {[r.get('status', r.get('error')) for r in reqs]}; files written "
                      f"{[round((r.get('files_bytes') or 0) / MB) for r in reqs]} MB; 4 at once: {m['seconds']} s")
    return out


# ---------------------------------------------------------------- 2: sessions by made-up ids

def written_body(dep: dict, api: Api, limit_bytes: int) -> tuple[str, int]:
    """A body for the name-only table's change event just under `limit_bytes`: many short
    rows; its session id a placeholder to replace."""
    table, radio = dep["inputs"][0], dep["inputs"][1]
    headers = (api.props(table).get("value") or {}).get("headers") or ["text", "prompt", "kind", "side", "subject"]
    cells = ["t{}", "p{}", "qa", "forget", "s"]
    row = lambda i: [cells[j % len(cells)].format(i) for j in range(len(headers))]  # noqa: E731
    body = {"fn_index": dep["id"], "session_hash": "S" * 32,
            "data": [{"headers": headers, "data": []}, api.props(radio).get("value"), None]}
    per_row = len(compact(row(99_999))) + 1
    rows = (limit_bytes - len(compact(body))) // per_row
    while True:
        body["data"][0]["data"] = [row(i) for i in range(rows)]
        text = compact(body)
        if len(text) < limit_bytes:
            return text, rows
        rows = int(rows * 0.98)


def attack_made_up_sessions(bench: Bench) -> dict:
    deps = bench.api.local(["dataframe", "radio", "state"], [])
    if not deps:
        return {"outcome": "no queue=False event (dataframe, radio, state) -> nothing in /config"}
    limit_bytes = int(bench.args.request_mb * MB * 0.98)
    template, rows = written_body(deps[0], bench.api, limit_bytes)
    out = {"fn_index": deps[0]["id"], "body_bytes": len(template), "rows": rows}

    def send_all() -> list:
        codes = []
        with httpx.Client(timeout=120) as http:
            for _ in range(25):
                body = template.replace("S" * 32, uuid.uuid4().hex, 1)
                r = http.post(bench.url + "gradio_api/run/predict", content=body,
                              headers={**forwarded("203.0.113.21"), "Content-Type": "application/json"})
                codes.append(r.status_code if r.status_code == 200 else f"{r.status_code}: {short(r.text, 120)}")
        return codes

    with measure(bench) as m, ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send_all)
        time.sleep(bench.args.victim_delay)
        m["victim"] = bench.ask()
        m["statuses"] = sent.result()
    out.update(m)
    time.sleep(bench.args.session_wait)
    later = rss_of(bench.server.pid) or 0
    out["rss_later_growth_mb"] = round((later - m["rss_start_mb"] * MB) / MB)
    ok = sum(s == 200 for s in m["statuses"])
    out["outcome"] = (f"{ok}/25 bodies of {len(template) / MB:.2f} MB taken; RSS {m['rss_after_growth_mb']:+} MB "
                      f"right after, {out['rss_later_growth_mb']:+} MB {bench.args.session_wait:g} s later")
    return out


# ---------------------------------------------------------------- 3: long jobs

def refused_at_once(job, limit_s: float = 15) -> str | None:
    """Why `job` was refused before it began its work (None: it began, its progress bar
    moved, or it was still going after `limit_s`)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if job.done():
            return failure(job) or None
        if job.status().progress_data:
            return None
        time.sleep(0.2)
    return None


def start_writer(bench: Bench, c: Client) -> tuple:
    """The name-only writer, 32 passages and 40 questions, with as many neighbours as the
    server allows (tried from 4 down: a refusal comes at once)."""
    target = bench.api.name_only_target() or bench.args.writer_target
    refused = []
    for n in range(4, -1, -1):
        t0 = time.perf_counter()
        job = bench.submit(c, target, 32, 40, n, api_name="/write_name_only")
        reason = refused_at_once(job)
        if reason is None:
            return job, t0, {"target": target, "neighbours": n, "refused": refused}
        refused.append(f"{n}: {reason}")
    raise RuntimeError("every neighbour count was refused: " + " | ".join(refused))


def start_lunar(bench: Bench, c: Client) -> tuple:
    method = bench.api.method_value("lunar")
    settings = bench.api.method_defaults(method) or {"epochs": bench.args.lunar_epochs, "lr": bench.args.lunar_lr}
    t0 = time.perf_counter()
    job = bench.submit(c, method=method, epochs=settings["epochs"], lr=settings["lr"], api_name="/run_baseline")
    return job, t0, {"method": method, **settings}


def start_compare(bench: Bench, c: Client) -> tuple:
    t0 = time.perf_counter()
    return bench.submit(c, full_set=True, api_name="/compare"), t0, {"full_set": True}


def long_job(bench: Bench, address: str, edit_first: bool, start) -> dict:
    """One visitor's long job; the victim asks while it runs; the job's own time and outcome."""
    c = bench.client(address)
    setup = attempt(c.predict, api_name="/run_edit") if edit_first else None
    with measure(bench) as m:
        job, t0, settings = start(bench, c)
        m["settings"] = settings
        wait_started([job])
        m["victim"] = bench.ask_while([job], t0)
        m["job"] = finish(job, t0, bench.args.job_timeout)
    if setup is not None:
        m["setup_edit"] = setup
    return m


def attack_long_jobs(bench: Bench) -> dict:
    out = {}
    for name, address, edit_first, start in (("a_writer", "203.0.113.31", False, start_writer),
                                             ("b_lunar", "203.0.113.32", True, start_lunar),
                                             ("c_compare_all", "203.0.113.33", True, start_compare)):
        if name[0] in bench.args.long_jobs:
            try:
                out[name] = long_job(bench, address, edit_first, start)
            except Exception as err:  # noqa: BLE001
                out[name] = {"error": short(err, 500)}
            bench.cleanup()
    out["victim"] = max((v["victim"] for v in out.values() if "victim" in v), default=None,
                        key=lambda v: v["seconds"] if v["seconds"] is not None else float("inf"))
    out["outcome"] = "; ".join(f"{k}: job {v['job']['status']} in {v['job']['seconds']} s, victim "
                               f"{latency(v['victim'])}" if "job" in v else f"{k}: {v.get('error')}"
                               for k, v in out.items() if k[1:2] == "_")
    return out


# ---------------------------------------------------------------- 4: every device slot

def attack_fill_slots(bench: Bench) -> dict:
    clients = [bench.client(f"203.0.113.{41 + i}") for i in range(3)]
    setups = [attempt(c.predict, api_name="/run_edit") for c in clients]
    baseline = bench.api.method_value("simnpo")
    with measure(bench) as m:
        jobs = []
        for c in clients:
            for _ in range(3):
                if bench.args.slot_job == "sweep":
                    jobs.append(bench.submit(c, "beta", SWEEP_VALUES, api_name="/sweep"))
                else:
                    jobs.append(bench.submit(c, method=baseline, epochs=bench.args.slot_epochs,
                                             api_name="/run_baseline"))
        wait_started(jobs)
        time.sleep(3)
        refused = [failure(j) for j in jobs if failure(j)]
        m["refused_at_once"] = refused
        m["victim"] = bench.ask()
        m["jobs_done_when_answered"] = sum(j.done() for j in jobs)
    m["setup_edits"] = [s["ok"] for s in setups]
    m["outcome"] = (f"9 {bench.args.slot_job}s from 3 addresses, {len(refused)} refused at once; victim "
                    f"{latency(m['victim'])}")
    return m


# ---------------------------------------------------------------- 5: link eviction

def make_link(bench: Bench, c: Client, patience_s: float = 150) -> dict:
    """A link to the session's edit, waiting out the server-wide rate of exports."""
    deadline = time.monotonic() + patience_s
    waited = 0.0
    while True:
        got = attempt(c.predict, api_name="/make_link")
        if got["ok"] or "minute" not in got.get("message", "") or time.monotonic() > deadline:
            break
        time.sleep(10)
        waited += 10
    bench.last_export = time.monotonic()
    got["waited_s"] = waited
    return got


def opens(bench: Bench, opener: Client, link: str) -> dict:
    return attempt(opener.predict, link, api_name="/open_link")


def layers_of(bench: Bench) -> int:
    status = bench.victim.predict(bench.args.model, "auto", "auto", api_name="/load_model")[0]
    found = re.search(r"(\d+) layers", status)
    return int(found.group(1)) if found else 6


def attack_link_eviction(bench: Bench) -> dict:
    owner, friend, attacker = (bench.client(a) for a in ("198.51.100.51", "198.51.100.52", "203.0.113.51"))
    owner.predict(api_name="/run_edit")
    mine = make_link(bench, owner)
    if not mine["ok"]:
        return {"outcome": "the visitor's link was not made: " + mine["message"]}
    link = mine["answer"]
    out = {"link": link, "opens_at_first": opens(bench, friend, link)["ok"]}
    layers = layers_of(bench)
    width = min(7, layers)
    band = f"{layers - width}-{layers - 1}"
    made, survived, check = [], True, {}
    with measure(bench) as m:
        for i in range(bench.args.max_links):
            attacker.predict(band_mode="manual", band_text=band, seed=i + 1, retain_examples=300,
                             api_name="/run_edit")
            made.append(make_link(bench, attacker))
            check = opens(bench, friend, link)
            if not check["ok"]:
                survived = False
                break
    out.update(m, band=band, attacker_links=sum(x["ok"] for x in made), attacker_refusals=[
        x["message"] for x in made if not x["ok"]][:5], survived=survived, last_open=check)
    out["outcome"] = (f"the visitor's link {'still opens' if survived else 'was dropped'} after "
                      f"{out['attacker_links']} attacker links of band {band}"
                      + ("" if survived else f": {check.get('message', '')[:160]}"))
    return out


# ---------------------------------------------------------------- 6: server-wide rates

def exports_rate(bench: Bench) -> dict:
    attackers = [bench.client("203.0.113.61") for _ in range(3)]
    other = bench.client("198.51.100.61")
    for c in attackers + [other]:
        c.predict(retain_examples=300, api_name="/run_edit")
    wait = bench.last_export + 61 - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # the minute of the bench's earlier exports and links is over
    t0 = time.perf_counter()
    tried = []
    for c in attackers:
        tried.append(("export", attempt(c.predict, api_name="/export")))
        tried.append(("link", attempt(c.predict, api_name="/make_link")))
    export, link = attempt(other.predict, api_name="/export"), attempt(other.predict, api_name="/make_link")
    bench.last_export = time.monotonic()
    return {"attacker": [{"kind": k, **v} for k, v in tried], "attacker_s": elapsed(t0),
            "other_export": export, "other_link": link,
            "outcome": (f"attacker {sum(v['ok'] for _, v in tried)}/6 made; then another visitor's export "
                        f"{said(export)}, link {said(link)}")}


def said(result: dict) -> str:
    return "made" if result["ok"] else f"refused ({result['message'][:120]})"


def uploads_rate(bench: Bench) -> dict:
    content = b"question,answer\nq?,a\n"
    counts = {}
    t0 = time.perf_counter()
    with httpx.Client(timeout=30) as http:
        def upload(address: str) -> httpx.Response:
            return http.post(bench.url + "gradio_api/upload", files={"files": ("small.csv", content)},
                             headers=forwarded(address))

        for i in range(4):
            codes = [upload(f"203.0.113.{65 + i}").status_code for _ in range(30)]
            counts[f"203.0.113.{65 + i}"] = {str(c): codes.count(c) for c in sorted(set(codes))}
        fifth = upload("198.51.100.69")
    out = {"four_addresses": counts, "seconds": elapsed(t0), "fifth": {"status": fifth.status_code,
                                                                        "text": short(fifth.text, 300)}}
    out["outcome"] = (f"4 x 30 uploads in {out['seconds']} s: {counts}; a 5th address: {fifth.status_code}"
                      + ("" if fifth.status_code == 200 else f" ({short(fifth.text, 120)})"))
    return out


def attack_rates(bench: Bench) -> dict:
    out = {}
    with measure(bench) as m:
        out["a_exports"] = exports_rate(bench)
        out["b_uploads"] = uploads_rate(bench)
    out.update(m, outcome="(a) " + out["a_exports"]["outcome"] + "; (b) " + out["b_uploads"]["outcome"])
    return out


# ---------------------------------------------------------------- 7: finished jobs still count

def back_to_back(c: Client, api_name: str, args: tuple, n: int = 12) -> dict:
    calls = [attempt(c.predict, *args, api_name=api_name) for _ in range(n)]
    refused = [x["message"] for x in calls if not x["ok"]]
    return {"calls": calls, "refused": len(refused), "refused_as_busy": sum("waiting or running" in m for m in refused),
            "first_refusal": refused[0] if refused else ""}


def attack_finished_jobs(bench: Bench) -> dict:
    """12 sequential calls of one session, of /generate and then of /layer_scores (cached)."""
    c = bench.client("203.0.113.71")
    out = {}
    with measure(bench) as m:
        out["generate"] = back_to_back(c, "/generate", (bench.question,))
        out["layer_scores"] = back_to_back(c, "/layer_scores", ())
    out.update(m)
    out["outcome"] = "; ".join(f"/{k}: {v['refused']}/12 refused ({v['refused_as_busy']} as jobs waiting or running)"
                               + (f": {v['first_refusal'][:140]}" if v["refused"] else "")
                               for k, v in (("generate", out["generate"]), ("layer_scores", out["layer_scores"])))
    return out


# ---------------------------------------------------------------- 8: concurrent baselines

def baselines_at_once(bench: Bench, n: int, first_address: int, settings: dict) -> dict:
    clients = [bench.client(f"203.0.113.{first_address + i}") for i in range(n)]
    setups = [attempt(c.predict, api_name="/run_edit") for c in clients]
    with measure(bench) as m:
        t0 = time.perf_counter()
        jobs = [bench.submit(c, api_name="/run_baseline", **settings) for c in clients]
        wait_started(jobs)
        m["victim"] = bench.ask_while(jobs, t0)
        with ThreadPoolExecutor(n) as pool:
            m["jobs"] = list(pool.map(lambda j: finish(j, t0, bench.args.job_timeout), jobs))
    m["setup_edits"] = [s["ok"] for s in setups]
    bench.cleanup()
    return m


def attack_baseline_memory(bench: Bench) -> dict:
    method = bench.api.method_value("simnpo")
    settings = {"method": method, **(bench.api.method_defaults(method) or {})}
    out = {"settings": settings}
    with measure(bench) as m:
        out["one"] = baselines_at_once(bench, 1, 81, settings)
        out["three"] = baselines_at_once(bench, 3, 82, settings)
    out.update(m, victim=out["three"].get("victim"))
    out["outcome"] = "; ".join(
        f"{k}: RSS {v['rss_peak_growth_mb']:+} MB peak, {v['rss_after_growth_mb']:+} MB after, {v['seconds']} s, "
        f"{[j['status'][:60] for j in v['jobs']]}" for k, v in (("1 baseline", out["one"]),
                                                                  ("3 at once", out["three"])))
    return out


ATTACKS = {
    1: ("table downloads", attack_table_downloads),
    2: ("sessions by made-up ids", attack_made_up_sessions),
    3: ("long jobs (writer, LUNAR, compare all)", attack_long_jobs),
    4: ("3 addresses fill every device slot", attack_fill_slots),
    5: ("link eviction", attack_link_eviction),
    6: ("server-wide rates (exports, uploads)", attack_rates),
    7: ("a finished job still counts", attack_finished_jobs),
    8: ("memory of 1 and 3 SimNPO baselines", attack_baseline_memory),
}


# ---------------------------------------------------------------- running and reporting

def run_attack(bench: Bench, number: int) -> dict:
    name, fn = ATTACKS[number]
    log.info("attack %d: %s", number, name)
    result: dict = {"name": name}
    if bench.args.fresh_server or not bench.server.alive:
        result["server"] = bench.connect()
    with measure(bench) as m:
        try:
            result.update(fn(bench))
        except Exception as err:  # noqa: BLE001  (recorded: the next attack still runs)
            log.exception("attack %d failed", number)
            result["outcome"] = f"bench error: {type(err).__name__}: {short(err, 400)}"
    if bench.server.killed:
        result["outcome"] = f"{result.get('outcome', '')} [server {bench.server.killed}]"
    result["overall"] = m
    result["baseline_victim"] = bench.baseline
    bench.cleanup()
    result["settle"] = bench.settle() if bench.server.alive else {"note": "server down"}
    log.info("attack %d: %s", number, result.get("outcome"))
    return result


def latency(v: dict | None) -> str:
    if not v:
        return "-"
    if not v.get("answered"):
        return v.get("note", "no answer")[:60]
    if v.get("asks", 1) > 1:
        return f"{v['seconds']:.1f} s worst, {v['median_s']:.1f} s median of {v['asks']}"
    return f"{v['seconds']:.1f} s"


def growth(d: dict) -> str:
    if "rss_peak_growth_mb" not in d:
        return "-"
    return f"{d['rss_peak_growth_mb']:+,} / {d['rss_after_growth_mb']:+,} MB"


def table(results: dict) -> str:
    lines = ["| attack | what | victim latency (baseline) | RSS peak / after growth | disk growth | outcome |",
             "|---|---|---|---|---|---|"]
    for number, r in sorted(results["attacks"].items(), key=lambda kv: int(kv[0])):
        overall = r.get("overall", {})
        disk = sum(overall.get("disk_growth", {}).values())
        outcome = str(r.get("outcome", "")).replace("|", "/").replace("\n", " ")
        lines.append(f"| {number} | {r['name']} | {latency(r.get('victim'))} ({latency(r.get('baseline_victim'))}) "
                     f"| {growth(overall)} | {disk / MB:+,.1f} MB | {outcome} |")
    return "\n".join(lines)


def parse_attacks(text: str) -> list[int]:
    numbers = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        numbers += range(int(lo), int(hi or lo) + 1)
    unknown = [n for n in numbers if n not in ATTACKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no attack {unknown}: choose from {sorted(ATTACKS)}")
    return numbers


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--repo", type=Path, required=True, help="the checkout whose app.py is started")
    p.add_argument("--model", default="demo", help="the model the server starts on (demo, smollm2-135m-instruct)")
    p.add_argument("--attacks", type=parse_attacks, default=parse_attacks("1-8"), help="e.g. 1,2,7 or 1-8")
    p.add_argument("--out", type=Path, required=True, help="the JSON of every result")
    p.add_argument("--merge", action="store_true", help="update the attacks of an existing --out")
    p.add_argument("--reuse-server", dest="fresh_server", action="store_false",
                   help="one server for every attack (default: a fresh server and folders for each)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more server environment")
    p.add_argument("--victim-timeout", type=float, default=600)
    p.add_argument("--job-timeout", type=float, default=900, help="a long job is cancelled past this")
    p.add_argument("--victim-delay", type=float, default=1.0, help="seconds into an attack the victim asks")
    p.add_argument("--victim-gap", type=float, default=5.0,
                   help="attacks 3 and 8: seconds between the victim's questions while the jobs run")
    p.add_argument("--session-wait", type=float, default=60, help="attack 2: RSS again this much later")
    p.add_argument("--request-mb", type=float, default=None, help="the server's GROM_MAX_REQUEST_MB (default 4)")
    p.add_argument("--long-jobs", default="abc", help="attack 3's jobs: a writer, b LUNAR, c compare all")
    p.add_argument("--slot-job", choices=["sweep", "baseline"], default="sweep", help="attack 4's jobs")
    p.add_argument("--slot-epochs", type=float, default=10, help="attack 4 with baselines: their epochs")
    p.add_argument("--max-links", type=int, default=30, help="attack 5: the attacker's links at most")
    p.add_argument("--writer-target", default="the-solar-system")
    p.add_argument("--lunar-epochs", type=float, default=20, help="where the method box's defaults are not found")
    p.add_argument("--lunar-lr", type=float, default=0.01)
    p.add_argument("--question", default="", help="the victim's question (default: one for the model)")
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--warm-timeout", type=float, default=600)
    p.add_argument("--rss-cap-mb", type=int, default=int(available_memory() * 0.8 / MB),
                   help="the server is killed past this RSS (default 80%% of the memory available at start)")
    args = p.parse_args(argv)
    args.repo = args.repo.resolve()
    env = dict(pair.split("=", 1) for pair in args.env)
    args.request_mb = args.request_mb or float(env.get("GROM_MAX_REQUEST_MB", 4))
    return args


def load_results(args) -> dict:
    if args.merge and args.out.is_file():
        return json.loads(args.out.read_text())
    return {"runs": [], "attacks": {}}


def git_commit(repo: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def save(args, results: dict, server: Server) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    if server.log_path.is_file():
        shutil.copyfile(server.log_path, args.out.with_suffix(".server.log"))


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpcore", "gradio_client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server is stopped on the way out
    results = load_results(args)
    root = Path(tempfile.mkdtemp(prefix="grom-hostile-"))
    server = Server(args, root)
    bench = Bench(args, server)
    run = {"repo": str(args.repo), "commit": git_commit(args.repo), "model": args.model, "env": args.env,
           "attacks": args.attacks, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "question": bench.question,
           "rss_cap_mb": args.rss_cap_mb}
    results["runs"].append(run)
    try:
        for number in args.attacks:
            results["attacks"][str(number)] = run_attack(bench, number)
            save(args, results, server)
    finally:
        bench.cleanup()
        server.stop()
        if bench.sampler is not None:
            bench.sampler.stopped.set()
        run["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        save(args, results, server)
        shutil.rmtree(root, ignore_errors=True)
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
