"""`run_baseline`: fine-tuning unlearning baselines (GA, GradDiff, NPO, SimNPO) as an `Edit`.

The recipe follows OpenUnlearning's TOFU unlearning setup (configs/trainer/finetune.yaml,
configs/experiment/unlearn/tofu/default.yaml, the HF Trainer defaults it runs under):

- data: each forget sequence is visited once per epoch in a seeded random order; each gets
  a retain sequence drawn uniformly at random (seeded), as ``ForgetRetainDataset`` with
  ``anchor="forget"``. QA items are the formatted prompt (grom.data.prompts, the same code
  as grom.keys) followed by the answer and the EOS token; the loss is on the answer tokens
  and EOS only (the prompt is masked with -100), as ``preprocess_chat_instance``. Text items
  are plain LM on every token after the first. Choice items are QA on the correct option's
  letter (grom.keys.choice_question).
- optimiser: ``torch.optim.AdamW`` (betas 0.9/0.999, eps 1e-8), weight decay 0.01 except on
  biases and norm weights (HF Trainer's grouping), gradients clipped to norm 1.0, linear
  warm-up over ``warmup_epochs`` (1.0) epochs' worth of steps then linear decay to 0 (HF's
  default "linear" schedule), lr 1e-5, 10 epochs. Upstream's effective batch is 32 (8 per
  device x 4 accumulation steps): ``batch_size=8, grad_accum=4`` reproduces it.
- precision: float32 / float64 parameters are trained in place; lower-precision ones
  (bf16, fp16) through float32 master copies (the forward/backward runs in the model's
  dtype, AdamW updates the masters, the weights get the rounded masters). The patch is
  ``master - W0`` in float32, cast to the weight's dtype.

The model comes back exactly as it was found (weights bit for bit, train/eval mode,
requires_grad flags, .grad), also when training fails or `progress` raises.
"""
from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from grom.arch import model_device
from grom.config import EditConfig
from grom.data.prompts import PromptFormat
from grom.data.schema import TextExample, as_examples
from grom.edit import Edit
from grom.keys import Encoded, encode_example, pad_id
from grom.baselines.losses import (IGNORE_INDEX, ga_loss, mean_nll, npo_loss, sequence_nll,
                                   simnpo_loss)

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]

BASELINES = ("ga", "graddiff", "npo", "simnpo")

# OpenUnlearning's configs/trainer/{GradAscent,GradDiff,NPO,SimNPO}.yaml method_args.
DEFAULTS: dict[str, dict[str, float]] = {
    "ga": {},
    "graddiff": {"gamma": 1.0, "alpha": 1.0},
    "npo": {"beta": 0.1, "gamma": 1.0, "alpha": 1.0},
    "simnpo": {"beta": 4.5, "delta": 0.0, "gamma": 0.125, "alpha": 1.0},
}

# HF Trainer.get_decay_parameter_names: no weight decay on these (and on nn.LayerNorm).
_NO_DECAY = [re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)",
                                     r"_norm(?:$|\.)")]


@dataclass(frozen=True)
class Settings:
    """Every setting of one baseline run, resolved (None: not used by the method)."""

    method: str
    epochs: float = 10
    lr: float = 1e-5
    batch_size: int = 8
    grad_accum: int = 1
    warmup_epochs: float = 1.0
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    seed: int = 0
    max_length: int = 512
    beta: float | None = None
    alpha: float | None = None
    gamma: float | None = None
    delta: float | None = None
    params: tuple[str, ...] | None = None
    prompt_format: PromptFormat | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = list(self.params) if self.params is not None else None
        return d


