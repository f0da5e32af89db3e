"""The attack suite: every probe type and every attack on the weights for one edit, each
scored by fact recall on the held-out probes for the base model and the edited one.

    results = run_attacks(model, tokenizer, edit, probes, fitted=bench.forget)
    results["paraphrase"].edited   # recall of the edited model on the paraphrased probes

Names: the probe types of `grom.robustness.probes` (heldout, paraphrase, cloze, reverse,
format, incontext, prefix_injection, affirmative_suffix, role_play, and the written ones:
multi_hop, alias, asked from the hand-written probes of the subjects the held-out probes are
about, `grom.robustness.written`), then the attacks on
the weights of `grom.robustness.weights` (relearn, quant4, quant8, logit_lens), the depth
score (depth, `grom.robustness.depth`: per-layer activation patching, UDS with a retain
model), then the membership attacks (mia, `grom.robustness.membership`: AUCs, not recall);
"quick" names
the cheap set `QUICK`. An unknown name is refused before any work, with the list of names. The model is left as it was
found (unedited) whatever happens: an attack that raises with the edit applied still
reverts it.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from torch import nn

from grom.data.prompts import PromptFormat
from grom.data.schema import QAExample
from grom.edit import check_patchable
from grom.model.arch import loaded_from
from grom.robustness import weights
from grom.robustness.calibration import relearn_lr
from grom.robustness.depth import depth_attack
from grom.robustness.kept import UneditedSide
from grom.robustness.membership import membership_attack
from grom.robustness.probes import PROBE_TYPES, probes_from_examples, transform
from grom.robustness.relearn import RELEARN_BATCH, RELEARN_STEPS
from grom.robustness.result import AttackResult, BelowTheEdit, Probe, Recall, probe_recall, probe_recalls
from grom.turns import Between, Held, give, inside

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """What every attack is given."""

    model: nn.Module
    tokenizer: object
    edit: object  # a grom.edit.Edit
    probes: tuple[Probe, ...]
    fitted: tuple[QAExample, ...]
    fmt: PromptFormat | None
    holdout: tuple = ()
    between: Between | None = None  # the suite's step boundary, the model unedited there
    reference: nn.Module | None = None  # a retain model (never saw the forget set), for UDS
    kept: UneditedSide | None = None
    """The unedited model's results kept on disk (`grom.robustness.kept`): read where they are,
    written where they are computed; None: every result computed here."""
    measured: dict = field(default_factory=dict)
    """The recalls this run has measured, by what they depend on (`_asked`): a generation
    the suite would run twice (the held-out probes' attack, then relearning's step 0) runs once."""

    def score(self, model: nn.Module, between: Between | None = None) -> Recall:
        """The held-out probes' fact recall of `model` as it is now (`ScoreFn`); `between`
        the caller's, whose as_found undoes what it holds the model in."""
        return probe_recall(model, self.tokenizer, self.probes, fmt=self.fmt, between=between)

    def recall(self, asked: Sequence[Probe], fmt: PromptFormat | None, edited: bool,
               below: BelowTheEdit | None = None) -> Recall:
        """The recall of `asked` in `fmt` by the unedited model, or with the edit applied
        (which a turn reverts and applies again); measured once per run. below: the
        unedited model records the layers below the edit, the edited one replays them."""
        key = _asked(asked, fmt, edited)
        if key not in self.measured and not edited:
            self._read_kept([key])
        if key not in self.measured:
            reuse = None if below is None else below.replaying if edited else below.recording
            with Held((lambda: self.edit.applied(self.model)) if edited else None, reuse) as held:
                self.measured[key] = probe_recall(self.model, self.tokenizer, asked, fmt=fmt,
                                                  between=inside(self.between, held.left))
            if not edited and self.kept is not None:
                self.kept.keep("probe_recall", _what(key), [self.measured[key]])
        return self.measured[key]

    def _read_kept(self, keys: Sequence[tuple]) -> None:
        """The unedited recalls of `keys` (`_asked`) read into `measured` where `kept` has them."""
        for key in keys:
            if self.kept is not None and key not in self.measured:
                found = self.kept.recalls("probe_recall", _what(key))
                if found:
                    self.measured[key] = found[0]

    def answer_ahead(self, names: Sequence[str], progress: Callable[[float, str], None]) -> dict[str, int]:
        """The recalls the probe attacks `names` will ask for (`recall`), measured now for
        all of them together: the unedited model's answers to every attack's questions in
        one decoding run per prompt format (recording the layers below the edit), then the
        edited model's in one (replaying them), instead of two runs per attack. The same
        answers as each attack's own runs, up to the float rounding of a wider batch.
        {attack: questions it asks}, for the attacks it answered."""
        wanted = {n: (transform(self.probes, n), PROBE_TYPES[n].fmt or self.fmt) for n in names}
        self._read_kept([_asked(asked, fmt, False) for asked, fmt in wanted.values() if asked])
        wanted = {n: (asked, fmt) for n, (asked, fmt) in wanted.items()
                  if asked and _asked(asked, fmt, True) not in self.measured}
        formats: list = []
        for _, fmt in wanted.values():
            if fmt not in formats:
                formats.append(fmt)
        total = 2 * sum(len(a) for a, _ in wanted.values())
        done = [0]
        below = BelowTheEdit(self.model, self.edit)
        for edited in (False, True):
            for fmt in formats:
                groups = list(dict.fromkeys(asked for asked, f in wanted.values() if f == fmt))
                fresh = [g for g in groups if _asked(g, fmt, edited) not in self.measured]
                if not fresh:
                    continue
                give(self.between)
                n0 = done[0]

                def say() -> None:
                    progress(done[0] / total, f"answering the questions of {len(wanted)} attacks together: "
                                              f"{done[0]} of {total}")

                def step(finished: int, _n: int, n0=n0) -> None:  # said when another answer is finished
                    if n0 + finished > done[0]:
                        done[0] = n0 + finished
                        say()
                say()
                reuse = below.replaying if edited else below.recording
                with Held((lambda: self.edit.applied(self.model)) if edited else None, reuse) as held:
                    recalls = probe_recalls(self.model, self.tokenizer, fresh, fmt=fmt,
                                            between=inside(self.between, held.left), on_step=step)
                for g, r in zip(fresh, recalls):
                    self.measured[_asked(g, fmt, edited)] = r
                    if not edited and self.kept is not None:
                        self.kept.keep("probe_recall", _what(_asked(g, fmt, edited)), [r])
                done[0] = n0 + sum(len(g) for g in fresh)
        return {n: len(asked) for n, (asked, _) in wanted.items()}

    def known(self, edited: bool) -> Recall | None:
        """The held-out probes' recall (`score`) of the unedited or the edited model, where
        this run has measured it already; else None."""
        return self.measured.get(_asked(self.probes, self.fmt, edited))


