"""grom.eval.quant: RTN by hand, error bound, and the bit-exact quantized() context."""
from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from grom.eval import quant
from grom.eval.quant import QuantInfo, choose_method, nf4_available, nf4_quantize, quantized, rtn_quantize
from tests.conftest import assert_bit_exact, snapshot


def tiny_llama(dtype=torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg).eval()


# ---------------------------------------------------------------- rtn_quantize

def test_rtn_two_bit_hand_example():
    # one group of 4, bits 2 -> qmax 3; lo = -1, hi = 2 -> scale = 3/3 = 1, zero = round(1) = 1
    # q = round(w/1) + 1 = [-1, 0, 1, 2] + 1 = [0, 1, 2, 3]; w_hat = (q - 1) * 1 = [-1, 0, 1, 2]
    W = torch.tensor([[-1.0, 0.2, 0.7, 2.0]])
    out = rtn_quantize(W, bits=2, group_size=4)
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, 1.0, 2.0]]), atol=1e-6)


def test_rtn_four_bit_hand_example():
    # bits 4 -> qmax 15; lo = 0, hi = 1.5 -> scale = 0.1, zero = 0
    # w/scale = [0, 3.3, 10.4, 15] -> q = [0, 3, 10, 15] -> w_hat = [0, 0.3, 1.0, 1.5]
    W = torch.tensor([[0.0, 0.33, 1.04, 1.5]])
    out = rtn_quantize(W, bits=4, group_size=4)
    assert torch.allclose(out, torch.tensor([[0.0, 0.3, 1.0, 1.5]]), atol=1e-6)


def test_rtn_all_positive_group_keeps_zero_in_range():
    # lo = min(0.25, 0) = 0, hi = 1.75 -> scale = 1.75/15, zero = 0: nothing is clipped,
    # 1.75 = 15 * scale is exact; 0.5/scale = 4.29 -> 4 -> 4 * 1.75/15 = 0.4667
    W = torch.tensor([[0.25, 0.5, 1.0, 1.75]])
    out = rtn_quantize(W, bits=4, group_size=4)
    s = 1.75 / 15
    expected = torch.tensor([[2 * s, 4 * s, 9 * s, 15 * s]])  # 0.25/s = 2.14, 1.0/s = 8.57
    assert torch.allclose(out, expected, atol=1e-6)


def test_rtn_remainder_group():
    # 7 inputs, groups of 4: [0, 0.33, 1.04, 1.5] as above, then the remainder
    # [-0.5, 0.12, 1.0]: lo = -0.5, hi = 1 -> scale 0.1, zero = round(5) = 5;
    # w/scale = [-5, 1.2, 10] -> q = [0, 6, 15] -> w_hat = [-0.5, 0.1, 1.0]
    W = torch.tensor([[0.0, 0.33, 1.04, 1.5, -0.5, 0.12, 1.0]])
    out = rtn_quantize(W, bits=4, group_size=4)
    assert out.shape == W.shape
    assert torch.allclose(out, torch.tensor([[0.0, 0.3, 1.0, 1.5, -0.5, 0.1, 1.0]]), atol=1e-6)


def test_rtn_groups_are_independent_slices_of_the_last_dim():
    torch.manual_seed(1)
    W = torch.randn(5, 300)  # groups 128, 128, 44
    out = rtn_quantize(W, group_size=128)
    parts = [rtn_quantize(W[:, a:b].contiguous(), group_size=b - a)
             for a, b in ((0, 128), (128, 256), (256, 300))]
    assert torch.equal(out, torch.cat(parts, dim=1))
    # rows with very different magnitudes are quantized on their own scales
    W2 = torch.stack([torch.randn(128) * 1e-3, torch.randn(128) * 10])
    out2 = rtn_quantize(W2)
    assert (out2[0] - W2[0]).abs().max() < 1e-3 * 0.5


