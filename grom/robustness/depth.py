"""Where the knowledge still lives: the Unlearning Depth Score (UDS) by per-layer activation
patching (gnueaj/unlearning-depth-score, July 2026, `compute_uds.py`).

For each probe the question is followed by its answer, teacher-forced, and the model is
scored by the mean log-probability of the fact's tokens (the answer tokens that overlap the
fact's characters; where the answer does not state the fact, the fact alone stands for the
answer). Then, for each decoder layer l, the hidden states a source model writes at the
output of layer l, at the positions that predict the fact's tokens, are put in place of the
unedited model's there, the unedited model runs on from them, and the score falls by

    delta_l = logp(unedited) - logp(unedited with layer l's states from the source).

S2 takes the source to be the edited model, S1 a retain model (one that never saw the forget
set). The layers where S1 falls by more than tau (0.05) are those where the retain model
lacks the knowledge the unedited one holds; UDS weighs each by its S1 fall:

    UDS = sum_l d1_l * clip(d2_l / d1_l, 0, 1) / sum_l d1_l    over {l : d1_l > tau},

1 where the edited model lacks the fact at every such layer as the retain model does, 0 where
the unedited model reads the fact back from the edited model's states at each of them. A
probe with no such layer has no UDS; the score of a set is the mean over those that have one
(upstream's ``avg_uds``).

Without a retain model (most of this studio's subjects: nobody has a SmolLM2 that never read
about the solar system) there is no S1 and no UDS. What stays measurable is S2 against the
edit's own fall at the output, d_out = logp(unedited) - logp(edited): per layer the share
clip(d2_l / d_out, 0, 1) of probes whose score fell by more than tau, 1 where layer l's
states already carry the whole fall (the unedited layers above cannot read the fact back),
0 where they carry none of it. Its mean over layers is reported as the "output-referenced
depth", said as such: it is not UDS (a perfect unlearner need not change the layers where the
fact is not yet written, and the retain model, which S1 would credit for it, is missing).

Two points where this follows upstream's computation and not its code to the letter:
upstream takes the source's states from ``output_hidden_states``, whose last entry has the
final norm applied (transformers' convention), and patches it into the last layer's output,
which the unedited model then normalizes again; here every layer's output is taken as the
layer writes it (`grom.model.hooks.capture_outputs`). Below the first layer an edit changes
(`grom.eval.prefix.first_changed_layer`) the edited model's states are the unedited one's bit
for bit, so S2 there is 0 without a pass, and the passes above replay the unchanged layers
(`BelowTheEdit`). tests/test_depth.py checks both against a transcription of upstream's.
"""
from __future__ import annotations

import math
import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.data.prompts import PromptFormat, encode_prompt
from grom.eval.prefix import first_changed_layer
from grom.model.arch import decoder_layers, model_device, num_layers
from grom.model.hooks import capture_outputs, hooked
from grom.robustness.result import AttackResult, BelowTheEdit, Probe
from grom.robustness.weights import readout
from grom.turns import Between, Held, give

THRESHOLD = 0.05
"""tau: a layer holds the knowledge where patching the retain model's states there lowers the
fact's mean log-probability by more than this (upstream's ``--delta_threshold``)."""
BATCH = 16


@dataclass(frozen=True)
class FactTokens:
    """One probe teacher-forced: its ids (the formatted question, then the answer), the
    positions whose next-token logits are the fact's tokens (`at`, also where states are
    patched: upstream's ``patch_scope="span"``), those tokens, and whether the answer states
    the fact (False: the fact alone was taken as the answer)."""

    ids: tuple[int, ...]
    at: tuple[int, ...]
    tokens: tuple[int, ...]
    found: bool


