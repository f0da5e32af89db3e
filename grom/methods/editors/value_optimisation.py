"""The facts the editors edit, and the one per-fact value optimisation all four share
(was grom/baselines/values.py).

A fact is (subject, relation, object): a ZsRE `FactRecord` (its prompt, subject, answer)
or a `QAExample` with a `subject` (the real-knowledge set: the question, the target it is
about, and the `fact` inside the answer, else the whole answer). It is tokenised as the
prompt followed by its answer (``grom.data.prompts.encode_qa``: the chat template for QA,
the raw prompt for fact records, as GROM's own keys read them), with
- the key token: the last token of the subject where the subject is written in the prompt
  (ROME's ``subject_last``), else the last prompt token (ROME's ``last``);
- the object tokens: the answer tokens that spell the object.

The value optimisation (ROME's compute_v, kmeng01/rome rome/compute_v.py, turned to
unlearning): one vector delta per fact is added to the output of decoder layer L (the
residual stream, as MEMIT's compute_z does at its last layer) at the fact's key token, and
a few Adam steps minimise

    mean_t -log(1 - p_t(object token t))                      (unlikelihood)
    + kl_factor * KL(p_now || p_before) at the key token of "{subject} is a"
    + weight_decay * ||delta|| / ||h||^2,

with ||delta|| clamped to clamp_norm_factor * ||h|| after each step (h the layer's output
at the key token). Why unlikelihood, and not ROME's NLL of a new object or gradient ascent
on the answer's NLL: it is what unlearning asks (the answer made improbable) without
choosing a replacement answer, and it is bounded: it falls to 0 as the answer's
probability does, so the optimisation stops once the answer is gone (loss below
`stop_loss`, upstream's 5e-2) instead of pushing delta to the clamp as an unbounded NLL
ascent would. The KL, the weight decay (its norm-over-squared-norm form as upstream) and
the clamp are ROME's, defaults from the ZeroUnlearn harness's Llama hparams (25 steps,
lr 0.1, clamp 0.75, kl 0.0625, decay 0.5). Deliberate differences from upstream: no
random context prefixes (one prompt per fact), and the clamp is relative to the residual
norm for every rule (MEMIT's, AlphaEdit's, ZeroUnlearn's z; ROME's is the MLP output).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from grom.data.prompts import PromptFormat, encode_qa, format_prompt, uses_chat_template
from grom.data.schema import FactRecord, QAExample
from grom.methods.editors.layers_above import capture_upper, upper_logits
from grom.model.arch import model_device

RAW = PromptFormat(kind="template", template="{question}")  # fact records: the bare prompt


@dataclass(frozen=True)
class Fact:
    """One tokenised fact: ids (prompt + answer), the key token, the object's tokens."""

    subject: str
    ids: tuple[int, ...]
    key: int  # position of the key token (inside the prompt)
    objects: tuple[int, ...]  # positions of the object tokens (inside the answer)
    subject_last: bool  # the key is the subject's last token (else the prompt's last)
    essence: tuple[int, ...]  # ids of "{subject} is a"
    essence_key: int  # the subject's last token in it


def missing_facts(examples: Sequence) -> str | None:
    """Why `examples` cannot be facts (None: they can): what each one lacks."""
    for i, ex in enumerate(examples):
        if isinstance(ex, FactRecord):
            continue
        if not isinstance(ex, QAExample):
            return (f"forget example {i + 1} is a {type(ex).__name__}; the editors need facts "
                    "(subject, relation, object): question/answer pairs with a subject, or fact records")
        if not (ex.subject or "").strip():
            return (f"forget example {i + 1} ({ex.question[:60]!r}) has no subject; the editors need "
                    "(subject, relation, object) facts, as the real-knowledge and ZsRE sets give")
    return None


