"""A shared opening (a chat template's system prompt) run once: the same keys, edits and
readings as whole sequences give, on every family, and nothing shared where it cannot be."""
import pickle

import pytest
import torch

from grom import EditConfig, run_edit
from grom.closed_form.collect import LayerStream
from grom.closed_form.pipeline import local_batches, prepare
from grom.data.encoding import Batch
from grom.data.prompts import PromptFormat
from grom.model.arch import ARCHITECTURES, decoder_layers, edited_matrix, layer_kinds
from grom.model.shared_prefix import MIN_SHARED, PrefixKV, common_prefix, suffix_batch
from tests.conftest import FORGET, RETAIN
from tests.test_stream_families import relative_error, tiny_model

SYSTEM = PromptFormat(kind="chat", system_prompt="You answer questions about people and places, briefly and well.")
CONFIG = EditConfig(layers=(1, 2, 3), beta=4.0, w_r=10.0, rho=0.05, prompt_format=SYSTEM)


def _batches(tokenizer, config=CONFIG):
    return local_batches(prepare(tokenizer, FORGET, RETAIN, config, len(tokenizer)))[1]


def test_the_opening_is_what_every_row_begins_with(tokenizer):
    batches = _batches(tokenizer)
    n = common_prefix(batches)
    assert n >= MIN_SHARED
    rows = [b.input_ids[r] for b in batches for r in range(len(b.input_ids))]
    assert all(torch.equal(r[:n], rows[0][:n]) for r in rows)
    assert not all(int(r[n]) == int(rows[0][n]) for r in rows)  # the longest such
    assert all(int(b.cols.min()) >= n for b in batches if len(b.cols))
    rest = suffix_batch(batches[0], n)
    assert torch.equal(rest.input_ids, batches[0].input_ids[:, n:])
    assert torch.equal(rest.select(rest.input_ids[..., None]), batches[0].select(batches[0].input_ids[..., None]))


def test_nothing_is_shared_without_a_long_common_opening(tokenizer):
    plain = _batches(tokenizer, CONFIG.replace(prompt_format=None))
    assert common_prefix(plain) < MIN_SHARED
    left = [Batch(torch.tensor([[0, 5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]),
                  torch.tensor([[0] + [1] * 9, [1] * 10]), *(torch.zeros(0, dtype=torch.long),) * 4)]
    assert common_prefix(left) == 0  # left padding: the rows do not start together


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_a_shared_opening_gives_the_edit_whole_sequences_give(tokenizer, model_type):
    """run_edit's stream shares the opening; replay runs whole sequences from the start."""
    model = tiny_model(model_type, len(tokenizer))
    streamed = run_edit(model, tokenizer, FORGET, RETAIN, CONFIG, progress=False)
    replayed = run_edit(model, tokenizer, FORGET, RETAIN, CONFIG.replace(stream=False), progress=False)
    errors = {name: relative_error(P, replayed.patches[name]) for name, P in streamed.patches.items()}
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gpt_neox", "qwen2", "mistral"])
@pytest.mark.parametrize("budget", [None, 0])
def test_stream_keys_with_and_without_the_opening(tokenizer, model_type, budget):
    """Keys, the linear advance and the re-run advance, kept or replayed: the same with the
    opening shared as without; sliding-window caches share nothing."""
    model = tiny_model(model_type, len(tokenizer))
    batches, layers = _batches(tokenizer), decoder_layers(model)
    streams = [LayerStream(model, layers, 1, batches, last=3, kinds=layer_kinds(model), budget=budget,
                           share_prefix=share) for share in (False, True)]
    sliding = model_type in ("qwen2", "mistral") and getattr(model.config, "sliding_window", None)
    assert (streams[1].shared > 0) == (not sliding) and streams[0].shared == 0
    for step in range(3):
        t = edited_matrix(model, "down_proj", 1 + step)
        matrix = model.get_submodule(t.module_name)
        keys = [torch.cat([x for _, x in s.key_batches(matrix, keep_inputs=budget is None)]) for s in streams]
        torch.testing.assert_close(keys[1], keys[0], rtol=1e-4, atol=1e-5)
        if step == 2:
            break
        P = torch.randn(t.from_param(matrix.weight).shape, generator=torch.Generator().manual_seed(step)) * 0.1
        param = model.get_parameter(t.param_name)
        with torch.no_grad():
            param.add_(t.to_param(P))
        for s in streams:
            s.advance_linear(P) if budget is None and step == 0 else s.advance()
    with torch.no_grad():
        model.load_state_dict(tiny_model(model_type, len(tokenizer)).state_dict())


def test_a_resumed_stream_has_its_own_opening(tokenizer):
    """Two streams resumed from one start, advanced under different edits in turn, each
    keep their own opening's keys and values."""
    model = tiny_model("llama", len(tokenizer))
    batches, layers = _batches(tokenizer), decoder_layers(model)
    first = LayerStream(model, layers, 1, batches, last=3, share_prefix=True)
    start = first.start()
    t = edited_matrix(model, "down_proj", 1)
    param = model.get_parameter(t.param_name)
    matrix2 = model.get_submodule(edited_matrix(model, "down_proj", 2).module_name)
    a, b = (LayerStream.resume(model, layers, batches, start) for _ in range(2))
    P = t.to_param(torch.ones(t.from_param(param).shape) * 0.05)
    with torch.no_grad():
        param.add_(P)
        a.advance()
        param.sub_(P)
        b.advance()
        param.add_(P)
        got_a = torch.cat([x for _, x in a.key_batches(matrix2)])
        param.sub_(P)
        got_b = torch.cat([x for _, x in b.key_batches(matrix2)])
        fresh = LayerStream(model, layers, 1, batches, last=3)
        fresh.advance()
        torch.testing.assert_close(got_b, torch.cat([x for _, x in fresh.key_batches(matrix2)]), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(got_a, got_b)


def test_the_opening_and_a_reader_that_kept_one_pickle(tokenizer):
    """A session's state goes to another process (ZeroGPU): the views are not sent along."""
    from grom.landscape import AnswerReader
    from grom.landscape.reader import Question

    model = tiny_model("llama", len(tokenizer))
    kv = PrefixKV.of(model, torch.arange(3, 3 + MIN_SHARED))
    assert kv is not None and len(kv) == MIN_SHARED
    reader = AnswerReader(tokenizer, {"s": [Question("Where is Paris?", "In France.", "France")]}, SYSTEM)
    reader.read(model, None)
    again = pickle.loads(pickle.dumps(reader))
    assert again.read(model, None) == reader.read(model, None)


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gpt_neox"])
def test_answers_scored_with_the_opening_shared(tokenizer, model_type):
    """The answer classes' perplexities (the judge's pass) share the opening: the same scores."""
    from grom.eval.runner import score_answers

    model = tiny_model(model_type, len(tokenizer))
    pairs = [(ex.question, ex.answer) for ex in FORGET + RETAIN]
    whole = score_answers(model, tokenizer, pairs, prompt_format=SYSTEM, batch_size=4)
    shared = score_answers(model, tokenizer, pairs, prompt_format=SYSTEM, batch_size=4, share_opening=True)
    for a, b in zip(whole, shared):
        assert a.avg_loss == pytest.approx(b.avg_loss, rel=1e-5) and (a.predicted == b.predicted).all()