def _asked(probes: Sequence[Probe], fmt: PromptFormat | None, edited: bool) -> tuple:
    """What a recall depends on: each probe's question (asked), answer (the generation's
    budget) and fact (the hit), the prompt format, and whether the edit is applied."""
    return tuple((p.question, p.answer, p.fact) for p in probes), fmt, edited


def _what(asked: tuple) -> list:
    """An `_asked` key as the unedited side's store reads it (JSON: the format by its repr)."""
    probes, fmt, edited = asked
    return [[list(p) for p in probes], repr(fmt), edited]


def _control_what(fitted: Sequence[QAExample], probes: Sequence[Probe], fmt: PromptFormat | None, lr: float) -> dict:
    """What relearning's control depends on, as the unedited side's store reads it: the data
    it trains on, the probes it is scored on and its settings."""
    return {"train": [repr(ex) for ex in fitted], "probes": _what(_asked(probes, fmt, False)),
            "lr": lr, "steps": list(RELEARN_STEPS), "batch_size": RELEARN_BATCH, "seed": 0}


def unedited_inputs(model: nn.Module, probes: Sequence[Probe], fitted: Sequence[QAExample] = (),
                    fmt: PromptFormat | None = None,
                    attacks: str | Sequence[str] = "all") -> dict[str, list[tuple[str, object]]]:
    """{attack: [(kind, what)]}: for each attack of `attacks` whose unedited side a kept store
    (`UneditedSide`) can hold, the entries `run_attacks(kept=...)` would read for it on
    `model` (the unedited answers to a probe attack's questions; relearning's control). With
    `UneditedSide.holds`, what tells a caller ahead of a run which attacks will find their
    unedited half on disk (an estimate of the run's time, say)."""
    probes = tuple(probes)
    out: dict[str, list[tuple[str, object]]] = {}
    for name in attack_names(attacks):
        if name in PROBE_TYPES:
            asked = transform(probes, name)
            if asked:
                out[name] = [("probe_recall", _what(_asked(asked, PROBE_TYPES[name].fmt or fmt, False)))]
        elif name == "relearn" and fitted:
            out[name] = [("relearn_control", _control_what(tuple(fitted), probes, fmt, relearn_lr(model).lr))]
    return out


