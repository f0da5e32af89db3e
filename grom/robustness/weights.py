"""Attacks on the weights: is the forgotten knowledge still in the edited model, to come
back when someone fine-tunes it a little, quantizes it, or reads its residual stream?

- `relearn_attack`: a few fine-tuning steps of the edited model on some of the fitted
  questions, then recall (the caller's `score`, on probes never trained on) per step
  (the run is `grom.robustness.relearn.relearn_curve`).
- `quantization_attack`: round-to-nearest weights (or bitsandbytes NF4 / int8), base
  against edited (Zhang et al., ICLR 2025: quantizing a gradient-unlearned model brings
  the answers back).
- `logit_lens_attack`: the answer's fact token read at every layer through the final norm
  and unembedding (nostalgebraist 2020), base against edited.

Each returns an `AttackResult` and leaves the model exactly as it found it (weights bit
for bit, modes, requires_grad flags), also when it fails.
"""
from __future__ import annotations

import logging
import re
import time
from contextlib import ExitStack
from typing import Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.data.prompts import PromptFormat, encode_prompt
from grom.data.schema import QAExample
from grom.eval.quant import bnb_unavailable, quantized
from grom.model.arch import decoder_layers, final_norm, finish_logits, model_device, unembedding
from grom.model.hooks import capture_outputs
from grom.model.process_memory import releasing
from grom.robustness.relearn import RELEARN_BATCH, RELEARN_LR, RELEARN_STEPS, Progress, relearn_curve
from grom.robustness.result import AttackResult, BelowTheEdit, Probe, Recall, ScoreFn, scored
from grom.turns import Between, Held, give, inside

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- relearning

@releasing()
def relearn_attack(model: nn.Module, tokenizer, edit, train: Sequence[QAExample], score: ScoreFn, *,
                   steps: Sequence[int] = RELEARN_STEPS, lr: float = RELEARN_LR,
                   batch_size: int = RELEARN_BATCH, progress: Progress | None = None,
                   relearn_base: bool = True, fmt: PromptFormat | None = None, seed: int = 0,
                   between: Between | None = None,
                   start: tuple[Recall | None, Recall | None] = (None, None),
                   control: Sequence[Recall] | None = None) -> AttackResult:
    """Name "relearn": fine-tune the edited model on `train` (question -> answer, the loss
    on the answer tokens and EOS, prompts formatted as `grom.methods.trained.sequences` and
    `grom.eval.runner.encode_pair` do) and call `score` after each count of optimizer
    steps in `steps` (0, the edited model before relearning, is always scored).

    Every parameter trains (the attacker owns the weights), AdamW as the baselines run it
    (betas 0.9/0.999, weight decay 0.01 off norms and biases, gradients clipped to 1.0)
    at a CONSTANT `lr` (no warm-up or decay: a short attack, not a schedule to finish);
    each step takes `batch_size` questions from a seeded shuffle of `train`, reshuffled
    once used up. Defaults: steps (0, 5, 10), lr 2e-5 (not calibrated: the lr for a model
    is `grom.robustness.calibration.relearn_lr`), batch 4.

    `relearn_base` (the default) relearns the unedited model the same way, the control
    that says what the fine-tune does to a model that forgot nothing: base = its score
    after the last step, as every other attack's base is the unedited model under the
    same attack, and details["base_recall"] its score per step (details["base_start"] at
    step 0). It doubles the time. With relearn_base False, base = score(base model), no
    relearning. edited = the edited model's score after the last step.
    details: steps, recall (edited, per step), loss (the training loss of each optimizer
    step, edited model), lr, batch_size, n_train.
    The model comes back bit for bit, also on failure or when `progress` raises.
    between: a step boundary (`grom.turns`) between two optimizer steps and inside each
    scoring (`relearn_curve`'s), the model as found there; the results do not depend on it.
    start: (base, edited) `score` of the unedited and the edited model before any step,
    where the caller has them (the suite, from its held-out probes attack; None: scored
    here); what `score` would give there, so the results are the same.
    control: with relearn_base, the control's curve (`relearn_control` with the same
    arguments) where the caller has it (the suite keeps it, `grom.robustness.kept`: it does
    not depend on the edit); None: computed here.
    """
    if not train:
        raise ValueError("relearning needs at least one training question")
    steps = sorted({0, *(int(k) for k in steps)})
    if steps[0] < 0:
        raise ValueError(f"relearning steps must be >= 0, got {steps}")
    if lr < 0 or batch_size < 1:
        raise ValueError("lr must be >= 0 and batch_size >= 1")
    t0, tell = time.perf_counter(), progress or (lambda *_: None)
    share = (lambda a, b: lambda f, m: tell(a + (b - a) * f, m))  # noqa: E731
    run = dict(lr=lr, batch_size=batch_size, fmt=fmt, seed=seed, between=between)
    details: dict = {"steps": steps, "lr": lr, "batch_size": batch_size, "n_train": len(train)}
    if relearn_base:
        if control is not None and len(control) == len(steps):
            base_curve = list(control)
        else:
            base_curve = relearn_control(model, tokenizer, train, score, steps=steps, progress=share(0.0, 0.5),
                                         start=start[0], **run)
        details.update(base_recall=[r.value for r in base_curve], base_start=base_curve[0].value)
        base = base_curve[-1]
    elif start[0] is not None:
        base = start[0]
    else:
        tell(0.0, "relearn: the base model's recall")
        model.eval()
        base = scored(score, model, between)
    give(between)
    curve, losses = relearn_curve(model, tokenizer, edit, train, score, steps,
                                  progress=share(0.5 if relearn_base else 0.1, 1.0), start=start[1], **run)
    details.update(recall=[r.value for r in curve], loss=losses)
    return AttackResult("relearn", base.value, curve[-1].value, time.perf_counter() - t0, len(curve[-1].hits),
                        base.answers, curve[-1].answers, details)


