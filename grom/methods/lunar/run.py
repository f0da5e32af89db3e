"""LUNAR's run and its row of the method registry: `LunarConfig`, `run_lunar`, `lunar_layer`.

One run (upstream's `run_lunar.py`, commit dfa56eb0291a93e967284a9ec2d28d5572d235b1, for
one layer, its config's `layer_modified: [22]` of Llama-3-8B's 32):
1. the refusal direction r at block l's output, last prompt token (refusal prompts minus
   forget prompts, grom.methods.lunar.activations);
2. the rows: down_proj's inputs and outputs at every token of the forget and retain
   prompts; the forget targets moved by coeff r;
3. the fit of block l's down_proj to them: upstream's AdamW training (`solver="adamw"`, in
   upstream's bfloat16 by default, `dtype="float32"` our variant) or the same least-squares
   objective solved exactly on GROM's solver (`solver="closed-form"`, float64;
   grom.methods.lunar.fit).
The result is a `grom.Edit` with one patch, W - W0 of that down_proj (applied, reverted,
saved and checked as an editor's: `config.layers` is (l,), one `LayerRecord`); the model
is left as it was found.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.data.prompts import PromptFormat, settings_from_dict
from grom.data.schema import TextExample, as_examples
from grom.edit import Edit, LayerRecord
from grom.methods.costs import data_tokens, shape_of
from grom.methods.lunar.activations import encode_instructions, read_activations, refusal_direction
from grom.methods.lunar.direction_prompts import KINDS, refusal_prompts
from grom.methods.lunar.fit import closed_form_patch, fit_adamw, mse, training_rows
from grom.model.arch import edited_matrix, loaded_from, num_layers, residual_gain
from grom.registry import Box, MethodEntry, Reason, register, where
from grom.turns import Between, evaluating, give, inside, modes, modes_as

SOLVERS = ("adamw", "closed-form")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
"""The AdamW fit's dtypes (`LunarConfig.dtype`): upstream's bfloat16 (its EstimatedNet cast,
src/dataset_utils.py `prepare_estimated_net_list`), or float32, our variant."""
SOURCE = ("Shen et al., \"LUNAR: LLM Unlearning via Neural Activation Redirection\", NeurIPS 2025; "
          "code github.com/facebookresearch/LUNAR, read at commit dfa56eb0291a93e967284a9ec2d28d5572d235b1 "
          "(run_lunar.py, src/generate_directions.py, src/estimated_net_utils.py, config/forget.yaml)")
"""Where LUNAR comes from, for the studio's glossary."""
UPSTREAM_LAYER, UPSTREAM_DEPTH = 22, 32  # config/forget.yaml: layer_modified [22] on Llama-3-8B-Instruct


def lunar_layer(n_layers: int) -> int:
    """The block LUNAR edits on an `n_layers`-layer model: upstream's 22 of 32 at the same
    relative depth, below the last block (the direction is read at the next block's input)."""
    return max(0, min(n_layers - 2, round(n_layers * UPSTREAM_LAYER / UPSTREAM_DEPTH)))


