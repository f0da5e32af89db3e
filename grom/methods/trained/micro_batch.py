"""One micro-batch of a trained run (was grom/baselines/micro.py): its loss from the method's row, with what the row
needs computed here (the reference NLL of the forget answers under the unedited model, the
retain batch's NLL or its KL to the unedited model)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from grom.data.encoding import Encoded
from grom.methods.trained.losses import kl_to_reference, mean_nll, sequence_nll
from grom.methods.trained.method import LossInputs, Method
from grom.methods.trained.sequences import batch_forward, batch_logits, batch_nll, collate
from grom.methods.trained.settings import Settings


@contextmanager
def eval_mode(model: nn.Module):
    """The model in eval mode (no dropout), as upstream's reference model; restored after."""
    was = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, t in was.items():
            m.training = t


def reference_nll(model: nn.Module, forget: list[Encoded], s: Settings, pad: int) -> torch.Tensor:
    """Summed answer NLL of every forget sequence under the initial weights, (n,) float32.

    The reference model is the model before unlearning; its log-probabilities are fixed, so
    they are computed once here (eval mode, as upstream's ref_model), one number per
    sequence, instead of keeping a copy of the model."""
    out = []
    with eval_mode(model), torch.no_grad():
        for i in range(0, len(forget), s.batch_size):
            nll, _ = batch_nll(model, collate(forget[i:i + s.batch_size], pad))
            out.append(nll.float().cpu())
    return torch.cat(out)


class RetainTerms(NamedTuple):
    """One retain batch's terms: NLL per sequence and label counts (B,), the KL term or
    None, the layer's activations (B, T, d) and the unedited model's, or None, the labels."""

    nll: torch.Tensor
    counts: torch.Tensor
    kl: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    reference_hidden: torch.Tensor | None = None
    labels: torch.Tensor | None = None


def retain_terms(model, s: Settings, batch, ref_params, hidden: int | None = None) -> RetainTerms:
    """The terms of one retain batch; the KL's reference logits and the reference
    activations come from the unedited weights `ref_params`, in eval mode."""
    logits, h = batch_forward(model, batch, hidden=hidden)
    labels = batch.labels.to(logits.device)
    r_nll, r_counts = sequence_nll(logits, labels)
    kl = ref_h = None
    if s.retain_loss == "kl" or hidden is not None:
        with eval_mode(model), torch.no_grad():
            ref_logits, ref_h = batch_forward(model, batch, ref_params, hidden=hidden)
        kl = kl_to_reference(logits, ref_logits) if s.retain_loss == "kl" else None
    return RetainTerms(r_nll, r_counts, kl, h, ref_h, labels)


@dataclass
class RunData:
    """What every micro-batch of one run reads: the encoded forget / retain / alternate
    sequences (alternates[i] answers forget[i]'s question), the reference NLLs of the
    forget and alternate answers (n,), the unedited trained weights for reference logits,
    the pad id, the method's run-long state, and the passes over the forget set done."""

    forget: list[Encoded]
    retain: list[Encoded]
    pad: int
    alternates: list[Encoded] | None = None
    ref: torch.Tensor | None = None
    ref_alternates: torch.Tensor | None = None
    ref_params: dict | None = None
    state: dict = field(default_factory=dict)
    epoch: int = 0


def micro_loss(model, s: Settings, row: Method, run: RunData, f_idx,
               r_idx) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's loss and its logged terms: the row's, and the forget NLL."""
    idx = f_idx.tolist()
    batch = collate([run.forget[i] for i in idx], run.pad)
    hidden = int(s.method_args["layer"]) + 1 if row.needs_hidden else None
    logits, f_hidden = batch_forward(model, batch, hidden=hidden)
    labels = batch.labels.to(logits.device)
    nll, counts = sequence_nll(logits, labels)
    ref_logits = a_nll = a_counts = ref_alt = None
    r = RetainTerms(None, None)
    if row.uses_retain(s.method_args):
        r = retain_terms(model, s, collate([run.retain[i] for i in r_idx.tolist()], run.pad), run.ref_params, hidden)
    if row.needs_reference_logits:
        with eval_mode(model), torch.no_grad():
            ref_logits = batch_logits(model, batch, run.ref_params)
    if row.needs_answers:
        a_nll, a_counts = batch_nll(model, collate([run.alternates[i] for i in idx], run.pad))
        if run.ref_alternates is not None:
            ref_alt = run.ref_alternates[f_idx].to(nll.device)
    reference = None if run.ref is None else run.ref[f_idx].to(nll.device)
    loss, terms = row.loss(LossInputs(nll, counts, r.nll, r.counts, reference, s.method_args, r.kl,
                                      forget_logits=logits, forget_labels=labels, forget_hidden=f_hidden,
                                      retain_hidden=r.hidden, reference_retain_hidden=r.reference_hidden,
                                      retain_labels=r.labels,
                                      reference_logits=ref_logits, alternate_nll=a_nll,
                                      alternate_counts=a_counts, reference_alternate_nll=ref_alt,
                                      state=run.state, epoch=run.epoch))
    parts = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in terms.items()}
    parts["forget_nll"] = float(mean_nll(nll.detach(), counts))
    return loss, parts
