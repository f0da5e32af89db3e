"""The benchmarks' tasks: one `Task` per benchmark (`grom.tasks.base`), each in its own file
with its row builder and its benchmarks' loaders, registered when this package is imported
(the `grom` package imports it): `TASKS` by the `Benchmark.task` they evaluate, and their
benchmarks in `grom.data.BENCHMARKS`, in the order a UI lists them (the demo first)."""
from grom.tasks.base import QUANT_METRICS, TASKS, QuantMetrics, Task, get_task, register_task, unregister_task

# the order of registration is the order a UI lists the benchmarks:
# isort: off
from grom.tasks import knowledge, tofu, muse, wmdp, zsre, custom, demo  # noqa: E402,F401
# isort: on

__all__ = ["QUANT_METRICS", "QuantMetrics", "TASKS", "Task", "get_task", "register_task", "unregister_task"]
