"""The locate-then-edit editors' shared run: `run_editor` (ROME, MEMIT, AlphaEdit or
ZeroUnlearn as an unlearning edit, on GROM's terms), their settings (`EditorConfig`), their
row (`EditorMethod`) and family of the method registry (`EDITORS`, `register_editor`), what
an editor can run on (`editor_reason`) and its band (`editor_band`) (was
grom/baselines/editing.py). Each editor is a file of grom/methods/editors/ that registers
its row.

The paper's comparison (section "Baselines"): the four locate-then-edit editors get the
same per-fact value optimisation and the same retain covariance as GROM, so they differ
only in the update rule. Here:
1. GROM's own preparation (grom.closed_form.pipeline.prepare) gives the retain key batches (and, where
   no layers are given, the band from GROM's layer scores);
2. each forget example becomes a fact (grom.methods.editors.value_optimisation.encode_fact; a split without
   subjects is refused before any work) whose key token is read, as GROM's keys are, from a
   residual stream through the band (grom.closed_form.collect.LayerStream), retain keys likewise, at
   every edited layer;
3. one value optimisation at the band's last layer L (grom.methods.editors.value_optimisation) gives each
   fact the residual delta that makes its answer improbable;
4. each layer of the band, in order, on the model as the earlier layers left it: the
   residual still missing at L's output, divided by the layers left (MEMIT's spread; the
   whole of it for ROME, which edits L alone), goes through the editor's rule
   (grom.methods.editors.update_rules) with C0 = Xr Xr^T / r of that layer's retain keys.
The result is a `grom.Edit` (down_proj patches by parameter name, `method` the editor's
name, `info` its settings and the facts' answer probabilities), applied and reverted like
GROM's; the model is left as it was found.

The editors are the "editor" family of the one method registry (grom.registry):
`EDITORS` is its view, rows of `EditorMethod` (an update rule), not the trained `Method`.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from grom import registry
from grom.closed_form.collect import HIDDEN_CACHE_BYTES, Keys, LayerStream, forward
from grom.closed_form.config import EditConfig
from grom.closed_form.layer_scores import LayerScores
from grom.closed_form.pipeline import prepare, score_prepared
from grom.data.encoding import Encoded, make_batches, pad_id
from grom.data.prompts import PromptFormat, settings_from_dict
from grom.data.schema import as_examples
from grom.edit import Edit, LayerRecord
from grom.methods.costs import data_tokens, shape_of, train_flops
from grom.methods.editors import update_rules as rules
from grom.methods.editors.value_optimisation import (
    Values,
    ValueSettings,
    encode_fact,
    missing_facts,
    object_probabilities,
    optimise_values,
    unreachable_facts,
)
from grom.model.arch import (
    decoder_layers,
    edited_matrix,
    layer_kinds,
    loaded_from,
    num_layers,
    residual_gain,
    unembedding,
)
from grom.model.hooks import capture_outputs, stop_after
from grom.registry import Box, FamilyView, MethodEntry, Reason, where
from grom.turns import Between, give, inside, modes, modes_as

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditorConfig:
    """Settings of an editor run; upstream defaults (the ZeroUnlearn harness's Llama
    hparams) unless said otherwise."""

    layers: tuple[int, ...] | None = None  # the band (ROME edits its last layer); None: GROM's automatic band
    k: int = 5  # width of the automatic band
    w_r: float = 15000.0  # retain weight on C0 (MEMIT's mom2_update_weight, ZeroUnlearn's wiki_*_lam)
    rho: float = 0.03  # GROM's ridge, mu = rho * mean diag (ROME, MEMIT)
    null_threshold: float = 2e-2  # AlphaEdit's nullspace_threshold (absolute eigenvalue of C0)
    l2: float = 10.0  # AlphaEdit's L2
    w_f: float = 50.0  # ZeroUnlearn's forget_*_lam
    lam: float = 1.0  # ZeroUnlearn's regularization_lam
    eps: float = 0.01  # ZeroUnlearn's eps: the forget outputs' span is scaled by eps, not removed
    values: ValueSettings = field(default_factory=ValueSettings)
    retain_budget: int | None = 40000  # retain key columns, as GROM
    retain_key_mode: str = "auto"
    prompt_format: PromptFormat | None = None
    max_length: int = 512
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        v = self.values if isinstance(self.values, ValueSettings) else ValueSettings(**self.values)
        object.__setattr__(self, "values", v)
        positive = {"w_r": self.w_r, "rho": self.rho, "null_threshold": self.null_threshold, "l2": self.l2,
                    "w_f": self.w_f, "lr": v.lr, "clamp_norm_factor": v.clamp_norm_factor}
        bad = [f"{k} = {x!r} must be a positive number" for k, x in positive.items()
               if not (isinstance(x, (int, float)) and 0 < x < float("inf"))]
        bad += [f"{k} = {x!r} must be a number >= 0" for k, x in
                {"lam": self.lam, "eps": self.eps, "kl_factor": v.kl_factor, "weight_decay": v.weight_decay,
                 "stop_loss": v.stop_loss}.items() if not (isinstance(x, (int, float)) and 0 <= x < float("inf"))]
        bad += [] if isinstance(v.steps, int) and 1 <= v.steps <= 1000 else [f"steps = {v.steps!r}: use 1 to 1000"]
        if bad:
            raise ValueError(f"EditorConfig: {bad[0]}")
        self.edit_config()  # GROM's checks of the shared settings (layers, k, budgets, ...)

    def edit_config(self) -> EditConfig:
        """The GROM settings of the shared preparation (keys, band, prompt format)."""
        return EditConfig(matrix="down_proj", layers=self.layers, k=self.k, w_r=self.w_r, rho=self.rho,
                          retain_budget=self.retain_budget, retain_key_mode=self.retain_key_mode,
                          prompt_format=self.prompt_format, max_length=self.max_length, seed=self.seed,
                          batch_size=self.batch_size, keep_keys=False)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EditorConfig":
        """The settings `to_dict` wrote (a key of no setting is refused)."""
        return settings_from_dict(cls, d, tuples=("layers",))


# A rule: (W (m, n), K (n, u), R (m, u), C0 (n, n), config) -> the patch (m, n) float64
Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, EditorConfig], torch.Tensor]


@dataclass(frozen=True)
class EditorMethod:
    """One editor: its registry name, label, update rule, whether it spreads over the band,
    and a sentence on what it does and needs (for a UI)."""

    name: str
    label: str
    rule: Rule
    description: str
    spreads: bool = True  # False: edits only the band's last layer (ROME)


EDITORS: Mapping[str, EditorMethod] = FamilyView("editor")
"""Every registered editor, in registration order: the editor family of the one registry
(grom.registry), read-only (change it with register_editor)."""


MAX_VALUE_STEPS = 100  # a box's bound (ROME's 20-25, upstream's longest 50); EditorConfig takes up to 1000


def editor_boxes(model_name: str | None = None) -> tuple[Box, Box]:
    """An editor's two boxes: its value optimisation's steps and learning rate (ROME's, for
    every model)."""
    v = ValueSettings()
    return (Box("Value steps (per-fact vector)", "value_steps", float(v.steps), 1.0, MAX_VALUE_STEPS, whole=True,
                upstream="ROME takes 20 to 25"),
            Box("Value learning rate", "value_lr", v.lr, 0.0, 10.0, above_low=True, upstream="ROME: 0.1 to 0.5"))


def editor_settings(model, data, values, band=None) -> EditorConfig:
    """An editor's run on `data` with the boxes' value steps and learning rate, on
    `editor_band(band)`: GROM's band where an editor can move facts there."""
    return EditorConfig(layers=editor_band(band, num_layers(model)), prompt_format=getattr(data, "prompt_format", None),
                        values=ValueSettings(steps=int(values["value_steps"]), lr=float(values["value_lr"])))