def fact_tokens(tokenizer, probe: Probe, fmt: PromptFormat | None = None) -> FactTokens:
    """`FactTokens` of `probe`: the answer tokenized on its own after the prompt (as the
    logit lens and upstream's ``build_logprob_ctx`` do), the fact found as whole words,
    case-insensitive, at its first place in the answer, and its tokens those whose characters
    overlap the fact's (upstream's ``get_eval_span``)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the depth score finds the fact's tokens by character offsets, which need a fast "
                         "tokenizer (load it with use_fast=True)")
    fact = (probe.fact or "").strip()
    m = re.search(rf"(?<!\w){re.escape(fact)}(?!\w)", probe.answer, re.IGNORECASE) if fact else None
    answer, start, end = (probe.answer, m.start(), m.end()) if m else (fact, 0, len(fact))
    if not answer:
        raise ValueError(f"probe {probe.id or probe.question!r} has no fact to score")
    enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    span = [k for k, (a, b) in enumerate(enc["offset_mapping"]) if b > start and a < end]
    prompt = encode_prompt(tokenizer, probe.question, fmt)
    ids = [int(i) for i in enc["input_ids"]]
    return FactTokens(tuple(prompt + ids), tuple(len(prompt) + k - 1 for k in span),
                      tuple(ids[k] for k in span), bool(m))


@dataclass(frozen=True)
class _Batch:
    """Rows right-padded into one input, and where their fact positions are."""

    x: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor  # (k,) the row (0..B-1) of each fact position, the rows in order
    cols: torch.Tensor  # (k,) its position
    labels: torch.Tensor  # (k,) the fact token it predicts


def _batch(rows: Sequence[FactTokens], pad: int) -> _Batch:
    lengths = torch.tensor([len(r.ids) for r in rows])
    x = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        x[i, :len(r.ids)] = torch.tensor(r.ids)
    mask = (torch.arange(x.shape[1]) < lengths[:, None]).long()
    where = torch.tensor([i for i, r in enumerate(rows) for _ in r.at], dtype=torch.long)
    cols = torch.tensor([c for r in rows for c in r.at], dtype=torch.long)
    labels = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.long)
    return _Batch(x, mask, where, cols, labels)


@contextmanager
def patching(layer: nn.Module, batch: _Batch, states: torch.Tensor) -> Iterator[None]:
    """Within the block, `layer`'s output at the batch's fact positions is `states` (k, n)."""
    def hook(_module, _args, output):
        h = output[0] if isinstance(output, (tuple, list)) else output
        h = h.clone()
        h[batch.rows.to(h.device), batch.cols.to(h.device)] = states.to(device=h.device, dtype=h.dtype)
        return (h, *output[1:]) if isinstance(output, (tuple, list)) else h

    with hooked(layer, hook):
        yield


@torch.no_grad()
def _pass(model: nn.Module, batch: _Batch, layers: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward pass of `model` as it is held now: each row's mean log-probability of
    its fact tokens (B,) float64, and the outputs of the decoder `layers` at the fact
    positions {l: (k, n)}."""
    blocks, dev = decoder_layers(model), model_device(model)
    at = lambda h: h[batch.rows.to(h.device), batch.cols.to(h.device)].detach()  # noqa: E731
    wanted = sorted(set(layers) | {len(blocks) - 1})
    with _captured(blocks, wanted, at) as got:
        model.base_model(input_ids=batch.x.to(dev), attention_mask=batch.mask.to(dev), use_cache=False)
    states = {layer: got[layer][-1] for layer in wanted}
    logp = torch.log_softmax(readout(model, states[len(blocks) - 1]), -1).cpu()
    token = logp.gather(1, batch.labels[:, None])[:, 0].double()
    rows = int(batch.x.shape[0])
    total = torch.zeros(rows, dtype=torch.float64).index_add_(0, batch.rows, token)
    count = torch.zeros(rows, dtype=torch.float64).index_add_(0, batch.rows, torch.ones_like(token))
    return total / count, {layer: states[layer] for layer in layers}


@contextmanager
def _captured(blocks, wanted: Sequence[int], select) -> Iterator[dict[int, list]]:
    with ExitStack() as stack:
        yield {layer: stack.enter_context(capture_outputs(blocks[layer], select)) for layer in wanted}