def unreachable_facts(facts: Sequence[Fact], value_layer: int, n_layers: int) -> int:
    """How many facts a value vector at decoder layer `value_layer` (of `n_layers`) cannot
    move: at the last layer nothing mixes positions after it, so only a fact whose first
    object token is predicted at its key token (key == objects[0] - 1) reaches its loss."""
    if value_layer < n_layers - 1:
        return 0
    return sum(f.key != f.objects[0] - 1 for f in facts)


def _overlapping(offsets, lo: int, hi: int, first: int, last: int) -> list[int]:
    return [j for j in range(first, last) if offsets[j][1] > offsets[j][0]
            and offsets[j][0] < hi and offsets[j][1] > lo]


def encode_fact(tokenizer, example, fmt: PromptFormat | None, max_length: int) -> Fact:
    """The `Fact` of a FactRecord or a QAExample with a subject."""
    if isinstance(example, FactRecord):
        question, fmt, obj = example.prompt, RAW, example.answer
        answer = example.answer if example.prompt[-1:].isspace() else " " + example.answer
    else:
        question, answer = example.question, example.answer
        obj = example.fact if example.fact and example.fact in example.answer else example.answer
    subject = example.subject.strip()
    ids, start = encode_qa(tokenizer, question, answer, fmt)
    text = format_prompt(tokenizer, question, fmt)
    chat = uses_chat_template(tokenizer, fmt)
    full = text + (answer.strip() if chat else answer)
    offsets = tokenizer(full, add_special_tokens=not chat, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) != len(ids) or start == 0 or start >= len(ids):
        raise ValueError(f"cannot place the answer of {question[:60]!r} after its prompt")
    at = text.rfind(subject)
    on_subject = _overlapping(offsets, at, at + len(subject), 0, start) if at >= 0 else []
    lo = full.rfind(obj)
    objects = _overlapping(offsets, lo, lo + len(obj), start, len(ids)) if lo >= len(text) else []
    objects = objects or list(range(start, len(ids)))
    if objects[-1] >= max_length:
        raise ValueError(f"the fact {question[:60]!r} is longer than max_length ({max_length} tokens)")
    ess = tokenizer(f"{subject} is a", add_special_tokens=True, return_offsets_mapping=True)
    ess_key = max(_overlapping(ess["offset_mapping"], 0, len(subject), 0, len(ess["input_ids"])))
    return Fact(subject, tuple(ids[:objects[-1] + 1]), on_subject[-1] if on_subject else start - 1,
                tuple(objects), bool(on_subject), tuple(ess["input_ids"]), ess_key)


@dataclass(frozen=True)
class ValueSettings:
    """The value optimisation's settings (ROME's names in brackets)."""

    steps: int = 25  # Adam steps (v_num_grad_steps)
    lr: float = 0.1  # (v_lr)
    clamp_norm_factor: float = 0.75  # ||delta|| <= this * ||h|| (clamp_norm_factor)
    kl_factor: float = 0.0625  # weight of the essence KL (kl_factor)
    weight_decay: float = 0.5  # (v_weight_decay)
    stop_loss: float = 0.05  # stop once every fact's loss is below this


@dataclass
class Values:
    """The result: delta (u, d) to add at layer L's output, h (u, d) that output at the
    key tokens, and the mean object-token probability before and after, (u,)."""

    layer: int
    delta: torch.Tensor
    h: torch.Tensor
    p_before: torch.Tensor
    p_after: torch.Tensor
    steps: int


