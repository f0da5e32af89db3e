"""Quantized and offloaded weights are refused before any forward pass (issue 26 items 5-6),
and the runner indexes hidden states on the device where they live.

bitsandbytes is not installed here (and needs CUDA): its layers are mimicked by stand-ins
with its class names and weight layouts (Linear8bitLt: an int8 (out, in) weight;
Linear4bit: a packed uint8 (out * in / 2, 1) weight). Offloading is real accelerate
(`dispatch_model` with one layer on "disk"), and a weight moved to meta by hand.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from grom import EditConfig, run_edit
from grom.eval import runner
from grom.model.editable import NotEditable, weight_problem
from grom.robustness.suite import check_edit_fits
from tests.conftest import FORGET, RETAIN, tiny_llama


class Linear8bitLt(nn.Linear):
    """Stand-in for bitsandbytes.nn.Linear8bitLt: an int8 weight of the Linear's shape."""

    def __init__(self, lin: nn.Linear):
        super().__init__(lin.in_features, lin.out_features, bias=False)
        scale = lin.weight.abs().amax(1, keepdim=True) / 127
        self.weight = nn.Parameter((lin.weight / scale).round().to(torch.int8), requires_grad=False)


class Linear4bit(nn.Linear):
    """Stand-in for bitsandbytes.nn.Linear4bit: two 4-bit codes per uint8, (out*in/2, 1)."""

    def __init__(self, lin: nn.Linear):
        super().__init__(lin.in_features, lin.out_features, bias=False)
        packed = torch.zeros(lin.in_features * lin.out_features // 2, 1, dtype=torch.uint8)
        self.weight = nn.Parameter(packed, requires_grad=False)


@contextlib.contextmanager
def counting_forwards(model):
    """A list that grows by one for every forward pass through the embeddings."""
    calls: list[int] = []
    handle = model.get_input_embeddings().register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def _quantize_layer(model, layer: int, cls) -> None:
    mlp = model.model.layers[layer].mlp
    mlp.down_proj = cls(mlp.down_proj)


CFG = EditConfig(layers=(2,), beta=5.0, w_r=10.0)


@pytest.mark.parametrize("cls", [Linear8bitLt, Linear4bit])
@pytest.mark.parametrize("layers", [(2,), None])  # given, or the automatic band (any layer)
def test_quantized_band_weight_refused_before_any_forward(tokenizer, cls, layers):
    model = tiny_llama(len(tokenizer))
    _quantize_layer(model, 2, cls)
    with counting_forwards(model) as calls, pytest.raises(NotEditable) as err:
        run_edit(model, tokenizer, FORGET, RETAIN, CFG.replace(layers=layers))
    assert calls == []
    msg = str(err.value)
    assert "model.layers.2.mlp.down_proj" in msg and "quantized" in msg and "bfloat16" in msg


@pytest.mark.parametrize("cls", [Linear8bitLt, Linear4bit])
def test_edit_apply_and_attack_check_refuse_a_quantized_weight(tokenizer, cls):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, CFG)
    name = "model.layers.2.mlp.down_proj"
    _quantize_layer(model, 2, cls)
    before = model.get_submodule(name).weight.clone()
    with pytest.raises(NotEditable, match=name.replace(".", r"\.")):
        edit.apply(model)
    assert not edit.is_applied and torch.equal(model.get_submodule(name).weight, before)
    with pytest.raises(ValueError, match="quantized"):
        check_edit_fits(model, edit)


def test_weight_problem_names_int_and_packed_weights():
    lin = nn.Linear(8, 4)
    assert weight_problem(lin, "m") is None
    assert "quantized" in weight_problem(Linear8bitLt(lin), "m")
    assert "quantized" in weight_problem(Linear4bit(lin), "m")
    odd = nn.Linear(8, 4)
    odd.weight = nn.Parameter(torch.zeros(16, 2))  # a float weight of another shape
    assert "shape (16, 2)" in weight_problem(odd, "m")