def resolve_settings(method: str, **kw) -> Settings:
    """Validate `method` and the hyperparameters; None takes the method's default."""
    name = str(method).lower()
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {method!r}; use one of {', '.join(BASELINES)}")
    defaults = DEFAULTS[name]
    for key in ("beta", "alpha", "gamma", "delta"):
        if key not in defaults:
            if kw.get(key) is not None:
                log.warning("%s does not use %s; ignored", name, key)
            kw[key] = None
        elif kw.get(key) is None:
            kw[key] = defaults[key]
        else:
            kw[key] = float(kw[key])
    params = kw.get("params")
    if isinstance(params, str):
        params = (params,)
    kw["params"] = tuple(params) if params is not None else None
    s = Settings(method=name, **kw)
    checks = [
        (s.epochs > 0 or (s.max_steps or 0) > 0, "epochs must be > 0 (or give max_steps)"),
        (s.max_steps is None or s.max_steps >= 1, "max_steps must be None or >= 1"),
        (s.lr >= 0, "lr must be >= 0"),
        (s.batch_size >= 1 and s.grad_accum >= 1, "batch_size and grad_accum must be >= 1"),
        (s.warmup_epochs >= 0 and s.weight_decay >= 0 and s.max_grad_norm >= 0,
         "warmup_epochs, weight_decay and max_grad_norm must be >= 0"),
        (s.max_length >= 2, "max_length must be >= 2"),
        (s.beta is None or s.beta > 0, "beta must be > 0"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"{name}: {msg}")
    return s


# ---------------------------------------------------------------------------------------
# data

def encode_sequences(tokenizer, examples: Sequence, fmt: PromptFormat | None, max_length: int,
                     add_eos: bool = True) -> list[Encoded]:
    """Training sequences of `examples`: QA on the answer (+ EOS), text as plain LM.

    Uses grom.keys.encode_example ("qa" mode for QA / choice / fact examples, "corpus" for
    text), so prompts are formatted exactly as for GROM's forget keys; the EOS token is
    appended to QA answers as OpenUnlearning's ``preprocess_chat_instance`` does.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    out: list[Encoded] = []
    for i, ex in enumerate(as_examples(examples)):
        text = isinstance(ex, TextExample)
        for e in encode_example(tokenizer, ex, i, mode="corpus" if text else "qa", fmt=fmt,
                                max_length=max_length):
            if (add_eos and not text and eos is not None and e.gold[-1] != eos
                    and len(e.input_ids) < max_length):
                e = Encoded(e.input_ids + (int(eos),), e.positions + (len(e.input_ids) - 1,),
                            e.gold + (int(eos),), e.example)
            out.append(e)
    return out


@dataclass
class LMBatch:
    """A right-padded batch with HF-style (unshifted) labels, -100 where there is no loss."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T)


def collate(encoded: Sequence[Encoded], pad: int) -> LMBatch:
    T = max(len(e.input_ids) for e in encoded)
    ids = torch.full((len(encoded), T), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), T), dtype=torch.long)
    labels = torch.full((len(encoded), T), IGNORE_INDEX, dtype=torch.long)
    for b, e in enumerate(encoded):
        ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[b, : len(e.input_ids)] = 1
        labels[b, torch.tensor(e.positions) + 1] = torch.tensor(e.gold)
    return LMBatch(ids, mask, labels)


def batch_nll(model: nn.Module, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of each sequence's label tokens and their number, (B,) each."""
    dev = model_device(model)
    logits = model(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
                   use_cache=False).logits
    return sequence_nll(logits, batch.labels.to(logits.device))


def answer_nll(model: nn.Module, tokenizer, examples: Sequence, *, prompt_format=None,
               batch_size: int = 8, max_length: int = 512, add_eos: bool = True) -> float:
    """Token-mean NLL of the examples' answers (the baselines' training loss), no grad."""
    enc = encode_sequences(tokenizer, examples, prompt_format, max_length, add_eos)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(enc), batch_size):
            nll, n = batch_nll(model, collate(enc[i:i + batch_size], pad_id(tokenizer)))
            total, count = total + float(nll.double().sum()), count + int(n.sum())
    return total / max(count, 1)


# ---------------------------------------------------------------------------------------
# model state

def select_parameters(model: nn.Module, params: Sequence[str] | None) -> list[tuple[str, nn.Parameter]]:
    """The trained parameters: all floating ones, or those whose name contains one of the
    `params` substrings. From named_parameters(), so a tied pair appears once, under the
    name model.get_parameter resolves."""
    named = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    chosen = named if params is None else [(n, p) for n, p in named if any(s in n for s in params)]
    if not chosen:
        raise ValueError(f"no parameter name contains any of {list(params or [])}; names look like "
                         f"{', '.join(n for n, _ in named[:4])}")
    meta = [n for n, p in chosen if p.device.type == "meta"]
    if meta:
        raise ValueError(f"{meta[0]} is offloaded (on the meta device); load the model on a real device")
    return chosen


