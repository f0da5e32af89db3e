"""The comparison's rows: Base, Edited (and the retain model where there is one), with
the unedited rows cached per (model, benchmark, size) so that an edit costs one row.
Shared by the Compare panel and the baseline panel."""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import replace

from components.server.allowed_sources import DEMO
from components.server.costs import check_comparison
from components.server.device import (
    DEVICE_LOCK,
    ON_ZEROGPU,
    Yielded,
    give_turn,
    kept_cache,
    on_device,
    wait_for_quiet,
    yielding,
)
from components.server.durations import report_s
from components.server.flights import shared, wait_for
from components.server.limits import limit, over
from components.server.session import (
    REGISTRY,
    ModelHandle,
    ModelKey,
    Session,
    current_benchmark,
    current_model,
    resident,
)
from components.server.validate import whole_number
from components.studio import cards
from grom.demo import load_demo_model
from grom.eval import evaluate
from grom.eval.report import BASE, DRAFTS, EDITED, record_drafts
from grom.eval.tasks import get_task
from grom.model.loading import resolve_dtype

log = logging.getLogger(__name__)
FORGET_SETS = ("forget", "verbmem_forget", "knowmem_forget", "forget_mc")


RETAIN_SETS = ("retain", "neighbours", "knowmem_retain", "utility_mc", "real_authors", "world_facts",
               "general")


_BASE_CACHE: OrderedDict = OrderedDict()  # (model key, benchmark id, n, stage) -> (benchmark, first Report)
BASE_STAGES = ("forget", "answers", "full")
"""The unedited rows kept, each stage lending its answers to the next (`grom.eval.evaluate`'s
stages): the answers to the forget questions and the probes (what a first verdict reads), then
the other answers (what the whole card reads), then every score (what the comparison adds):
on SmolLM2's default page on a 2-core CPU the answers take 17 s and the scores 31 s more, so a
card need not wait for the scores, nor a first verdict for the kept sets' answers."""


def _reference_loader(key: ModelKey):
    return load_demo_model("retain", device=key.device, dtype=resolve_dtype(key.dtype))


def reference_for(handle: ModelHandle, bench):
    """The retain model (never saw the forget set) where one exists: the demo's, for the
    demo benchmark's forget10 splits."""
    if handle.key.name == DEMO and bench.name == "demo-authors" and bench.split.startswith("forget10"):
        return REGISTRY.reference(handle.key, _reference_loader)
    return None


def shared_model(key: ModelKey, what: str = "comparison") -> ModelHandle:
    """The loaded model, checked to be still `key` (call with DEVICE_LOCK held)."""
    return resident(key, what)


@on_device(duration=report_s)
def compute_report(key: ModelKey, bench, edit, n, progress, record_at: tuple[int, ...] = (), prior=None,
                   prefix: bool = True, stage: str = "full", answers=None):
    """Base, Edited and Retain model rows in one Report, the unedited ones taken from
    `prior` (an earlier Report of the same model, benchmark and size) where given. Pure
    in what it returns; the caller keeps the Base report (`comparison_report`). `stage`
    and `answers` as `grom.eval.evaluate`'s (the card's answers first, then the rest)."""
    with DEVICE_LOCK:
        return report_rows(shared_model(key), bench, edit, n, progress, record_at, prior, prefix, stage, answers)


def report_rows(handle: ModelHandle, bench, edit, n, progress, record_at: tuple[int, ...] = (), prior=None,
                prefix: bool = True, stage: str = "full", answers=None):
    """Base, Edited (with `edit`) and Retain model rows; the unedited rows come from
    `prior` (`evaluate(reuse=)`), and the Edited row runs only the edit's layers and above
    on batches seen before (`evaluate(prefix=)`, the model's prefix cache; none on
    ZeroGPU, where it would be filled in a worker: `kept_cache`; the Base row records
    them for a band starting at a layer of `record_at`; `prefix` False: no prefix cache,
    as for a baseline's patch of every layer). Runs under DEVICE_LOCK
    (re-entrant: callers may hold it already)."""
    with DEVICE_LOCK:
        return evaluate(handle.model, handle.tokenizer, bench, edit=edit,
                        reference=reference_for(handle, bench), max_examples=n,
                        progress=progress, reuse=prior,
                        prefix=kept_cache(handle.prefix_cache) if prefix else None,
                        record_at=record_at, stage=stage, answers=answers,
                        between=give_turn)  # a visitor waiting goes between the rows and their batches