def editor_flops(model, data, values) -> float:
    """The value optimisation's steps over the facts, priced as epochs of training (each step
    a forward and backward pass from the value layer up, over every fact), with the keys'
    and retain covariance's forward pass."""
    return train_flops(shape_of(model), data_tokens(data), float(values["value_steps"]))


def describe_editor(label: str, edit, values) -> str:
    """"**MEMIT** (closed-form editor: layers 4, 5 edited, each from its keys and retain
    covariance; the value optimisation 25 steps at lr 0.1, 3.2 s of it)": what a finished run did."""
    band = edit.band
    where = f"layer{'s' if len(band) > 1 else ''} {', '.join(str(layer) for layer in band)} edited"
    return (f"**{label}** (closed-form editor: {where}, each from its keys and retain covariance; the value "
            f"optimisation {float(values['value_steps']):g} steps at lr {float(values['value_lr']):g}, "
            f"{edit.timings.get('values', 0.0):.1f} s of it)")


def register_editor(editor: EditorMethod, order: int) -> EditorMethod:
    """Add `editor` to the registry at `order` in every list of methods; a name already
    registered is refused."""
    registry.register(MethodEntry(
        editor.name, editor.label, "editor", editor.description,
        can_run=lambda model, data: editor_reason(editor, model, data), defaults=editor_defaults,
        run=partial(_run, editor.name), settings=EditorConfig, order=order,
        kind="closed-form editor", boxes=editor_boxes, configure=editor_settings, on_grom_band=True,
        flops=editor_flops, describe=partial(describe_editor, editor.label), detail=editor))
    return editor