def _no_decay_names(model: nn.Module) -> set[str]:
    names = set()
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(mod, nn.LayerNorm) or any(r.search(full.lower()) for r in _NO_DECAY):
                names.add(full)
    return names


class ModelState:
    """Train/eval mode, requires_grad flags and .grad of every parameter, to put back."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.training = {m: m.training for m in model.modules()}
        self.flags = [(p, p.requires_grad, p.grad) for p in model.parameters()]

    def restore(self) -> None:
        for m, t in self.training.items():
            m.training = t
        for p, flag, grad in self.flags:
            p.requires_grad_(flag)
            p.grad = grad


# ---------------------------------------------------------------------------------------
# training

@dataclass
class Trained:
    """What one training run produced (the weights themselves stay in the model)."""

    masters: dict[str, torch.Tensor]  # float32 masters of low-precision parameters
    history: list[dict] = field(default_factory=list)
    steps: int = 0
    total_steps: int = 0
    warmup_steps: int = 0
    n_forget: int = 0
    n_retain: int = 0
    seconds: float = 0.0


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """HF's get_linear_schedule_with_warmup factor of the lr at optimizer step `step`."""
    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def _reference_nll(model: nn.Module, forget: list[Encoded], s: Settings, pad: int) -> torch.Tensor:
    """Summed answer NLL of every forget sequence under the initial weights, (n,) float32.

    The NPO reference model is the model before unlearning; its log-probabilities are fixed,
    so they are computed once here (eval mode, as upstream's ref_model) instead of keeping a
    copy of the model."""
    was = {m: m.training for m in model.modules()}
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for i in range(0, len(forget), s.batch_size):
                nll, _ = batch_nll(model, collate(forget[i:i + s.batch_size], pad))
                out.append(nll.float().cpu())
    finally:
        for m, t in was.items():
            m.training = t
    return torch.cat(out)


def _loss(model, s: Settings, forget: list[Encoded], retain: list[Encoded], f_idx, r_idx,
          ref: torch.Tensor | None, pad: int) -> tuple[torch.Tensor, dict]:
    nll, counts = batch_nll(model, collate([forget[i] for i in f_idx.tolist()], pad))
    f_nll = float(mean_nll(nll.detach(), counts))
    if s.method in ("ga", "graddiff"):
        forget_loss = ga_loss(nll, counts)
    elif s.method == "npo":
        forget_loss = npo_loss(nll, ref[f_idx].to(nll.device), s.beta)
    else:
        forget_loss = simnpo_loss(nll, counts, s.beta, s.delta)
    if s.method == "ga":
        return forget_loss, {"forget": float(forget_loss.detach()), "forget_nll": f_nll}
    parts = {"forget": float(forget_loss.detach()), "forget_nll": f_nll}
    loss = s.gamma * forget_loss
    if s.alpha != 0:
        retain_loss = mean_nll(*batch_nll(model, collate([retain[i] for i in r_idx.tolist()], pad)))
        loss = loss + s.alpha * retain_loss
        parts["retain"] = float(retain_loss.detach())
    return loss, parts