def _probe_attack(name: str) -> Callable[[Context], AttackResult]:
    written = PROBE_TYPES[name].written

    def run(ctx: Context) -> AttackResult:
        asked = transform(ctx.probes, name)
        fmt = PROBE_TYPES[name].fmt or ctx.fmt
        if not asked:  # e.g. a reverse query where no probe has a subject
            why = (f"no written {name} probes for what the probes are about (the bundled real-knowledge "
                   "subjects have them)" if written else f"no probe could be made into a {name} probe")
            return AttackResult(name, math.nan, math.nan, 0.0, 0, details={"skipped": why})
        below = BelowTheEdit(ctx.model, ctx.edit)
        base = ctx.recall(asked, fmt, edited=False, below=below)
        give(ctx.between)
        edited = ctx.recall(asked, fmt, edited=True, below=below)
        if written:
            details = {"by_reach": by_reach(asked, base, edited, ctx.fitted, ctx.probes)}
        else:
            details = {"left_out": len(ctx.probes) - len(asked)} if len(asked) < len(ctx.probes) else {}
        return AttackResult(name, base.value, edited.value, 0.0, len(asked), base.answers, edited.answers,
                            details=details)
    return run


def by_reach(asked: Sequence[Probe], base: Recall, edited: Recall, fitted: Sequence[QAExample],
             probes: Sequence[Probe]) -> dict[str, dict]:
    """Written probes' recall by where the fact they reach lies: "fitted" (a QA pair the
    edit was fitted on: is a fitted fact back by another road?), "heldout" (one of the
    held-out probes), "other" (neither, or linked to none): {side: {"n", "base",
    "edited"}} for the sides that have probes."""
    fitted_ids = {ex.id for ex in fitted}
    heldout_ids = {p.id for p in probes}
    side = ["fitted" if p.reaches in fitted_ids else "heldout" if p.reaches in heldout_ids else "other"
            for p in asked]
    out = {}
    for name in ("fitted", "heldout", "other"):
        idx = [i for i, s in enumerate(side) if s == name]
        if idx:
            out[name] = {"n": len(idx), "base": sum(base.hits[i] for i in idx) / len(idx),
                         "edited": sum(edited.hits[i] for i in idx) / len(idx)}
    return out


def _weights(fn: str):
    """The function `fn` of grom.robustness.weights, read at call time (a test puts a
    stand-in module of the same signatures in `weights`' place)."""
    return getattr(weights, fn)


def _relearn(ctx: Context) -> AttackResult:
    """At the model family's calibrated lr (`grom.robustness.calibration.relearn_lr`), with
    the unedited model relearned the same way as the control (its base). Both runs start
    from the held-out probes' recall where the suite measured it already (its heldout attack)."""
    from_model = relearn_lr(ctx.model)
    control = None
    if ctx.kept is not None:  # the control does not depend on the edit: kept between runs
        what = _control_what(ctx.fitted, ctx.probes, ctx.fmt, from_model.lr)
        control = ctx.kept.recalls("relearn_control", what)
        if control is None:
            control = _weights("relearn_control")(ctx.model, ctx.tokenizer, ctx.fitted, ctx.score, lr=from_model.lr,
                                                  fmt=ctx.fmt, between=ctx.between, start=ctx.known(edited=False))
            ctx.kept.keep("relearn_control", what, control)
        give(ctx.between)
    res = _weights("relearn_attack")(ctx.model, ctx.tokenizer, ctx.edit, ctx.fitted, ctx.score, lr=from_model.lr,
                                     fmt=ctx.fmt, relearn_base=True, between=ctx.between,
                                     start=(ctx.known(edited=False), ctx.known(edited=True)), control=control)
    return replace(res, details={**res.details, "lr_why": from_model.why, "lr_calibrated": from_model.calibrated})


def _quant(bits: int) -> Callable[[Context], AttackResult]:
    def run(ctx: Context) -> AttackResult:
        return _weights("quantization_attack")(ctx.model, ctx.tokenizer, ctx.edit, ctx.score, bits=bits,
                                               between=ctx.between)
    return run


