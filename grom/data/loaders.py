"""The benchmark registry and its one entry point, `load_benchmark`.

    load_benchmark("tofu", "forget10")                         # from the Hub
    load_benchmark("tofu", "forget10", source="data/TOFU")     # a local folder, same files
    load_benchmark("wmdp-bio", source="data/wmdp", retain="wikitext")
    load_benchmark("custom", source={"forget": "f.csv", "retain": "r.jsonl"})

Each benchmark's module (grom/tasks/<name>.py, its loader and its task) documents its files
and local layout. Without a network the Hub fails with a `BenchmarkError` that says so;
offline mode (HF_HUB_OFFLINE=1) is honoured.

The benchmarks are registered by their tasks (grom/tasks/): `grom.tasks.register_task`
adds a task's `BenchmarkSpec`s here, the bundled demo world heads the list. The registry
calls `fill_before_reading`'s fills before it is first read (the `grom` package gives it one
that imports `grom.tasks`), so it is full whatever was imported first.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from grom.data.readers import BenchmarkError
from grom.data.schema import Benchmark
from grom.read_view import ReadView

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchmarkSpec:
    """A registered benchmark.

    load: `load(split, source, **options) -> Benchmark`.
    splits: the valid splits, the default first. aliases: other names for them.
    options: the keyword options `load` takes besides split and source.
    bundled: with no source, it reads files that ship with the package (else the Hub).
    label: how a UI lists it (None: its name). hub_id: the Hub data set it reads without a
    source (None: none). start_split: the split a UI starts on (None: the default).
    preset: GROM's settings for it, a name of `grom.closed_form.config.PRESETS` (the paper's
    for its benchmark), or one per split (the demo's); None: none (a UI's own choice).
    known_to: the models (by their names in the model registry, `grom.model.fetch`) known to
    hold its facts, where only some do (the demo's invented authors, the facts probed on
    SmolLM2); () where any model may. session_only: where its data exist only in the
    session that made them (a visitor's upload, what a model wrote), what they are in a few
    words (a link or a run file cannot bring them back); "" otherwise.
    """

    name: str
    load: Callable[..., Benchmark]
    splits: tuple[str, ...]
    options: tuple[str, ...] = ("prompt_format",)
    aliases: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    bundled: bool = False
    label: str | None = None
    hub_id: str | None = None
    start_split: str | None = None
    preset: str | Mapping[str, str] | None = None
    known_to: tuple[str, ...] = ()
    session_only: str = ""

    def preset_for(self, split: str) -> str | None:
        """The preset of `split` (`preset`, or its entry for the split; None: none)."""
        if isinstance(self.preset, Mapping):
            return self.preset.get(split, self.preset.get("*"))
        return self.preset


_REGISTRY: dict[str, BenchmarkSpec] = {}
_fills: list[Callable[[], None]] = []  # called before the registry's next read (fill_before_reading)


def fill_before_reading(fill: Callable[[], None]) -> None:
    """Have `fill` called before the registry's next read. The `grom` package gives one
    that imports the tasks: they register the benchmarks and import this module, so this
    module cannot import them."""
    _fills.append(fill)


def _full() -> Mapping[str, BenchmarkSpec]:
    """`_REGISTRY`, read-only, with the fills done before it is read."""
    for fill in list(_fills):  # a read during a fill (the tasks' own import) finds what is there so far
        fill()
    _fills.clear()
    return MappingProxyType(_REGISTRY)


# Every registered benchmark, in the order a UI lists them; read-only (see register_benchmark).
BENCHMARKS: Mapping[str, BenchmarkSpec] = ReadView(_full, "BENCHMARKS")


def register_benchmark(spec: BenchmarkSpec, *, first: bool = False) -> BenchmarkSpec:
    """Add `spec` to `BENCHMARKS`, last (or `first`); a name already registered is refused."""
    if spec.name in _REGISTRY:
        raise ValueError(f"a benchmark named {spec.name!r} is already registered")
    entries = {spec.name: spec, **_REGISTRY} if first else {**_REGISTRY, spec.name: spec}
    _REGISTRY.clear()
    _REGISTRY.update(entries)
    return spec


def unregister_benchmark(name: str) -> None:
    """Remove the benchmark `name` from `BENCHMARKS`."""
    del _REGISTRY[name]


def get_spec(name: str) -> BenchmarkSpec:
    """The registered benchmark `name`; an unknown name lists the known ones."""
    spec = BENCHMARKS.get(name.strip().lower())
    if spec is None:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return spec


def resolve_split(spec: BenchmarkSpec, split: str | None) -> str:
    """`split` as one of the spec's splits (None: the default); an unknown one lists them."""
    if split is None:
        return spec.splits[0]
    split = spec.aliases.get(split, split)
    if split not in spec.splits:
        valid = ", ".join([*spec.splits, *spec.aliases])
        raise BenchmarkError(f"{spec.name}: unknown split {split!r}; valid splits: {valid}")
    return split


def load_benchmark(name: str, split: str | None = None, source: Any = None, **options: Any) -> Benchmark:
    """Load benchmark `name`, split `split` (None: its default).

    source: None (the Hugging Face Hub, or the bundled data of "demo" and "real-knowledge"),
    a local folder or file in the benchmark's format, or for "custom" {"forget": path,
    "retain": path}.
    options: benchmark options, e.g. prompt_format= (all but demo), retain= and utility=
    (WMDP). Every data problem raises `BenchmarkError` (a ValueError).
    """
    spec = get_spec(name)
    split = resolve_split(spec, split)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        accepted = ", ".join(spec.options) or "none"
        raise BenchmarkError(f"{spec.name}: unknown option(s) {', '.join(unknown)}; it takes: {accepted}")
    where = source if source is not None else ("its bundled files" if spec.bundled else "the Hub")
    logger.info("loading benchmark %s/%s from %s", spec.name, split, where)
    return spec.load(split, source, **options)
