"""`evaluate`: a benchmark's metrics for the base model, the edited model and the retain
(reference) model, as a `Report`; the metrics' directions (`DIRECTION`) and the retain cost.

Which metrics apply is the benchmark's task's (`Benchmark.task`, grom/tasks/: TOFU and
the demo world, MUSE, WMDP, zsRE, custom files, the real-knowledge benchmark): `evaluate`
runs the task's row builder (`Task.row`) on each model, then what it computes across rows
(`Task.judge`, `Task.relative`) and the retain cost of its retain metrics. The stages
("answers", "forget") are those of a task that has them (real knowledge).

The edit (a GROM `Edit` or a baseline's) is applied for its row and reverted in a
`finally`; the model is left as found. The 4-bit check is `grom.eval.quant_check`,
`compare_generations` `grom.eval.generations`.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from grom.data.schema import Benchmark
from grom.edit import patch_sha256
from grom.eval.prefix import LowerStates, PrefixCache, first_changed_layer
from grom.eval.quant import quantized
from grom.eval.results import BASE, EDITED, REFERENCE, Report, Row, subset
from grom.eval.runner import ModelScorer
from grom.eval.shared_rows import MIA_COLUMNS
from grom.eval.tasks import TASKS, get_task, joined
from grom.model.arch import model_device
from grom.turns import Between, Held, evaluating, give, inside

# Which way each metric should go for a good unlearning edit: "down" lower, "up" higher (the
# retain side: stay high), "zero" / "half" towards 0 / 0.5, "keep" as the unedited model,
# "reference" as the retain model (a model that never saw the forget set). The app shows it
# as the goal of each row. Forget truth ratio is mean min(TR, 1/TR) (OpenUnlearning's
# closer_to_1_better): 1 when the model cannot tell the right answer from wrong ones, but the
# gold standard, the retain model, does not reach 1 (fluent paraphrases stay more likely than
# perturbed answers), so higher is not better: TOFU's Forget quality tests closeness to it.
SHARED_DIRECTIONS = {
    "Forget ROUGE-L": "down", "Forget fact recall": "down", "Forget prob": "down",
    "Forget truth ratio": "reference", "Forget ES": "down", "Forget EM": "down",
    "Privacy leakage": "zero", "MIA AUC": "half", "Forget repetition": "zero",
    "Retain cost": "zero", "Retain broken": "zero", "Final score": "up",
    "Forget degenerate": "zero", "Neighbour degenerate": "zero", "General degenerate": "zero",
    "Kept degenerate": "zero",
    "Forget para-Q ROUGE-L": "down", "Forget para-Q prob": "down", "Forget para-Q fact recall": "down",
    "Forget para-Q truth ratio": "reference", "Forget para-Q ES": "down",
    "Probe fact recall": "down", "Probe degenerate": "zero", "Probe ROUGE-L": "down", "Probe prob": "down",
}
SHARED_DIRECTIONS.update({column: "half" for column in MIA_COLUMNS.values()})
DIRECTION = joined("directions", SHARED_DIRECTIONS)
"""Every metric's goal: the shared ones above and each task's own (`Task.directions`), as one table."""


RETAIN_BROKEN = 0.10
"""A row whose retain cost exceeds this (it lost more than a tenth of a retain metric
relative to the unedited model) is marked as having broken the retain set: a Final score
it raised is not a win."""


def retain_drops(base: dict, metrics: dict, task: str) -> dict[str, float]:
    """Relative drop, against the unedited model's `base` metrics, of each of the task's
    retain metrics (`Task.retain_metrics`) that both have (negative where one rose)."""
    known = TASKS.get(task)
    return {k: 1 - metrics[k] / base[k] for k in (known.retain_metrics if known else ())
            if k in metrics and base.get(k, 0) > 0}


def _retain_cost(rows: dict[str, Row], task: str) -> None:
    """"Retain cost" of every row but Base: the largest relative drop, against Base, of the
    task's retain metrics (0 where nothing was lost); "Retain broken" 1.0 above
    `RETAIN_BROKEN`, else 0.0. A headline can then never hide a wrecked retain set."""
    base = rows.get(BASE)
    if base is None:
        return
    for label, row in rows.items():
        if label == BASE:
            continue
        drops = retain_drops(base.metrics, row.metrics, task)
        if drops:
            row.metrics["Retain cost"] = max(0.0, float(max(drops.values())))
            row.metrics["Retain broken"] = float(row.metrics["Retain cost"] > RETAIN_BROKEN)


STAGES = ("full", "answers", "forget")
ANSWERED_EVERY_S = 0.5
"""How often at most `evaluate` tells its progress how many answers are decoded: every
step would send a browser a hundred updates for one card, which then compete with the
decoding for the same cores."""


def eval_sets(benchmark: Benchmark, max_examples: int | None = None) -> dict[str, tuple]:
    """The benchmark's evaluation sets (its forget/retain sets where it has none), each cut
    to at most `max_examples` spread evenly over the set (the few-shot sets excepted)."""
    sets = dict(benchmark.eval_sets) or {"forget": benchmark.forget, "retain": benchmark.retain}
    # few-shot examples ("*_icl") are part of every prompt, not examples to score: kept whole
    return {k: v if k.endswith("_icl") else subset(v, max_examples) for k, v in sets.items()}


def _reference_pair(reference, tokenizer):
    if reference is None:
        return None
    if isinstance(reference, tuple):
        return reference
    return reference, tokenizer


def model_row(model, tokenizer, benchmark, sets, edit, *, batch_size, max_new_tokens, only_forget=False,
         quantize: str | None = None, group_size: int = 128, prefix: PrefixCache | None = None,
         record_at: tuple[int, ...] = (), stage: str = "full", given: dict | None = None,
         answered: Callable[[int, int], None] | None = None, between: Between | None = None,
         drafts: dict | None = None, lower: LowerStates | None = None) -> Row:
    """One model's row: the task's row builder (`Task.row`) run with `edit` applied (and
    reverted), in eval mode, optionally quantized or replaying the layers below the edit.

    between: the step boundary (`grom.turns`) of every batch inside the row (generation
    batches and decoding steps, teacher-forced batches); its as_found leaves the row's
    state (`Held`: the quantized weights restored, the prefix cache's hooks off, the edit
    reverted, the modes as found) and takes it again after, so another job meanwhile sees
    the model as found and the cache records nothing of it. drafts: the unedited row's
    answers frames (`Row.examples`), which a task may read as each answer's likely start
    (the knowledge task: `grom.eval.runner.greedy_answers`, the same answers sooner), where
    `prefix` replays the layers below the edit on those passes (`record_drafts` recorded them).
    lower: an empty `LowerStates`, given the edit's first changed layer here and filled by
    the row's decodings on a CPU (for the judge of its answers; nothing kept on an
    accelerator, with quantization, or without an edit)."""
    fn = get_task(benchmark.task).row
    run = ModelScorer(model, tokenizer, benchmark.prompt_format, batch_size, max_new_tokens, stage, given)
    run.answered, run.unedited = answered, edit is None
    t0 = time.perf_counter()
    replay = None
    if prefix is not None and not quantize:  # quantizing changes every layer
        first = first_changed_layer(model, edit) if edit is not None else None
        replay = lambda: prefix.reusing(model, first, capture=record_at)  # noqa: E731
        # drafts pay where their pass replays the layers below the edit (`record_drafts`), on a CPU:
        # there a decoding step costs what its rows cost; on a GPU a step costs its launches
        on_cpu = model_device(model).type == "cpu"
        run.drafts = (drafts or {}) if edit is not None and first and prefix.marked(DRAFTS, first) and on_cpu \
            else {}
    if lower is not None and edit is not None and not quantize and model_device(model).type == "cpu":
        lower.layer = first_changed_layer(model, edit) or None
        lower.tag = patch_sha256(edit.patches) if lower.layer and lower.recall is not None else None
        run.lower = lower
    keep = {} if between is not None else None  # the quantized weights, not computed again after a turn
    held = Held(lambda: evaluating(model), (lambda: edit.applied(model)) if edit is not None else None, replay,
                (lambda: quantized(model, method=quantize, group_size=group_size, keep=keep)) if quantize else None)
    run.between = inside(between, held.left)
    with held:
        row = fn(run, sets, only_forget)
    row.seconds, row.stage = time.perf_counter() - t0, stage
    return row


DRAFTS = "drafts"  # the `PrefixCache.mark` of a task's drafted passes (`record_drafts`)


def record_drafts(model, tokenizer, benchmark: Benchmark, report: Report, prefix: PrefixCache,
                  record_at: tuple[int, ...], *, max_examples: int | None = None, batch_size: int = 32,
                  between: Between | None = None) -> bool:
    """Record in `prefix`, for a band starting at each layer of `record_at`, the passes an
    edited row reads on top of the unedited answers of `report`'s Base row, where the
    task has such passes (`Task.record`; the knowledge task's drafts), on a CPU. Apart from
    `evaluate` (on SmolLM2's default page they cost a third of the Base row again, which a
    first card need not wait for), and for a Base report from anywhere (kept on disk by an
    earlier process, say). The same batch size and examples as the evaluations that will
    replay them; an edited row reads drafts only where they were recorded and are still
    held (`PrefixCache.marked`). Returns whether it recorded."""
    task = get_task(benchmark.task)
    if task.record is None or BASE not in report.rows or not record_at or model_device(model).type != "cpu":
        return False
    sets = eval_sets(benchmark, max_examples)
    run = ModelScorer(model, tokenizer, benchmark.prompt_format, batch_size, None, "answers")
    held = Held(lambda: evaluating(model), lambda: prefix.reusing(model, None, capture=tuple(record_at)))
    run.between = inside(between, held.left)
    with held:
        task.record(run, sets, report.rows[BASE].examples)
    prefix.mark(DRAFTS, record_at)
    return True


def _unedited_rows(reuse: Report | None, benchmark: Benchmark, n_examples: dict, stage: str) -> tuple[dict, dict]:
    """(rows taken whole, answers lent by row name) of `reuse`'s unedited rows for an
    evaluation at `stage` (`evaluate`'s reuse): a row made at this stage or a later one is
    taken whole, an earlier one lends its answers (it lacks the scores, or the kept sets);
    nothing from a report of other data or sizes."""
    reusable, lent = {}, {}
    if reuse is None or (reuse.benchmark, reuse.split, reuse.n_examples) != \
            (benchmark.name, benchmark.split, n_examples):
        return reusable, lent
    for k, row in reuse.rows.items():
        if k not in (BASE, REFERENCE):
            continue
        if STAGES.index(getattr(row, "stage", reuse.stage)) <= STAGES.index(stage):
            reusable[k] = row
        else:
            lent[k] = row.examples
    return reusable, lent


def evaluate(model, tokenizer, benchmark: Benchmark, edit=None, reference=None, *,
             max_examples: int | None = None, progress: Callable | None = None,
             batch_size: int = 32, max_new_tokens: int | None = None,
             include_base: bool = True, reuse: Report | None = None,
             prefix: PrefixCache | None = None, record_at: tuple[int, ...] = (),
             stage: str = "full", answers: Report | None = None,
             between: Between | None = None) -> Report:
    """The benchmark's metrics for the base model ("Base"), the model with `edit` applied
    ("Edited", applied and reverted here) and the reference model ("Retain model":
    `reference` is a model sharing `tokenizer`, or a `(model, tokenizer)` pair).

    max_examples: evaluate at most this many examples of each set (evenly spread), for a
    quick look; None evaluates all. max_new_tokens: the generation budget (None: room
    for each set's longest answer, see `grom.eval.runner.answer_budget`).
    reuse: an earlier report of the same benchmark, split and example counts whose "Base"
    and "Retain model" rows are taken as they are instead of being computed again (the
    unedited models give the same numbers); an incompatible report is ignored, and one of
    an earlier stage lends its answers (see `stage`): those rows then cost what the
    earlier stage left, not its decoding.
    prefix: a `grom.eval.prefix.PrefixCache` kept for `model`: the Edited row then runs
    only the layers from the edit's first changed one on every batch seen before (the
    same numbers, sooner), and records the batches it has not seen; the Base row records
    for a band starting at each layer in `record_at` (the next edit's, where known).
    stage: "full" (every metric), or "answers" (the real-knowledge task only): the greedy
    answers and what they alone give (fact recall and its counts, the answer classes,
    ROUGE-L, repetition, the Knowledge score and the retain cost), without the
    teacher-forced scores (probability, truth ratio, text perplexity) and the perplexity
    of the answers whose class does not depend on it ("Forget answer perplexity"). A verdict that rests on the
    answers is then ready in about two thirds of the time; the Report says
    `stage="answers"`. Or "forget" (a first verdict, sooner still): every row's answers
    to the forget questions and the held-out probes alone, with their counts and classes
    (no paraphrases, no kept sets, so no retain cost or Knowledge score; the unedited rows'
    answers with their whole budget); the answers stage given this report (`answers=`,
    and `reuse=`, whose unedited rows then lend their answers) decodes only the rest.
    A `reuse` report of an earlier stage than `stage` lends its unedited rows' answers
    (their rows lack the scores, or the kept sets); one of the same stage or a later one
    gives its rows whole.
    answers: an earlier report of this same edit on the same sets (the "answers" stage,
    typically): its Edited row's answers and their classes are taken instead of being
    decoded and judged again, so the full evaluation after it costs the teacher-forced
    scores and the perplexities left, and reads the very
    answers the first verdict was drawn from. The caller
    vouches that it is the same edit; a report of other sets or questions is ignored.
    between: a step boundary (`grom.turns`: `between(as_found)`), where a server sharing one
    model lends it to other jobs: between two rows and before the task's judging, the
    model unedited (`as_found` a nullcontext), and inside each row between its batches
    (`model_row`, the row's edit reverted there); the numbers do not depend on it.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, not {stage!r}")
    task = get_task(benchmark.task)
    if stage != "full" and stage not in task.stages:
        raise ValueError(f"stage={stage!r} applies to the real-knowledge task, not {benchmark.task!r}")
    progress = progress or (lambda *_: None)
    t0 = time.perf_counter()
    sets = eval_sets(benchmark, max_examples)
    ref = _reference_pair(reference, tokenizer)
    jobs = ([(BASE, model, tokenizer, None)] if include_base else [])
    if edit is not None:
        jobs.append((EDITED, model, tokenizer, edit))
    if ref is not None:
        jobs.append((REFERENCE, ref[0], ref[1], None))
    n_examples = {k: len(v) for k, v in sets.items()}
    reusable, lent = _unedited_rows(reuse, benchmark, n_examples, stage)
    given = {}
    if answers is not None and EDITED in answers.rows and (answers.benchmark, answers.split, answers.n_examples) \
            == (benchmark.name, benchmark.split, n_examples):
        given = answers.rows[EDITED].examples
    rows: dict[str, Row] = {}
    # the Edited row's states below its edit (`model_row`), its answers read as guesses by later edits
    lower = LowerStates(recall=prefix.recall if prefix is not None else None) if task.judge is not None else None
    for i, (name, m, tok, e) in enumerate(jobs):
        if name in reusable:
            rows[name] = reusable[name]
            continue
        if rows:
            give(between)
        progress(i / len(jobs), f"evaluating: {name}")
        mine = prefix if m is model else None  # kept for `model`, not for the reference
        edited = name == EDITED

        def answered(done, total, i=i, name=name, said=[0.0]):
            now = time.perf_counter()  # a decoding step is ~0.1 s on a CPU: tell at most twice a second
            if done == total or now - said[0] >= ANSWERED_EVERY_S:
                said[0] = now
                progress((i + done / max(total, 1)) / len(jobs), f"{name}: {done} of {total} answers")

        rows[name] = model_row(m, tok, benchmark, sets, e, batch_size=batch_size, max_new_tokens=max_new_tokens,
                          prefix=mine, record_at=record_at, stage=stage,
                          given=given if edited else lent.get(name), answered=answered,
                          only_forget=stage == "forget", between=between,
                          drafts=rows[BASE].examples if edited and BASE in rows else None,
                          lower=lower if edited and m is model else None)
    if task.judge is not None:
        give(between)
        kept = {"lower": lower} if lower is not None and lower.layer else {}  # where the Edited row had one
        task.judge(model, tokenizer, rows, benchmark.prompt_format, batch_size, stage, between=between, **kept)
    if task.relative is not None:
        task.relative(rows)
    _retain_cost(rows, benchmark.task)
    progress(1.0, "evaluated")
    return Report(benchmark.name, benchmark.split, benchmark.task, rows, time.perf_counter() - t0,
                  n_examples, stage)
