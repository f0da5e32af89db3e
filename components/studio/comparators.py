"""Every method the studio can run beside GROM, by one name, from its registry row
(`grom.registry`): the trained methods (GA, GradDiff, NPO, SimNPO, IDK-NLL, ...), the
closed-form locate-then-edit editors (ROME, MEMIT, AlphaEdit, ZeroUnlearn) and LUNAR. The
Compare tab's baseline and the "Is it gone?" tab both run through `run_comparator`, so each
lists, checks and runs the same methods, and neither asks which family a method is: the row
says what its two number boxes mean and start from (`MethodEntry.boxes`), what values they
take (`Box.read`, in the words of a refusal), the settings a run gets from them
(`MethodEntry.configure`: an editor on GROM's band where it can move facts there, LUNAR at its
own layer, a trained method under its benchmark's recipe), and how it runs. What is the
server's, not the method's, is applied here: GROM_MAX_EPOCHS on a run that trains the model
step by step (`MethodEntry.stepwise`), GROM_MAX_EXAMPLES on every run, ZeroGPU's calls.

An editor edits GROM's band of the session's edit where there is one (the paper's terms:
the same keys and retain covariance, only the update rule differs), unless that band ends
at the model's last layer (`editor_band`): there a value vector at the subject's token
reaches no answer token (nothing mixes positions after the last layer), so ROME, MEMIT and
AlphaEdit would change nothing (SmolLM2's default band, 25-29 of 30); the editors then
take the upstream editors' band instead, and the summary says so (`band_note`).

`unavailable(name, bench)` says why a method cannot run on a split (an editor without
facts that carry a subject, a retain-term method without a retain set) in the words its
run is refused with (`gap`: also a few words for the box), as the registry's row says it;
the method box greys such methods out (`comparator_choices` with the split), and `glossary`
gives each method's line: what it does, what it needs.
"""
from __future__ import annotations

from components.server.device import DEVICE_LOCK, ON_ZEROGPU, device_progress, give_turn, on_device
from components.server.durations import train_call_s, train_plan
from components.server.errors import UserError, shorten
from components.server.gpu_time import refuse_over
from components.server.limits import limit, over
from components.server.session import ModelKey, resident
from components.server.train_parts import train_in_calls
from grom.methods import ALL, BadSetting, MethodEntry, Reason, can_run
from grom.methods.trained.checkpoint import Part


def comparator_names() -> tuple[str, ...]:
    """Every method but GROM, in the registry's order."""
    return tuple(name for name, row in ALL.items() if row.family != "closed-form")


def row_of(method) -> MethodEntry:
    """The registry row for the method box's value (its name or label, any case; not GROM)."""
    name = str(method or "").strip().lower()
    for key in comparator_names():
        if name in (key, ALL[key].label.lower()):
            return ALL[key]
    raise UserError(f"Unknown baseline {shorten(method)!r}: choose one of "
                    f"{', '.join(ALL[n].label for n in comparator_names())}.")


def choice_label(row: MethodEntry) -> str:
    """How the method box lists a method: "NPO: what it does (trained method)"."""
    return f"{row.label}: {row.description.rstrip('.')} ({row.kind})"


def comparator_choices(bench=None) -> list[tuple[str, str]]:
    """(label, name) of every method but GROM, in the registry's order. With a benchmark, a
    method that cannot run on it is greyed out: "⊘ ROME: not on this split (...)", the
    reason in `unavailable`."""
    rows = [ALL[n] for n in comparator_names()]
    if bench is None:
        return [(choice_label(r), r.name) for r in rows]
    gaps = {r.name: gap(r.name, bench) for r in rows}
    return [(choice_label(r) if gaps[r.name] is None else f"⊘ {r.label}: not on this split ({gaps[r.name][0]})",
             r.name) for r in rows]


