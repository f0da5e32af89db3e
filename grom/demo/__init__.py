"""The bundled fictitious-authors world and its tiny trained demo models.

`generate_world(seed)` invents the world, `load_demo_benchmark(split)` views it as a
`Benchmark`, `load_demo_model(kind)` loads a trained model from `assets/` (build them with
`python -m grom.demo.train`). The world is the benchmark
"demo" of `grom.data.load_benchmark` through grom/tasks/demo.py.
"""
from grom.demo.model import ASSETS_DIR, MODEL_KINDS, demo_model_dir, load_demo_model
from grom.demo.world import SPLITS, World, generate_world, load_demo_benchmark

__all__ = ["ASSETS_DIR", "MODEL_KINDS", "SPLITS", "World", "demo_model_dir",
           "generate_world", "load_demo_benchmark", "load_demo_model"]
