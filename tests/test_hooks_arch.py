"""Hooks always remove themselves; the architecture map finds the right matrices."""
import gc
import weakref

import pytest
import torch
from torch import nn

from grom.model.arch import (
    UnsupportedArchitecture,
    edited_matrix,
    lm_head_is_tied,
    num_layers,
    retie_lm_head,
    unembedding,
    untie_lm_head,
)
from grom.model.hooks import StopForward, capture_inputs, capture_outputs, stop_after
from tests.conftest import tiny_gpt2, tiny_llama, tiny_neox


def n_hooks(module: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_hooks_removed_after_exception():
    lin = nn.Linear(3, 2)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_inputs(lin, lambda x: x), capture_outputs(lin, lambda x: x):
            assert n_hooks(lin) == 2
            raise RuntimeError("boom")
    assert n_hooks(lin) == 0


def test_capture_inputs_and_outputs_at_positions():
    lin = nn.Linear(3, 2)
    x = torch.randn(2, 4, 3)
    pick = lambda t: t[torch.tensor([0, 1]), torch.tensor([3, 0])]  # noqa: E731
    with capture_inputs(lin, pick) as ins, capture_outputs(lin, pick) as outs:
        lin(x)
    torch.testing.assert_close(ins[0], torch.stack([x[0, 3], x[1, 0]]))
    torch.testing.assert_close(outs[0], lin(ins[0]))


def test_stop_after_skips_later_layers(tokenizer):
    model = tiny_llama(len(tokenizer), layers=4)
    ran = []
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
    with stop_after(model.model.layers[1]):
        model(torch.tensor([[1, 2, 3]]))
    assert ran == [0, 1]
    assert n_hooks(model) == 4  # only the test's own hooks are left


class _KeepsTheStop(nn.Module):
    """A model whose forward keeps the exception that ends it in a local, as an exit
    handler on the way may (the frame, the exception and its traceback then form a cycle,
    which held the ended passes' activations on a GPU until Python's cyclic collector ran:
    2-4 GiB a band layer, bench_gpu.py, muse-8b on an H100)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.seen = []

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        h = self.emb(input_ids)
        try:
            for layer in self.layers:
                self.seen.append(weakref.ref(h))  # the input of each layer run
                h = layer(h)
        except StopForward as stop:
            kept = stop  # noqa: F841  (the cycle)
            raise
        return h


def test_an_ended_forward_pass_is_freed_at_once():
    """A forward pass ended early (stop_after; the stream's replay, which captures a
    layer's call and stops there) leaves nothing for the cyclic collector: its activations
    go when the call returns, even where a frame on the way kept the exception."""
    from grom.closed_form.collect import _capture_layer_calls
    from grom.data.encoding import Batch

    model = _KeepsTheStop()
    ids = torch.tensor([[1, 2, 3]])
    batch = Batch(ids, torch.ones_like(ids), *(torch.zeros(0, dtype=torch.long) for _ in range(4)))
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            with stop_after(model.layers[1]):
                model(ids)
            calls = _capture_layer_calls(model, model.layers, [2], batch)
        assert list(calls) == [2] and len(model.seen) == 2 + 3
        assert all(ref() is None for ref in model.seen[:4])  # gone with each pass,
        assert model.seen[4]() is calls[2][0][0]  # but the captured call, which is kept
    finally:
        gc.enable()


@pytest.mark.parametrize("build,down,conv", [
    (tiny_llama, "model.layers.2.mlp.down_proj.weight", False),
    (tiny_gpt2, "transformer.h.2.mlp.c_proj.weight", True),
    (tiny_neox, "gpt_neox.layers.2.mlp.dense_4h_to_h.weight", False),
])
def test_edit_targets(tokenizer, build, down, conv):
    model = build(len(tokenizer))
    t = edited_matrix(model, "down_proj", 2)
    assert t.param_name == down and t.transposed == conv
    W = t.from_param(model.get_parameter(t.param_name))
    assert W.shape == (32, 64 if build is not tiny_gpt2 else 128)  # (out, in) whatever the storage
    assert num_layers(model) == 4
    assert edited_matrix(model, "o_proj", 0).param_name.endswith("weight")
    assert unembedding(model).shape == (len(tokenizer), 32)
    with pytest.raises(ValueError, match="outside the model"):
        edited_matrix(model, "down_proj", 4)
    with pytest.raises(ValueError, match="unknown"):
        edited_matrix(model, "q_proj", 0)


def test_unknown_architecture_names_the_supported_ones():
    class Cfg:
        model_type = "mamba"

    model = nn.Linear(2, 2)
    model.config = Cfg()
    with pytest.raises(UnsupportedArchitecture, match="llama.*gpt2|gpt2.*llama"):
        edited_matrix(model, "down_proj", 0)


def test_untie_and_retie_lm_head(tokenizer):
    model = tiny_gpt2(len(tokenizer))
    emb = model.get_input_embeddings().weight
    assert lm_head_is_tied(model)
    assert untie_lm_head(model)
    assert not lm_head_is_tied(model) and torch.equal(unembedding(model), emb)
    assert not untie_lm_head(model)
    retie_lm_head(model)
    assert unembedding(model) is emb