def methods_line() -> str:
    """Every method but GROM in a line, by kind, in the registry's order: "15 trained
    methods (GA, GradDiff, NPO, SimNPO, ...), 4 closed-form editors (ROME, ...), LUNAR
    (activation redirection)"."""
    kinds: dict[str, list[str]] = {}
    for name in comparator_names():
        kinds.setdefault(ALL[name].kind, []).append(ALL[name].label)
    return ", ".join(f"{len(labels)} {kind}s ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''})"
                     if len(labels) > 1 else f"{labels[0]} ({kind})" for kind, labels in kinds.items())


def glossary(name: str) -> str:
    """The method's glossary line: its label, its kind and what it does and needs."""
    row = ALL.get(str(name or "").strip().lower())
    return "" if row is None else f"**{row.label}** ({row.kind}): {row.description}"


def comparator_label(name: str) -> str:
    return row_of(name).label


def box_values(row: MethodEntry, count, rate) -> dict:
    """The panel's two boxes' values by the row's box names (first: the count, second: the rate)."""
    first, second = row.boxes(None)[:2]
    return {first.name: count, second.name: rate}


def check_request(name: str, bench, count, rate) -> tuple[MethodEntry, float, float]:
    """(the row, count, rate) of a request to run the method `name` on `bench`, each checked
    before any work: the boxes' values as the row takes them, a training within this
    server's GROM_MAX_EPOCHS, what the split lacks for the method (the row's `Reason`), and
    the split within GROM_MAX_EXAMPLES; a `UserError` that says what to change."""
    row = row_of(name)
    try:
        values = row.read_boxes(box_values(row, count, rate))
    except BadSetting as err:
        raise UserError(str(err)) from None
    count, rate = values.values()
    if row.stepwise and count > limit("GROM_MAX_EPOCHS"):
        raise over(row.boxes(None)[0].label, count, "GROM_MAX_EPOCHS")
    missing = can_run(row.name, None, bench) if bench is not None else None
    if missing:
        raise UserError(missing[1])
    if bench is not None:
        check_sizes(bench, row)
    return row, count, rate


def check_sizes(bench, row: MethodEntry) -> None:
    """A method reads the whole forget and retain sets: each within GROM_MAX_EXAMPLES; a
    method that writes alternates (AltPO) trains on that many rows per question, which count
    too (and are as many answers to generate)."""
    method = row.detail
    per_question = int(method.defaults.get("n_alternates", 1)) if getattr(method, "make_alternates", None) else 1
    for what, examples in (("forget", bench.forget), ("retain", bench.retain)):
        n = len(examples) * (per_question if what == "forget" else 1)
        if n > limit("GROM_MAX_EXAMPLES"):
            rows = f" ({per_question} alternates for each of {len(examples)} questions)" if n != len(examples) else ""
            raise over(f"{row.label} reads every {what} example, and {bench.name}/{bench.split} "
                       f"makes {{n}}{rows}", n, "GROM_MAX_EXAMPLES")


def gap(name: str, bench) -> Reason | None:
    """What the method `name` lacks on `bench` at its defaults (None: nothing, or no
    benchmark is loaded): the registry's `Reason` (a few words, the message its run would be
    refused with)."""
    if bench is None:
        return None
    return can_run(row_of(name).name, None, bench)


def unavailable(name: str, bench) -> str | None:
    """Why the method `name` cannot run on `bench` (None: it can), in its refusal's words."""
    missing = gap(name, bench)
    return None if missing is None else missing[1]


def band_note(edit_band, grom_band, n_layers: int) -> str:
    """Why the editors ran on `edit_band` (`editor_band`'s) rather than GROM's band
    (empty where it is GROM's, or there was none)."""
    if not grom_band or tuple(edit_band) == tuple(sorted(grom_band)):
        return ""
    return (f" GROM's band ({min(grom_band)}-{max(grom_band)}) ends at the model's last layer ({n_layers - 1}), "
            "where an editor's value vector at the subject's token reaches no answer token, so the editors "
            f"run on layers {min(edit_band)}-{max(edit_band)} (the upstream editors' band; ROME edits the "
            "last of them): their keys and retain covariance are those layers', not GROM's.")