def relearn_control(model: nn.Module, tokenizer, train: Sequence[QAExample], score: ScoreFn, *,
                    steps: Sequence[int] = RELEARN_STEPS, lr: float = RELEARN_LR,
                    batch_size: int = RELEARN_BATCH, progress: Progress | None = None,
                    fmt: PromptFormat | None = None, seed: int = 0, between: Between | None = None,
                    start: Recall | None = None) -> list[Recall]:
    """`relearn_attack`'s control: the unedited model relearned on `train` as the attack
    relearns the edited one, `score` after each count of optimizer steps in `steps` (0
    first: `start` where the caller has it). The model comes back bit for bit."""
    steps = sorted({0, *(int(k) for k in steps)})
    curve, _ = relearn_curve(model, tokenizer, None, train, score, steps, lr=lr, batch_size=batch_size,
                             progress=progress, fmt=fmt, seed=seed, between=between, start=start)
    return curve


# ---------------------------------------------------------------- quantization

def _quantized_patches(model: nn.Module, edit, info) -> dict[str, torch.Tensor]:
    """The weights the edit patches among those `info` (`quantized`'s) quantized, copied as
    they are now (quantized): Q(W) for `_patch_kept`, read where the attack has them."""
    names = {f"{name}.weight" for name in info.modules}
    return {n: model.get_parameter(n).detach().clone() for n in edit.patches if n in names}


