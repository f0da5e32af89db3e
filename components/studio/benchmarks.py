"""Benchmarks from the widgets' values: the registered ones (shared, frozen; their labels,
splits, default split and Hub data sets are the registry's, `grom.data.BENCHMARKS`, which
grom/tasks/ fills), uploads (size- and row-limited), each with its preset."""
from __future__ import annotations

import functools
import threading
import weakref
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from components.server.allowed_sources import DEMO, REAL, allowed_source, require_hub
from components.server.costs import check_loaded
from components.server.errors import UserError, shorten
from components.server.limits import limit, upload_bytes
from components.studio.name_only import written_benchmark
from grom.data import BENCHMARKS, load_benchmark
from grom.data.readers import TooManyRows

# The models a preset was tuned on where the studio knows it (the demo's presets and
# smollm2): such a preset is not filled in for another model, whose band it would miss.
TUNED_ON = {"demo": DEMO, "demo-forget05": DEMO, "demo-forget01": DEMO, "smollm2": REAL}
MODEL_PRESET = {DEMO: "demo", REAL: "smollm2"}  # the preset of a model the studio knows
NAME_ONLY = "name-only"  # RWKU's setting: the forget set is the table the model wrote (components.studio.name_only)


class _SessionData(Mapping):
    """The benchmarks whose data only the visitor's session holds (a link or a run file cannot
    bring them back), by name: what they are in a few words (`BenchmarkSpec.session_only`)."""

    def _rows(self) -> dict[str, str]:
        return {name: spec.session_only for name, spec in BENCHMARKS.items() if spec.session_only}

    def __getitem__(self, name: str) -> str:
        return self._rows()[name]

    def __iter__(self):
        return iter(self._rows())

    def __len__(self) -> int:
        return len(self._rows())


SESSION_DATA: Mapping[str, str] = _SessionData()


def preset_for(name: str, split: str, model_name: str | None = None) -> str:
    """The preset the Edit panel takes for a benchmark's split (the demo's are per split) on
    `model_name`: where that preset was tuned on another model, the loaded model's own
    preset (or "(custom)", the suggested band): the demo's band 3-5 and relative beta 150
    on SmolLM2 forget nothing and break the rest."""
    spec = BENCHMARKS.get(name)
    chosen = (spec.preset_for(split) if spec is not None else None) or "(custom)"
    tuned = TUNED_ON.get(chosen)
    if model_name is None or tuned in (None, model_name):
        return chosen if tuned is not None or model_name not in MODEL_PRESET else MODEL_PRESET[model_name]
    return MODEL_PRESET.get(model_name, "(custom)")


def fit_note(name: str, model_name: str | None) -> str:
    """A warning where the loaded model cannot know the benchmark's facts, else ""."""
    spec = BENCHMARKS.get(name)  # the models known to hold its facts (the demo's, SmolLM2's probed facts)
    known_to = spec.known_to if spec is not None else ()
    if model_name is None or not known_to or model_name in known_to:
        return ""
    if name == "demo":
        return (" ⚠ This model never saw the demo's invented authors (they exist only in the demo "
                "model's training data): it knows none of these facts, so there is nothing to forget "
                "and the comparison will count 0 known facts. Load the demo model for this benchmark.")
    if model_name == DEMO:
        return (" ⚠ The demo model was trained only on invented authors: it knows none of these real "
                "facts, so there is nothing to forget. Load SmolLM2 (or another real model) for it.")
    return ""


def preset_note(name: str, split: str) -> str:
    """A word where the suggested preset was tuned on another split of the benchmark."""
    factor = {"forget01": 10, "forget05": 2}.get(split) if name == "tofu" else None
    if factor:
        return (f" The tofu10 preset was tuned on forget10: with fewer forget keys each weighs "
                f"more (the forget term is a mean), so raise w_r about {factor}x to keep the retain set.")
    return ""


def benchmark_names() -> list[tuple[str, str]]:
    """(label, name) of every registered benchmark, in the registry's order."""
    return [(spec.label or name, name) for name, spec in BENCHMARKS.items()]


def splits_for(name: str) -> list[str]:
    spec = BENCHMARKS.get(name)
    return list(spec.splits) if spec else []


def default_split(name: str) -> str | None:
    """The split a benchmark starts on: its spec's `start_split` (the demo's forget10, the
    TOFU-10% analogue its presets were tuned on), else the registry's first (real-knowledge:
    the subject SmolLM2 knows best)."""
    spec = BENCHMARKS.get(name)
    if spec is None or not spec.splits:
        return None
    return spec.start_split if spec.start_split in spec.splits else spec.splits[0]