def key_note(info) -> str:
    """How many of an editor's facts found their subject in the question (their key sits
    on its last token) and how many key on the question's last token instead (empty where
    every fact found it, or the run is not an editor's)."""
    n, on = (info or {}).get("facts"), (info or {}).get("subject_last_keys")
    if not n or on is None or on >= n:
        return ""
    return (f" {n - on} of the {n} facts' questions do not write their subject, so their key is the "
            "question's last token rather than the subject's (as the upstream editors do with no subject).")


def run_comparator(name: str, model, tokenizer, bench, count: float, rate: float, *, band=None, progress=None,
                   part: Part | None = None, between=None):
    """The method's edit of the session's data (an `Edit`; the model is given back as
    found), with the settings its row makes of the panel's two boxes (`count`, `rate`) and
    GROM's band (`band`, for a method that runs there); with `part` (a stepwise run on
    ZeroGPU) that part of its training: a `Paused` record where it stops before the end.
    `between` (`grom.turns`), given to every run: a trained method lends the model out
    between its optimizer steps, an editor between its value steps and layers, LUNAR
    between its activation batches and epochs."""
    row = row_of(name)
    settings = row.settings_for(model, bench, box_values(row, count, rate), band)
    kw = {"part": part} if row.stepwise else {}
    return row.run(model, tokenizer, bench.forget, bench.retain, settings, progress=progress, between=between, **kw)


@on_device(duration=train_call_s)
def train_call(key: ModelKey, bench, name: str, count: float, rate: float, band=None, part: Part | None = None,
               progress=None):
    """`run_comparator` on the resident model `key`, as one compute function: the method's
    Edit (CPU patches of every parameter it changed; the shared model given back as
    found), or with `part` (a trained method on ZeroGPU) that part of its training: a
    `Paused` record where it stops before the end. A split it cannot train on is a
    `UserError` that says so."""
    with DEVICE_LOCK:
        handle = resident(key, "baseline")
        try:
            return run_comparator(name, handle.model, handle.tokenizer, bench, count, rate, band=band,
                                  progress=progress, part=part, between=give_turn)
        except (ValueError, TypeError) as err:  # the data: nothing the baseline can train on
            raise UserError(f"{comparator_label(name)} cannot run on {bench.name}/{bench.split}: {err}.") from err


def train_comparator(key: ModelKey, bench, name: str, count: float, rate: float, band=None, progress=None):
    """The method's Edit on the session's data (`train_call`), `progress` a callback of this
    process. Off ZeroGPU: one call in this process, as it always ran. On ZeroGPU a trained
    method runs as GPU calls that each fit GROM_GPU_SECONDS (`train_plan`), its state
    carried between them in a checkpoint file (components.server.train_parts), its progress
    and Stop relayed from the worker; an editor is one call."""
    if not ON_ZEROGPU or not row_of(name).stepwise:
        return train_call(key, bench, name, count, rate, band, None, device_progress(progress))
    plan = train_plan(key, bench, name, count)
    if plan is None:  # not loaded: the call says so
        return train_call(key, bench, name, count, rate, band, None, None)
    return train_in_calls(lambda part, watch: train_call(key, bench, name, count, rate, band, part, watch),
                          plan, comparator_label(name), progress)


def check_gpu_time(key: ModelKey, bench, name: str, count: float) -> None:
    """On ZeroGPU: refuse, before any work, a training whose single optimizer step (with its
    checkpoint read and written) cannot fit one GPU call. A longer training is split into
    calls (`train_comparator`); its total is bounded by GROM_MAX_EPOCHS x GROM_MAX_EXAMPLES
    (the panel's checks, before this one)."""
    if not ON_ZEROGPU or not row_of(name).stepwise:
        return
    plan = train_plan(key, bench, name, count)
    if plan is not None:
        refuse_over(plan.call_s + plan.step_s, f"One optimizer step of {comparator_label(name)} on "
                    f"{len(bench.forget) + len(bench.retain):,} examples, with its checkpoint,",
                    "a smaller model")