def _patch_kept(model: nn.Module, edit, q0: dict[str, torch.Tensor]) -> float | None:
    """<Q(W + P) - Q(W), P> / ||P||^2 over the quantized matrices the edit patches: the
    share of the patch, along its own direction, that the quantized edited model still
    carries (1: all of it; 0: quantization snaps the edited weights back onto the base's
    grid, as Zhang et al. find for gradient unlearning). The rounding noise orthogonal to
    P is left out (||Q(W+P) - Q(W)|| alone exceeds ||P|| at 4 bits, since P moves each
    group's scale and so re-rounds all of its weights). Read with the edited model
    quantized now (Q(W + P)), `q0` the base's Q(W) (`_quantized_patches`): the attack's own
    quantized weights, not quantized again (each pass over SmolLM2's weights is seconds).
    None where no patched matrix is quantized. Changes nothing."""
    if not q0:
        return None
    num = den = 0.0
    for n, Q in q0.items():
        P = edit.patches[n].double()
        num += float(((model.get_parameter(n).detach().double().cpu() - Q.double().cpu()) * P).sum())
        den += float((P * P).sum())
    return num / den if den > 0 else None


def _why(info, bits: int) -> str:
    """Why this quantizer: asked for, and for round-to-nearest whether bitsandbytes'
    formats could have run here."""
    if info.method != "rtn":
        return info.reason
    missing = bnb_unavailable()
    other = "NF4" if bits == 4 else "int8"
    return f"{info.reason}; bitsandbytes {other}: " + (f"cannot run here ({missing})" if missing else
                                                      f"available (method='{other.lower()}')")


def quantization_attack(model: nn.Module, tokenizer, edit, score: ScoreFn, *, bits: int = 4,
                        method: str = "rtn", group_size: int = 128, between: Between | None = None) -> AttackResult:
    """Names "quant4" / "quant8" (method "rtn"), "nf4", "int8": score the base model and
    the edited model (edit merged first) with every linear weight but the LM head
    fake-quantized by `grom.eval.quant.quantized`.

    "rtn": round-to-nearest, asymmetric, PER GROUP of `group_size` (128) consecutive
    input weights of each output row, `bits` 4 or 8 (GPTQ's RTN w4g128 / w8g128), on any
    device. "nf4" (bits 4) / "int8" (bits 8, one absmax scale per row): bitsandbytes, a
    RuntimeError naming what is missing without CUDA or bitsandbytes.
    details: method (also as quantizer) and quantizer_reason (asked for; for round-to-nearest,
    why bitsandbytes' format could not run here, or that it could), bits, group_size,
    n_matrices, skipped (the modules left alone),
    patch_kept (`_patch_kept`: the share of the patch the quantized edited model still
    carries along the patch's direction; None where it patches no quantized matrix).
    between: a step boundary (`grom.turns`) inside each scoring (`score(model, between=)`)
    and between them, the weights put back (not quantized, the edit reverted) there.
    The edited model's prompt passes replay the quantized layers below the edit from the
    base's (`BelowTheEdit`): the same numbers.
    """
    if method == "rtn" and bits not in (4, 8):
        raise ValueError(f"round-to-nearest runs at 4 or 8 bits here, got {bits}")
    if method not in ("rtn", "nf4", "int8"):
        raise ValueError(f"quantization method must be 'rtn', 'nf4' or 'int8', got {method!r}")
    name = f"quant{bits}" if method == "rtn" else method
    t0 = time.perf_counter()
    model.eval()
    def quant(keep: dict | None):  # the quantized weights kept for a turn, not computed again after it
        return lambda: quantized(model, method, group_size=group_size, bits=bits, keep=keep)

    below = BelowTheEdit(model, edit)  # the layers below the edit: quantized alike in both models
    with Held(quant({} if between else None), below.recording) as held:
        base = scored(score, model, inside(between, held.left))
        info = held.entered[0]
        q0 = _quantized_patches(model, edit, info)
    give(between)
    with Held(lambda: edit.applied(model), quant({} if between else None), below.replaying) as held:
        edited = scored(score, model, inside(between, held.left))
        kept = _patch_kept(model, edit, q0)
    details = {"method": info.method, "quantizer": info.method, "quantizer_reason": _why(info, bits),
               "bits": bits, "group_size": info.group_size,
               "n_matrices": info.n_matrices, "skipped": list(info.skipped), "patch_kept": kept}
    return AttackResult(name, base.value, edited.value, time.perf_counter() - t0, len(edited.hits),
                        base.answers, edited.answers, details)


