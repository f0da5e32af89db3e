"""The `Task`: what one benchmark's evaluation needs besides the metric code it calls (its
rows, the metrics computed across rows, its headline and retain metrics, what a 4-bit
verdict reads, its training recipe, the benchmarks it loads), and the registry of tasks,
`TASKS` (`register_task`, `get_task`).

A benchmark's `Benchmark.task` names its task; `grom.eval.report.evaluate` and
`grom.eval.quant_check` ask the task for everything that differs between benchmarks. A
new benchmark is one file in grom/tasks/ holding its loader and registering its `Task`
(with its benchmarks, `BenchmarkSpec`s of that loader, which `register_task` adds to
`grom.data.BENCHMARKS`), or a `BenchmarkSpec` whose benchmarks name an existing task (the
demo's, grom/tasks/demo.py). The record and its registry live here, below grom/tasks/, so
that the evaluation asks a benchmark's task without importing the tasks; the registry is
filled on its first read (with the benchmarks': the `grom` package's import of grom.tasks).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grom.data.loaders import BENCHMARKS, BenchmarkSpec, register_benchmark, unregister_benchmark
from grom.read_view import ReadView

if TYPE_CHECKING:
    from grom.eval.results import Row
    from grom.eval.runner import ModelScorer

__all__ = ["QUANT_METRICS", "TASKS", "MetricSource", "QuantMetrics", "Task", "get_task", "joined", "register_task",
           "unregister_task"]


@dataclass(frozen=True)
class MetricSource:
    """Where one metric comes from."""

    implementation: str
    """A key of `grom.eval.metric_sources.IMPLEMENTATIONS`."""
    follows: str
    """The upstream function (or our own definition) it computes."""
    deviation: str = ""
    """Where the project deliberately differs, and why (empty: none)."""


@dataclass(frozen=True)
class QuantMetrics:
    """What a 4-bit verdict reads for a task."""

    forget: tuple[str, ...]
    """The forget metrics, the first the table has (without NaN) is read."""
    retain: tuple[str, ...]
    """The retain metrics, likewise."""
    from_full_base: bool = False
    """Measure the forgetting left at 4 bits from the full-precision base model ((B - E4) /
    (B - E): the share of what the edit removed that stays removed) instead of from the
    4-bit base ((B4 - E4) / (B - E)). Right where the metric counts what the full-precision
    base knew (the real-knowledge task's known facts): the base model's own losses at 4
    bits are then not charged to the edit."""


QUANT_METRICS = QuantMetrics(
    forget=("Forget ROUGE-L", "Forget prob"),
    retain=("Retain ROUGE-L", "Neighbour ROUGE-L", "Retain prob", "Neighbour prob"))
"""What a 4-bit verdict reads where a task does not say otherwise (TOFU's measures, which the
custom task shares)."""


@dataclass(frozen=True)
class Task:
    """One benchmark's evaluation, as `evaluate` runs it.

    name: the `Benchmark.task` it evaluates ("tofu", "muse" ...).
    row: `row(scorer, sets, only_forget) -> Row`, the metrics of one model on the
    evaluation sets (only_forget: the forget side alone, for a first verdict or a 4-bit
    check).
    retain_metrics: the metrics that say how much of what should stay was kept (higher is
    better), read in order by the retain cost (`grom.eval.report.retain_drops`).
    headline: the metric a comparison is ranked by, where the task has one.
    benchmarks: the loaders of the benchmarks it evaluates, registered with it.
    relative: `relative(rows)`, the metrics of each row that need the others (forget
    quality against the reference, privacy leakage ...), after every row is computed.
    judge: `judge(model, tokenizer, rows, prompt_format, batch_size, stage, between=None,
    lower=None)`, run before `relative` where the task judges the rows' answers with the
    unedited model (real knowledge; `between` the step boundary of its batches,
    `grom.turns`; `lower`, given only where the row builder's decodings kept some through
    `ModelScorer.lower`, the states below the edit, `grom.eval.prefix.LowerStates`); a task
    with one scores a 4-bit check's rows as `evaluate` scores them.
    quant: what a 4-bit verdict reads. quant_sets: the sets a 4-bit check with the retain
    side keeps (None: the forget sets and the first of `QUANT_RETAIN_SETS` it has).
    recipe: the name of the training recipe OpenUnlearning runs for it
    (grom/methods/trained/recipes.py RECIPES).
    stages: the `evaluate(stage=)` values it takes besides "full".
    record: `record(scorer, sets, frames)`, where the task's edited rows read passes on top
    of the unedited row's answers (`frames`, its `Row.examples`): run those passes on the
    unedited model, for a prefix cache to record (`grom.eval.report.record_drafts`).
    sources: where each metric only this task reports comes from (a full metric name, or the
    measure after a set label: "KnowMem forget", "accuracy"), `MetricSource`s; the measures
    several tasks report are in `grom.eval.metric_sources.SHARED_SOURCES`.
    directions: the goal of each metric only this task reports ("down", "up", "zero",
    "half", "keep", "reference": `grom.eval.report.DIRECTION`), by full metric name.
    """

    name: str
    row: Callable[[ModelScorer, dict[str, tuple], bool], Row]
    retain_metrics: tuple[str, ...]
    headline: str | None = None
    benchmarks: tuple[BenchmarkSpec, ...] = ()
    relative: Callable[[dict[str, Row]], None] | None = None
    judge: Callable[..., None] | None = None
    quant: QuantMetrics = QUANT_METRICS
    quant_sets: tuple[str, ...] | None = None
    recipe: str = "tofu"
    stages: tuple[str, ...] = ()
    record: Callable[..., None] | None = None
    sources: Mapping[str, MetricSource] = field(default_factory=dict)
    directions: Mapping[str, str] = field(default_factory=dict)


_TASKS: dict[str, Task] = {}


def _filled() -> dict[str, Task]:
    """The tasks, after the benchmarks' registry has run its fills (`grom.data.loaders`: the
    `grom` package's import of `grom.tasks`, whose files register their tasks here)."""
    len(BENCHMARKS)
    return _TASKS


TASKS: Mapping[str, Task] = ReadView(_filled, "TASKS")
"""Every registered task by name; read-only (see `register_task`), filled on first read."""


_SHARED: dict[str, Mapping] = {}  # field name -> the table of what several tasks share (`joined`)


def joined(name: str, shared: Mapping) -> Mapping:
    """A read-only view of `shared` and every registered task's table `name` ("sources",
    "directions") together: one table of the facts about every metric, each stated once
    (`register_task` refuses a task's entry that another task, or `shared`, already has)."""
    _SHARED[name] = shared
    for task in _TASKS.values():  # those registered before the shared table was made
        _stated_once(task, against_tasks=False)

    def every() -> Mapping:
        table = dict(shared)
        for task in _filled().values():
            table.update(getattr(task, name))
        return table
    return ReadView(every, name)


def _stated_once(task: Task, against_tasks: bool = True) -> None:
    """Refuse a metric fact of `task` that the shared tables (those made so far) or another
    task state already."""
    for name in ("sources", "directions"):
        taken = {key: "grom.eval's shared table" for key in _SHARED.get(name, {})}
        if against_tasks:
            taken.update({key: f"the task {other.name!r}" for other in _TASKS.values() if other is not task
                          for key in getattr(other, name)})
        for key in getattr(task, name):
            if key in taken:
                raise ValueError(f"the task {task.name!r} states the {name[:-1]} of {key!r}, which "
                                 f"{taken[key]} already states: a metric's {name[:-1]} is stated once")


def register_task(task: Task) -> Task:
    """Add `task` to `TASKS` and its benchmarks to `grom.data.BENCHMARKS` (after those
    already there); a task or benchmark name already registered is refused, and so is a
    metric's source or direction already stated (`joined`)."""
    if task.name in _TASKS:
        raise ValueError(f"a task named {task.name!r} is already registered")
    _stated_once(task)
    for spec in task.benchmarks:
        register_benchmark(spec)
    _TASKS[task.name] = task
    return task


def unregister_task(name: str) -> None:
    """Remove the task `name` and its benchmarks (a test's extra task)."""
    task = _TASKS.pop(name)
    for spec in task.benchmarks:
        unregister_benchmark(spec.name)


def get_task(name: str) -> Task:
    """The registered task `name`; an unknown name lists the known ones."""
    task = _filled().get(name)
    if task is None:
        raise ValueError(f"no metrics for task {name!r}; known: {', '.join(_TASKS)}")
    return task