def _offload_to_disk(model, layer: int, folder) -> nn.Module:
    from accelerate import dispatch_model

    names = ["model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"]
    names += [f"model.layers.{l}" for l in range(len(model.model.layers))]
    device_map = {n: "disk" if n == f"model.layers.{layer}" else "cpu" for n in names}
    return dispatch_model(model, device_map=device_map, offload_dir=str(folder), main_device="cpu")


def test_offloaded_band_layer_refused_before_any_forward(tokenizer, tmp_path):
    model = _offload_to_disk(tiny_llama(len(tokenizer)), 2, tmp_path)
    assert model.model.layers[2].mlp.down_proj.weight.device.type == "meta"
    with counting_forwards(model) as calls, pytest.raises(NotEditable) as err:
        run_edit(model, tokenizer, FORGET, RETAIN, CFG)
    assert calls == [] and "model.layers.2.mlp.down_proj is offloaded" in str(err.value)
    edit = run_edit(model, tokenizer, FORGET, RETAIN, CFG.replace(layers=(3,)))  # a layer on a device
    assert edit.band == [3] and edit.patch_norm() > 0


def test_weight_moved_to_meta_refused_in_run_edit_and_apply(tokenizer):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, CFG)
    model.model.layers[2].mlp.down_proj.to("meta")
    with counting_forwards(model) as calls, pytest.raises(NotEditable, match="offloaded"):
        run_edit(model, tokenizer, FORGET, RETAIN, CFG)
    assert calls == []
    with pytest.raises(NotEditable, match="offloaded"):
        edit.apply(model)


def test_offloaded_lm_head_refused_for_the_suppression_target(tokenizer):
    model = tiny_llama(len(tokenizer))
    model.lm_head.to("meta")
    with counting_forwards(model) as calls, pytest.raises(NotEditable, match="LM head"):
        run_edit(model, tokenizer, FORGET, RETAIN, CFG)
    assert calls == []


class _TwoDevices(TorchFunctionMode):
    """Two devices simulated on one CPU: "meta" stands for the first device of a sharded
    model and the CPU for its last. A tensor sent to meta stays on the CPU (it holds its
    values: the model runs on the CPU), and, as on CUDA, a tensor indexed by tensors of
    another device is an error (the CPU itself would allow meta indices)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and "meta" in (str(kwargs.get("device")), *map(str, args[1:2])):
            return args[0]
        if func is torch.Tensor.__getitem__:
            x, index = args[0], args[1]
            parts = index if isinstance(index, tuple) else (index,)
            bad = [i.device for i in parts if isinstance(i, torch.Tensor) and i.device != x.device]
            if bad:
                raise RuntimeError(f"indices on {bad[0]} index a tensor on {x.device}")
        return func(*args, **kwargs)


def test_score_sequences_indexes_where_the_hidden_state_lives(tokenizer, monkeypatch):
    """A sharded model takes its inputs on its first device and returns the last hidden
    state on its last one (`_TwoDevices`: the first is said to be meta, the hidden state
    is on the CPU). The scores are those of the model on one device."""
    model = tiny_llama(len(tokenizer))
    seqs = [(tokenizer(e.question + " " + e.answer)["input_ids"], 3) for e in FORGET]
    expected = runner.score_sequences(model, tokenizer, seqs)
    monkeypatch.setattr(runner, "model_device", lambda m: torch.device("meta"))
    with _TwoDevices():
        with pytest.raises(RuntimeError, match="indices on meta"):  # the simulation bites
            torch.zeros(3)[torch.tensor([0], device="meta")]
        got = runner.score_sequences(model, tokenizer, seqs)
    for a, b in zip(expected, got):
        assert a.logprobs.shape == b.logprobs.shape and abs(a.logprobs - b.logprobs).max() < 1e-6


def test_a_norm_or_embedding_weight_is_editable():
    """The trained baselines patch every parameter they train, norms included: a 1-D float
    weight has no layer shape to check and is editable as it is."""
    from grom.model.editable import weight_problem
    from tests.conftest import tiny_llama

    model = tiny_llama(64)
    assert weight_problem(model.model.layers[0].input_layernorm, "norm") is None
    assert weight_problem(model.model.embed_tokens, "embed") is None