# ---------------------------------------------------------------- the logit lens

def fact_position(tokenizer, probe: Probe, fmt: PromptFormat | None = None) -> tuple[list[int], int, bool]:
    """(ids, token, found): the formatted question followed by the probe's answer up to
    its fact (teacher-forced), and the answer's token where the fact starts; the lens reads
    the residual stream at the last of `ids`, where the model predicts `token`.

    The answer is tokenized on its own, as `grom.eval.runner.encode_pair` does; the fact is
    found as whole words, case-insensitive, at its first place in the answer (as fact
    recall reads it), and `token` is the first answer token whose characters reach past
    the fact's first character (with a byte-level BPE, " Mars" with its space). Where the
    answer does not contain the fact (`found` False), the answer is taken to be the fact
    itself, so `token` is the fact's first token right after the question.
    """
    m = re.search(rf"(?<!\w){re.escape(probe.fact.strip())}(?!\w)", probe.answer, re.IGNORECASE)
    answer, start = (probe.answer, m.start()) if m else (probe.fact.strip(), 0)
    if not answer:
        raise ValueError(f"probe {probe.id or probe.question!r} has no fact to read")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the logit lens finds the fact's token by character offsets, which need a "
                         "fast tokenizer (load it with use_fast=True)")
    enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    k = next(i for i, (_, end) in enumerate(enc["offset_mapping"]) if end > start)
    return encode_prompt(tokenizer, probe.question, fmt) + list(enc["input_ids"][:k]), int(enc["input_ids"][k]), bool(m)