def _logit_lens(ctx: Context) -> AttackResult:
    return _weights("logit_lens_attack")(ctx.model, ctx.tokenizer, ctx.edit, ctx.probes, fmt=ctx.fmt,
                                         between=ctx.between)


def _depth(ctx: Context) -> AttackResult:
    return depth_attack(ctx.model, ctx.tokenizer, ctx.edit, ctx.probes, fitted=probes_from_examples(ctx.fitted),
                        reference=ctx.reference, fmt=ctx.fmt, between=ctx.between)


def _membership(ctx: Context) -> AttackResult:
    return membership_attack(ctx.model, ctx.tokenizer, ctx.edit, ctx.fitted, ctx.probes, ctx.holdout, fmt=ctx.fmt,
                             between=ctx.between)


ATTACKS: dict[str, Callable[[Context], AttackResult]] = {
    **{name: _probe_attack(name) for name in PROBE_TYPES},
    "relearn": _relearn, "quant4": _quant(4), "quant8": _quant(8), "logit_lens": _logit_lens,
    "depth": _depth, "mia": _membership,
}
WEIGHT_ATTACKS = ("relearn", "quant4", "quant8", "logit_lens")
TEACHER_FORCED = ("logit_lens", "depth", "mia")
"""The attacks that read likelihoods, not generated answers (no answers to show)."""
AUC_ATTACKS = ("mia",)
"""The attacks whose `base`/`edited` are an AUC (0.5: cannot tell), not a recall."""
NOT_RECALL = ("depth", *AUC_ATTACKS)
"""The attacks whose `base`/`edited` are not a recall: the depth score (0 to 1, higher: the
fact erased deeper) and the AUCs."""
QUICK = ("heldout", "paraphrase", "incontext", "affirmative_suffix", "logit_lens", "depth")
"""`attacks="quick"`: the held-out probes (every other attack is read against them), the
cheap attacks that most often raised recall above them (BENCHMARKS.md, "Is it gone?"), and
the depth score beside the logit lens (on a GROM edit its band's layers alone are patched):
about a fifth of the whole suite's time on SmolLM2."""


def _short_name(name: str) -> str:
    """A model's name without its folder or Hub owner, lower case: "HuggingFaceTB/SmolLM2-135M"
    and "/models/smollm2-135m" are both "smollm2-135m"."""
    return Path(str(name).rstrip("/\\")).name.lower()


def check_edit_fits(model: nn.Module, edit) -> None:
    """That `edit` was made for `model`: the model name its edit.json records (when it
    records one) names the same model, every patch has a weight of its shape, and that
    weight can take it (`grom.model.editable`: not quantized, not offloaded). A ValueError that
    says which, before anything is run."""
    loaded = loaded_from(model)
    if edit.model_name and loaded and _short_name(edit.model_name) != _short_name(loaded):
        raise ValueError(f"this edit was made for the model {edit.model_name!r}, and {loaded!r} is loaded: "
                         "give the model it was made for (--model)")
    check_patchable(model, edit.patches)  # quantized (a packed shape) or offloaded: said as such
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    held = edit.held  # shapes only: no factored patch expanded
    for name in held:
        W, shape = params.get(name), tuple(held.shape(name))
        if W is None:
            raise ValueError(f"this edit patches {name}, which the model has not: it was made for another model")
        if W is not None and tuple(W.shape) != shape:
            raise ValueError(f"this edit's patch for {name} has shape {shape}, the model's weight "
                             f"{tuple(W.shape)}: it was made for another model")


def attack_names(attacks: str | Sequence[str] = "all") -> tuple[str, ...]:
    """The attacks to run, in the suite's order: "all", "quick" (`QUICK`), or names (a
    comma list or a sequence, "quick" among them); an unknown name is a ValueError that
    lists the names."""
    if isinstance(attacks, str):
        attacks = [a.strip() for a in attacks.split(",") if a.strip()]
    everything = list(attacks) in (["all"], [])
    wanted = list(ATTACKS) if everything else [n for a in attacks for n in (QUICK if a == "quick" else (a,))]
    unknown = [a for a in wanted if a not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown attack {unknown[0]!r}; the attacks: all, {', '.join(ATTACKS)}, or quick "
                         f"({', '.join(QUICK)})")
    return tuple(a for a in ATTACKS if a in wanted)