def _train(model: nn.Module, s: Settings, forget: list[Encoded], retain: list[Encoded],
           slots: list[tuple[str, nn.Parameter]], pad: int, progress: Progress) -> Trained:
    """Train `slots` in place. Sets train mode and requires_grad; the caller restores them."""
    t0 = time.perf_counter()
    dev = model_device(model)
    trained = {n for n, _ in slots}
    torch.manual_seed(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    ref = None
    if s.method == "npo":
        progress(0.0, "npo: reference log-probabilities")
        ref = _reference_nll(model, forget, s, pad)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
        p.grad = None
    model.train()

    masters: dict[str, torch.Tensor] = {}
    pairs = []  # (model parameter, the tensor AdamW updates)
    for n, p in slots:
        if p.dtype in (torch.float32, torch.float64):
            pairs.append((p, p))
        else:
            masters[n] = p.detach().float().clone()
            pairs.append((p, masters[n]))
    no_decay = _no_decay_names(model)
    groups = [{"params": [o for (n, _), (_, o) in zip(slots, pairs) if n not in no_decay],
               "weight_decay": s.weight_decay},
              {"params": [o for (n, _), (_, o) in zip(slots, pairs) if n in no_decay],
               "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.999), eps=1e-8)
    n_f = len(forget)
    micro_per_epoch = math.ceil(n_f / s.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / s.grad_accum)
    total = s.max_steps if s.max_steps is not None else max(1, math.ceil(s.epochs * steps_per_epoch))
    warmup = int(s.warmup_epochs * n_f // (s.batch_size * s.grad_accum))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(warmup, total))
    opt_tensors = [o for _, o in pairs]
    result = Trained(masters, steps=0, total_steps=total, warmup_steps=warmup, n_forget=n_f,
                     n_retain=len(retain))

    step = 0
    while step < total:
        order = torch.randperm(n_f, generator=gen)
        micro = list(torch.split(order, s.batch_size))
        for k in range(0, len(micro), s.grad_accum):
            if step >= total:
                break
            group = micro[k:k + s.grad_accum]
            lr = opt.param_groups[0]["lr"]
            record: dict[str, float] = {}
            for f_idx in group:
                r_idx = (torch.randint(0, len(retain), (len(f_idx),), generator=gen)
                         if retain and s.method != "ga" else None)
                loss, parts = _loss(model, s, forget, retain, f_idx, r_idx, ref, pad)
                (loss / len(group)).backward()
                parts["loss"] = float(loss.detach())
                for key, v in parts.items():
                    record[key] = record.get(key, 0.0) + v / len(group)
            for p, o in pairs:
                if o is not p:
                    o.grad = None if p.grad is None else p.grad.float()
                    p.grad = None
            if s.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(opt_tensors, s.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p, o in pairs:
                    if o is not p:
                        p.copy_(o)
            step += 1
            result.steps = step
            result.history.append({"step": step, "lr": lr, **record})
            progress(step / total, f"{s.method} step {step}/{total}: loss {record['loss']:.4f}, "
                                   f"forget NLL {record['forget_nll']:.3f}")
    result.seconds = time.perf_counter() - t0
    log.info("%s: %d steps in %.1fs on %s", s.method, step, result.seconds, dev)
    return result


def _setup(method, tokenizer, forget, retain, kw) -> tuple[Settings, list[Encoded], list[Encoded]]:
    s = resolve_settings(method, **kw)
    forget, retain = as_examples(forget), as_examples(retain or ())
    if not forget:
        raise ValueError("the forget set is empty: give at least one example to forget")
    if s.method != "ga" and s.alpha != 0 and not retain:
        raise ValueError(f"{s.method} needs retain examples for its retain loss (or alpha=0)")
    enc_f = encode_sequences(tokenizer, forget, s.prompt_format, s.max_length)
    enc_r = encode_sequences(tokenizer, retain, s.prompt_format, s.max_length) if retain else []
    if not enc_f:
        raise ValueError("the forget examples produced no answer tokens (empty answers or texts?)")
    if s.method != "ga" and s.alpha != 0 and not enc_r:
        raise ValueError("the retain examples produced no answer tokens (empty answers or texts?)")
    return s, enc_f, enc_r


def _rng_devices(model: nn.Module) -> list[int]:
    dev = model_device(model)
    if dev.type != "cuda":
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


def train_in_place(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, *,
                   progress: Progress | None = None, **kw) -> Trained:
    """Train `model` with the baseline and leave it trained (mode, requires_grad flags and
    .grad are restored; the weights are not). Same arguments as `run_baseline`; for tests
    and for whoever wants the trained model itself."""
    s, enc_f, enc_r = _setup(method, tokenizer, forget, retain, kw)
    slots = select_parameters(model, s.params)
    state = ModelState(model)
    try:
        with torch.random.fork_rng(devices=_rng_devices(model)):
            return _train(model, s, enc_f, enc_r, slots, pad_id(tokenizer), progress or (lambda *_: None))
    finally:
        state.restore()


def run_baseline(method: str, model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, *,
                 epochs: float = 10, seed: int = 0, progress: Progress | None = None,
                 lr: float = 1e-5, batch_size: int = 8, prompt_format: PromptFormat | None = None,
                 beta: float | None = None, alpha: float | None = None, gamma: float | None = None,
                 delta: float | None = None, params: Sequence[str] | None = None,
                 max_steps: int | None = None, grad_accum: int = 1, warmup_epochs: float = 1.0,
                 weight_decay: float = 0.01, max_grad_norm: float = 1.0,
                 max_length: int = 512) -> Edit:
    """Unlearn by fine-tuning with `method` (one of BASELINES) and return the weight change
    as an `Edit`; the model is returned exactly as it was found (also on failure).

    forget / retain: sequences of benchmark examples (grom.data.schema). beta / alpha /
    gamma / delta: None takes OpenUnlearning's defaults for the method (`DEFAULTS`):
    GradDiff gamma 1, alpha 1; NPO beta 0.1, gamma 1, alpha 1; SimNPO beta 4.5, delta 0,
    gamma 0.125, alpha 1 (GA uses none). `epochs` over the forget set, or `max_steps`
    optimizer steps (overrides epochs, as in HF). `params`: None trains every parameter,
    else those whose name contains one of the substrings (e.g. ["mlp"]). `progress(fraction,
    message)` is called after every optimizer step.

    The Edit: `patches` = final - initial weights of every parameter that changed (each in
    its weight's dtype), `method`, `info` (settings, steps, final losses, loss history),
    `timings` {"train", "total"}; `config` is a default EditConfig, unused by baselines;
    `layers` is empty.
    """
    t_start = time.perf_counter()
    progress = progress or (lambda *_: None)
    progress(0.0, "tokenizing")
    kw = dict(epochs=epochs, seed=seed, lr=lr, batch_size=batch_size, prompt_format=prompt_format,
              beta=beta, alpha=alpha, gamma=gamma, delta=delta, params=params, max_steps=max_steps,
              grad_accum=grad_accum, warmup_epochs=warmup_epochs, weight_decay=weight_decay,
              max_grad_norm=max_grad_norm, max_length=max_length)
    s, enc_f, enc_r = _setup(method, tokenizer, forget, retain, kw)
    slots = select_parameters(model, s.params)
    state = ModelState(model)
    originals = {n: p.detach().to("cpu", copy=True) for n, p in slots}
    patches: dict[str, torch.Tensor] = {}
    try:
        with torch.random.fork_rng(devices=_rng_devices(model)):
            run = _train(model, s, enc_f, enc_r, slots, pad_id(tokenizer), progress)
        with torch.no_grad():
            for n, p in slots:
                final = run.masters.get(n, p.detach())
                work = torch.promote_types(p.dtype, torch.float32)
                d = final.to(work) - originals[n].to(final.device, work)
                if bool((d != 0).any()):
                    patches[n] = d.to(p.dtype).cpu()
    finally:
        with torch.no_grad():
            for n, p in slots:
                p.copy_(originals[n].to(p.device))
        state.restore()
    last = run.history[-1] if run.history else {}
    info = {
        **s.to_dict(),
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "n_forget_sequences": run.n_forget,
        "n_retain_sequences": run.n_retain,
        "trained_parameters": len(slots),
        "trained_numel": sum(p.numel() for _, p in slots),
        "fp32_master_weights": sorted(run.masters),
        "final": {k: v for k, v in last.items() if k not in ("step", "lr")},
        "history": run.history,
        "note": "config is a default EditConfig and is not used by baselines",
    }
    timings = {"train": run.seconds, "total": time.perf_counter() - t_start}
    progress(1.0, "done")
    return Edit(config=EditConfig(), patches=patches, layers=[], timings=timings,
                model_name=getattr(getattr(model, "config", None), "_name_or_path", None),
                method=s.method, info=info)