def editor_defaults(model=None) -> dict:
    """An editor's settings by default (`EditorConfig()`: the band GROM's automatic one,
    which `editor_band` moves below the model's last layer where it ends there)."""
    return EditorConfig().to_dict()


def _run(name, model, tokenizer, forget, retain, settings=None, **kw) -> Edit:
    """The registry's runner of the editor `name`: `run_editor` with `settings` (an
    `EditorConfig`; None: the defaults)."""
    return run_editor(name, model, tokenizer, forget, retain, settings or EditorConfig(), **kw)


def editor_reason(editor: EditorMethod, model, data) -> Reason | None:
    """What an editor lacks on `data` (None: nothing): facts with a subject to locate, and a
    retain set for its covariance; with a `model`, an MLP output that reaches the residual
    stream linearly."""
    label, at = editor.label, where(data)
    why = missing_facts(getattr(data, "forget", ()) or ())
    if why:
        return Reason("no facts with a subject", f"{label} cannot edit {at}: {why}. Load real-knowledge, ZsRE, "
                      "TOFU or the demo, or upload rows with a `subject` column.")
    if not getattr(data, "retain", None):
        return Reason("no retain set", f"{label} needs a retain set (its covariance keeps what is not "
                      f"forgotten): {at} has none.")
    if model is not None and residual_gain(model, "down_proj") is None:
        return Reason("MLP output normalised", NORMALISED.format(label=label))
    return None


NORMALISED = ("{label} edits the MLP output (down_proj) of a model whose MLP output reaches the residual "
              "stream linearly; this model normalises it first")


UPSTREAM_EDITOR_BAND = (4, 5, 6, 7, 8)
"""MEMIT's and AlphaEdit's band for Llama-3-8B (32 layers) in their released hparams."""


def editor_band(band, n_layers: int) -> tuple[int, ...]:
    """The layers an editor edits on an `n_layers`-layer model: `band` (GROM's) where its
    last layer is below the model's last; else, and without a band, the upstream editors'
    layers 4-8 (`UPSTREAM_EDITOR_BAND`) on a model of 12 layers or more, or the three
    layers ending two below the top on a smaller one (the demo's 6: layers 1-3)."""
    if band and max(band) < n_layers - 1:
        return tuple(sorted(band))
    if n_layers >= 12:
        return UPSTREAM_EDITOR_BAND
    return tuple(range(max(0, n_layers - 5), max(1, n_layers - 2)))


def get_editor(name: str) -> EditorMethod:
    """The registered editor `name` (case and surrounding spaces ignored)."""
    return registry.get(name, "editor").detail


def _layer_outputs(model: nn.Module, batches, layer: int) -> torch.Tensor:
    """Decoder layer `layer`'s output at each batch's key positions, (u, d) float32."""
    module = decoder_layers(model)[layer]
    parts = []
    with torch.no_grad():
        for batch in batches:
            with capture_outputs(module, batch.select) as got, stop_after(module):
                forward(model, batch)
            parts.extend(got)
    return torch.cat(parts).float()


def _band(model, config: EditorConfig, prep, scores: LayerScores | None,
          between: Between | None = None) -> tuple[list[int], LayerScores | None]:
    """The band (the given layers, else GROM's layer scores' band, `between` between their
    forward batches: the model is as found there) and the scores it came from."""
    if config.layers is not None:
        band = sorted(config.layers)
    else:
        scores = scores or score_prepared(model, prep, config.edit_config(), between=between)
        band = list(scores.band)
    n = num_layers(model)
    if any(not 0 <= l < n for l in band):
        raise ValueError(f"layers {band} are outside the model: it has layers 0..{n - 1}")
    return band, scores