def run_attacks(model: nn.Module, tokenizer, edit, probes: Sequence[Probe], *,
                fitted: Sequence[QAExample] = (), holdout: Sequence = (),
                attacks: str | Sequence[str] = "all", fmt: PromptFormat | None = None,
                progress: Callable[[float, str], None] | None = None,
                between: Between | None = None, reference: nn.Module | None = None,
                kept: UneditedSide | None = None) -> dict[str, AttackResult]:
    """Each attack of `attacks` on `edit` (a grom.edit.Edit of `model`), by name, in the
    suite's order. probes: the held-out probes (never fitted); fitted: the questions the
    edit was fitted on (relearning trains on a part of them; the membership attacks score
    them); holdout: answers of the same kind the edit neither fitted nor aimed at (the
    membership attacks' other side; without them "all" reports mia as skipped, and "mia"
    asked by name is refused); fmt: the prompt format
    (None: the chat template). `progress(fraction, message)` before each attack and at the
    end. Each result's `seconds` is that attack's wall time; the probe attacks (`PROBE_TYPES`)
    answer their questions together first (`Context.answer_ahead`), that run's time shared
    among them by their questions. The model is returned unedited
    whatever happens (the attacks on the weights restore what they change themselves,
    `grom.robustness.weights`; the suite reverts the edit if one left it applied).
    between: a step boundary (`grom.turns`) between two attacks and inside each (between
    generation batches and decoding steps, teacher-forced batches, relearning steps), the
    model as found there (the edit reverted, trained or quantized weights put back); the
    results do not depend on it. reference: a retain model (of the same architecture and
    tokenizer, never trained on the forget set), with which the depth attack reports UDS
    (`grom.robustness.depth`); without one, the output-referenced depth. kept: the unedited
    model's side kept on disk (`grom.robustness.kept.UneditedSide(model, tokenizer)`, made
    before the suite starts): the unedited answers to the probe attacks' questions and
    relearning's control are read from it where an earlier run on the same weights, tokenizer
    and inputs left them, and written to it where computed; None: all computed here."""
    names = attack_names(attacks)
    if not probes:
        raise ValueError("no probes to attack with: give the held-out probe questions (question, answer, fact)")
    if "relearn" in names and not fitted:
        raise ValueError("relearn trains on the fitted questions: give fitted= (the edit's forget pairs)")
    asked = [a.strip() for a in attacks.split(",")] if isinstance(attacks, str) else list(attacks)
    if "mia" in asked and (len(holdout) < 2 or len(fitted) < 2):
        raise ValueError("mia compares the fitted forget answers with held-out answers of the same kind: give "
                         "fitted= and holdout= (at least two rows each, e.g. the benchmark's neighbours)")
    if edit.is_applied:
        raise ValueError("the edit is applied to the model; revert it first (the suite applies it itself)")
    progress = progress or (lambda *_: None)
    ctx = Context(model, tokenizer, edit, tuple(probes), tuple(fitted), fmt, tuple(holdout), between,
                  reference=reference, kept=kept)
    out: dict[str, AttackResult] = {}
    try:
        together = [n for n in names if n in PROBE_TYPES]
        shares, ahead = {}, 0.0
        if len(together) > 1:  # their questions answered in one run, its time shared by their questions
            ahead = len(together) / len(names)
            t0 = time.perf_counter()
            asked = ctx.answer_ahead(together, lambda f, msg: progress(ahead * f, msg))
            spent = time.perf_counter() - t0
            shares = {n: spent * k / max(sum(asked.values()), 1) for n, k in asked.items()}
        for i, name in enumerate(names):
            if i or ahead:
                give(between)
            progress(max(i / len(names), ahead), f"attack {i + 1}/{len(names)}: {name}")
            t0 = time.perf_counter()
            result = ATTACKS[name](ctx)
            out[name] = replace(result, name=name, seconds=time.perf_counter() - t0 + shares.get(name, 0.0))
            log.info("attack %s: base %.3f, edited %.3f (%d probes, %.1f s)", name, result.base,
                     result.edited, result.n, out[name].seconds)
    finally:
        if edit.is_applied:  # an attack that failed inside edit.applied reverts there; this is the net
            edit.revert(model)
    progress(1.0, "attacks done")
    return out