def _pad(seqs: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
    return ids.to(device), mask.to(device)


def _object_probs(logits: torch.Tensor, facts: Sequence[Fact]) -> list[torch.Tensor]:
    """Per fact, the probabilities (t,) of its object tokens, each read one position early."""
    out = []
    for b, f in enumerate(facts):
        pos = torch.tensor(f.objects, device=logits.device)
        logp = torch.log_softmax(logits[b, pos - 1].float(), dim=-1)
        out.append(logp.gather(1, torch.tensor(f.ids, device=logits.device)[pos].unsqueeze(1)).squeeze(1).exp())
    return out


def object_probabilities(model: nn.Module, facts: Sequence[Fact], pad_id: int) -> torch.Tensor:
    """The mean probability of each fact's object tokens under the model as it is, (u,)."""
    ids, mask = _pad([f.ids for f in facts], pad_id, model_device(model))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return torch.stack([p.mean() for p in _object_probs(logits, facts)]).cpu()


def optimise_values(model: nn.Module, facts: Sequence[Fact], layer: int, pad_id: int,
                    settings: ValueSettings = ValueSettings()) -> Values:
    """Optimise one delta per fact at decoder layer `layer`'s output (see the module
    docstring); the model's weights are not touched and its gradients are left as found.

    Each step runs only what delta changes (grom.methods.editors.layers_above): the layers above
    `layer` on the stream captured once below it, the LM head at the object and essence
    positions alone; the facts and their short "{subject} is a" prompts are two batches, so
    the prompts are not padded to the facts' length. The loss, its gradient and the steps
    are those of a full forward pass of the model with delta added by a hook."""
    u, dev = len(facts), model_device(model)
    f_ids, f_mask = _pad([f.ids for f in facts], pad_id, dev)
    e_ids, e_mask = _pad([f.essence for f in facts], pad_id, dev)
    rows = torch.arange(u, device=dev)
    keys = torch.tensor([f.key for f in facts], device=dev)
    e_keys = torch.tensor([f.essence_key for f in facts], device=dev)
    o_rows = torch.cat([torch.full((len(f.objects),), b, device=dev) for b, f in enumerate(facts)])
    o_pos = torch.cat([torch.tensor(f.objects, device=dev) for f in facts])
    gold = torch.tensor([f.ids[p] for f in facts for p in f.objects], device=dev)
    sizes = [len(f.objects) for f in facts]
    with torch.no_grad():
        upper, e_upper = capture_upper(model, layer, f_ids, f_mask), capture_upper(model, layer, e_ids, e_mask)
    dtype = torch.promote_types(upper.hidden.dtype, torch.float32)  # float32 for half models, as before
    h = upper.hidden[rows, keys].detach().to(dtype)  # (u, d)
    h_norm = h.norm(dim=1)
    delta = torch.zeros(u, h.shape[1], device=dev, dtype=dtype, requires_grad=True)

    def run() -> tuple[list[torch.Tensor], torch.Tensor]:
        logits = upper_logits(model, upper, delta, rows, keys, o_rows, o_pos - 1)  # (t, V)
        probs = torch.log_softmax(logits.float(), -1).gather(1, gold.unsqueeze(1)).squeeze(1).exp()
        e_logits = upper_logits(model, e_upper, delta, rows, e_keys, rows, e_keys)  # (u, V)
        return list(probs.split(sizes)), torch.log_softmax(e_logits.float(), -1)

    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    opt = torch.optim.Adam([delta], lr=settings.lr)
    step = 0
    try:
        with torch.enable_grad():
            for step in range(settings.steps):
                probs, kl_logp = run()
                if step == 0:
                    p_before = torch.stack([p.mean() for p in probs]).detach()
                    kl_init = kl_logp.detach()
                unlikely = torch.stack([-torch.log1p(-p.clamp(max=1 - 1e-6)).mean() for p in probs])
                kl = (kl_logp.exp() * (kl_logp - kl_init)).sum(-1)  # KL(now || before), as upstream's kl_div
                loss = unlikely + settings.kl_factor * kl + settings.weight_decay * delta.norm(dim=1) / h_norm ** 2
                if bool((loss < settings.stop_loss).all()):
                    break
                opt.zero_grad()
                loss.sum().backward()
                opt.step()
                with torch.no_grad():
                    cap = settings.clamp_norm_factor * h_norm
                    delta.mul_((cap / delta.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0).unsqueeze(1))
        with torch.no_grad():
            p_after = torch.stack([p.mean() for p in run()[0]])
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return Values(layer, delta.detach(), h, p_before.cpu(), p_after.cpu(), step + 1)
