"""Is it gone? The attack suite (`grom.robustness.run_attacks`) on the session's edit: the
held-out probe questions the edit never saw, asked as they are and transformed
(paraphrase, fill in the blank, reverse, another prompt format, in context, RWKU's
adversarial wrappers), questions written to reach the same facts another way (through
another entity, under another name: `grom.robustness.written`), and attacks on the
weights (relearning, 4- and 8-bit quantization, the logit lens), each scored by fact
recall for the base model and the edited one, the depth score (at which layers the facts
are still recoverable: per-layer activation patching, `grom.robustness.depth`), and the membership attacks (LOSS, zlib,
Min-K, Min-K++: can the forget answers be told from the other subjects' answers by their
likelihood? an AUC, 0.5 = they cannot).

Optionally the baseline set in Compare (a trained method or a closed-form editor, with its
two settings; `components.studio.comparators`) is
trained once and put through the same suite, side by side; its patch is dropped after.
The shared model is given back unedited whatever happens (the suite's promise).

Before a run each attack's label carries its estimated seconds on the session's model and
benchmark, and a line their sum for the ticked ones (`attack_estimates`: the work counted
from the model's size and the probes' tokens, `components.server.durations`, priced at the
pace this host measured, `components.server.pace`), and the device's queue ahead. The
unedited model's side of each attack (its answers to the probe attacks' questions,
relearning's control) is kept on disk between runs (`unedited_side`,
`grom.robustness.kept`), so a second edit's attacks compute the edited side alone, and the
estimates and the pace count only that. Each attack run is timed into that pace. The panel opens
on a quick set (`QUICK`), the rest one click away. While the suite runs, the summary says
what runs, and the progress counts the ticked attacks (each is a call of its own).
"""
from __future__ import annotations

import logging
import math
import threading
import weakref
from contextlib import contextmanager
from types import SimpleNamespace

import gradio as gr
import pandas as pd
import torch

from components.server import pace
from components.server.costs import check_job
from components.server.device import DEVICE_LOCK, device_progress, give_turn, local_progress, on_device
from components.server.durations import AttackInputs, attack_inputs, attack_memory, attack_s, attack_work
from components.server.errors import UserError, ui_errors
from components.server.limits import limit, over
from components.server.memory_budget import BUDGET, budget_bytes
from components.server.session import (
    REGISTRY,
    ModelKey,
    Session,
    current_benchmark,
    current_edit,
    current_model,
    in_turn,
)
from components.studio import cards
from components.studio.comparators import check_gpu_time, check_request, comparator_label, train_comparator
from components.studio.comparison import shared_model
from components.studio.runs import band_text
from components.studio.wiring import LOCAL, Page, device_queue, offer_files
from components.views import plots, text
from components.views.tables import TABLE_LABELS, answers_table_html, download_box, empty_table, title_html
from grom.data.schema import QAExample
from grom.eval.prefix import first_changed_layer
from grom.eval.verdicts import Tally, tally_answers
from grom.model.process_memory import release_memory
from grom.robustness.calibration import DAMAGE_TOLERANCE
from grom.robustness.kept import UneditedSide, unedited_root
from grom.robustness.membership import holdout_of
from grom.robustness.probes import PROBE_TYPES, probes_from_examples, transform
from grom.robustness.suite import (
    NOT_RECALL,
    TEACHER_FORCED,
    WEIGHT_ATTACKS,
    attack_names,
    run_attacks,
    unedited_inputs,
)
from grom.robustness.suite import QUICK as SUITE_QUICK

log = logging.getLogger(__name__)

LABELS = {
    "heldout": "Held-out probes", "paraphrase": "Paraphrase", "cloze": "Fill in the blank",
    "reverse": "Reverse query", "format": "Plain 'Question: Answer:' format", "incontext": "In context",
    "prefix_injection": "Prefix injection", "affirmative_suffix": "Affirmative suffix",
    "role_play": "Role play", "multi_hop": "Multi-hop (through another entity)",
    "alias": "Alias (another name)", "relearn": "Relearning", "quant4": "4-bit quantization",
    "quant8": "8-bit quantization", "logit_lens": "Logit lens (top-1, last layer)",
    "depth": "Depth (share of layers erased; 1 = gone at every layer)",
    "mia": "Membership inference (Min-K AUC; 0.5 = can't tell)",
}
GROM = "GROM"
TRAIN_SHARE = 0.4  # of the progress bar, when a baseline is trained first
QUICK = SUITE_QUICK
"""The attacks ticked when the panel opens: the few that answer "is it gone?" soonest. The
held-out probes (every other attack is read against them), and of the rest the cheap ones
that most often brought recall back above them on SmolLM2's solar system (BENCHMARKS.md,
"every pick through every attack"): a paraphrase, solved questions first (in context), RWKU's
affirmative suffix, and the logit lens (two teacher-forced passes: is the fact still the
model's top choice inside?), and the depth score beside it (at which layers is it still
recoverable? on GROM's edit about two teacher-forced passes, its band's layers alone
patched). On SmolLM2 on a CPU that is about a fifth of the whole suite's
time (bench/attack_times.py); relearning alone, two fine-tunings each scored three times,
is a third of it. The others are one click away (**Every attack**). The written probes
(multi_hop, alias) are cheap but stay out: they exist only for the bundled real-knowledge
subjects (an upload would show them as not run), and at five questions a subject one answer
moves their recall by 0.2."""
START_SUMMARY = "Run an edit, tick the attacks and press **Run the attacks**."
RUNNING = "Running "  # how the summary line begins while the attacks run (`on_attacks_start`)