def _disk_key(key: ModelKey, bench, n, stage: str = "full") -> str | None:
    """The key of the Base report of (model, benchmark, n) at `stage` on disk
    (`cards.keep_object`): the weights, their dtype, the data and the size; None where the
    model is not loaded."""
    handle = REGISTRY.get(key)
    weights = cards.fingerprint_of(handle) if handle is not None else None
    if weights is None:
        return None
    try:
        return cards.object_key(_KIND[stage], weights, key.dtype, bench.name, bench.split, cards.data_digest(bench),
                                n)
    except (AttributeError, TypeError):  # not a benchmark of examples (a test's stand-in): kept in memory only
        return None


_KIND = {"full": "base-report", "answers": "base-answers", "forget": "base-forget"}  # `cards.keep_object`'s kinds


def _kept(key: ModelKey, bench, n, stage: str):
    """The Base report of exactly `stage` made in this process, else kept on disk, or None."""
    hit = _BASE_CACHE.get((key, id(bench), n, stage))
    if hit is not None and hit[0] is bench:
        return hit[1]
    disk = _disk_key(key, bench, n, stage)
    report = cards.find_object(_KIND[stage], disk) if disk is not None else None
    if report is not None and getattr(report, "stage", "") == stage and BASE in getattr(report, "rows", {}):
        _BASE_CACHE[(key, id(bench), n, stage)] = (bench, report)
        return report
    return None


def _stage_of(stage: str) -> str:
    return stage if stage in BASE_STAGES else "full"


def base_report(key: ModelKey, bench, n, stage: str = "full"):
    """The unedited rows of (model, benchmark, n) for an evaluation at `stage`, made in this
    process or kept on disk by an earlier one on the same weights and data (a restarted
    server's first comparison costs one row), or None: the most complete kept of `stage`
    or a later one (`BASE_STAGES`)."""
    later = BASE_STAGES[BASE_STAGES.index(_stage_of(stage)):]
    return next((r for r in (_kept(key, bench, n, s) for s in reversed(later)) if r is not None), None)


def earlier_base(key: ModelKey, bench, n, stage: str):
    """The most complete Base report kept of a stage before `stage`, whose answers an
    evaluation at `stage` takes (`grom.eval.evaluate`'s reuse), or None."""
    earlier = BASE_STAGES[:BASE_STAGES.index(_stage_of(stage))]
    return next((r for r in (_kept(key, bench, n, s) for s in reversed(earlier)) if r is not None), None)


def base_flight(key: ModelKey, bench, n, stage: str = "full") -> tuple:
    """The `flights` key of the Base report of (model, benchmark, n) at `stage` being computed."""
    return ("base report", key, id(bench), n, _stage_of(stage))


def keep_base(key: ModelKey, bench, n, report) -> None:
    """Keep `report`'s unedited rows as the Base report of (model, benchmark, n) at its stage
    unless one is kept (the twelve most recent kept). In the main process: a compute
    function only returns it."""
    stage = _stage_of(report.stage)
    ck = (key, id(bench), n, stage)
    hit = _BASE_CACHE.get(ck)
    if (hit is None or hit[0] is not bench) and BASE in report.rows:
        kept = replace(unedited(report), stage=stage)
        _BASE_CACHE[ck] = (bench, kept)
        while len(_BASE_CACHE) > 12:
            _BASE_CACHE.popitem(last=False)
        disk = _disk_key(key, bench, n, stage)
        if disk is not None:  # the unedited rows alone: an edit's row is the visitor's
            cards.keep_object(_KIND[stage], disk, kept)


