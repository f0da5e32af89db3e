"""A memory plan for an edit, from the model's config alone: bytes per stage, and whether
it fits on a device, before anything is loaded or run.

    p = plan(AutoConfig.from_pretrained(name), band=[11, 12, 13, 14, 15],
             n_forget_tokens=200_000, n_retain_tokens=400_000, dtype="bfloat16")
    check_fits(p, torch.cuda.mem_get_info()[0], headroom=headroom_for("cuda"))   # or a number of bytes

What is held, as `run_edit` holds it (grom.closed_form.pipeline,
grom.closed_form.layer_solver, grom.closed_form.collect, grom.closed_form.solve):

- weights: every parameter in `dtype` (an untied copy of a tied LM head when it is edited);
- hidden cache: the states entering the band and the call arguments of its layers (the
  rotary cos/sin, the attention mask), T (h + 2 d + L) e for T tokens of sequences of
  length L, at most `hidden_budget` (`LayerStream`; beyond it, batches are replayed);
- system: the layer's A_data (n, n) and D Xf^T (m, n) in float64, summed per batch; each
  batch of k keys adds three (n, k) float64 copies of its keys and its (m, k) target while
  it is summed (`SystemSums.add_forget`);
- solve: A factored in its own memory (`grom.closed_form.solve.factor`), then P = (w_f/s) (A^-1
  (D Xf^T)^T)^T: three (m, n) float64 results (the two triangular solves, the scaling)
  beside D Xf^T, and P in the weight's dtype;
- keys: with keep_keys, every band layer's keys, float32 (n, s + r), on the CPU;
- patches: per edited layer the patch and the original weight kept for `restore`;
- key pass: for every band layer but the last, the matrix inputs and layer outputs of the
  cached batches, T (n + h) e, kept to advance the stream linearly (at most
  `grom.closed_form.collect.MAX_INPUT_CACHE_BYTES`, else the layer is re-run);
- forward / evaluation: one batch's activations, B L (4 h + 3 I) e plus the attention
  scores B H L^2 e; evaluation adds float32 logits and log-probabilities of the scored
  positions, 2 B L V 4.

Each stage's figure is its peak, everything held at that moment included. The formulas
follow the code, not a profiler: allocator slack, the framework's own buffers and
intermediate tensors of a family's forward pass are not counted (tests/test_plan.py
compares them with the measured peak on the CPU, where the plan stays above it). On an
H100 the key stage measured 1.13-1.26x the plan (BENCHMARKS.md, "The paper's shapes on a
GPU": some 5 GiB of the key pass's transients on an 8B model are not counted yet), so a
GPU edit wants a quarter of headroom over it.

(Was `grom/plan.py`.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import torch

from grom.closed_form.collect import HIDDEN_CACHE_BYTES, MAX_INPUT_CACHE_BYTES
from grom.closed_form.config import EditConfig
from grom.closed_form.pipeline import prepare

GiB = 1 << 30
_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only LM that memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    n_params: int

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        """From a transformers config (or a dict of one). Parameters are counted for the
        Llama layout (q, k, v, o; gate, up, down; two norms per layer) unless the config
        says `num_parameters`; GPT-2 style names (n_embd, n_layer) are read too."""
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        h = get("hidden_size") or get("n_embd")
        L = get("num_hidden_layers") or get("n_layer")
        if not h or not L or not get("vocab_size"):
            raise ValueError("the model config needs hidden_size, num_hidden_layers and vocab_size")
        inter = get("intermediate_size") or get("n_inner") or 4 * h
        H = get("num_attention_heads") or get("n_head") or 1
        kv = get("num_key_value_heads") or H
        d = get("head_dim") or h // H
        V, tied = get("vocab_size"), bool(get("tie_word_embeddings", True))
        per_layer = h * H * d * 2 + 2 * h * kv * d + 3 * h * inter + 2 * h
        n = get("num_parameters") or V * h * (1 if tied else 2) + L * per_layer + h
        return cls(h, inter, L, V, H, kv, d, tied, int(n))

    def matrix(self, kind: str) -> tuple[int, int]:
        """(m, n) of the edited matrix: out, in."""
        return {"down_proj": (self.hidden, self.intermediate), "o_proj": (self.hidden, self.heads * self.head_dim),
                "lm_head": (self.vocab, self.hidden)}[kind]


@dataclass(frozen=True)
class MemoryPlan:
    """Peak bytes per stage (`stages`, in the order they run), the sizes they are made of
    (`parts`), and what they were planned for (`settings`)."""

    stages: dict[str, int]
    parts: dict[str, int]
    settings: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.stages.values())

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=self.stages.get)

    def describe(self) -> str:
        """A table of the stages and the parts, in GiB."""
        lines = [f"{'stage':<12} {'peak GiB':>9}"] + [f"{s:<12} {b / GiB:>9.3f}" for s, b in self.stages.items()]
        lines += ["", f"{'part':<14} {'GiB':>9}"] + [f"{p:<14} {b / GiB:>9.3f}" for p, b in self.parts.items()]
        return "\n".join(lines)


def dtype_bytes(dtype) -> int:
    name = str(dtype).removeprefix("torch.")
    if name not in _BYTES:
        raise ValueError(f"dtype {dtype!r} is unknown; use one of {', '.join(_BYTES)}")
    return _BYTES[name]


def plan(model_config, band: Sequence[int], n_forget_tokens: int, n_retain_tokens: int,
         dtype="float32", hidden_budget: int | None = HIDDEN_CACHE_BYTES, *,
         config: EditConfig | None = None, seq_len: int | None = None,
         n_forget_keys: int | None = None, n_retain_keys: int | None = None) -> MemoryPlan:
    """The memory plan of `run_edit` on a model of `model_config` loaded in `dtype`.

    band: the layers edited (its length matters; the LM head edit: one matrix). Tokens:
    every token the model runs (prompts and answers, or corpus windows). Keys default to
    the tokens cut to the config's budgets (an upper bound: QA keys are the answers').
    config: the EditConfig (matrix, batch_size, max_length, budgets, keep_keys); seq_len:
    the sequences' length (default config.max_length)."""
    cfg = config or EditConfig()
    shape = ModelShape.from_config(model_config)
    e, (m, n) = dtype_bytes(dtype), shape.matrix(cfg.matrix)
    k = 1 if cfg.matrix == "lm_head" else max(1, len(band))
    T, L, B = n_forget_tokens + n_retain_tokens, seq_len or cfg.max_length, cfg.batch_size
    L = min(L, max(1, T))
    s = n_forget_keys if n_forget_keys is not None else _cut(n_forget_tokens, cfg.forget_budget)
    r = n_retain_keys if n_retain_keys is not None else _cut(n_retain_tokens, cfg.retain_budget)
    h, d = shape.hidden, shape.head_dim
    weights = shape.n_params * e + (shape.vocab * h * e if cfg.matrix == "lm_head" and shape.tied else 0)
    full_cache = T * (h + 2 * d + L) * e
    cache = 0 if cfg.matrix == "lm_head" or not cfg.stream else \
        (full_cache if hidden_budget is None else min(full_cache, hidden_budget))
    kept = cache / full_cache if full_cache else 0.0
    pass_cache = int(kept * T * (n + h) * e) if k > 1 and kept * T * n * e <= MAX_INPUT_CACHE_BYTES else 0
    system = 8 * (n * n + m * n)
    batches = max(1, -(-T // (B * L)))
    k_b = -(-(s + r) // batches)  # keys of one batch
    keys_layer = 4 * n * (s + r) if cfg.keep_keys else 0
    parts = {
        "weights": weights, "hidden_cache": cache, "system": system,
        "batch_keys": 3 * 8 * n * k_b + 12 * m * k_b, "solve_extra": 3 * 8 * m * n + m * n * e,
        "keys_kept": keys_layer * k, "patches": 2 * k * m * n * e, "key_pass": pass_cache,
        "forward": B * L * (4 * h + 3 * shape.intermediate) * e + B * shape.heads * L * L * e,
        "eval_logits": 2 * B * L * shape.vocab * 4,
    }
    base = weights + cache + parts["patches"]
    transient = max(parts["forward"], parts["batch_keys"])
    # before the band's last layer: its stream's pass cache and the earlier layers' keys;
    # at the last: every layer's keys (this one's still in batches)
    before_last = pass_cache + (k - 1) * keys_layer if k > 1 else 0
    stages = {
        "weights": weights,
        "forward": weights + cache + parts["forward"],
        "keys": base + system + transient + max(before_last, k * keys_layer),
        # the solve, then (keep_keys) the layer's keys concatenated beside the factor; before the
        # band's last layer the stream's pass cache stays through the solve (grom.closed_form.pipeline._edit_band
        # advances the stream with P once it is solved)
        "solve": base + max(before_last, k * keys_layer) + max(system + parts["solve_extra"], 8 * n * n + keys_layer),
        "evaluation": weights + parts["forward"] + parts["eval_logits"],
    }
    settings = dict(matrix=cfg.matrix, band=list(band), n_forget_tokens=n_forget_tokens,
                    n_retain_tokens=n_retain_tokens, forget_keys=s, retain_keys=r, dtype=str(dtype),
                    hidden_budget=hidden_budget, keep_keys=cfg.keep_keys, seq_len=L, batch_size=B,
                    m=m, n=n)
    return MemoryPlan({k_: int(v) for k_, v in stages.items()}, {k_: int(v) for k_, v in parts.items()}, settings)


def _cut(tokens: int, budget: int | None) -> int:
    return tokens if budget is None else min(tokens, budget)


class WillNotFit(MemoryError):
    """The plan needs more memory than the device has; the message says what would fit."""


def _alternatives(p: MemoryPlan, model_config, free: int, config: EditConfig, held: int = 0) -> list[str]:
    """Changes of one setting each that would fit in `free` bytes (`held` of each plan
    already in memory)."""
    st, out = p.settings, []
    kw = dict(config=config, seq_len=st["seq_len"])
    base = (model_config, st["band"], st["n_forget_tokens"], st["n_retain_tokens"], st["dtype"], st["hidden_budget"])

    def fits(q: MemoryPlan) -> bool:
        return q.peak - held <= free

    if st["keep_keys"] and fits(plan(*base, **{**kw, "config": config.replace(keep_keys=False)})):
        out.append("keep_keys off (the diagnostics' keys)")
    if len(st["band"]) > 1 and fits(plan(model_config, st["band"][:1], *base[2:], **kw)):
        out.append(f"a band of 1 layer ({st['band'][0]})")
    for budget in (GiB, GiB // 4, 0):
        if (st["hidden_budget"] is None or budget < st["hidden_budget"]) and fits(plan(*base[:5], budget, **kw)):
            out.append(f"hidden_budget={budget} bytes ({budget / GiB:.2f} GiB; batches beyond it are replayed)")
            break
    for frac in (2, 4, 10):
        q = plan(model_config, st["band"], st["n_forget_tokens"] // frac, st["n_retain_tokens"] // frac,
                 *base[4:], **kw)
        if fits(q):
            out.append(f"1/{frac} of the tokens ({st['n_forget_tokens'] // frac} forget, "
                       f"{st['n_retain_tokens'] // frac} retain)")
            break
    if dtype_bytes(st["dtype"]) > 2 and fits(plan(*base[:4], "bfloat16", base[5], **kw)):
        out.append("dtype bfloat16")
    if config.matrix == "down_proj" and fits(plan(*base, **{**kw, "config": config.replace(matrix="o_proj")})):
        out.append("matrix o_proj (n = the attention width instead of the MLP's)")
    return out


# A GPU edit is checked against the plan times this: on an H100 the key stage measured
# 1.13-1.26x the plan (BENCHMARKS.md, "The paper's shapes on a GPU"), the key pass's
# transients there not being counted yet. On the CPU the plan stays above the measure.
GPU_HEADROOM = 1.25


def headroom_for(device) -> float:
    """GPU_HEADROOM for a CUDA device, or a device map ("auto", "balanced", ...) on a
    machine with CUDA; 1 otherwise."""
    name = str(device or "cpu").lower()
    if name.startswith("cuda"):
        return GPU_HEADROOM
    maps = ("auto", "balanced", "balanced_low_0", "sequential")
    return GPU_HEADROOM if name in maps and torch.cuda.is_available() else 1.0


def check_fits(p: MemoryPlan, device_free_bytes: int, model_config=None, config: EditConfig | None = None,
               held: int = 0, headroom: float = 1.0) -> None:
    """Raise `WillNotFit` when the plan's peak exceeds `device_free_bytes`, naming the stage
    and, given the model's config (and the EditConfig it was planned with), the changes of
    one setting that would fit. held: bytes of the plan in memory already (the weights of
    a loaded model, which the free memory no longer counts): the peak less them must fit.
    headroom: the factor the peak (less `held`) is taken with (`headroom_for(device)`)."""
    need = (p.peak - held) * headroom
    if need <= device_free_bytes:
        return
    stage = p.peak_stage
    more = " more" if held else ""
    extra = (f" (the plan's {(p.peak - held) / GiB:.2f} and {headroom - 1:.0%} for what a GPU measured beyond it)"
             if headroom > 1 else "")
    msg = (f"this edit will not fit on this device: it needs {need / GiB:.2f} GiB{more}{extra} at stage "
           f"{stage!r} and {device_free_bytes / GiB:.2f} GiB are free")
    if model_config is not None:
        ideas = _alternatives(p, model_config, device_free_bytes / headroom, config or EditConfig(), held)
        msg += (": here is what would fit: " + "; ".join(ideas)) if ideas else \
            ": no single change of band, hidden budget, tokens, dtype or matrix fits; use a larger device"
    raise WillNotFit(msg + ".")


def plan_edit(model_config, tokenizer, forget, retain, config: EditConfig, dtype="float32",
              hidden_budget: int | None = HIDDEN_CACHE_BYTES) -> MemoryPlan:
    """The plan of `run_edit(model, tokenizer, forget, retain, config)` for a model of
    `model_config` in `dtype`, from the examples as `run_edit` tokenizes and cuts them (no
    model needed): the tokens and keys counted, the band config.layers (automatic: its
    width config.k)."""
    prep = prepare(tokenizer, forget, retain, config, int(ModelShape.from_config(model_config).vocab))
    count = lambda bs: sum(int(b.attention_mask.sum()) for b in bs)  # noqa: E731
    keys = lambda bs: sum(b.gold.numel() for b in bs)  # noqa: E731
    band = list(config.layers) if config.layers is not None else list(range(config.k))
    L = max((b.input_ids.shape[1] for b in prep.forget + prep.retain), default=1)
    return plan(model_config, band, count(prep.forget), count(prep.retain), dtype, hidden_budget,
                config=config, seq_len=L, n_forget_keys=keys(prep.forget), n_retain_keys=keys(prep.retain))


def free_bytes(device: str | torch.device) -> int:
    """Memory free on `device` now: CUDA's free memory, else the RAM available (Linux)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:  # MemAvailable: free plus what the page cache gives back
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse
