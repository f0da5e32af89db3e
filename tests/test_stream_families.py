"""The streamed band edit equals the replay path on a tiny random model of every family
that `grom.model.arch.ARCHITECTURES` lists as supported.

The stream advances from one band layer to the next either by adding `P x` to the layer's
unpatched output (where down_proj's output enters the residual stream unchanged) or by
re-running the layer; replay takes every layer's keys by full forward passes. A family
whose block normalises (OLMo2, Gemma2) or scales (Granite) the MLP output before the
residual add, or whose layers see different attention masks (sliding windows), breaks
the first shortcut if the stream does not know about it.
"""
import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from grom import EditConfig, run_edit
from grom.model.arch import ARCHITECTURES, decoder_layers, edited_matrix, layer_kinds, residual_gain
from grom.model.hooks import capture_inputs, capture_outputs
from tests.conftest import FORGET, RETAIN, tiny_gpt2, tiny_llama, tiny_neox

LAYERS = 4
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=False,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Per family: what makes the tiny model exercise the family's own block (a residual
# multiplier other than 1, sliding windows shorter than the prompts).
EXTRA = {
    "granite": dict(residual_multiplier=0.3, embedding_multiplier=2.0, attention_multiplier=0.2,
                    logits_scaling=1.5),
    "gemma2": dict(sliding_window=5, query_pre_attn_scalar=8),
    "qwen2": dict(use_sliding_window=True, sliding_window=5, max_window_layers=2),
    "qwen3": dict(use_sliding_window=True, sliding_window=5, max_window_layers=2),
    "mistral": dict(sliding_window=5),
    "smollm3": dict(use_sliding_window=True, sliding_window=5, no_rope_layer_interval=2),
    "phi3": dict(original_max_position_embeddings=256),
}


def tiny_model(model_type: str, vocab: int, seed: int = 0):
    """A seeded float32 random causal LM of `model_type` with LAYERS small layers."""
    if model_type == "llama":
        return tiny_llama(vocab, layers=LAYERS, seed=seed)
    if model_type == "gpt2":
        return tiny_gpt2(vocab, layers=LAYERS, seed=seed)
    if model_type == "gpt_neox":
        return tiny_neox(vocab, layers=LAYERS, seed=seed)
    torch.manual_seed(seed)
    cfg = CONFIG_MAPPING[model_type](vocab_size=vocab, **SMALL, **EXTRA.get(model_type, {}))
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def relative_error(P: torch.Tensor, ref: torch.Tensor) -> float:
    return float((P.double() - ref.double()).norm() / ref.double().norm())


def test_every_family_has_a_builder(tokenizer):
    for model_type in ARCHITECTURES:
        assert tiny_model(model_type, len(tokenizer)).config.model_type == model_type


def _layer_shift(model, layer: int, P: torch.Tensor, ids: torch.Tensor):
    """(x, delta): down_proj's input in `layer`, (T, n), and how much the layer's output,
    (T, m), moves when P (math layout) is added to that down_proj."""
    t = edited_matrix(model, "down_proj", layer)
    param, block = model.get_parameter(t.param_name), decoder_layers(model)[layer]
    outs = []
    with torch.no_grad():
        for patch in (None, t.to_param(P)):
            if patch is not None:
                param.add_(patch)
            with capture_inputs(model.get_submodule(t.module_name), lambda x: x[0]) as x, \
                    capture_outputs(block, lambda y: y[0]) as y:
                model(input_ids=ids)
            outs.append((x[0], y[0]))
        param.sub_(t.to_param(P))
    return outs[0][0], outs[1][1] - outs[0][1]


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_residual_gain_is_what_the_layer_does(tokenizer, model_type):
    """Where arch says down_proj reaches the residual stream as g P x, it does; where it says
    it does not (None), no g fits: the stream's shortcut is used exactly where it is right."""
    model = tiny_model(model_type, len(tokenizer))
    ids = torch.randint(3, len(tokenizer), (1, 12), generator=torch.Generator().manual_seed(0))
    t = edited_matrix(model, "down_proj", 1)
    W = t.from_param(model.get_parameter(t.param_name))
    # far larger than W: the MLP output of a random tiny model is so small that a norm after
    # it works in its epsilon regime, where it is nearly linear
    P = torch.randn(W.shape, generator=torch.Generator().manual_seed(1))
    x, delta = _layer_shift(model, 1, P, ids)
    Px = x @ P.T  # (T, m)
    g = residual_gain(model, "down_proj")
    if g is not None:
        torch.testing.assert_close(delta, g * Px, rtol=1e-4, atol=1e-5)
    else:
        best = float((delta * Px).sum() / (Px * Px).sum())  # least-squares g
        assert relative_error(best * Px, delta) > 0.05
    assert residual_gain(model, "o_proj") is None and residual_gain(model, "lm_head") is None


def test_layer_kinds_follow_the_configured_attention_types(tokenizer):
    assert layer_kinds(tiny_model("llama", len(tokenizer))) == (None,) * LAYERS
    kinds = layer_kinds(tiny_model("gemma2", len(tokenizer)))
    assert kinds == ("sliding_attention", "full_attention") * (LAYERS // 2)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("matrix,band", [("down_proj", (1, 2, 3)), ("o_proj", (0, 1, 2)),
                                         ("down_proj", (0, 1)), ("down_proj", (0, 2))])
def test_streamed_band_equals_replay(tokenizer, model_type, matrix, band):
    model = tiny_model(model_type, len(tokenizer))
    config = EditConfig(matrix=matrix, layers=band, beta=4.0, w_r=10.0, rho=0.05)
    streamed = run_edit(model, tokenizer, FORGET, RETAIN, config)
    replayed = run_edit(model, tokenizer, FORGET, RETAIN, config.replace(stream=False))
    assert streamed.patches.keys() == replayed.patches.keys()
    assert len(streamed.patches) == len(band)
    errors = {name: relative_error(P, replayed.patches[name]) for name, P in streamed.patches.items()}
    assert max(errors.values()) < 1e-4, errors