def unedited(report):
    """`report` with its unedited rows only (Base, and the retain model's)."""
    return replace(report, rows={k: v for k, v in report.rows.items() if k != EDITED})


WAITED = {"forget": "the unedited answers to the forget questions", "answers": "the unedited answers",
          "full": "the unedited model's scores"}  # what a report waits for, by stage


def comparison_report(handle: ModelHandle, bench, edit, n, progress, record_at: tuple[int, ...] = (),
                      stage: str = "full", answers=None):
    """`compute_report` with the Base report of this process for `stage` (`base_report`;
    else the answers of one of an earlier stage, lent (`earlier_base`): the Base row then
    costs what that stage left; else the unedited rows of `answers`, an earlier stage's
    report of this edit) and the result kept (`keep_base`). Where a page's warm-up
    computes the unedited rows now, an edit's report waits for the stages it reads (a
    first verdict for the forget side's answers alone) and reads them. The evaluation
    examples are checked first against the token limits (`components.server.costs`); the
    reference model, where there is one, is loaded here first, so that a ZeroGPU worker
    forked next inherits it."""
    check_comparison(handle.tokenizer, bench, n)
    reference_for(handle, bench)
    key = handle.key
    prior = base_report(key, bench, n, stage)
    if prior is None and edit is not None:  # read, not computed again: a card waits for the answers it reads alone
        for step in BASE_STAGES[:BASE_STAGES.index(_stage_of(stage)) + 1]:
            if wait_for(base_flight(key, bench, n, step), WAITED[step]):
                prior = base_report(key, bench, n, stage)
    prior = prior or earlier_base(key, bench, n, stage)
    prior = prior or answers
    report = compute_report(key, bench, edit, n, progress, record_at, prior, stage=stage, answers=answers)
    keep_base(key, bench, n, report)
    return report


def warm_base_rows(max_examples: int, session: Session, band_start: int | None = None,
                   answers_only: bool = False) -> None:
    """Compute the unedited rows of the session's benchmark ahead of the first comparison
    (a new page of the real model: the first Run edit then costs only the Edited row, and
    on the layers from `band_start` on, the suggested band's first): their answers first,
    on which a card waits (`BASE_STAGES`), then the drafted passes (`record_ahead`), then
    (unless `answers_only`) the scores the comparison adds. Cached per model, benchmark
    and size for every session, so a second call reads what the first kept; silent on any
    problem. Skipped on ZeroGPU: it would spend a visitor's GPU time on opening the page."""
    if ON_ZEROGPU:
        return
    try:
        handle, bench = current_model(session), current_benchmark(session)
        n = int(max_examples)
        record_at = () if band_start is None else (int(band_start),)
        stages = BASE_STAGES if set(BASE_STAGES) <= {"full", *get_task(bench.task).stages} else ("full",)
        drafted = "answers" if "answers" in stages else "full"
        for stage in stages[:stages.index(drafted) + 1] if answers_only else stages:
            def compute(stage=stage):  # each stage lends its answers to the next (`comparison_report`)
                return comparison_report(handle, bench, None, n, None, record_at, stage=stage)
            # pages opened at once compute each once: the others wait for it (`flights`) and read it
            report = shared(base_flight(handle.key, bench, n, stage), lambda stage=stage: base_report(
                handle.key, bench, n, stage), compute, WAITED[stage])
            if stage == drafted and band_start is not None:  # every answer in: the next card's drafts
                record_ahead(handle, bench, report, n, int(band_start))
    except Exception as err:  # noqa: BLE001  (a warm-up: the comparison itself reports problems)
        log.info("base rows not precomputed: %s", err)


def record_ahead(handle: ModelHandle, bench, report, n, band_start: int) -> None:
    """Unless this model's prefix cache holds them for a band from `band_start`, record the
    passes the Edited row's card reads on the Base report's answers
    (`grom.eval.report.record_drafts`), at the evaluation's batch size: the first verdict then
    reads the forget side in one pass of the band's layers, and the whole card decodes only
    the answers the edit changed."""
    cache = kept_cache(handle.prefix_cache)
    if cache is None:
        return

    def record():
        # each pass is one forward (the second 28 s on SmolLM2's default page on a 2-core CPU), with no
        # step boundary inside for a visitor to go at: it stops at the next layer instead once a visitor's
        # job waits (`yielding`: B's question and A's click waited 10 s behind it), and starts again from
        # the beginning once the device has been quiet, at most DRAFT_TRIES times
        for _ in range(DRAFT_TRIES):
            try:
                with yielding(), DEVICE_LOCK:
                    if not cache.marked(DRAFTS, band_start):
                        record_drafts(handle.model, handle.tokenizer, bench, report, cache, (band_start,),
                                      max_examples=n, between=give_turn)
                return True
            except Yielded:
                if not wait_for_quiet(DRAFT_QUIET_S, DRAFT_QUIET_GIVE_UP_S):
                    break
        return None
    try:
        shared(("drafts", id(cache), band_start), lambda: True if cache.marked(DRAFTS, band_start) else None, record,
               "the drafted passes")
    except Exception as err:  # noqa: BLE001  (work ahead of need: the card decodes without it)
        log.info("drafted passes not recorded: %s", err)


DRAFT_TRIES = 5  # a drafted pass stopped by visitors' jobs starts again, at most this often
DRAFT_QUIET_S = 2.0  # ... once no visitor's job has used the device for this long
DRAFT_QUIET_GIVE_UP_S = 600.0  # a device busy this long: the cards decode without the drafts


WHOLE_SPLIT_UP_TO = 60
"""A comparison on the real model starts on every example where each set holds at most this
many (the default split's known facts: 27 forget, 43 neighbour, 16 general questions), so
the first verdict counts all of them; beyond it, a sample of `SAMPLE_EXAMPLES`."""
SAMPLE_EXAMPLES = 10


def set_sizes(bench) -> dict[str, int]:
    """Examples per evaluation set (the forget and retain sets where it has none)."""
    sets = bench.eval_sets or {"forget": bench.forget, "retain": bench.retain}
    return {name: len(v) for name, v in sets.items()}


def default_examples(bench, real: bool) -> int:
    """The Compare slider's first value: on the real model, the largest set's size rounded
    up to the slider's step of 5 where that is at most `WHOLE_SPLIT_UP_TO` (every example
    counts), else `SAMPLE_EXAMPLES`; 20 on the demo model (fast)."""
    if not real:
        return 20
    largest = max(set_sizes(bench).values(), default=0) if bench is not None else WHOLE_SPLIT_UP_TO + 1
    return max(5, -(-largest // 5) * 5) if largest <= WHOLE_SPLIT_UP_TO else SAMPLE_EXAMPLES


def covers_split(bench, n: int | None) -> bool:
    """Whether a comparison of up to `n` examples per set (None: all) holds every example."""
    return n is None or max(set_sizes(bench).values(), default=0) <= n


def examples_per_set(max_examples, full_set, bench) -> int | None:
    """The examples per evaluation set a comparison asks for (None: all), within
    GROM_MAX_EVAL_EXAMPLES; NaN, a fraction or too many is an error that says so."""
    cap = limit("GROM_MAX_EVAL_EXAMPLES")
    if full_set:
        largest = max(set_sizes(bench).values(), default=0)
        if largest > cap:
            raise over(f"With all examples, {bench.name}/{bench.split} would evaluate {{n}} examples "
                       "in its largest set", largest, "GROM_MAX_EVAL_EXAMPLES")
        return None
    n = whole_number(max_examples, "number of examples per set", 1, 10**9)
    if n > cap:
        raise over("Examples per set", n, "GROM_MAX_EVAL_EXAMPLES")
    return n
