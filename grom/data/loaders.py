"""The benchmark registry and its one entry point, `load_benchmark`.

    load_benchmark("tofu", "forget10")                         # from the Hub
    load_benchmark("tofu", "forget10", source="data/TOFU")     # a local folder, same files
    load_benchmark("wmdp-bio", source="data/wmdp", retain="wikitext")
    load_benchmark("custom", source={"forget": "f.csv", "retain": "r.jsonl"})

Each benchmark's module documents its files and local layout. Without a network the Hub
fails with a `BenchmarkError` that says so; offline mode (HF_HUB_OFFLINE=1) is honoured.

A benchmark that lives outside grom.data registers itself with `register_benchmark`: the
bundled demo world (grom.demo, which the `grom` package imports, so it is registered
whatever is imported first) heads the list.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Callable, Mapping

from grom.data import custom, knowledge, muse, tofu, wmdp, zsre
from grom.data.schema import Benchmark
from grom.data.readers import BenchmarkError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchmarkSpec:
    """A registered benchmark.

    load: `load(split, source, **options) -> Benchmark`.
    splits: the valid splits, the default first. aliases: other names for them.
    options: the keyword options `load` takes besides split and source.
    bundled: with no source, it reads files that ship with the package (else the Hub).
    """

    name: str
    load: Callable[..., Benchmark]
    splits: tuple[str, ...]
    options: tuple[str, ...] = ("prompt_format",)
    aliases: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    bundled: bool = False


def _muse_spec(corpus: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        f"muse-{corpus}", partial(muse.load_muse, corpus), muse.SPLITS, aliases={"raw": "forget"},
        description=f"MUSE-{corpus.capitalize()} (Hub {muse.HUB_IDS[corpus]}): texts; verbmem, knowmem, privleak",
    )


def _wmdp_spec(subject: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        f"wmdp-{subject}", partial(wmdp.load_wmdp, subject), wmdp.SPLITS,
        options=("prompt_format", "retain", "utility"), aliases={"test": "forget"},
        description=f"WMDP-{subject}: forget corpus, WikiText or corpus retain, multiple-choice questions",
    )


_REGISTRY: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec("real-knowledge", knowledge.load_knowledge, knowledge.SPLITS,
                      options=("prompt_format", "known_only"), bundled=True,
                      description="facts a small chat model knows, by target: forget one, keep the rest (offline)"),
        BenchmarkSpec("tofu", tofu.load_tofu, tofu.SPLITS,
                      description=f"TOFU fictitious authors (Hub {tofu.HUB_ID})"),
        _muse_spec("news"),
        _muse_spec("books"),
        *(_wmdp_spec(s) for s in wmdp.SUBJECTS),
        BenchmarkSpec("zsre", zsre.load_zsre, zsre.SPLITS, aliases=zsre.ALIASES,
                      description=f"zsRE facts from a local {zsre.FILE_NAME}: {zsre.N_FORGET} to "
                                  f"forget, {zsre.N_RETAIN} to retain, one draw per seed split"),
        BenchmarkSpec("custom", custom.load_custom, custom.SPLITS, options=("prompt_format", "max_rows"),
                      description="your own forget and retain files (JSON, JSON lines, CSV)"),
    )
}
# Every registered benchmark, in the order a UI lists them; read-only (see register_benchmark).
BENCHMARKS: Mapping[str, BenchmarkSpec] = MappingProxyType(_REGISTRY)


def register_benchmark(spec: BenchmarkSpec, *, first: bool = False) -> BenchmarkSpec:
    """Add `spec` to `BENCHMARKS`, last (or `first`); a name already registered is refused."""
    if spec.name in _REGISTRY:
        raise ValueError(f"a benchmark named {spec.name!r} is already registered")
    entries = {spec.name: spec, **_REGISTRY} if first else {**_REGISTRY, spec.name: spec}
    _REGISTRY.clear()
    _REGISTRY.update(entries)
    return spec


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
