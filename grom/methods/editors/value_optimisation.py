"""The facts the editors edit, and the one per-fact value optimisation all four share
(was grom/baselines/values.py).

A fact is (subject, relation, object): a ZsRE `FactRecord` (its prompt, subject, answer)
or a `QAExample` with a `subject` (the real-knowledge set: the question, the subject it is
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
from grom.methods.editors.layers_above import Upper, capture_upper, upper_logits
from grom.model.arch import model_device
from grom.turns import Between, flags_as, give, inside

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


def object_probabilities(model: nn.Module, facts: Sequence[Fact], pad_id: int,
                         between: Between | None = None) -> torch.Tensor:
    """The mean probability of each fact's object tokens under the model as it is, (u,):
    VALUE_CHUNK facts a forward pass, `between` between two."""
    out = []
    for lo in range(0, len(facts), VALUE_CHUNK):
        if lo:
            give(between)
        part = facts[lo:lo + VALUE_CHUNK]
        ids, mask = _pad([f.ids for f in part], pad_id, model_device(model))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out += [p.mean() for p in _object_probs(logits, part)]
    return torch.stack(out).cpu()


VALUE_CHUNK = 8
"""Facts per forward and backward pass of a value step. A step of SmolLM2's 25 real-knowledge
facts runs 21 layers forward and back over ~1,500 tokens: 20-40 s on a busy 2-core CPU in
one pass; in chunks of 8 facts, 1.5-11 s each for the same total (chunks of 4 were slower
in all), and a host sharing the model lends it between two chunks (`between`). Each fact's
loss and gradient read its own row alone, so the chunks change no step, up to float
rounding."""


@dataclass
class _Chunk:
    """A few facts (`lo`:`hi` of the run's) as a value step reads them: their stream above
    the layer (`upper`, and `e_upper` for their "{subject} is a" prompts), delta's rows and
    positions in it, the object positions and tokens the loss reads."""

    lo: int
    hi: int
    upper: Upper
    e_upper: Upper
    rows: torch.Tensor
    keys: torch.Tensor
    e_keys: torch.Tensor
    o_rows: torch.Tensor
    o_pos: torch.Tensor
    gold: torch.Tensor
    sizes: list[int]

    @classmethod
    def of(cls, model: nn.Module, facts: Sequence[Fact], lo: int, hi: int, layer: int, pad_id: int, dev) -> "_Chunk":
        part = facts[lo:hi]
        f_ids, f_mask = _pad([f.ids for f in part], pad_id, dev)
        e_ids, e_mask = _pad([f.essence for f in part], pad_id, dev)
        with torch.no_grad():
            upper, e_upper = capture_upper(model, layer, f_ids, f_mask), capture_upper(model, layer, e_ids, e_mask)
        return cls(lo, hi, upper, e_upper, torch.arange(len(part), device=dev),
                   torch.tensor([f.key for f in part], device=dev),
                   torch.tensor([f.essence_key for f in part], device=dev),
                   torch.cat([torch.full((len(f.objects),), b, device=dev) for b, f in enumerate(part)]),
                   torch.cat([torch.tensor(f.objects, device=dev) for f in part]),
                   torch.tensor([f.ids[p] for f in part for p in f.objects], device=dev),
                   [len(f.objects) for f in part])

    def run(self, model: nn.Module, delta: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(per fact, its object tokens' probabilities; the log-probabilities at the key
        token of its "{subject} is a") with `delta`'s rows of these facts added."""
        d = delta[self.lo:self.hi]
        logits = upper_logits(model, self.upper, d, self.rows, self.keys, self.o_rows, self.o_pos - 1)  # (t, V)
        probs = torch.log_softmax(logits.float(), -1).gather(1, self.gold.unsqueeze(1)).squeeze(1).exp()
        e_logits = upper_logits(model, self.e_upper, d, self.rows, self.e_keys, self.rows, self.e_keys)
        return list(probs.split(self.sizes)), torch.log_softmax(e_logits.float(), -1)


def _chunks(model, facts: Sequence[Fact], layer: int, pad_id: int, between: Between | None) -> list[_Chunk]:
    """The facts in chunks of VALUE_CHUNK, each's stream captured (`between` between them)."""
    out, dev = [], model_device(model)
    for lo in range(0, len(facts), VALUE_CHUNK):
        if lo:
            give(between)
        out.append(_Chunk.of(model, facts, lo, min(lo + VALUE_CHUNK, len(facts)), layer, pad_id, dev))
    return out


def _step(model, chunks: list[_Chunk], delta, h_norm, settings: ValueSettings, start: dict,
          turn: Between | None) -> torch.Tensor:
    """One step's loss per fact (u,), its gradient accumulated into delta.grad chunk by
    chunk (forward and backward, then `turn`: no graph is held while the model is lent,
    so another job may write its weights in place meanwhile). `start` keeps the first
    step's probabilities and essence log-probabilities (the KL's reference)."""
    losses = []
    for i, c in enumerate(chunks):
        if i:
            give(turn)
        probs, kl_logp = c.run(model, delta)
        if i not in start:
            start[i] = (torch.stack([p.mean() for p in probs]).detach(), kl_logp.detach())
        unlikely = torch.stack([-torch.log1p(-p.clamp(max=1 - 1e-6)).mean() for p in probs])
        kl = (kl_logp.exp() * (kl_logp - start[i][1])).sum(-1)  # KL(now || before), as upstream's kl_div
        d, norm = delta[c.lo:c.hi], h_norm[c.lo:c.hi]
        loss = unlikely + settings.kl_factor * kl + settings.weight_decay * d.norm(dim=1) / norm ** 2
        loss.sum().backward()
        losses.append(loss.detach())
    return torch.cat(losses)


def optimise_values(model: nn.Module, facts: Sequence[Fact], layer: int, pad_id: int,
                    settings: ValueSettings = ValueSettings(), between: Between | None = None) -> Values:
    """Optimise one delta per fact at decoder layer `layer`'s output (see the module
    docstring); the model's weights are not touched and its gradients are left as found.

    Each step runs only what delta changes (grom.methods.editors.layers_above): the layers above
    `layer` on the stream captured once below it, the LM head at the object and essence
    positions alone; the facts and their short "{subject} is a" prompts are two batches, so
    the prompts are not padded to the facts' length, in chunks of VALUE_CHUNK facts. The
    loss, its gradient and the steps are those of a full forward pass of the model with
    delta added by a hook.

    between: a step boundary (`grom.turns`) between two chunks and two steps, the
    parameters' grad flags as found there (the streams captured and delta are this run's
    own; the same values with or without it)."""
    chunks = _chunks(model, facts, layer, pad_id, between)
    dev = model_device(model)
    h = torch.cat([c.upper.hidden[c.rows, c.keys] for c in chunks]).detach()  # (u, d)
    h = h.to(torch.promote_types(h.dtype, torch.float32))  # float32 for half models, as before
    h_norm = h.norm(dim=1)
    delta = torch.zeros(len(facts), h.shape[1], device=dev, dtype=h.dtype, requires_grad=True)
    flags = [p.requires_grad for p in model.parameters()]
    turn = inside(between, lambda: flags_as(model, flags))
    model.requires_grad_(False)
    opt = torch.optim.Adam([delta], lr=settings.lr)
    step, start = 0, {}
    try:
        with torch.enable_grad():
            for step in range(settings.steps):
                if step:
                    give(turn)
                opt.zero_grad()
                if bool((_step(model, chunks, delta, h_norm, settings, start, turn) < settings.stop_loss).all()):
                    break
                opt.step()
                with torch.no_grad():
                    cap = settings.clamp_norm_factor * h_norm
                    delta.mul_((cap / delta.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0).unsqueeze(1))
        delta.grad = None
        after = []
        with torch.no_grad():
            for c in chunks:
                give(turn)
                after += [p.mean() for p in c.run(model, delta)[0]]
        p_after = torch.stack(after)
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    p_before = torch.cat([start[i][0] for i in range(len(chunks))])
    return Values(layer, delta.detach(), h, p_before.cpu(), p_after.cpu(), step + 1)