def readout(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Logits of residual states h (k, n) through the final norm and the unembedding, in
    float32, with the logit scaling / soft-capping a family applies after its head
    (Granite's logits_scaling, Gemma 2's final_logit_softcapping), so that at the last
    layer they are the model's own logits. (k, vocab)."""
    W = unembedding(model)
    z = (final_norm(model)(h.to(W.device)).to(W.dtype) @ W.T).float()
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        z = z + head.bias.float()
    return finish_logits(model, z)


@torch.no_grad()
def lens(model: nn.Module, ids: Sequence[Sequence[int]], tokens: Sequence[int], *, pad: int = 0,
         batch_size: int = 16, between: Between | None = None, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(prob, rank), each (L - start, P) float64: at the output of every decoder layer l
    from `start` on and for every sequence p, the probability of tokens[p] read from the
    residual stream at the sequence's last position (`readout`), and its rank (1 = the most
    likely token; a tie counts for it). The last layer's row is the model's own next-token
    distribution. The decoder stack runs without the head (`readout` reads the last
    positions only). between: a step boundary (`grom.turns`) between two batches."""
    layers, dev = decoder_layers(model)[start:], model_device(model)
    prob, rank = [], []
    for b in range(0, len(ids), batch_size):
        if b:
            give(between)
        chunk, t = ids[b:b + batch_size], torch.tensor(tokens[b:b + batch_size])
        lengths = torch.tensor([len(q) for q in chunk])
        x = torch.full((len(chunk), int(lengths.max())), pad, dtype=torch.long)  # right padding
        for r, seq in enumerate(chunk):
            x[r, :len(seq)] = torch.tensor(seq)
        mask = (torch.arange(x.shape[1]) < lengths[:, None]).long()
        at = lambda h: h[torch.arange(len(chunk), device=h.device), (lengths - 1).to(h.device)]  # noqa: E731
        with ExitStack() as stack:
            got = [stack.enter_context(capture_outputs(layer, at)) for layer in layers]
            model.base_model(input_ids=x.to(dev), attention_mask=mask.to(dev), use_cache=False)
        # every layer's states through the head in one product: 30 products of a few rows each
        # cost the head's weights read 30 times (on SmolLM2, 22 ms a layer on the 2-core CPU)
        z = readout(model, torch.cat([g[0] for g in got])).view(len(layers), len(chunk), -1).cpu()  # (L, B, vocab)
        gold = z.gather(2, t.expand(len(layers), -1)[..., None])  # (L, B, 1)
        prob.append(torch.softmax(z, -1).gather(2, t.expand(len(layers), -1)[..., None])[..., 0].double())
        rank.append(1 + (z > gold).sum(2).double())
    return torch.cat(prob, 1), torch.cat(rank, 1)


def _head_patched(model: nn.Module, edit) -> bool:
    """Whether `edit` changes the LM head, which the lens reads every layer through."""
    head = model.get_output_embeddings()
    params = dict(model.named_parameters(remove_duplicate=False))
    return bool(getattr(edit, "unties_lm_head", False)) or any(params.get(n) is head.weight for n in edit.patches)


def logit_lens_attack(model: nn.Module, tokenizer, edit, probes: Sequence[Probe], *,
                      fmt: PromptFormat | None = None, between: Between | None = None) -> AttackResult:
    """Name "logit_lens": where the answer still lives. For each probe, the residual stream
    at the position that predicts the fact (the question, then the answer up to its fact,
    teacher-forced: `fact_position`) is read at every layer's output through the final norm
    and the unembedding (`lens`), on the base model and on the edited one (each with its own
    head, so an edit of the head shows at every layer).

    base / edited: the share of probes whose fact token is the top-1 prediction at the last
    layer (the model's own greedy choice at that position, not a generated answer).
    details, per layer (index l = the output of decoder layer l): base_prob / edited_prob
    the mean probability over probes, base_rank / edited_rank the median rank (1 = top);
    band (the edit's layers), first_changed_layer, fact_not_in_answer (probes read as their
    fact alone), and a note on the layers below the edit. between: a step boundary
    (`grom.turns`) between the lens's batches, the edit reverted there.
    """
    if not probes:
        raise ValueError("the logit lens needs at least one probe")
    t0 = time.perf_counter()
    read = [fact_position(tokenizer, p, fmt) for p in probes]
    ids, tokens = [r[0] for r in read], [r[1] for r in read]
    model.eval()
    below = BelowTheEdit(model, edit)
    first = below.first
    # the edited model's residual stream below its first changed layer is the base's, read through
    # the same head: those rows are the base's, and its passes replay those layers (`BelowTheEdit`)
    start = first if 0 < first < len(decoder_layers(model)) and not _head_patched(model, edit) else 0
    with Held(below.recording if start else None) as held:
        pb, rb = lens(model, ids, tokens, pad=pad_id(tokenizer), between=inside(between, held.left))
    give(between)
    with Held(lambda: edit.applied(model), below.replaying if start else None) as held:
        pe, re_ = lens(model, ids, tokens, pad=pad_id(tokenizer), between=inside(between, held.left), start=start)
    pe, re_ = torch.cat([pb[:start], pe]), torch.cat([rb[:start], re_])
    if first >= pb.shape[0]:
        note = ("The edit changes only the LM head: the residual stream is the base model's at every "
                "layer by construction, and the lens differs only through the edited head.")
    elif first > 0:
        note = (f"Below layer {first} (the edit's first) the residual stream is untouched by construction: "
                "no weight there changes, so base and edited read the same there.")
    else:
        note = "The edit changes weights that the first layer reads (embeddings or more): no layer is untouched."
    details = {"layers": list(range(pb.shape[0])),
               "base_prob": pb.mean(1).tolist(), "edited_prob": pe.mean(1).tolist(),
               "base_rank": rb.median(1).values.tolist(), "edited_rank": re_.median(1).values.tolist(),
               "band": list(getattr(edit, "band", [])), "first_changed_layer": first,
               "fact_not_in_answer": sum(not r[2] for r in read), "note": note}
    top = lambda r: float((r[-1] == 1).double().mean())  # noqa: E731
    return AttackResult("logit_lens", top(rb), top(re_), time.perf_counter() - t0, len(probes),
                        details=details)
