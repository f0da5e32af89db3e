"""The benchmarks' tasks: one `Task` per benchmark (`grom.eval.tasks`), each in its own file
with its benchmarks' loaders and its row builder (tofu.py, muse.py ...), registered when
this package is imported (the `grom` package imports it): `TASKS` by the `Benchmark.task`
they evaluate, and their benchmarks in `grom.data.BENCHMARKS`, in the order a UI lists them
(the demo first). A user's files (`load_custom_file`) and the bundled real knowledge
(`load_knowledge`) are loaded from here too."""
from grom.eval.tasks import QUANT_METRICS, TASKS, QuantMetrics, Task, get_task, register_task, unregister_task

# the order of registration is the order a UI lists the benchmarks:
# isort: off
from grom.tasks import knowledge, name_only, tofu, muse, wmdp, zsre, custom, demo  # noqa: E402,F401
# isort: on
from grom.tasks.custom import load_custom_file
from grom.tasks.knowledge import load_knowledge

__all__ = ["QUANT_METRICS", "QuantMetrics", "TASKS", "Task", "get_task", "load_custom_file", "load_knowledge",
           "register_task", "unregister_task"]