def _check(editor: EditorMethod, model, forget, retain) -> float:
    """What the run needs, before any work; returns the down_proj residual gain."""
    if not forget:
        raise ValueError(f"{editor.label} needs a forget set: it is empty")
    why = missing_facts(forget)
    if why:
        raise ValueError(f"{editor.label} cannot run on this split: {why}")
    if not retain:
        raise ValueError(f"{editor.label} needs a retain set (its retain covariance): it is empty")
    gain = residual_gain(model, "down_proj")
    if gain is None:
        raise ValueError(NORMALISED.format(label=editor.label))
    return gain


@contextmanager
def _as_found(model: nn.Module, found: dict, saved: dict[str, torch.Tensor]):
    """The model as `run_editor` found it for the block (its modes, and the layers edited
    so far back to their originals `saved`), then as the run has it, bit for bit."""
    edited = {name: model.get_parameter(name).detach().clone() for name in saved}
    with torch.no_grad():
        for name, W0 in saved.items():
            model.get_parameter(name).copy_(W0)
    try:
        with modes_as(model, found):
            yield
    finally:
        with torch.no_grad():
            for name, W in edited.items():
                model.get_parameter(name).copy_(W)


def run_editor(name: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence,
               config: EditorConfig = EditorConfig(), progress: Callable[[float, str], None] | None = None,
               scores: LayerScores | None = None, values: Values | None = None,
               between: Between | None = None) -> Edit:
    """The editor `name`'s unlearning edit of `forget` (facts), keeping `retain`; the model
    is returned as it was found. See the module docstring for the steps.

    `values`, the `Values` of an earlier run on the same model, facts and value layer
    (`Edit.info["values"]` is not it: keep the object, e.g. from `optimise_values`), are
    reused instead of optimised again, so the four rules can share one optimisation.
    between: a step boundary (`grom.turns`) between two value optimisation steps, after
    it and between two layers of the band, the model as found there (the layers edited so
    far reverted, then edited again); the edit does not depend on it."""
    progress = progress or (lambda *_: None)
    editor, t_start = get_editor(name), time.perf_counter()
    forget, retain = as_examples(forget), as_examples(retain)
    gain = _check(editor, model, forget, retain)
    progress(0.0, "tokenizing")
    prep = prepare(tokenizer, forget, retain, config.edit_config(), unembedding(model).shape[0])
    facts = [encode_fact(tokenizer, ex, config.prompt_format, config.max_length) for ex in forget]
    band, scores = _band(model, config, prep, scores, between)
    layers = band if editor.spreads else band[-1:]
    unreachable = unreachable_facts(facts, band[-1], num_layers(model))
    if unreachable:
        log.warning("%s: the value layer %d is the model's last, where a vector at the key token changes only "
                    "that token's next-token logits: %d of %d facts, whose object is not the next token, cannot "
                    "move. Give a band below the top (upstream ROME/MEMIT edit early-middle layers).",
                    editor.label, band[-1], unreachable, len(facts))
    pid = pad_id(tokenizer)
    fact_batches = make_batches([Encoded(f.ids[:f.key + 1], (f.key,), (f.ids[f.objects[0]],), i)
                                 for i, f in enumerate(facts)], config.batch_size, pid)
    found = modes(model)
    model.eval()
    saved: dict[str, torch.Tensor] = {}
    turn = inside(between, lambda: _as_found(model, found, saved))
    try:
        progress(0.1, f"value optimisation at layer {band[-1]}")
        t0 = time.perf_counter()
        if values is None or values.layer != band[-1] or values.delta.shape[0] != len(facts):
            values = optimise_values(model, facts, band[-1], pid, config.values, between=turn)
        timings = {"values": time.perf_counter() - t0}
        give(turn)
        z = _layer_outputs(model, fact_batches, band[-1]) + values.delta.to(values.h.device)
        patches, records = _edit_layers(editor, model, config, layers, fact_batches, prep.retain, z, gain,
                                        saved, progress, timings, turn)
        give(turn)
        p_edited = object_probabilities(model, facts, pid, turn)
    finally:
        with torch.no_grad():
            for pname, W0 in saved.items():
                model.get_parameter(pname).copy_(W0)
        for m, training in found.items():
            m.training = training
    timings["total"] = time.perf_counter() - t_start
    progress(1.0, "done")
    info = {"editor": editor.name, "settings": config.to_dict(),
            "value_layer": band[-1], "value_steps": values.steps,
            "subject_last_keys": sum(f.subject_last for f in facts), "facts": len(facts),
            "unreachable_facts": unreachable,
            "p_answer_before": values.p_before.tolist(), "p_answer_value": values.p_after.tolist(),
            "p_answer_edited": p_edited.tolist()}
    log.info("%s edit of %s: %s", editor.label, list(patches), timings)
    return Edit(settings=dataclasses.replace(config, layers=tuple(layers)), patches=patches, layers=records,
                scores=scores, timings=timings, model_name=loaded_from(model),
                method=editor.name, info=info)


