"""Benchmarks from the widgets' values: the registered ones (shared, frozen; their labels,
splits, default split and Hub data sets are the registry's, `grom.data.BENCHMARKS`, which
grom/tasks/ fills), uploads (size- and row-limited), each with its preset."""
from __future__ import annotations

import functools
from pathlib import Path

from components.core.allowed_sources import DEMO, REAL, require_hub, resolve_source
from components.core.errors import UserError, shorten
from components.core.limits import limit, upload_bytes
from components.core.written import written_benchmark
from grom import demo_preset
from grom.data import BENCHMARKS, load_benchmark
from grom.data.readers import TooManyRows

PRESET_FOR = {"real-knowledge": "smollm2", "name-only": "smollm2", "tofu": "tofu10", "muse-news": "muse-news",
              "muse-books": "muse-books", "wmdp-bio": "wmdp-bio", "zsre": "zsre"}


# The models a preset was tuned on where the studio knows it (the demo's presets and
# smollm2): such a preset is not filled in for another model, whose band it would miss.
TUNED_ON = {"demo": DEMO, "demo-forget05": DEMO, "demo-forget01": DEMO, "smollm2": REAL}
MODEL_PRESET = {DEMO: "demo", REAL: "smollm2"}  # the preset of a model the studio knows
# what each bundled benchmark's facts are known to (the demo's invented authors exist only in
# the demo model's training data; the real-knowledge facts were probed on SmolLM2)
KNOWN_TO = {"demo": (DEMO,), "real-knowledge": (REAL,), "name-only": (REAL,)}
NAME_ONLY = "name-only"  # RWKU's setting: the forget set is the table the model wrote (components.core.written)
# the benchmarks whose data only the visitor's session holds (a link or a run file cannot bring it back)
SESSION_DATA = {"custom": "uploaded benchmark files", NAME_ONLY: "what the model wrote (name only)"}


def preset_for(name: str, split: str, model_name: str | None = None) -> str:
    """The preset the Edit panel takes for a benchmark's split (the demo's are per split) on
    `model_name`: where that preset was tuned on another model, the loaded model's own
    preset (or "(custom)", the suggested band): the demo's band 3-5 and relative beta 150
    on SmolLM2 forget nothing and break the rest."""
    chosen = demo_preset(split) if name == "demo" else PRESET_FOR.get(name, "(custom)")
    tuned = TUNED_ON.get(chosen)
    if model_name is None or tuned in (None, model_name):
        return chosen if tuned is not None or model_name not in MODEL_PRESET else MODEL_PRESET[model_name]
    return MODEL_PRESET.get(model_name, "(custom)")


def fit_note(name: str, model_name: str | None) -> str:
    """A warning where the loaded model cannot know the benchmark's facts, else ""."""
    known_to = KNOWN_TO.get(name)
    if model_name is None or known_to is None or model_name in known_to:
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
    the target SmolLM2 knows best)."""
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
    local = resolve_source(source, "data") if (source or "").strip() else None
    if local is None and BENCHMARKS[name].hub_id:
        require_hub(splits_hub_id(name), "data set")
    known_only = name == "real-knowledge" and local is None and model_name == REAL
    return _load_shared(name, split or None, local, known_only)


@functools.lru_cache(maxsize=8)
def _load_shared(name: str, split: str | None, local: str | None, known_only: bool = False):
    """Registered benchmarks are frozen values: one copy serves every session (and the
    comparison's cache of base rows is shared with it). known_only: the real-knowledge
    facts SmolLM2 was probed to know (grom/data/knowledge/known.json), so that every
    example a quick comparison evaluates is a fact the model knew."""
    return load_benchmark(name, split, source=local, **({"known_only": True} if known_only else {}))


def splits_hub_id(name: str) -> str | None:
    """The Hub data set the benchmark reads without a source (None: none)."""
    return BENCHMARKS[name].hub_id