MIN_RETAIN = 20


def retain_needed(n_forget: int) -> int:
    """The fewest retain examples an uploaded benchmark should have: as many as its forget
    examples, and never fewer than 20.

    Why, from the method: P leaves an output alone only along the key directions the
    retain keys span (the retain term of A); a direction that only forget keys reach is
    edited freely, and every other input with a component along it changes too. Retain
    questions of the same kind as the forget ones reach those directions, and fewer retain
    than forget examples cannot span what the forget keys span. Twenty, because below it
    the retain metrics are noise: one answer of 3 moves a retain score by a third, one of
    20 by 5%, half the 10% loss that marks a retain set as broken."""
    return max(MIN_RETAIN, int(n_forget))


def retain_warning(bench) -> str:
    """A warning where the retain set is smaller than `retain_needed`, else ""."""
    need, have = retain_needed(len(bench.forget)), len(bench.retain)
    if have >= need:
        return ""
    return (f" ⚠ Only {have} retain example{'s' * (have != 1)}: too few for the edit to know what "
            f"to keep, or for the retain metrics to mean much. Upload at least {need} (as many as "
            f"the forget set, and at least {MIN_RETAIN}).")


def _file_path(upload) -> str | None:
    if upload is None:
        return None
    path = Path(upload if isinstance(upload, str) else getattr(upload, "name", upload))
    if not path.is_file():
        raise UserError("The uploaded file could not be read; upload it again.")
    if path.stat().st_size == 0:
        raise UserError(f"{shorten(path.name)} is empty: upload a JSON, JSON lines or CSV file with "
                        "question/answer (or text) rows.")
    if path.stat().st_size > upload_bytes():
        raise UserError(f"{shorten(path.name)} is larger than the {limit('GROM_MAX_UPLOAD_MB')} MB this server "
                        "takes: upload a smaller file (hosting the studio yourself, raise GROM_MAX_UPLOAD_MB).")
    return str(path)


def read_benchmark(name: str, split: str | None, source: str, forget_file, retain_file,
                   model_name: str | None = None, written=None, use: str = "questions"):
    """A `Benchmark` from the widgets' values; every problem is a message to act on.
    written, use: the name-only table (what the model wrote, as edited) and what of it to fit."""
    name = (name or "").strip()
    if name not in dict((v, v) for _, v in benchmark_names()):
        raise UserError(f"Unknown benchmark {shorten(name)!r}; "
                        f"pick one of {', '.join(v for _, v in benchmark_names())}.")
    if name == NAME_ONLY:
        return written_benchmark(split or default_split(name), written, use, known_only=model_name == REAL)
    if name == "custom":
        forget = _file_path(forget_file)
        if forget is None:
            raise UserError("Custom benchmark: upload a forget file (and a retain file, or one file "
                            "with a 'split' column of forget/retain).")
        retain = _file_path(retain_file)
        src = {"forget": forget, "retain": retain} if retain else forget
        cap = limit("GROM_MAX_UPLOAD_ROWS")
        try:  # reading stops at the row past the cap, and at a header without a needed column
            return load_benchmark("custom", "forget", source=src, max_rows=cap)
        except TooManyRows:
            raise UserError(f"The upload has more than {cap:,} rows, the most this server reads: upload "
                            "fewer rows (hosting the studio yourself, raise GROM_MAX_UPLOAD_ROWS).") from None
        except ValueError as err:  # name the uploads by their file names, not server paths
            msg = str(err)
            for path in filter(None, (forget, retain)):
                msg = msg.replace(str(Path(path).parent) + "/", "")
            raise UserError(msg) from err
    local = allowed_source(source, "data") if (source or "").strip() else None
    if local is None and BENCHMARKS[name].hub_id:
        require_hub(splits_hub_id(name), "data set")
    known_only = name == "real-knowledge" and local is None and model_name == REAL
    return _shared(name, split or None, local, known_only)


_LOADING = defaultdict(threading.Lock)  # per benchmark: a second reader waits for the first's copy


def _shared(name: str, split: str | None, local: str | None, known_only: bool = False):
    """`_load_shared`, one reader per benchmark at a time: a visitor who chooses the demo
    while the server reads it at start (`warm_bundled`) waits for that copy instead of
    generating its world a second time beside it."""
    with _LOADING[name]:
        return _load_shared(name, split, local, known_only)