def _streams(model, layers: list[int], *batch_sets, between: Between | None = None) -> list[LayerStream]:
    """One residual stream per batch set, entering layers[0] (one forward pass up to it);
    at most HIDDEN_CACHE_BYTES of hidden states each, the rest replayed (grom.closed_form.collect)."""
    return [LayerStream(model, decoder_layers(model), layers[0], batches, last=layers[-1], kinds=layer_kinds(model),
                        budget=HIDDEN_CACHE_BYTES, between=between) for batches in batch_sets]


def _keys(stream: LayerStream, module, dev, between: Between | None = None) -> torch.Tensor:
    """The inputs of `module` (inside the stream's current layer) at the key positions, (n, k),
    `between` between two batches (no hook is held between them)."""
    parts = []
    for i, x in stream.key_batches(module):
        if i:
            give(between)
        parts.append(x)
    return Keys.concat(parts, stream.batches, dev).X


def _edit_layers(editor: EditorMethod, model, config: EditorConfig, layers: list[int], fact_batches, retain_batches,
                 z: torch.Tensor, gain: float, saved: dict, progress, timings: dict, between: Between | None = None):
    """Solve and apply each layer in order (in place, originals kept in `saved`). The keys
    of each layer are read from residual streams that advance through the band as it is
    edited (`_streams`): the inputs a forward pass of the model as the earlier layers left
    it gives, without running the layers below each one again. `between` before every
    layer but the first (the streams are this run's own: another job changes none)."""
    patches, records, last = {}, [], layers[-1]
    timings.update(keys=0.0, solve=0.0)
    t0 = time.perf_counter()
    streams = _streams(model, layers, fact_batches, retain_batches, between=between)
    timings["keys"] += time.perf_counter() - t0
    for i, l in enumerate(layers):
        if i:
            give(between)
        progress(0.3 + 0.65 * i / len(layers), f"layer {l}: keys, rule, apply")
        t = edited_matrix(model, "down_proj", l)
        param = model.get_parameter(t.param_name)
        module = model.get_submodule(t.module_name)
        dev = param.device if param.device.type == "cuda" else torch.device("cpu")
        t0 = time.perf_counter()
        while streams[0].at < l:  # a band given with gaps: run the layers between as they are
            for stream in streams:
                stream.advance(between)
        K, Xr = (_keys(stream, module, dev, between) for stream in streams)  # (n, u), (n, r)
        cur = _layer_outputs(model, fact_batches, last)  # (u, d)
        t1 = time.perf_counter()
        R = ((z.to(cur.device) - cur) / (len(layers) - i) / gain).T.to(dev)  # (m, u)
        W = t.from_param(param.detach()).to(dev, torch.float32)
        P = editor.rule(W, K, R, rules.retain_covariance(Xr), config)
        patch = t.to_param(P.to(param.dtype)).to(param.device)
        if not torch.isfinite(patch).all():
            raise FloatingPointError(f"{editor.label}'s update for {t.param_name} is not finite; raise rho or l2")
        t2 = time.perf_counter()
        with torch.no_grad():
            saved[t.param_name] = param.detach().clone()
            param.add_(patch)
        if l != last:
            for stream in streams:
                stream.advance(between)  # the edited layer, as the model now is
        timings["keys"] += t1 - t0 + time.perf_counter() - t2
        timings["solve"] += t2 - t1
        patches[t.param_name] = patch.cpu()
        records.append(LayerRecord(t.param_name, l, 0.0, 0.0, K.shape[1], Xr.shape[1], float(P.norm()),
                                   float(W.double().norm()), t2 - t1, t.transposed))
    return patches, records
