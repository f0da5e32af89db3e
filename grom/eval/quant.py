"""4-bit weight quantization for the quantization check.

The claim being checked (Zhang et al., ICLR 2025, "Catastrophic failure of LLM unlearning
via quantization"): gradient-based unlearning moves weights by less than a 4-bit
quantization step, so quantizing the unlearned model snaps most weights back to the
original's grid and the forgotten answers return. A GROM edit is a large low-rank change,
so it should survive. The check evaluates the model inside :func:`quantized`, which swaps
every linear weight for its quantized-then-dequantized value (simulated, "fake"
quantization) and puts the exact original weights back on exit.

Two transforms:

* :func:`rtn_quantize`: round-to-nearest, asymmetric min/max with an integer zero point,
  group-wise along the input dimension (GPTQ's asymmetric ``Quantizer`` per group of
  128, i.e. the "RTN w4g128" baseline of the GPTQ/AWQ papers). Runs anywhere.
* :func:`nf4_quantize`: bitsandbytes NF4 (what ``load_in_4bit=True`` uses), CUDA only
  (bitsandbytes is the optional GPU extra: requirements-gpu.txt, ``pip install .[gpu]``).
* :func:`int8_quantize`: bitsandbytes LLM.int8() weights (what ``load_in_8bit=True``
  stores), CUDA only.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

__all__ = ["rtn_quantize", "nf4_quantize", "int8_quantize", "nf4_available", "bnb_unavailable",
           "choose_method", "quantized",
           "QuantInfo", "quantizable_weights"]


# ---------------------------------------------------------------- RTN

def _rtn_groups(x: torch.Tensor, qmax: int) -> torch.Tensor:
    """Fake-quantize the groups along the last dim of x (float32, (..., g))."""
    # The range always contains 0 (as GPTQ's quantizer does), so the zero point is a
    # valid integer code in [0, qmax] and 0.0 is represented exactly.
    mn = x.amin(dim=-1, keepdim=True).clamp(max=0)
    mx = x.amax(dim=-1, keepdim=True).clamp(min=0)
    scale = (mx - mn) / qmax
    const = scale == 0
    safe = torch.where(const, torch.ones_like(scale), scale)
    zero = torch.round(-mn / safe).clamp(0, qmax)
    q = torch.clamp(torch.round(x / safe) + zero, 0, qmax)
    deq = (q - zero) * safe
    # An all-zero group (the only case with hi == lo) stays exactly zero.
    return torch.where(const, torch.zeros_like(x), deq)


def rtn_quantize(W: torch.Tensor, bits: int = 4, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest asymmetric group-wise fake quantization; returns W's shape and dtype.

    W: (..., n) with n the INPUT dimension (an ``nn.Linear`` weight is (out, in)). Each
    row is cut into consecutive groups of ``group_size`` along n; when n is not a
    multiple, the last group of each row is the shorter remainder (no padding). Per
    group, with ``qmax = 2**bits - 1``, ``lo = min(min(w), 0)``, ``hi = max(max(w), 0)``:

        scale = (hi - lo) / qmax
        zero  = clamp(round(-lo / scale), 0, qmax)                  (integer zero point)
        q     = clamp(round(w / scale) + zero, 0, qmax)             (the stored code)
        w_hat = (q - zero) * scale                                  (what we return)

    The range is widened to contain 0, as in GPTQ's ``Quantizer`` (``sym=False``): for
    real weight groups, which straddle 0, this is plain min/max; for an all-positive or
    all-negative group it keeps the 4-bit zero point inside [0, qmax] instead of clipping
    the group's top values (AWQ's pseudo-quantizer would clip there). ``round`` is
    round-half-to-even (``torch.round``). The error is at most scale/2 per element: with
    the rounded zero point, w/scale + zero lies in [-0.5, qmax + 0.5], so clamping never
    costs more than rounding does. An all-zero group stays zero.
    Computed in float32 (scale/zero kept in float32, not rounded to fp16 as a packed
    kernel would), then cast back to W's dtype.
    """
    if bits < 1 or bits > 16:
        raise ValueError(f"bits must be in 1..16, got {bits}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if W.ndim == 0 or W.shape[-1] == 0:
        raise ValueError(f"cannot quantize a tensor of shape {tuple(W.shape)}")
    if not W.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {W.dtype}")
    qmax = 2 ** bits - 1
    n = W.shape[-1]
    x = W.detach().reshape(-1, n).float()
    rows = x.shape[0]
    n_full = (n // group_size) * group_size
    parts = []
    if n_full:
        parts.append(_rtn_groups(x[:, :n_full].reshape(rows, -1, group_size), qmax).reshape(rows, n_full))
    if n_full < n:
        parts.append(_rtn_groups(x[:, n_full:], qmax))
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return out.reshape(W.shape).to(W.dtype)


# ---------------------------------------------------------------- NF4

def _import_bnb():
    try:
        import bitsandbytes.functional as bnbf  # noqa: WPS433 (optional dependency)
    except Exception as e:  # ImportError, or a broken CUDA setup inside bitsandbytes
        raise RuntimeError(
            "NF4 / int8 quantization needs the bitsandbytes package (pip install bitsandbytes) "
            f"and a CUDA GPU; it could not be imported: {e}. Use method='rtn' instead."
        ) from e
    return bnbf


def bnb_unavailable() -> str | None:
    """Why bitsandbytes' NF4 / int8 cannot run here (no CUDA GPU; not installed or broken),
    or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        _import_bnb()
    except RuntimeError:
        return "bitsandbytes not installed (pip install -r requirements-gpu.txt)"
    return None


def nf4_available() -> bool:
    """True when CUDA is available and bitsandbytes imports."""
    return bnb_unavailable() is None


def nf4_quantize(W: torch.Tensor, blocksize: int = 64) -> torch.Tensor:
    """bitsandbytes NF4 fake quantization: ``dequantize_4bit(*quantize_4bit(W, nf4))``.

    Blocks of ``blocksize`` consecutive elements of the row-major tensor (so along the
    input dimension of an (out, in) weight), absmax-scaled onto the 16 NF4 levels;
    blocksize 64 is bitsandbytes' and transformers' ``load_in_4bit`` default. The result
    comes back on W's device in W's dtype. Raises RuntimeError without CUDA or
    bitsandbytes.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("NF4 quantization (bitsandbytes) needs a CUDA GPU; use method='rtn'.")
    bnbf = _import_bnb()
    if not W.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {W.dtype}")
    x = W.detach()
    dev = x.device
    if x.device.type != "cuda":
        x = x.to("cuda")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        x = x.float()
    q, state = bnbf.quantize_4bit(x.contiguous(), blocksize=blocksize, quant_type="nf4")
    out = bnbf.dequantize_4bit(q, state)
    return out.reshape(W.shape).to(device=dev, dtype=W.dtype)


def int8_quantize(W: torch.Tensor) -> torch.Tensor:
    """bitsandbytes LLM.int8() weight fake quantization:
    ``int8_vectorwise_dequant(*int8_vectorwise_quant(W)[:2])``.

    Each row of the (out, in) weight is absmax-scaled onto the integers -127..127 (row-wise,
    "vector-wise", as ``Linear8bitLt`` stores a weight loaded with ``load_in_8bit=True``).
    The mixed-precision outlier path of LLM.int8() multiplies those same stored weights'
    columns in fp16, so the weights the model computes with are these either way; the
    activations' own 8-bit rounding is not simulated. Raises RuntimeError without CUDA or
    bitsandbytes (bitsandbytes >= 0.45, which has these functions).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("int8 quantization (bitsandbytes) needs a CUDA GPU; use method='rtn' with bits=8.")
    bnbf = _import_bnb()
    if not hasattr(bnbf, "int8_vectorwise_quant"):
        raise RuntimeError("int8 quantization needs bitsandbytes >= 0.45 (int8_vectorwise_quant); "
                           "upgrade it or use method='rtn' with bits=8.")
    if not W.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {W.dtype}")
    x = W.detach().to("cuda", torch.float16).reshape(-1, W.shape[-1]).contiguous()
    CB, SCB, _ = bnbf.int8_vectorwise_quant(x, threshold=0.0)
    out = bnbf.int8_vectorwise_dequant(CB, SCB)
    return out.reshape(W.shape).to(device=W.device, dtype=W.dtype)


# ---------------------------------------------------------------- the context manager

@dataclass
class QuantInfo:
    """What :func:`quantized` did: method used, matrices and parameters quantized,
    the quantized module names and the skipped ones (the LM head by default)."""

    method: str
    group_size: int | None
    reason: str = ""  # why this quantizer: "asked for", or why "auto" chose it
    n_matrices: int = 0
    n_params: int = 0
    modules: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"method": self.method, "quantizer": self.method, "reason": self.reason,
                "group_size": self.group_size, "n_matrices": self.n_matrices, "n_params": self.n_params,
                "modules": list(self.modules), "skipped": list(self.skipped)}


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' GPT-2 style Conv1D (weight (in, out), y = x W + b)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except Exception:  # transformers not importable: fall back on the name
        return type(module).__name__ == "Conv1D" and hasattr(module, "nf")
    return isinstance(module, Conv1D)


def _lm_head_modules(model: nn.Module) -> set[int]:
    ids = set()
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except Exception:
            head = None
        if isinstance(head, nn.Module):
            ids.add(id(head))
    for name, mod in model.named_modules():
        if name.split(".")[-1] == "lm_head":
            ids.add(id(mod))
    return ids


def quantizable_weights(model: nn.Module, include_lm_head: bool = False):
    """[(name, module, transposed)] of the weights :func:`quantized` touches, and the
    skipped names. ``transposed`` is True for Conv1D, whose weight is (in, out)."""
    heads = _lm_head_modules(model)
    seen: set[int] = set()
    out, skipped = [], []
    for name, mod in model.named_modules():
        conv = _is_conv1d(mod)
        if not (isinstance(mod, nn.Linear) or conv):
            continue
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.ndim != 2:
            continue
        if id(mod) in heads and not include_lm_head:
            skipped.append(name)
            continue
        if id(w) in seen:  # shared / tied weight: quantize once
            continue
        seen.add(id(w))
        out.append((name, mod, conv))
    return out, skipped


def choose_method(model: nn.Module, method: str) -> tuple[str, str]:
    """(quantizer, why): `method` itself ("asked for"; nf4/int8 raise a RuntimeError that
    names what is missing), or for "auto" NF4 when the model is on CUDA and bitsandbytes
    imports, else round-to-nearest and the reason (no CUDA GPU, bitsandbytes not
    installed, the model not on the GPU)."""
    if method not in ("auto", "rtn", "nf4", "int8"):
        raise ValueError(f"method must be 'auto', 'rtn', 'nf4' or 'int8', got {method!r}")
    if method != "auto":
        if method in ("nf4", "int8") and not torch.cuda.is_available():
            raise RuntimeError(f"method={method!r} needs a CUDA GPU and bitsandbytes, and this machine "
                               "has no CUDA GPU; use 'rtn'.")
        if method in ("nf4", "int8"):
            _import_bnb()
        return method, "asked for"
    from grom.model.arch import model_device

    missing = bnb_unavailable()
    if missing is None and model_device(model).type != "cuda":
        missing = f"the model is on {model_device(model).type}, not a CUDA GPU"
    if missing is None:
        return "nf4", "auto: CUDA and bitsandbytes are there"
    return "rtn", f"auto: NF4 (bitsandbytes) cannot run: {missing}"


@contextlib.contextmanager
def quantized(model: nn.Module, method: str = "auto", group_size: int = 128,
              include_lm_head: bool = False, bits: int = 4,
              keep: dict[str, torch.Tensor] | None = None) -> Iterator[QuantInfo]:
    """Temporarily replace every linear weight of ``model`` by its fake-quantized value.

    Touches ``nn.Linear`` and transformers' GPT-2 ``Conv1D`` weights (a Conv1D weight is
    (in, out), so it is transposed before quantizing: groups always run along the input
    dimension). The LM head (``get_output_embeddings()`` / a module named ``lm_head``) is
    skipped unless ``include_lm_head``, as transformers' bitsandbytes integration keeps it
    unquantized; embeddings, norms and biases are never touched (except that with
    ``include_lm_head`` an LM head tied to the input embedding is one tensor, so both
    see the quantized values until exit). A weight shared by several modules is
    quantized once.

    method: "rtn" (:func:`rtn_quantize`, ``bits``/``group_size``), "nf4"
    (:func:`nf4_quantize`, blocksize 64, ``group_size`` unused, ``bits`` 4), "int8"
    (:func:`int8_quantize`, one scale per row, ``bits`` 8) or "auto" (nf4 when the model
    is on CUDA and bitsandbytes works, else rtn).

    Quantizes whatever the weights are NOW (e.g. with a GROM edit applied) and on exit,
    normal or by exception, copies the saved originals back bit for bit. Originals are
    kept on the CPU. Yields a :class:`QuantInfo`.

    keep: where given, the quantized weights by module name (on the CPU), filled on exit
    and copied back on a later entry instead of being computed again: for a context left
    for another job's turn and entered again on the same weights (`grom.turns.Held`),
    where quantizing SmolLM2 again took 15-40 s of a busy CPU each time. The same values.
    """
    resolved, reason = choose_method(model, method)
    if resolved == "rtn":
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        fn = lambda w: rtn_quantize(w, bits=bits, group_size=group_size)  # noqa: E731
    elif resolved == "nf4":
        if bits != 4:
            raise ValueError("nf4 is a 4-bit format; bits must be 4")
        fn = nf4_quantize
    else:
        if bits != 8:
            raise ValueError("int8 is an 8-bit format; bits must be 8")
        fn = int8_quantize
    weights, skipped = quantizable_weights(model, include_lm_head=include_lm_head)
    group = {"rtn": group_size, "nf4": 64}.get(resolved)  # int8: one scale per row (None)
    info = QuantInfo(method=resolved, group_size=group, reason=reason, skipped=skipped)
    saved: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    whole = False
    try:
        with torch.no_grad():
            for name, mod, transposed in weights:
                w = mod.weight
                saved.append((name, w, w.detach().to("cpu", copy=True)))
                if keep is not None and name in keep:
                    w.copy_(keep[name].to(w.device))
                else:
                    src = w.detach().t() if transposed else w.detach()
                    q = fn(src.contiguous())
                    w.copy_(q.t() if transposed else q)
                info.n_matrices += 1
                info.n_params += w.numel()
                info.modules.append(name)
        whole = True
        yield info
    finally:
        with torch.no_grad():
            for name, w, orig in reversed(saved):
                if whole and keep is not None and name not in keep:
                    keep[name] = w.detach().to("cpu", copy=True)
                w.copy_(orig)
