"""The bundled fictitious-authors world and its tiny trained demo models.

`generate_world(seed)` invents the world, `load_demo_benchmark(split)` views it as a
`Benchmark`, `load_demo_model(kind)` loads a trained model from `assets/` (build them with
`python -m grom.demo.train`). Importing the package registers the world as the benchmark
"demo" of `grom.data.load_benchmark`, at the head of the list (the `grom` package imports
it, so the benchmark is there whichever grom module a caller imports first).
"""
from grom.data.loaders import register_benchmark
from grom.demo.benchmark import DEMO_BENCHMARK
from grom.demo.model import ASSETS_DIR, MODEL_KINDS, demo_model_dir, load_demo_model
from grom.demo.world import SPLITS, World, generate_world, load_demo_benchmark

register_benchmark(DEMO_BENCHMARK, first=True)

__all__ = ["ASSETS_DIR", "DEMO_BENCHMARK", "MODEL_KINDS", "SPLITS", "World", "demo_model_dir",
           "generate_world", "load_demo_benchmark", "load_demo_model"]
