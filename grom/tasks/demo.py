"""The bundled fictitious-authors world as the benchmark "demo" (was grom/demo/benchmark.py):
its question/answer and biography splits are evaluated by the TOFU task (grom/tasks/tofu.py),
its multiple-choice split by the WMDP task (grom/tasks/wmdp.py), so it registers a loader
and no task of its own, at the head of `grom.data.BENCHMARKS`. The app starts it on
forget10, the TOFU-10% analogue its presets were tuned on."""
from __future__ import annotations

from typing import Any

from grom.closed_form.config import demo_preset
from grom.data.loaders import BenchmarkSpec, register_benchmark
from grom.data.readers import BenchmarkError
from grom.data.schema import Benchmark
from grom.demo.world import SPLITS, load_demo_benchmark


def _load(split: str, source: Any = None) -> Benchmark:
    if source is not None:
        raise BenchmarkError("demo: the bundled demo benchmark takes no source=")
    return load_demo_benchmark(split)


DEMO_BENCHMARK = register_benchmark(
    BenchmarkSpec("demo", _load, SPLITS, options=(), bundled=True, label="Demo: fictitious authors (bundled)",
                  start_split="forget10", description="the bundled fictitious-authors world (offline)",
                  preset={split: demo_preset(split) for split in SPLITS}, known_to=("demo",)),
    first=True)
