"""Architecture knowledge, in one place: where a causal LM keeps its decoder layers, its
final norm, its unembedding matrix and the matrices GROM may edit.

A model architecture is one `ArchSpec` row in `ARCHITECTURES`; adding one is adding a row.
Everything else in the library asks this module, never the model's attribute names.

(Was `grom/arch.py`. Its `EditTarget` / `edit_target` are now `EditedMatrix` /
`edited_matrix`.)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from torch import nn

log = logging.getLogger(__name__)

MATRIX_KINDS = ("down_proj", "o_proj", "lm_head")


@dataclass(frozen=True)
class ArchSpec:
    """Dotted attribute paths of one model architecture.

    layers: the ModuleList of decoder blocks; final_norm: the norm before the LM head;
    lm_head: the unembedding Linear; down_proj / o_proj: the MLP output and attention
    output matrices inside a block; conv1d: the block matrices are GPT-2 `Conv1D`s, which
    store their weight transposed, as (in, out).

    How down_proj's output reaches the residual stream (read from each architecture's decoder
    layer in transformers): mlp_norm: the block normalises the MLP output before adding it
    (OLMo2's and Gemma2's post_feedforward_layernorm); residual_scale: the config attribute
    by which the block multiplies the MLP output before adding it (Granite's
    residual_multiplier), None for no scale.
    """

    layers: str
    final_norm: str
    lm_head: str
    down_proj: str
    o_proj: str
    conv1d: bool = False
    mlp_norm: bool = False
    residual_scale: str | None = None


_LLAMA = ArchSpec("model.layers", "model.norm", "lm_head", "mlp.down_proj", "self_attn.o_proj")
_GPT2 = ArchSpec("transformer.h", "transformer.ln_f", "lm_head", "mlp.c_proj", "attn.c_proj", conv1d=True)
_NEOX = ArchSpec("gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head",
                 "mlp.dense_4h_to_h", "attention.dense")

ARCHITECTURES: dict[str, ArchSpec] = {
    **{t: _LLAMA for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "phi3", "smollm3")},
    "gemma2": replace(_LLAMA, mlp_norm=True),
    "olmo2": replace(_LLAMA, mlp_norm=True),
    "granite": replace(_LLAMA, residual_scale="residual_multiplier"),
    "gpt2": _GPT2,
    "gpt_neox": _NEOX,
}


class UnsupportedArchitecture(ValueError):
    """The model's architecture is not in `ARCHITECTURES`."""


@dataclass(frozen=True)
class EditedMatrix:
    """One editable matrix: its parameter name and how its weight is laid out.

    The math uses W as (m, n) = (out, in). `transposed` is True where the parameter
    stores (in, out) (GPT-2's Conv1D); `to_param` / `from_param` convert.
    """

    kind: str
    layer: int | None  # None for the LM head
    module_name: str
    param_name: str
    transposed: bool

    def to_param(self, P: torch.Tensor) -> torch.Tensor:
        """A patch in the math layout (m, n) -> the parameter's layout."""
        return P.t().contiguous() if self.transposed else P

    def from_param(self, weight: torch.Tensor) -> torch.Tensor:
        """The parameter -> W as (m, n)."""
        return weight.t() if self.transposed else weight


def arch_spec(model: nn.Module) -> ArchSpec:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"model type {model_type!r} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}. Use a causal LM of one of these architectures."
        )
    return ARCHITECTURES[model_type]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_submodule(arch_spec(model).layers)


def num_layers(model: nn.Module) -> int:
    return len(decoder_layers(model))


def final_norm(model: nn.Module) -> nn.Module:
    return model.get_submodule(arch_spec(model).final_norm)


def finish_logits(model: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The logit transforms an architecture applies after its LM head, on head outputs z (..., V):
    Granite's division by `logits_scaling`, Gemma 2's soft-capping by
    `final_logit_softcapping`; z itself elsewhere. Differentiable."""
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logits_scaling", None)
    if scale:
        z = z / scale
    cap = getattr(cfg, "final_logit_softcapping", None)
    return cap * torch.tanh(z / cap) if cap else z


def unembedding(model: nn.Module) -> torch.Tensor:
    """The LM head weight, (vocab, hidden)."""
    return model.get_submodule(arch_spec(model).lm_head).weight


def edited_matrix(model: nn.Module, kind: str, layer: int | None = None) -> EditedMatrix:
    """The editable matrix of `kind` in `layer` (ignored for the LM head)."""
    spec = arch_spec(model)
    if kind == "lm_head":
        return EditedMatrix(kind, None, spec.lm_head, spec.lm_head + ".weight", transposed=False)
    if kind not in MATRIX_KINDS:
        raise ValueError(f"matrix kind {kind!r} is unknown; use one of {', '.join(MATRIX_KINDS)}")
    n = num_layers(model)
    if layer is None or not 0 <= layer < n:
        raise ValueError(f"layer {layer} is outside the model: it has layers 0..{n - 1}")
    name = f"{spec.layers}.{layer}.{getattr(spec, kind)}"
    return EditedMatrix(kind, layer, name, name + ".weight", transposed=spec.conv1d)


def residual_gain(model: nn.Module, kind: str) -> float | None:
    """g such that adding P to the `kind` matrix of a decoder layer moves the layer's output
    by exactly ``g * P x`` (x the matrix's input, at every position); None where no such g
    exists: o_proj (its output also feeds the MLP), the LM head, or a down_proj whose output
    is normalised before the residual add. Where it is None, a patched layer is re-run.
    """
    spec = arch_spec(model)
    if kind != "down_proj" or spec.mlp_norm:
        return None
    return float(getattr(model.config, spec.residual_scale)) if spec.residual_scale else 1.0


def layer_kinds(model: nn.Module) -> tuple:
    """Per decoder layer, a label; the model passes layers with equal labels the same
    arguments (attention mask, position embeddings). The config's `layer_types` where it
    has them (sliding-window vs full attention: Gemma2, Qwen2/Qwen3/SmolLM3 with sliding
    windows each get their own mask), else one label for every layer.
    """
    n = num_layers(model)
    types = getattr(getattr(model, "config", None), "layer_types", None)
    return tuple(types[:n]) if types else (None,) * n


def lm_head_is_tied(model: nn.Module) -> bool:
    emb = model.get_input_embeddings()
    return emb is not None and unembedding(model) is emb.weight


def untie_lm_head(model: nn.Module) -> bool:
    """Give the LM head its own copy of the embedding matrix; True if it was tied.

    Editing a tied head would also edit the input embeddings, which GROM must not do.
    """
    if not lm_head_is_tied(model):
        return False
    head = model.get_submodule(arch_spec(model).lm_head)
    head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    log.warning("The LM head was tied to the input embeddings; it was untied so that only "
                "the head is edited.")
    return True


def retie_lm_head(model: nn.Module) -> None:
    """Undo `untie_lm_head`: point the head back at the input embeddings."""
    model.get_submodule(arch_spec(model).lm_head).weight = model.get_input_embeddings().weight


def loaded_from(model: nn.Module) -> str | None:
    """The Hub id or folder the model was loaded from (its config's name_or_path), or None."""
    return getattr(getattr(model, "config", None), "_name_or_path", None) or None


def model_device(model: nn.Module) -> torch.device:
    """The device of the input embeddings, where input ids must go."""
    return model.get_input_embeddings().weight.device
