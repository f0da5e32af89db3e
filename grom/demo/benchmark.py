"""The demo world as a benchmark of grom.data's registry ("demo"): grom.data knows no demo,
the demo package registers this spec when it is imported (grom/demo/__init__.py)."""
from __future__ import annotations

from typing import Any

from grom.data.loaders import BenchmarkSpec
from grom.data.schema import Benchmark
from grom.data.readers import BenchmarkError
from grom.demo.world import SPLITS, load_demo_benchmark


def _load(split: str, source: Any = None) -> Benchmark:
    if source is not None:
        raise BenchmarkError("demo: the bundled demo benchmark takes no source=")
    return load_demo_benchmark(split)


DEMO_BENCHMARK = BenchmarkSpec("demo", _load, SPLITS, options=(), bundled=True,
                               description="the bundled fictitious-authors world (offline)")