@dataclass(frozen=True)
class LunarConfig:
    """A LUNAR run's settings: upstream's config/forget.yaml and run_lunar.py unless said."""

    layer: int | None = None  # the block whose down_proj is rewritten; None: `lunar_layer`
    coeff: float = 2.0  # coeff_list [+2.0]
    epochs: int = 20  # num_epochs (README's example: 10)
    lr: float = 0.01  # lr
    batch_size: int = 64  # rows (tokens) per optimizer step: run_lunar.py's DataLoader
    gamma: float = 0.9  # ExponentialLR, stepped each epoch
    weight_decay: float = 0.01  # torch AdamW's default, which upstream keeps
    # the AdamW fit's dtype (weight, rows, loss, moments): upstream's bfloat16 (src/dataset_utils.py casts the
    # EstimatedNet to it; the model is loaded in it), or "float32", our variant; the closed form is float64 either way
    dtype: str = "bfloat16"
    prompts: str = "harmful"  # the direction's refusal prompts: use_harmful (default) or "unverifiable"
    # how many of them (the first n; None: all 120 of a kind). Upstream's files hold 260 harmful / 199 unverified;
    # ours, in our own words, 120 / 120 since issue 47 item 4 (24: the set before, for the older benchmark rows)
    n_prompts: int | None = None
    solver: str = "adamw"  # upstream's training, or "closed-form": the same objective solved exactly
    # the closed form's ridge (GROM's mu = rho x mean diagonal; GROM's 0.03); ours, not upstream's. At 1e-6
    # (near the least-norm solution) SmolLM2 kept 0.016 of its other facts on the solar system, 80% of the
    # forget answers degenerate; at 0.03, 0.83 (BENCHMARKS.md): AdamW's early stop is a regulariser too
    rho: float = 0.03
    prompt_format: PromptFormat | None = None
    max_length: int = 512
    seed: int = 0  # the shuffling of the rows
    forward_batch: int = 16  # prompts per forward pass (upstream: 1 for the rows, 32 for the direction)

    def __post_init__(self) -> None:
        bad = []
        for k in ("coeff", "lr", "gamma", "rho"):
            x = getattr(self, k)
            if not (isinstance(x, (int, float)) and math.isfinite(x) and (x > 0 or (k == "coeff" and x != 0))):
                bad.append(f"{k} = {x!r} must be a {'non-zero' if k == 'coeff' else 'positive'} number")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < float("inf")):
            bad.append(f"weight_decay = {self.weight_decay!r} must be a number >= 0")
        for k, hi in (("epochs", 1000), ("batch_size", 1 << 20), ("forward_batch", 4096), ("max_length", 1 << 16)):
            x = getattr(self, k)
            if not (isinstance(x, int) and 1 <= x <= hi):
                bad.append(f"{k} = {x!r}: use a whole number from 1 to {hi}")
        if self.layer is not None and not (isinstance(self.layer, int) and self.layer >= 0):
            bad.append(f"layer = {self.layer!r}: use a block index >= 0, or None")
        if self.n_prompts is not None and not (isinstance(self.n_prompts, int) and self.n_prompts >= 1):
            bad.append(f"n_prompts = {self.n_prompts!r}: use a whole number >= 1, or None for all")
        if self.prompts not in KINDS:
            bad.append(f"prompts = {self.prompts!r}: use one of {', '.join(KINDS)}")
        if self.dtype not in DTYPES:
            bad.append(f"dtype = {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.solver not in SOLVERS:
            bad.append(f"solver = {self.solver!r}: use one of {', '.join(SOLVERS)}")
        if bad:
            raise ValueError(f"LunarConfig: {bad[0]}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LunarConfig":
        """The settings `to_dict` wrote (a key of no setting is refused)."""
        return settings_from_dict(cls, d)

    def replace(self, **kw) -> "LunarConfig":
        return dataclasses.replace(self, **kw)


NORMALISED = ("LUNAR rewrites the MLP output (down_proj) of a model whose MLP output reaches the residual stream "
              "linearly; this model normalises it first")


def lunar_reason(model, data) -> Reason | None:
    """What LUNAR lacks on `data` (None: nothing): forget questions (instructions), a
    retain set (its retain rows hold the other prompts' activations), and with a `model`, an
    MLP output that reaches the residual stream linearly."""
    at, forget = where(data), tuple(getattr(data, "forget", None) or ())
    if not forget:
        return Reason("no forget set", f"LUNAR needs examples to forget: {at} has none.")
    if any(isinstance(ex, TextExample) for ex in forget):
        return Reason("needs questions", f"LUNAR redirects the activations of the forget questions at their "
                      f"prompt tokens: {at} is a text corpus, with no questions.")
    if not getattr(data, "retain", None):
        return Reason("no retain set", f"LUNAR needs a retain set (its rows keep the other prompts' "
                      f"activations where they are): {at} has none.")
    if model is not None and residual_gain(model, "down_proj") is None:
        return Reason("MLP output normalised", NORMALISED)
    return None


def lunar_defaults(model=None) -> dict:
    """LUNAR's settings by default, its layer fitted to `model` (`lunar_layer`)."""
    config = LunarConfig()
    if model is not None:
        config = config.replace(layer=lunar_layer(num_layers(model)))
    return config.to_dict()


def rows_and_direction(model, tokenizer, forget, retain, config: LunarConfig, layer: int, pid: int,
                       between: Between | None = None):
    """The forget and retain `Activations` at block `layer` and the refusal direction
    (config.prompts, its first config.n_prompts) minus the forget prompts' mean."""
    enc = lambda xs: encode_instructions(tokenizer, xs, config.prompt_format, config.max_length)  # noqa: E731
    f = read_activations(model, enc(forget), layer, pid, config.forward_batch, between=between)
    give(between)
    r = read_activations(model, enc(retain), layer, pid, config.forward_batch, between=between)
    give(between)
    refusals = read_activations(model, enc(refusal_prompts(config.prompts)[:config.n_prompts]), layer, pid,
                                config.forward_batch, keys=False, between=between)
    return f, r, refusal_direction(refusals.last, f.last)


def run_lunar(model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, config: LunarConfig | None = None,
              progress: Callable[[float, str], None] | None = None, between: Between | None = None, **_) -> Edit:
    """LUNAR's edit of `forget`, keeping `retain` (see the module docstring); the model is
    returned as it was found (nothing is written to it). between: a step boundary
    (`grom.turns`) between the activation batches (the model's modes as found there) and
    after every AdamW epoch; the edit does not depend on it."""
    config, progress, t_start = config or LunarConfig(), progress or (lambda *_: None), time.perf_counter()
    forget, retain = as_examples(forget), as_examples(retain)
    why = lunar_reason(model, SimpleNamespace(forget=forget, retain=retain))
    if why:
        raise ValueError(why.message)
    n = num_layers(model)
    layer = lunar_layer(n) if config.layer is None else config.layer
    if not 0 <= layer < n:
        raise ValueError(f"layer {layer} is outside the model: it has layers 0..{n - 1}")
    gain = residual_gain(model, "down_proj")
    t = edited_matrix(model, "down_proj", layer)
    param = model.get_parameter(t.param_name)
    found = modes(model)
    progress(0.0, f"activations at layer {layer}")
    with evaluating(model):
        f, r, direction = rows_and_direction(model, tokenizer, forget, retain, config, layer, pad_id(tokenizer),
                                             inside(between, lambda: modes_as(model, found)))
    timings = {"activations": time.perf_counter() - t_start}
    rows = training_rows(f.keys, f.outputs, r.keys, r.outputs, direction, config.coeff, gain)
    W0 = t.from_param(param.detach()).cpu()
    t0 = time.perf_counter()
    losses: list[float] = []
    if config.solver == "adamw":
        W, losses = fit_adamw(W0, rows, lr=config.lr, epochs=config.epochs, batch_size=config.batch_size,
                              gamma=config.gamma, weight_decay=config.weight_decay, gain=gain, seed=config.seed,
                              dtype=DTYPES[config.dtype], progress=lambda x, m: progress(0.2 + 0.75 * x, m),
                              between=between)
        P = W.double() - W0.to(W.dtype).double()  # the training's update, not W0's rounding to its dtype
    else:
        progress(0.5, "closed-form solve")
        P = closed_form_patch(f.keys, r.keys, direction, config.coeff, gain=gain, rho=config.rho)
    timings["solve"] = time.perf_counter() - t0
    patch = t.to_param(P.to(param.dtype)).to(param.device)
    if not torch.isfinite(patch).all():
        raise FloatingPointError(f"LUNAR's update of {t.param_name} is not finite; lower lr or raise rho")
    timings["total"] = time.perf_counter() - t_start
    progress(1.0, "done")
    info = {"settings": config.to_dict(), "layer": layer, "solver": config.solver,
            "dtype": config.dtype if config.solver == "adamw" else "float64",
            "direction_norm": float(direction.norm()), "forget_rows": rows.n_forget,
            "retain_rows": rows.X.shape[0] - rows.n_forget, "epoch_losses": losses,
            "loss_before": mse(W0, rows, gain), "loss_after": mse(W0.double() + P, rows, gain),
            **reach(P, f.keys, r.keys, direction, config.coeff, gain)}
    record = LayerRecord(t.param_name, layer, float(config.coeff), float(config.rho if config.solver != "adamw"
                                                                         else 0.0),
                         rows.n_forget, rows.X.shape[0] - rows.n_forget, float(P.norm()),
                         float(W0.double().norm()), timings["solve"], t.transposed)
    return Edit(settings=config.replace(layer=layer), patches={t.param_name: patch.cpu()}, layers=[record],
                timings=timings, model_name=loaded_from(model), method="lunar", info=info)


def reach(P: torch.Tensor, forget_keys, retain_keys, direction, coeff: float, gain: float = 1.0) -> dict:
    """How far the patch moves the rows: `forget_reach`, the mean share of coeff r that the
    forget rows' output change covers along r (1: all of it); `retain_shift`, the retain
    rows' mean output change relative to |coeff r| (0: held in place)."""
    target = (coeff * direction.double())
    size = float(target.norm()) or 1.0
    moved_f = gain * (forget_keys.double() @ P.double().T)
    moved_r = gain * (retain_keys.double() @ P.double().T)
    return {"forget_reach": float((moved_f @ target).mean() / size ** 2),
            "retain_shift": float(moved_r.norm(dim=1).mean() / size)}


MAX_EPOCHS = 100  # a box's bound: epochs of one matrix on activations read once (seconds each on a CPU)


def lunar_boxes(model_name: str | None = None) -> tuple[Box, Box]:
    """LUNAR's two boxes: its AdamW fit's epochs and learning rate (upstream's)."""
    c = LunarConfig()
    return (Box("Epochs (AdamW fit of one down_proj)", "epochs", float(c.epochs), 1.0, MAX_EPOCHS, whole=True,
                upstream="upstream: 20"),
            Box("Learning rate", "lr", c.lr, 0.0, 1.0, above_low=True, upstream="upstream: 0.01"))


def lunar_settings(model, data, values, band=None) -> LunarConfig:
    """LUNAR's run on `data` with the boxes' epochs and learning rate, at its own layer
    (`lunar_layer`, not GROM's band)."""
    return LunarConfig(**{**lunar_defaults(model), "epochs": int(values["epochs"]), "lr": float(values["lr"]),
                          "prompt_format": getattr(data, "prompt_format", None)})


def lunar_flops(model, data, values) -> float:
    """One forward pass over the forget and retain prompts and the refusal prompts (about as
    many tokens again), then `epochs` of AdamW on one matrix at every prompt token: forward
    and backward (~3x) of the down_proj, n inputs by at most n/2 outputs (SmolLM2: 1536 by
    576), a token."""
    shape, tokens = shape_of(model), data_tokens(data)
    forward = 2.0 * 2 * tokens * shape.layers * shape.layer_params
    return forward + 3 * 2.0 * tokens * shape.key_dim * (shape.key_dim / 2) * float(values["epochs"])


def describe_lunar(edit, values) -> str:
    """What a finished run did: the layer refitted, its rows, the fit, how far it moved them."""
    info = edit.info
    return (f"**LUNAR** (activation redirection: the down_proj of layer {info.get('layer', '?')} refitted on "
            f"{info.get('forget_rows', '?')} forget and {info.get('retain_rows', '?')} retain prompt tokens, "
            f"{float(values['epochs']):g} epochs of AdamW at lr {float(values['lr']):g} in "
            f"{(info.get('settings') or {}).get('dtype', 'bfloat16')}; the forget tokens reach "
            f"{info.get('forget_reach', float('nan')):.0%} of the refusal shift)")


LUNAR = register(MethodEntry(
    "lunar", "LUNAR", "redirection", "Rewrites one layer's MLP output matrix (Shen et al., NeurIPS 2025) "
    "so that the forget questions' activations move along a refusal direction (the mean activation of prompts the "
    "model refuses minus the forget prompts') while the retain questions' stay, by AdamW on the mean squared "
    "error (or its closed form); needs forget questions and a retain set.",
    can_run=lunar_reason, defaults=lunar_defaults, run=lambda model, tokenizer, forget, retain, settings=None, **kw:
    run_lunar(model, tokenizer, forget, retain, settings, **kw), settings=LunarConfig, order=400,
    kind="activation redirection", boxes=lunar_boxes, configure=lunar_settings,
    flops=lunar_flops, describe=describe_lunar))