def attack_choices(seconds: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """(label, name) of every attack; with `seconds`, each label ends with its estimate."""
    seconds = seconds or {}
    return [(LABELS.get(name, name) + (f" · {about(seconds[name])}" if name in seconds else ""), name)
            for name in attack_names("all")]


def about(seconds: float) -> str:
    """An estimate in words: "<1 s", "~25 s", "~4 min"."""
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"~{seconds:.0f} s"
    return f"~{seconds / 60:.0f} min"


def probes_of(bench) -> tuple[tuple, tuple[QAExample, ...]]:
    """(held-out probes, fitted questions) of a benchmark: its eval set "probes" (the
    real-knowledge subjects' held-out half; an upload's rows of split "probe")."""
    held = [ex for ex in (bench.eval_sets or {}).get("probes", ()) if isinstance(ex, QAExample) and ex.fact]
    if not held:
        raise UserError(f"{bench.name}/{bench.split} has no held-out probe questions with a fact: the attacks "
                        "ask questions the edit never saw. Load the real-knowledge benchmark, or upload your own "
                        "file with rows of split 'probe' (question, answer, fact).")
    cap = limit("GROM_MAX_EVAL_EXAMPLES")
    if len(held) > cap:
        raise over("Held-out probes", len(held), "GROM_MAX_EVAL_EXAMPLES")
    fitted = tuple(ex for ex in bench.forget if isinstance(ex, QAExample))
    return probes_from_examples(held), fitted


ESTIMATES: dict = {}
"""(model key, id of the benchmark) -> (the benchmark, its `AttackInputs`, the entries of the
unedited side each attack reads from a kept store, `unedited_inputs`): the tokenized sample
every estimate of that pair reads, measured once (the benchmark is held, so its id stays its
own)."""
MAX_ESTIMATES = 16
_ESTIMATES_LOCK = threading.Lock()  # sessions' events fill it from several threads


def _estimated(handle, bench) -> tuple:
    """`ESTIMATES`' entry for the model and benchmark, made the first time; a UserError where
    the benchmark has no held-out probes (the attacks cannot run: it says what to load)."""
    key = (handle.key, id(bench))
    with _ESTIMATES_LOCK:
        held = ESTIMATES.get(key)
        if held is None or held[0] is not bench:
            probes, fitted = probes_of(bench)
            inputs = attack_inputs(handle.model, handle.tokenizer, probes, fitted,
                                   holdout_of(bench.eval_sets, bench.retain), bench.prompt_format)
            entries = unedited_inputs(handle.model, probes, fitted, bench.prompt_format)
            while len(ESTIMATES) >= MAX_ESTIMATES:
                ESTIMATES.pop(next(iter(ESTIMATES)))
            held = ESTIMATES[key] = (bench, inputs, entries)
    return held


def inputs_of(handle, bench) -> AttackInputs:
    """The attacks' `AttackInputs` on the model and benchmark (tokenized once, kept in
    `ESTIMATES`); a UserError where the benchmark has no held-out probes."""
    return _estimated(handle, bench)[1]


_SIDES: dict = {}
"""(id of a model, the store's folder) -> (a weak reference to the model, its `UneditedSide`):
the unedited side of the attacks kept on disk (`grom.robustness.kept`), one per loaded model
(an unloaded model is not kept alive by it)."""
_SIDES_LOCK = threading.Lock()


def unedited_side(handle, read: bool = False) -> UneditedSide | None:
    """The kept unedited side of `handle`'s model (GROM_UNEDITED_DIR, default
    ~/.cache/grom/unedited): every attack run reads the unedited model's answers and
    relearning's control from it where an earlier run on the same weights left them, and
    writes them there. Its key holds the weights' fingerprint (the cards' own,
    `components.studio.cards`): read: compute it where it is not known yet (under the device
    lock, as an attack run holds it); else None until it is known. None too where the store
    is off (GROM_UNEDITED_DIR=off) or the handle has no torch model."""
    root = unedited_root()
    model = getattr(handle, "model", None)
    if root is None or not isinstance(model, torch.nn.Module):
        return None
    key = (id(model), str(root))
    with _SIDES_LOCK:
        hit = _SIDES.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    fingerprint = cards.weights_fingerprint(model) if read else cards.known_fingerprint(model)
    if fingerprint is None:
        return None
    side = UneditedSide(model, handle.tokenizer, root, fingerprint=fingerprint)
    with _SIDES_LOCK:
        while len(_SIDES) >= MAX_ESTIMATES:
            _SIDES.pop(next(iter(_SIDES)))
        _SIDES[key] = (weakref.ref(model), side)
    return side


def kept_attacks(handle, bench) -> frozenset[str]:
    """The attacks whose unedited side is on disk for the model and benchmark (`unedited_side`):
    a run of them computes only the edited side. Empty where nothing is known (the weights'
    fingerprint is not read yet, the store is off)."""
    side = unedited_side(handle)
    if side is None:
        return frozenset()
    entries = _estimated(handle, bench)[2]
    return frozenset(name for name, wanted in entries.items()
                     if wanted and all(side.holds(kind, what) for kind, what in wanted))


def attack_kind(name: str) -> str:
    """The kind of work an attack is to the host's pace (`components.server.pace`)."""
    return f"attack:{name}"


def attack_estimates(handle, bench, edit=None, first: int | None = None,
                     kept: frozenset[str] | None = None) -> dict[str, float]:
    """{attack: estimated seconds on one edit} on the loaded model, for every attack: its
    work counted (`components.server.durations.attack_work`, on `edit`'s layers where one is
    given: the depth score patches only the layers it changed; the edited side alone where
    the unedited one is kept on disk) and priced at this host's pace now
    (`components.server.pace.seconds`: the model's calibration, the attack's own measured
    pace, the CPU's load); a UserError where the benchmark has no held-out probes. first:
    the edit's first changed layer, where the edit itself is not at hand (a saved run).
    kept: the attacks whose unedited side counts as kept (None: those on disk now,
    `kept_attacks`)."""
    inputs = inputs_of(handle, bench)
    first = changed_from(handle, edit) if first is None else first
    kept = kept_attacks(handle, bench) if kept is None else kept
    return {name: pace.seconds(handle, attack_kind(name), attack_work(inputs, name, first, name in kept),
                               inputs.size)
            for name in attack_names("all")}


def changed_from(handle, edit) -> int:
    """The first layer `edit` changes on the model (0, every layer, without one: the most work)."""
    return 0 if edit is None else first_changed_layer(handle.model, edit)


@contextmanager
def paced(key: ModelKey, bench, name: str, edit=None):
    """Time one attack (`attack_once`) into the host's pace of its kind, its work counted as
    the run will do it (the edited side alone where the unedited one is kept on disk as it
    starts); nothing where the model or its inputs are not at hand: the attack runs all the
    same."""
    handle = REGISTRY.get(key)
    try:
        inputs = inputs_of(handle, bench) if handle is not None else None
    except Exception:  # noqa: BLE001  (no estimate, no record: the run does not depend on it)
        inputs = None
    if inputs is None:
        yield
        return
    work = attack_work(inputs, name, changed_from(handle, edit), name in kept_attacks(handle, bench))
    with pace.timed(handle, attack_kind(name), work, inputs.size):
        yield


@on_device(duration=attack_s)
def attack_once(key: ModelKey, bench, edit, name: str, progress=None) -> dict:
    """{name: AttackResult} of one attack on `edit` (a GPU call of its own on ZeroGPU); a
    visitor's job waiting goes between its steps (`give_turn`: generation batches and
    decoding steps, teacher-forced batches, relearning steps). The unedited model's side is
    read from the kept store where an earlier run left it, and written there (`unedited_side`)."""
    probes, fitted = probes_of(bench)
    holdout = holdout_of(bench.eval_sets, bench.retain)
    with DEVICE_LOCK:
        handle = shared_model(key, "attacks")
        return run_attacks(handle.model, handle.tokenizer, edit, probes, fitted=fitted, holdout=holdout,
                           attacks=(name,), fmt=bench.prompt_format, progress=progress, between=give_turn,
                           kept=unedited_side(handle, read=True))


def compute_attacks(key: ModelKey, bench, grom_edit, names: tuple[str, ...], baseline: tuple | None,
                    progress) -> dict[str, dict]:
    """{method: {attack: AttackResult}} for GROM's edit and, where `baseline` = (method,
    epochs, lr), that baseline trained now on the same data (its patch not kept). One
    compute function per attack and per edit, and one for the training (refused first on
    ZeroGPU where it cannot fit one call), so that each fits ZeroGPU's limit."""
    progress = rising(progress or (lambda *_: None))
    edits = {GROM: grom_edit}
    start = 0.0
    if baseline is not None:
        method, epochs, lr = baseline
        label = comparator_label(method)
        check_gpu_time(key, bench, method, epochs)
        edits[label] = train_comparator(key, bench, method, epochs, lr, grom_edit.band,
                                        local_progress(lambda f, m: progress(TRAIN_SHARE * f, f"{label}: {m}")))
        start = TRAIN_SHARE
    weight = progress_weights(key, bench, names, grom_edit)
    share = (1 - start) / len(edits)
    out: dict[str, dict] = {}
    for i, (method, edit) in enumerate(edits.items()):
        out[method] = {}
        at = start + i * share
        for j, name in enumerate(names):
            # the suite is called one attack at a time, so its own count would say "attack 1/1": the count
            # is made here, of the attacks ticked, and said before each call (on ZeroGPU, where no progress
            # reaches into the GPU call, too)
            message = f"{method}: attack {j + 1}/{len(names)}: {LABELS.get(name, name)}"
            width = share * weight[name]
            progress(at, message)
            step = device_progress(lambda f, _m, at=at, width=width, message=message: progress(
                at + width * f, message))
            with paced(key, bench, name, edit):
                out[method] |= attack_once(key, bench, edit, name, step)
            at += width
    progress(1.0, "attacks done")
    return out


def rising(progress):
    """`progress` that never goes back nor past 1: the attacks' shares are sums of floats, so
    the end of one edit's last attack (0.7000000000000001) may pass the start of the next
    edit's first (0.7) by a rounding."""
    last = [0.0]

    def said(fraction, message=None):
        last[0] = min(1.0, max(last[0], fraction))
        return progress(last[0], message)
    return said


def progress_weights(key: ModelKey, bench, names: tuple[str, ...], edit=None) -> dict[str, float]:
    """Each attack's share of the progress bar: its estimated seconds over the selection's
    (relearning alone is a third of the whole suite), equal shares where there is no
    estimate."""
    handle = REGISTRY.get(key)
    try:
        seconds = attack_estimates(handle, bench, edit) if handle is not None else {}
    except Exception:  # noqa: BLE001  (a bar that moves evenly is no reason to stop the attacks)
        seconds = {}
    total = sum(max(seconds.get(n, 0.0), 0.0) for n in names)
    if total <= 0 or any(n not in seconds for n in names):
        return {n: 1 / len(names) for n in names}
    return {n: max(seconds[n], 0.0) / total for n in names}


def asked(name: str, probes) -> tuple:
    """The questions attack `name` asked, in the order of its answers: the held-out probes as
    they are (the attacks on the weights, the teacher-forced ones), else transformed."""
    return tuple(probes) if name in WEIGHT_ATTACKS + TEACHER_FORCED else transform(probes, name)


def attack_tally(result, questions) -> Tally | None:
    """What the attacked model's answers did with the facts the base model stated under the
    same attack, by the card's rule (`grom.eval.verdicts.tally_answers`: degenerate text
    is broken, not forgotten); None for an attack without answers."""
    n = min(len(questions), len(result.base_answers), len(result.edited_answers))
    if n == 0:
        return None
    return tally_answers([p.fact for p in questions[:n]], result.base_answers[:n], result.edited_answers[:n])


def tally_text(t: Tally | None) -> str:
    """"9 of 12" (forgotten of known), with " · 2 broke" where answers broke; "" for none."""
    if t is None:
        return ""
    return f"{t.forgot} of {t.known}" + (f" · {t.broke} broke" if t.broke else "")


def results_frame(results: dict[str, dict], names: tuple[str, ...], probes=None) -> pd.DataFrame:
    """Rows = attacks, columns = Base (from GROM's run), each method's recall, with the
    held-out `probes` each method's facts forgotten of those the base model stated under
    the attack (`attack_tally`), the probes counted and GROM's seconds."""
    rows = []
    methods = list(results)
    for name in names:
        grom = results[GROM][name]
        row = {"attack": LABELS.get(name, name), "Base": grom.base}
        for method, res in results.items():
            row[method] = res[name].edited
        if probes is not None:
            questions = asked(name, probes) if any(res[name].edited_answers for res in results.values()) else ()
            for method, res in results.items():
                row[f"{method} forgot"] = tally_text(attack_tally(res[name], questions))
        row["probes"] = grom.n
        row["seconds"] = sum(res[name].seconds for res in results.values())
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in ["Base", *methods]:
        frame[col] = frame[col].map(lambda v: "" if v is None or math.isnan(v) else f"{v:.2f}")
    frame["seconds"] = frame["seconds"].map(lambda v: f"{v:.1f}")
    return frame


def summary_md(results: dict[str, dict], names: tuple[str, ...], probes=None) -> str:
    """The verdict in words: held-out recall (with the held-out `probes`, the facts the base
    model stated forgotten and broken, by the card's rule: `attack_tally`), the worst
    attack, relearning's curve."""
    grom = results[GROM]
    parts = []
    if "heldout" in grom:
        h = grom["heldout"]
        t = attack_tally(h, tuple(probes)) if probes is not None else None
        if t is not None and t.known:
            broke = f", {t.broke} broke into degenerate text" if t.broke else ""
            removed = f" (of the {t.known} it stated before, it forgot {t.forgot}, {t.share('forgot'):.0%}{broke})"
        else:
            removed = f" (the edit removed {1 - h.edited / h.base:.0%} of it)" if h.base > 0 else ""
        parts.append(f"On **{h.n} held-out probes** the edit never saw, recall went from **{h.base:.2f}** to "
                     f"**{h.edited:.2f}**{removed}.")
    ran = {k: r for k, r in grom.items() if not math.isnan(r.edited) and k != "heldout" and k not in NOT_RECALL
           and not _written(k)}
    if ran:
        name, worst = max(ran.items(), key=lambda kv: kv[1].edited)
        text = f"Worst attack: **{LABELS.get(name, name)}**, recall **{worst.edited:.2f}** (base {worst.base:.2f})"
        plain = grom["heldout"].edited if "heldout" in grom else math.nan
        if not math.isnan(plain):  # the attacks ask the same probes: above their plain recall is what came back
            text += (f", above the plain probes' {plain:.2f}: it brought back {worst.edited - plain:.2f}"
                     if worst.edited > plain else
                     f", no higher than the plain probes' {plain:.2f}: no attack brought recall back")
        parts.append(text + ".")
    written = [f"{LABELS.get(k, k).split(' (')[0].lower()} {r.base:.2f} → {r.edited:.2f} ({r.n} questions)"
               for k, r in grom.items() if _written(k) and not math.isnan(r.edited)]
    if written:
        parts.append("Questions written to reach the same facts another way (other questions, so read them "
                     f"against their own base): {'; '.join(written)}.")
    if "relearn" in grom:
        parts.append(relearn_md(grom["relearn"]))
    if "depth" in grom:
        parts.append(depth_md(results))
    if "mia" in grom and not math.isnan(grom["mia"].edited):
        parts.append(membership_md(grom["mia"]))
    for name, r in grom.items():
        why = r.details.get("skipped")  # a probe type that could make no probe says why (a string)
        if math.isnan(r.edited) and isinstance(why, str):
            parts.append(f"{LABELS.get(name, name)} not run: {why}.")
    seconds = sum(r.seconds for res in results.values() for r in res.values())
    parts.append(f"{len(names)} attack(s) on {', '.join(results)} in {seconds:.0f} s.")
    return " ".join(parts)


def _written(name: str) -> bool:
    """Whether `name` is a written probe type (multi_hop, alias): its own questions, not
    the held-out probes transformed."""
    return name in PROBE_TYPES and PROBE_TYPES[name].written


def relearn_md(result) -> str:
    """Relearning in words: the lr and whether it was calibrated for this model, the edited
    model's recall per step count, and the unedited model's relearned the same way (the
    control: what the fine-tune alone does to answers nothing was forgotten from)."""
    d = result.details
    curve = lambda values: ", ".join(f"{s} steps {r:.2f}" for s, r in zip(d.get("steps", ()), values))  # noqa: E731
    lr = d.get("lr")
    how = (f"lr {lr:g}, " if lr is not None else "") + (
        "calibrated for this model" if d.get("lr_calibrated") else "not calibrated for this model")
    text = f"Relearning ({how}) on {d.get('n_train', '?')} fitted questions: {curve(d.get('recall', ()))}."
    control = d.get("base_recall")
    if control:
        text += f" The unedited model relearned the same way: {curve(control)}."
        lost = control[0] - min(control)
        if lost > DAMAGE_TOLERANCE:
            text += (f" ⚠ The fine-tune alone cost the unedited model {lost:.2f} of its recall here, so a fall "
                     "in the edit's curve says little; compare the two curves step by step.")
    return text


def membership_md(result) -> str:
    """The membership attacks in words: the fitted forget answers' Min-K AUC against the
    other subjects' answers, base and edited, what its distance from 0.5 means, and the
    held-out probes' AUC."""
    d = result.details
    base, edited = result.base, result.edited
    if abs(edited - 0.5) <= max(0.1, abs(base - 0.5) + 0.05):
        meaning = "about as hard to tell apart as before the edit"
    elif edited < 0.5:
        meaning = ("far below 0.5: the forget answers became conspicuously unlikely, so an attacker who reads "
                   "likelihoods can tell which facts were unlearned")
    else:
        meaning = "far above 0.5: the forget answers are still likelier than comparable facts the model keeps"
    probes = d.get("auc", {}).get("probes", {}).get("min_k")
    tail = (f" On the held-out probes: {probes['base']:.2f} to {probes['edited']:.2f}." if probes else "")
    return (f"Membership inference (Min-K AUC of the {d.get('n_fitted', '?')} fitted forget answers against "
            f"{d.get('n_holdout', '?')} answers the edit did not aim at; 0.5 = cannot tell): **{base:.2f}** "
            f"before, **{edited:.2f}** after the edit, {meaning}.{tail}")


def lens_figure(results: dict[str, dict]):
    if "logit_lens" not in results.get(GROM, {}):
        return plots.empty_figure("Tick the logit lens and run the attacks.")
    d = results[GROM]["logit_lens"].details
    prob = {"Base": d["base_prob"], GROM: d["edited_prob"]}
    for method, res in results.items():
        if method != GROM and "logit_lens" in res:
            prob[method] = res["logit_lens"].details["edited_prob"]
    return plots.plot_logit_lens(d["layers"], prob, d.get("band", ()), d.get("first_changed_layer"))


def depth_figure(results: dict[str, dict]):
    """The depth score's erased share per layer, one line per method attacked (GROM first)."""
    if "depth" not in results.get(GROM, {}):
        return plots.empty_figure("Tick the depth score and run the attacks.")
    d = results[GROM]["depth"].details
    share = {m: res["depth"].details["erased_share"] for m, res in results.items() if "depth" in res}
    return plots.plot_depth(d["layers"], share, d.get("band", ()), d.get("first_changed_layer"),
                            with_retain=d.get("measure") == "uds")


def depth_md(results: dict[str, dict]) -> str:
    """The depth score in words: what it measured (UDS with a retain model, else the depth
    against the edit's own output), each method's value, and where GROM's facts are still
    recoverable."""
    grom = results[GROM]["depth"]
    d = grom.details
    layers, share = d.get("layers", []), d.get("erased_share", [])
    kept = [layer for layer, v in zip(layers, share) if v is not None and v < 0.5]
    values = "; ".join(f"{m} **{res['depth'].edited:.2f}**" for m, res in results.items()
                       if "depth" in res and not math.isnan(res["depth"].edited))
    if d.get("measure") == "uds":
        what = ("Depth (the Unlearning Depth Score: each layer's states patched into the unedited model, against "
                "a retain model's; 1 = erased wherever the retain model lacks the fact)")
    else:
        what = ("Depth (each layer's states patched into the unedited model, against the edit's own fall at the "
                "output; no retain model here, so this is not UDS; 1 = gone at every layer)")
    if not values:
        return f"{what}: the edit did not lower the probes' facts by more than {d.get('threshold', 0.05)} nats."
    where = (f" The unedited model reads most of GROM's forgotten facts back from the states of {len(kept)} of "
             f"{len(layers)} layers ({band_text(kept)})." if kept else "")
    return f"{what}: {values}.{where}"


def answers_html(session: Session, row: int) -> str:
    """The questions and answers behind one row of the table (the attack's probes)."""
    held = session.extra.get("attacks")
    if held is None:
        return ""
    _, results, names, probes = held
    if not 0 <= row < len(names):
        return ""
    name = names[row]
    grom = results[GROM][name]
    questions = asked(name, probes)
    if name == "mia":
        return membership_html(results)
    if name in TEACHER_FORCED or not grom.edited_answers:
        return title_html(f'{LABELS.get(name, name)}: '
                          f'{grom.details.get("note", "no answers to show (teacher-forced)")}')
    methods = list(results)
    rows = []
    for i, probe in enumerate(questions[:len(grom.edited_answers)]):
        cells = [probe.question, probe.fact, grom.base_answers[i] if i < len(grom.base_answers) else ""]
        cells += [results[m][name].edited_answers[i] if i < len(results[m][name].edited_answers) else ""
                  for m in methods]
        rows.append(cells)
    return answers_table_html(f"{LABELS.get(name, name)}: the {len(rows)} questions asked and every answer",
                              ["question", "fact", "Base", *methods], rows, width=300)


def membership_html(results: dict[str, dict]) -> str:
    """Every membership attack's AUC, per side (fitted forget answers, held-out probes) and
    method: the table behind the membership row."""
    methods = [m for m in results if "mia" in results[m] and results[m]["mia"].details.get("auc")]
    if not methods:
        why = results.get(GROM, {}).get("mia")
        note = why.details.get("skipped", "") if why is not None else ""
        return title_html(f"Membership inference: not run. {note}")
    auc = results[GROM]["mia"].details["auc"]
    rows = []
    for side, label in (("fitted", "fitted forget"), ("probes", "held-out probes")):
        for attack, cell in auc.get(side, {}).items():
            vals = [cell["base"]] + [results[m]["mia"].details["auc"].get(side, {}).get(attack, {}).get("edited",
                                                                                                    math.nan)
                                     for m in methods]
            rows.append([label, attack, *(f"{v:.3f}" for v in vals)])
    return answers_table_html("Membership inference: ROC AUC of the forget answers against answers the edit did "
                              "not aim at (0.5: the attack cannot tell them apart; below: the forget answers are "
                              "less likely)", ["answers", "attack", "Base", *methods], rows)


def _baseline_settings(with_baseline: bool, method, epochs, lr, bench=None) -> tuple | None:
    """(name, count, rate) of the baseline attacked beside GROM, as Compare's boxes hold them,
    checked as Compare checks them (`check_request`); None without one."""
    if not with_baseline:
        return None
    try:
        row, count, rate = check_request(method, bench, epochs, lr)
    except UserError as err:
        raise UserError(f"{err} (The baseline is Compare's: set it there.)") from None
    return row.name, count, rate


def check_data(tokenizer, bench, with_baseline: bool) -> None:
    """The attacks read the forget set (the fitted questions), the held-out probes and the
    holdout side of the membership test; a baseline trained for them, the retain set too:
    within the token limits (`components.server.costs`), before any work."""
    sets = {"forget": bench.forget, "probes": (bench.eval_sets or {}).get("probes", ()),
            "holdout": holdout_of(bench.eval_sets, bench.retain)}
    if with_baseline:
        sets["retain"] = bench.retain
    check_job(tokenizer, "These attacks", sets, "Choose a smaller split (fewer forget rows or probes).")


@ui_errors
def on_run_attacks(attacks: list[str], with_baseline: bool, method: str, epochs: float, lr: float,
                   session: Session, progress=gr.Progress()):
    """Run the chosen attacks on the session's edit (and the Compare tab's baseline)."""
    handle = current_model(session)
    bench = current_benchmark(session)
    edit = current_edit(session)
    names = chosen(attacks)
    probes, _ = probes_of(bench)  # checked here, before any work
    baseline = _baseline_settings(with_baseline, method, epochs, lr, bench)
    check_data(handle.tokenizer, bench, baseline is not None)
    held = attack_memory(handle.key, bench, names, baseline)
    with BUDGET.reserved(held, "the attack suite", handle.key.device):  # held between its turns
        results = compute_attacks(handle.key, bench, edit, names, baseline,
                                  local_progress(lambda f, m: progress(f, desc=m)))
    session.extra["attacks"] = (edit, results, names, probes)
    release_memory()
    frame = results_frame(results, names, probes)
    shown = [n for n in names if n not in NOT_RECALL]  # the plot's axis is recall, not an AUC or a depth
    recall = {"Base": [results[GROM][n].base for n in shown]}
    recall |= {m: [res[n].edited for n in shown] for m, res in results.items()}
    figure = plots.plot_attacks([LABELS.get(n, n) for n in shown], recall)
    return (summary_md(results, names, probes), frame, figure, lens_figure(results), depth_figure(results),
            answers_html(session, 0))


def chosen(attacks) -> tuple[str, ...]:
    """The ticked attacks in the suite's order; none ticked is refused (it once meant all
    fourteen, minutes of work nobody asked for)."""
    if not attacks:
        raise UserError("Tick at least one attack (**Quick set** ticks the quick ones), then press "
                        "**Run the attacks**.")
    try:
        return attack_names(list(attacks))
    except ValueError as err:
        raise UserError(str(err)) from None


def estimate_md(names, seconds: dict[str, float], n_probes: int, with_baseline: bool,
                second: dict[str, float] | None = None, kept: frozenset[str] = frozenset()) -> str:
    """The line under the attacks: the ticked ones' estimated time in all, what it is
    counted from, which of them find the unedited model's side kept from an earlier run
    (`kept`), and what a baseline adds (`second`: the seconds on a second edit, the unedited
    side then kept by the first; the first's where not given)."""
    if not names:
        return "No attack ticked: tick some, or press **Quick set**."
    total = sum(seconds.get(n, 0.0) for n in names)
    text = (f"The {len(names)} ticked attack(s) take about **{about(total).lstrip('~')}** on GROM's edit here "
            f"(each attack's estimate is beside its name: its work from the model's size and the {n_probes} "
            "held-out probes, at the pace this server measured, its load now included).")
    reused = [n for n in names if n in kept]
    if reused:
        text += (f" The unedited model's side of {len(reused)} of them (its answers, relearning's control) is "
                 "kept from an earlier run on these weights: only the edited side runs.")
    if with_baseline:
        more = sum((second or seconds).get(n, 0.0) for n in names)
        text += f" With the baseline: {about(total + more)} for the two edits, and its training first."
    return text + pace.queue_words()


def edit_of(session: Session):
    """The session's edit where it has one for its model (what the estimates are counted on),
    else None (counted on every layer)."""
    try:
        return current_edit(session)
    except UserError:
        return None


def attack_view(attacks, with_baseline: bool, session: Session):
    """(the attacks' choices, labelled with their estimates, the ticked ones kept; the
    estimate line) for the session's model and benchmark; plain labels and a line that says
    what is missing where no estimate can be made (no model, no benchmark, no probes)."""
    names = [n for n in attack_names("all") if n in set(attacks or ())]
    try:
        handle, bench = current_model(session), current_benchmark(session)
        edit = edit_of(session)
        kept = kept_attacks(handle, bench)
        seconds = attack_estimates(handle, bench, edit, kept=kept)
        second = (attack_estimates(handle, bench, edit, kept=frozenset(names))
                  if with_baseline and unedited_root() is not None else None)
        n_probes = len(probes_of(bench)[0])
    except UserError as err:
        return gr.CheckboxGroup(choices=attack_choices(), value=names), f"No estimate: {err}"
    except Exception:  # noqa: BLE001  (an estimate is a courtesy: the attacks still run without one)
        log.warning("no attack estimate for %s", session, exc_info=True)
        return gr.CheckboxGroup(choices=attack_choices(), value=names), "No estimate could be made for this data."
    held = held_md(attack_memory(handle.key, bench, names, None), handle.key.device)
    return (gr.CheckboxGroup(choices=attack_choices(seconds), value=names),
            estimate_md(names, seconds, n_probes, with_baseline, second, kept) + held)


def held_md(held: int, device: str) -> str:
    """What the ticked attacks hold between their turns, against what jobs may hold at once."""
    if not held:
        return ""
    return (f" They hold up to about {held / 2**30:.1f} GB between their turns on the device (relearning trains "
            f"every weight; the 4- and 8-bit attacks keep a quantized copy), of the "
            f"{budget_bytes(device) / 2**30:.1f} GB this server lets its jobs hold at once (GROM_JOBS_MEMORY_MB).")


@ui_errors
def on_attack_estimates(attacks, with_baseline: bool, session: Session):
    """After a model, a benchmark or an edit: the attacks' labels and the estimate line."""
    return attack_view(attacks, with_baseline, session)


@ui_errors
def on_attack_total(attacks, with_baseline: bool, session: Session) -> str:
    """After the ticks change: the estimate line of the new selection (cached estimates:
    nothing is tokenized again)."""
    return attack_view(attacks, with_baseline, session)[1]


def on_quick_set() -> list[str]:
    return [n for n in attack_names("all") if n in QUICK]


def on_every_attack() -> list[str]:
    return list(attack_names("all"))


def on_attacks_start(attacks, with_baseline: bool, session: Session) -> str:
    """The summary line as the run starts (beside the run, which then shows its progress
    there): what runs and about how long; or, where the run cannot start, why (the run's
    own error says so too)."""
    try:
        current_edit(session)
        bench = current_benchmark(session)
        names = chosen(attacks)
        probes_of(bench)
    except UserError as err:
        return f"Not run: {err}"
    try:
        handle, edit = current_model(session), edit_of(session)
        total = sum(attack_estimates(handle, bench, edit).get(n, 0.0) for n in names)
        if with_baseline:  # the baseline's edit finds the unedited side GROM's run keeps (where the store is on)
            again = frozenset(names) if unedited_root() is not None else None
            total += sum(attack_estimates(handle, bench, edit, kept=again).get(n, 0.0) for n in names)
        took = f", about {about(total).lstrip('~')}"
    except Exception:  # noqa: BLE001  (the run says what it does without a time)
        took = ""
    who = "GROM's edit and the baseline set in Compare (trained first)" if with_baseline else "GROM's edit"
    return (f"{RUNNING}{len(names)} attack(s) on {who}{took}: {', '.join(LABELS.get(n, n) for n in names)}. "
            f"The bar counts them; **Stop** ends the run at its next step.{pace.queue_words()}")


def on_attacks_stopped(summary: str):
    """Stop pressed: a "Running ..." line says the run stopped; a finished run's verdict stays."""
    if not str(summary or "").startswith(RUNNING):
        return gr.skip()
    return "Stopped: the model is left unedited. Press **Run the attacks** to run them again."


def on_attacks_failed(summary: str):
    """The run failed: a "Running ..." line says so (the error's own message says why)."""
    if not str(summary or "").startswith(RUNNING):
        return gr.skip()
    return "The attacks did not finish (the message at the top of the page says why); the model is left unedited."


def on_attack_select(evt: gr.SelectData, session: Session) -> str:
    row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    return answers_html(session, int(row))


def build_attack_panel() -> SimpleNamespace:
    text.md(text.ATTACKS, elem_classes="panel-intro")
    attacks = gr.CheckboxGroup(attack_choices(), value=on_quick_set(), label="Attacks", elem_id="attack-choices")
    with gr.Row(equal_height=True):
        estimate = gr.Markdown("Load a model and a benchmark with held-out probes to see how long the attacks take.",
                               elem_id="attack-estimate")
        quick = gr.Button("Quick set", size="sm", scale=0, min_width=100, elem_id="attack-quick")
        every = gr.Button("Every attack", size="sm", scale=0, min_width=110, elem_id="attack-every")
    with gr.Row(equal_height=True):
        with_baseline = gr.Checkbox(value=False, label="also the baseline set in Compare (trained here first)",
                                    scale=3)
        run = gr.Button("Run the attacks", variant="primary", scale=1, min_width=160, elem_id="attack-run")
        stop = gr.Button("Stop", variant="stop", scale=0, min_width=80, elem_id="attack-stop")
    summary = gr.Markdown(START_SUMMARY, elem_id="attack-summary")
    table = gr.Dataframe(empty_table("attacks"), label=TABLE_LABELS["attacks"],
                         interactive=False, wrap=True, elem_id="attack-table")
    files = download_box("the attack table")
    plot = gr.Plot(plots.empty_figure("Run the attacks to see recall per attack."), show_label=False)
    # one under the other: side by side, half the column each, their layer axes are too narrow to read
    lens = gr.Plot(plots.empty_figure("Tick the logit lens and run the attacks."), show_label=False)
    depth = gr.Plot(plots.empty_figure("Tick the depth score and run the attacks."), show_label=False)
    answers = gr.HTML(elem_id="attack-answers")
    return SimpleNamespace(attacks=attacks, estimate=estimate, quick=quick, every=every, with_baseline=with_baseline,
                           run=run, stop=stop, summary=summary, table=table, files=files, plot=plot, lens=lens,
                           depth=depth, answers=answers)


def wire(k: SimpleNamespace, page: Page) -> None:
    """The ticks and their estimate, Run the attacks (public `attacks`; sets `page.attacked`)
    and Stop, a row's answers; a new model, benchmark, edit or run: the estimates again."""
    s, bl = page.session, page.ui.baseline
    estimates = ([k.attacks, k.with_baseline, s], [k.attacks, k.estimate])  # each attack's ~seconds, the total
    for done in (page.model_loaded, page.data_loaded, page.edit_run, *page.run_opened, page.run_imported):
        done.success(on_attack_estimates, *estimates, **LOCAL)
    for trigger in (k.attacks.change, k.with_baseline.change):  # the ticks changed: the total again
        trigger(on_attack_total, estimates[0], k.estimate, **LOCAL)
    k.quick.click(on_quick_set, None, k.attacks, **LOCAL)
    k.every.click(on_every_attack, None, k.attacks, **LOCAL)
    k.run.click(on_attacks_start, estimates[0], k.summary, **LOCAL)  # what runs, at once
    attacked = k.run.click(in_turn(on_run_attacks), [k.attacks, k.with_baseline, bl.method, bl.epochs, bl.lr, s],
                           [k.summary, k.table, k.plot, k.lens, k.depth, k.answers], api_name="attacks",
                           show_progress_on=[k.summary], **device_queue())
    # Stop: the running suite ends at its next forward pass (components.server.device), the model unedited
    attacked.failure(on_attacks_failed, k.summary, k.summary, **LOCAL)  # a "Running ..." line says it did not finish
    k.stop.click(on_attacks_stopped, k.summary, k.summary, cancels=[attacked], **LOCAL)
    k.table.select(on_attack_select, s, k.answers, **LOCAL)
    offer_files(k.table, k.files, "attacks")
    page.attacked = attacked