@dataclass(frozen=True)
class Depth:
    """What `unlearning_depth` measured, per probe (rows) and layer (columns)."""

    layers: tuple[int, ...]
    base: tuple[float, ...]
    """Each probe's mean log-probability of its fact tokens, unedited model."""
    edited: tuple[float, ...]
    """The same, edited model (its output: no patching)."""
    s2: tuple[tuple[float, ...], ...]
    """delta per probe and layer, the edited model's states patched into the unedited one."""
    s1: tuple[tuple[float, ...], ...] | None
    """The same from the retain model; None without one."""
    threshold: float = THRESHOLD
    found: tuple[bool, ...] = ()

    @property
    def uds(self) -> tuple[float | None, ...]:
        """Each probe's UDS (module docstring); None without a retain model, and for a probe
        where no layer's S1 fall passes the threshold."""
        if self.s1 is None:
            return tuple(None for _ in self.base)
        return tuple(uds_of(d1, d2, self.threshold) for d1, d2 in zip(self.s1, self.s2))

    @property
    def mean_uds(self) -> float:
        """The mean UDS over the probes that have one (upstream's avg_uds; nan for none)."""
        values = [u for u in self.uds if u is not None]
        return sum(values) / len(values) if values else math.nan

    @property
    def output_drop(self) -> tuple[float, ...]:
        """d_out per probe: how far the edit lowered the fact's score at the output."""
        return tuple(b - e for b, e in zip(self.base, self.edited))

    def erased_share(self) -> tuple[float, ...]:
        """Per layer, how much of the knowledge is gone from its states (0: the unedited
        model reads the fact back from them; 1: erased there). With a retain model,
        upstream's layer erasure ratio: the mean of clip(d2_l / d1_l, 0, 1) over the probes
        for which layer l holds the knowledge (d1_l > tau). Without one, the mean of
        clip(d2_l / d_out, 0, 1) over the probes whose output fell by more than tau (module
        docstring). nan for a layer no probe counts at."""
        out = []
        for j in range(len(self.layers)):
            if self.s1 is not None:
                pairs = [(self.s2[i][j], self.s1[i][j]) for i in range(len(self.base))
                         if self.s1[i][j] > self.threshold]
            else:
                pairs = [(self.s2[i][j], d) for i, d in enumerate(self.output_drop) if d > self.threshold]
            out.append(sum(min(max(a / b, 0.0), 1.0) for a, b in pairs) / len(pairs) if pairs else math.nan)
        return tuple(out)

    @property
    def output_depth(self) -> float:
        """Without a retain model, the mean of `erased_share` over layers: the
        output-referenced depth (module docstring; not UDS). nan with one, and where no
        probe's output fell."""
        if self.s1 is not None:
            return math.nan
        share = [v for v in self.erased_share() if not math.isnan(v)]
        return sum(share) / len(share) if share else math.nan

    def mean(self, which: str) -> tuple[float, ...]:
        """Per layer, the mean delta over probes of "s1" or "s2"."""
        rows = self.s1 if which == "s1" else self.s2
        if not rows:
            return ()
        return tuple(sum(r[j] for r in rows) / len(rows) for j in range(len(self.layers)))


def uds_of(d1: Sequence[float], d2: Sequence[float], threshold: float = THRESHOLD) -> float | None:
    """One probe's UDS from its S1 and S2 falls per layer (module docstring); None where no
    layer's S1 fall passes `threshold`."""
    held = [(a, b) for a, b in zip(d1, d2) if a > threshold]
    if not held:
        return None
    return sum(a * min(max(b / a, 0.0), 1.0) for a, b in held) / sum(a for a, _ in held)