def test_rtn_error_bound_half_scale_per_group():
    torch.manual_seed(2)
    g = 64
    W = torch.randn(16, 200) * torch.rand(16, 1) * 3
    out = rtn_quantize(W, bits=4, group_size=g)
    for a in range(0, 200, g):
        blk, qb = W[:, a:a + g], out[:, a:a + g]
        lo = blk.amin(1, keepdim=True).clamp(max=0)
        hi = blk.amax(1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / 15
        assert ((blk - qb).abs() <= scale / 2 + 1e-6).all()
        # at most 16 distinct levels per group row
        for r in range(qb.shape[0]):
            assert qb[r].unique().numel() <= 16


def test_rtn_dtype_shape_and_zero_group():
    W = torch.randn(4, 130).to(torch.bfloat16)
    out = rtn_quantize(W)
    assert out.dtype == torch.bfloat16 and out.shape == W.shape
    Z = torch.zeros(2, 8)
    assert torch.equal(rtn_quantize(Z, group_size=4), Z)


def test_rtn_validation():
    with pytest.raises(ValueError):
        rtn_quantize(torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError):
        rtn_quantize(torch.zeros(2, 4), group_size=0)
    with pytest.raises(ValueError):
        rtn_quantize(torch.zeros(2, 0))


@pytest.mark.skipif(nf4_available(), reason="bitsandbytes + CUDA present")
def test_nf4_without_cuda_or_bnb_raises_clearly():
    with pytest.raises(RuntimeError, match="(bitsandbytes|CUDA)"):
        nf4_quantize(torch.randn(4, 64))
    with pytest.raises(RuntimeError):
        with quantized(tiny_llama(), method="nf4"):
            pass


@pytest.mark.gpu
@pytest.mark.skipif(not nf4_available(), reason="needs CUDA and bitsandbytes")
def test_nf4_roundtrip_on_cuda():
    W = torch.randn(32, 128, device="cuda", dtype=torch.bfloat16)
    out = nf4_quantize(W)
    assert out.shape == W.shape and out.dtype == W.dtype and out.device == W.device
    assert not torch.equal(out, W)
    assert (out - W).abs().max() < W.abs().max() * 0.5


# ---------------------------------------------------------------- quantized()

def test_quantized_llama_changes_logits_but_stays_close_and_restores():
    model = tiny_llama()
    snap = snapshot(model)
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        before = model(x).logits
        with quantized(model) as info:
            inside = model(x).logits
        after = model(x).logits
    assert isinstance(info, QuantInfo) and info.method == "rtn"  # CPU model -> rtn
    # per layer q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 MLP 176x64 = 46080; 2 layers
    assert info.n_matrices == 14 and info.n_params == 2 * 46080
    assert info.skipped == ["lm_head"]
    assert not torch.equal(before, inside)
    assert ((inside - before).norm() / before.norm()) < 0.3
    assert torch.equal(before, after)
    assert_bit_exact(model, snap)


def test_quantized_weight_is_rtn_of_current_weight():
    model = tiny_llama()
    w = model.model.layers[0].mlp.down_proj.weight  # (64, 176): groups 128 + 48
    expected = rtn_quantize(w.detach(), group_size=128)
    with quantized(model, method="rtn"):
        assert torch.equal(w.detach(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_restores_bit_exact_after_exception(dtype):
    model = tiny_llama(dtype)
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        with quantized(model):
            assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight,
                                   snap["model.layers.0.self_attn.q_proj.weight"])
            raise RuntimeError("boom")
    assert_bit_exact(model, snap)


def test_quantized_skips_lm_head_unless_asked():
    model = tiny_llama()
    head = model.lm_head.weight.detach().clone()
    with quantized(model):
        assert torch.equal(model.lm_head.weight, head)
    with quantized(model, include_lm_head=True) as info:
        assert not torch.equal(model.lm_head.weight, head)
        assert info.n_matrices == 15 and info.skipped == []
    assert torch.equal(model.lm_head.weight, head)


def test_quantized_on_an_edited_model_restores_the_edit():
    # a GROM edit is applied (W + P); quantizing must restore W + P, not W
    model = tiny_llama()
    w = model.model.layers[1].mlp.down_proj.weight
    orig = w.detach().clone()
    P = torch.randn_like(w) * 0.05
    with torch.no_grad():
        w.add_(P)
    edited = w.detach().clone()
    with quantized(model):
        assert torch.equal(w.detach(), rtn_quantize(edited))
    assert torch.equal(w.detach(), edited)
    with torch.no_grad():
        w.copy_(orig)


def test_quantized_gpt2_conv1d_grouped_along_input_dim():
    model = tiny_gpt2()
    snap = snapshot(model)
    c_attn = model.transformer.h[0].attn.c_attn.weight  # Conv1D: (in 64, out 192)
    c_fc = model.transformer.h[0].mlp.c_fc.weight  # (64, 256)
    exp_attn = rtn_quantize(c_attn.detach().t().contiguous()).t()
    exp_fc = rtn_quantize(c_fc.detach().t().contiguous()).t()
    x = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        before = model(x).logits
        with quantized(model) as info:
            assert torch.equal(c_attn.detach(), exp_attn)
            assert torch.equal(c_fc.detach(), exp_fc)
            # tied LM head / embedding untouched
            assert torch.equal(model.transformer.wte.weight, snap["transformer.wte.weight"])
            inside = model(x).logits
    # 4 Conv1D per block (c_attn, attn.c_proj, c_fc, mlp.c_proj) x 2 blocks
    assert info.n_matrices == 8 and info.skipped == ["lm_head"]
    assert not torch.equal(before, inside)
    assert ((inside - before).norm() / before.norm()) < 0.3
    assert_bit_exact(model, snap)


def test_quantized_bad_method():
    with pytest.raises(ValueError):
        with quantized(tiny_llama(), method="int3"):
            pass


def test_quantized_info_as_dict():
    with quantized(tiny_llama(), method="rtn", group_size=32) as info:
        d = info.as_dict()
    assert d["method"] == "rtn" and d["group_size"] == 32 and d["n_matrices"] == 14


def test_auto_says_which_quantizer_and_why(monkeypatch):
    """"auto" falls back to round-to-nearest only with a reason: no CUDA, no bitsandbytes,
    or a model off the GPU; an explicit method is "asked for"."""
    model = tiny_llama()
    monkeypatch.setattr(quant.torch.cuda, "is_available", lambda: False)
    assert choose_method(model, "auto") == ("rtn", "auto: NF4 (bitsandbytes) cannot run: no CUDA GPU")
    with quantized(model, "auto") as info:
        pass
    assert info.as_dict()["quantizer"] == "rtn" and "no CUDA GPU" in info.as_dict()["reason"]
    assert choose_method(model, "rtn") == ("rtn", "asked for")

    def no_bnb():
        raise RuntimeError("no module named bitsandbytes")

    monkeypatch.setattr(quant.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quant, "_import_bnb", no_bnb)
    method, why = choose_method(model, "auto")
    assert method == "rtn" and "bitsandbytes not installed" in why and "requirements-gpu.txt" in why
    monkeypatch.setattr(quant, "_import_bnb", lambda: object())  # bitsandbytes there, the model on the CPU
    assert choose_method(model, "auto") == ("rtn", "auto: NF4 (bitsandbytes) cannot run: the model is on cpu, "
                                                   "not a CUDA GPU")