@functools.lru_cache(maxsize=8)
def _load_shared(name: str, split: str | None, local: str | None, known_only: bool = False):
    """Registered benchmarks are frozen values: one copy serves every session (and the
    comparison's cache of base rows is shared with it). known_only: the real-knowledge
    facts SmolLM2 was probed to know (grom/data/knowledge/known.json), so that every
    example a quick comparison evaluates is a fact the model knew."""
    return load_benchmark(name, split, source=local, **({"known_only": True} if known_only else {}))


def warm_bundled() -> None:
    """The bundled demo read once as the server starts: its world of invented authors is
    generated in Python (1.3 s on a quiet 2-core CPU; beside a running edit on a busy one,
    long enough that choosing the demo took 96 s), after which each of its splits is read in
    milliseconds. A failure is left to the visitor's own load, which says what is wrong."""
    try:
        _shared("demo", default_split("demo"), None)
    except Exception:  # noqa: BLE001  (a warm-up: a visitor's load reports the problem)
        pass


_CHECKED: dict[int, tuple] = {}  # id(benchmark) -> (a weak reference to it, what it was checked with)


def check_once(bench, tokenizer, model_key) -> None:
    """`check_loaded(bench, tokenizer)` (its examples' lengths against the limits), once
    per benchmark object, model and limits: a registered benchmark is one shared copy, so
    choosing it again, or a second visitor choosing it on the same model, tokenizes
    nothing (0.1-0.8 s of CPU, seconds on a busy one). An upload is a new object each
    load, checked each time."""
    seen = (model_key, limit("GROM_MAX_EXAMPLE_TOKENS"), limit("GROM_MAX_JOB_TOKENS"))
    entry = _CHECKED.get(id(bench))
    alive = entry is not None and entry[0]() is bench
    if alive and seen in entry[1]:
        return
    check_loaded(bench, tokenizer)
    for key in [key for key, (ref, _) in list(_CHECKED.items()) if ref() is None]:
        _CHECKED.pop(key, None)
    _CHECKED[id(bench)] = (weakref.ref(bench), (entry[1] if alive else frozenset()) | {seen})


def note_choice(session, name: str, split: str | None) -> bool:
    """The Benchmark boxes now show `name`/`split` (chosen on the page): kept beside the
    data loaded at that moment, so that Run edit can tell the two apart until the next load
    (`check_choice`). Bounded: two short names and a weak reference. False where that was
    already the last choice (a dropdown reports one choice twice): nothing new to load."""
    chosen = f"{shorten(str(name or ''), 60)}/{shorten(str(split or ''), 60)}"
    last = session.extra.get("chosen")
    session.extra["chosen"] = (chosen, weakref.ref(session.benchmark) if session.benchmark is not None else None)
    return last is None or last[0] != chosen


def note_load(session) -> None:
    """The boxes' load just ended: a choice made since it was asked (a split chosen while the
    benchmark loaded) still waits for its own load, which the page runs next."""
    chosen = session.extra.get("chosen")
    if chosen and session.benchmark is not None:
        session.extra["chosen"] = (chosen[0], weakref.ref(session.benchmark))


def forget_choice(session) -> None:
    """The boxes show the loaded data again (a failed load restored them)."""
    session.extra.pop("chosen", None)


def check_choice(session) -> None:
    """A `UserError` where the Benchmark boxes show other data than the session has loaded:
    a choice of your own files or of name only waits for its Load press, and a registered
    benchmark for its load to end (the last of several chosen in a row), and Run edit must
    not run on the old data meanwhile. Data loaded another way (a link, an imported run)
    end the difference: those put the boxes on what they loaded."""
    chosen = session.extra.get("chosen")
    if not chosen:
        return
    label, ref = chosen
    loaded = ref() if ref is not None else None
    if loaded is not session.benchmark or label == session.bench_label:
        return
    name = label.split("/", 1)[0]
    todo = {"custom": "upload your files and press Load benchmark",
            NAME_ONLY: "press Write with the model, then Load what was written"}.get(name, "wait for it to load")
    raise UserError(f"The Benchmark boxes show {label}, but the data loaded are {session.bench_label or 'none'}: "
                    f"{todo} (or choose {session.bench_label or 'a benchmark'} again), then press Run edit.")


def splits_hub_id(name: str) -> str | None:
    """The Hub data set the benchmark reads without a source (None: none)."""
    return BENCHMARKS[name].hub_id