def unlearning_depth(model: nn.Module, tokenizer, edit, probes: Sequence[Probe], *, reference: nn.Module | None = None,
                     fmt: PromptFormat | None = None, threshold: float = THRESHOLD, batch_size: int = BATCH,
                     between: Between | None = None) -> Depth:
    """`Depth` of `edit` (a grom.edit.Edit of `model`, not applied) on `probes`: S2 at every
    layer (0 without a pass below the edit's first changed layer) and, with a `reference`
    (a retain model of the same architecture and tokenizer), S1 at every layer. The model is
    left unedited and unhooked; between: a step boundary between two passes, the model
    unedited there."""
    if not probes:
        raise ValueError("the depth score needs at least one probe")
    if edit.is_applied:
        raise ValueError("the edit is applied to the model; revert it first (the depth score applies it itself)")
    n = num_layers(model)
    if reference is not None and num_layers(reference) != n:
        raise ValueError(f"the retain model has {num_layers(reference)} layers and the model {n}: UDS patches "
                         "layer by layer between two models of the same architecture")
    rows = [fact_tokens(tokenizer, p, fmt) for p in probes]
    pad = pad_id(tokenizer)
    first = min(first_changed_layer(model, edit), n)
    # the unedited pass records every layer a patched pass starts above: a pass patched at layer l
    # runs only the layers above l (below and at l it is the unedited pass, bit for bit). Where the
    # cache evicted an entry, the pass runs whole and records its own, patched, output at l: a later
    # pass patched at l overwrites the same fact positions, so what it reads is the same
    below = BelowTheEdit(model, edit, upward_from=0 if reference is not None else first)
    replay = 0 < first < n
    blocks = decoder_layers(model)
    model.eval()
    if reference is not None:
        reference.eval()
    base, edited, s2, s1 = [], [], [], []
    for b in range(0, len(rows), batch_size):
        batch = _batch(rows[b:b + batch_size], pad)
        give(between)
        with Held(below.recording):
            full, _ = _pass(model, batch)
        give(between)
        with Held(lambda: edit.applied(model), below.replaying if replay else None):
            out, states = _pass(model, batch, range(first, n))
        d2 = torch.zeros(len(full), n, dtype=torch.float64)
        for layer in range(first, n):
            give(between)
            with Held(lambda layer=layer: below.replaying_from(layer + 1),
                      lambda layer=layer: patching(blocks[layer], batch, states[layer])):
                d2[:, layer] = full - _pass(model, batch)[0]
        base += full.tolist()
        edited += out.tolist()
        s2 += [tuple(r) for r in d2.tolist()]
        if reference is not None:
            give(between)
            _, kept = _pass(reference, batch, range(n))
            d1 = torch.zeros(len(full), n, dtype=torch.float64)
            for layer in range(n):
                give(between)
                with Held(lambda layer=layer: below.replaying_from(layer + 1),
                          lambda layer=layer: patching(blocks[layer], batch, kept[layer])):
                    d1[:, layer] = full - _pass(model, batch)[0]
            s1 += [tuple(r) for r in d1.tolist()]
    return Depth(tuple(range(n)), tuple(base), tuple(edited), tuple(s2), tuple(s1) if reference is not None else None,
                 threshold, tuple(r.found for r in rows))


def depth_attack(model: nn.Module, tokenizer, edit, probes: Sequence[Probe], *, fitted: Sequence[Probe] = (),
                 reference: nn.Module | None = None, fmt: PromptFormat | None = None,
                 between: Between | None = None) -> AttackResult:
    """Name "depth": at which layers the held-out probes' facts (and the fitted questions'
    where they name a fact: upstream scores the forget set) are still recoverable
    (`unlearning_depth`). base is 0 (the unedited model patched into itself loses nothing);
    edited is the held-out probes' mean UDS with a retain model (`reference`), else their
    output-referenced depth (module docstring), which `details["measure"]` names.

    details: layers; s2 / s1 (mean delta per layer, s1 [] without a retain model);
    erased_share per layer; output_drop (mean); uds per probe (None where undefined);
    the same under "fitted" for the fitted questions; first_changed_layer, band."""
    t0 = time.perf_counter()
    asked = list(probes) + list(fitted)
    d = unlearning_depth(model, tokenizer, edit, asked, reference=reference, fmt=fmt, between=between)
    k = len(probes)
    held, mine = _part(d, 0, k), (_part(d, k, len(asked)) if fitted else None)
    measure = "uds" if reference is not None else "output"
    value = lambda part: part.mean_uds if reference is not None else part.output_depth  # noqa: E731
    details = {"measure": measure, "threshold": d.threshold, **_summary(held),
               "first_changed_layer": first_changed_layer(model, edit), "band": list(getattr(edit, "band", [])),
               "fact_not_in_answer": sum(not f for f in held.found)}
    if mine is not None:
        details["fitted"] = {**_summary(mine), "value": _finite(value(mine))}
    return AttackResult("depth", 0.0, value(held), time.perf_counter() - t0, len(probes), details=details)


def _part(d: Depth, a: int, b: int) -> Depth:
    return Depth(d.layers, d.base[a:b], d.edited[a:b], d.s2[a:b], None if d.s1 is None else d.s1[a:b], d.threshold,
                 d.found[a:b])


def _finite(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def _summary(d: Depth) -> dict:
    drop = d.output_drop
    return {"layers": list(d.layers), "s2": list(d.mean("s2")), "s1": list(d.mean("s1")),
            "erased_share": [_finite(v) for v in d.erased_share()],
            "output_drop": sum(drop) / len(drop) if drop else 0.0,
            "uds": [None if u is None else float(u) for u in d.uds], "n": len(d.base),
            "dropped": sum(x > d.threshold for x in drop)}
