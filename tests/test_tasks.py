"""The task registry (grom/tasks/): every registered task is complete, and a task registered
from outside is evaluated and offered by the app without other edits."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import grom.data
from grom.data import BENCHMARKS, load_benchmark
from grom.data.loaders import BenchmarkSpec
from grom.data.schema import Benchmark, QAExample
from grom.eval import evaluate
from grom.eval.metric_sources import METRIC_SOURCES, MetricSource, metric_source, ours
from grom.eval.report import DIRECTION, STAGES
from grom.eval.results import Row
from grom.methods.trained.recipes import RECIPES, recipe_for_task
from grom.tasks import TASKS, Task, get_task, register_task, unregister_task


def test_the_tasks_and_their_benchmarks_are_registered_in_the_apps_order():
    assert set(TASKS) == {"tofu", "muse", "wmdp", "zsre", "custom", "knowledge"}
    served = [spec.name for task in TASKS.values() for spec in task.benchmarks]
    # the demo: a loader evaluated by tofu/wmdp; name-only: real knowledge's task on written data
    assert sorted(served + ["demo", "name-only"]) == sorted(BENCHMARKS)
    assert next(iter(BENCHMARKS)) == "demo"


@pytest.mark.parametrize("name", ["tofu", "muse", "wmdp", "zsre", "custom", "knowledge"])
def test_every_task_is_complete(name):
    task = get_task(name)
    assert task.name == name and callable(task.row)
    assert task.retain_metrics and all(metric_source(m) is not None for m in task.retain_metrics)
    assert task.headline is None or DIRECTION[task.headline] == "up"
    assert task.quant.forget and task.quant.retain
    assert all(DIRECTION.get(m, "down") == "down" for m in task.quant.forget)
    # the recipe the trainer runs for the task is the one the task names
    assert task.recipe in RECIPES and recipe_for_task(name).name == task.recipe
    assert set(task.stages) <= set(STAGES) - {"full"}
    assert task.benchmarks
    for spec in task.benchmarks:
        assert callable(spec.load) and spec.splits and spec.label
        assert spec.start_split is None or spec.start_split in spec.splits
        assert BENCHMARKS[spec.name] is spec


@pytest.mark.parametrize("name", ["demo", "real-knowledge"])
def test_every_split_of_the_bundled_benchmarks_names_a_registered_task(name):
    for split in BENCHMARKS[name].splits:
        assert load_benchmark(name, split).task in TASKS


def test_a_benchmark_is_one_file_its_loader_beside_its_task():
    """Each task's benchmarks load with code of the task's own file (grom/tasks/<name>.py,
    no grom/data/<name>.py beside it), and grom.data imports nothing of grom.tasks."""
    data = Path(grom.data.__file__).parent
    for name, task in TASKS.items():
        assert not (data / f"{name}.py").exists()
        for spec in task.benchmarks:
            load = getattr(spec.load, "func", spec.load)  # muse and wmdp: a partial per corpus/subject
            assert load.__module__ == f"grom.tasks.{name}", (spec.name, load.__module__)
    for path in data.glob("*.py"):
        imports = [ln for ln in path.read_text().splitlines() if ln.lstrip().startswith(("import ", "from "))]
        assert not [ln for ln in imports if "grom.tasks" in ln], path


def test_an_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="no metrics for task 'nope'; known: knowledge, tofu"):
        get_task("nope")


def _toy_row(run, sets, only_forget=False) -> Row:
    return Row(metrics={"Forget ROUGE-L": 0.25, "Retain ROUGE-L": 0.5 if run.model.bias.item() else 0.4,
                        "Toy score": 1.0})


def _toy_load(split, source=None, **options) -> Benchmark:
    qa = (QAExample("Who?", "Me."),)
    return Benchmark("toy", split, forget=qa, retain=qa, task="toy")


def test_a_task_registered_from_outside_is_evaluated_and_offered_by_the_app():
    """One registration, no other edit: evaluate runs its row builder and retain cost, the
    registry loads it, the app lists and loads it."""
    from components.studio import benchmarks as app_benchmarks

    task = Task("toy", _toy_row, retain_metrics=("Retain ROUGE-L",), headline=None,
                benchmarks=(BenchmarkSpec("toy", _toy_load, ("a", "b"), label="Toy: one question",
                                          start_split="b"),),
                sources={"Toy score": ours("the toy's own score")}, directions={"Toy score": "up"})
    register_task(task)
    try:
        # its metric's source and goal, stated in its row alone, are in the one tables
        assert metric_source("Toy score") == ours("the toy's own score") and DIRECTION["Toy score"] == "up"
        assert ("Toy: one question", "toy") in app_benchmarks.benchmark_names()
        assert app_benchmarks.splits_for("toy") == ["a", "b"] and app_benchmarks.default_split("toy") == "b"
        bench = app_benchmarks.read_benchmark("toy", "a", "", None, None)
        assert (bench.name, bench.split, bench.task) == ("toy", "a", "toy")
        model = torch.nn.Linear(1, 1)
        with torch.no_grad():
            model.bias.fill_(1.0)

        class Zeroed:  # an "edit" that zeroes the bias while applied
            def applied(self, m):
                from contextlib import contextmanager

                @contextmanager
                def ctx():
                    m.bias.data.fill_(0.0)
                    try:
                        yield
                    finally:
                        m.bias.data.fill_(1.0)
                return ctx()

        report = evaluate(model, None, bench, Zeroed())
        assert report.task == "toy"
        assert report.rows["Base"].metrics["Retain ROUGE-L"] == 0.5
        assert report.rows["Edited"].metrics["Retain cost"] == pytest.approx(0.2)
        with pytest.raises(ValueError, match="stage='answers'"):
            evaluate(model, None, bench, stage="answers")
        with pytest.raises(ValueError, match="'toy' is already registered"):
            register_task(task)
    finally:
        unregister_task("toy")
        app_benchmarks._load_shared.cache_clear()
    assert "toy" not in TASKS and "toy" not in BENCHMARKS
    assert "Toy score" not in METRIC_SOURCES and "Toy score" not in DIRECTION


@pytest.mark.parametrize("field, key, owner", [("sources", "ROUGE-L", "shared table"),
                                               ("sources", "KnowMem forget", "task 'muse'"),
                                               ("directions", "Knowledge score", "task 'knowledge'"),
                                               ("directions", "Forget prob", "shared table")])
def test_a_metric_is_stated_once(field, key, owner):
    """A task that restates a metric's source or goal (shared, or another task's) is refused:
    the benchmark's facts live in its one row."""
    value = MetricSource("GROM Studio", "again") if field == "sources" else "down"
    task = Task("again", _toy_row, retain_metrics=("Retain ROUGE-L",), **{field: {key: value}})
    with pytest.raises(ValueError, match=f"states the {field[:-1]} of '{key}'.*{owner}"):
        register_task(task)
    assert "again" not in TASKS


def test_each_benchmark_states_its_own_metrics():
    """MUSE's, WMDP's and zsRE's metrics are stated in their task files, not in grom.eval."""
    from grom.eval.metric_sources import SHARED_SOURCES
    from grom.eval.report import SHARED_DIRECTIONS

    for name, metric in (("muse", "KnowMem forget"), ("wmdp", "accuracy"), ("zsre", "Efficacy"),
                         ("knowledge", "Knowledge score"), ("tofu", "Model utility"), ("custom", "text loss")):
        assert metric in get_task(name).sources and metric not in SHARED_SOURCES
    for name, metric in (("muse", "VerbMem forget"), ("wmdp", "Forget accuracy"), ("zsre", "Generalisation")):
        assert DIRECTION[metric] == get_task(name).directions[metric] and metric not in SHARED_DIRECTIONS
