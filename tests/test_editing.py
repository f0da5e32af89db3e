"""run_edit end to end on tiny random models, against a plain sequential reference."""
import copy

import pytest
import torch

from grom import Edit, EditConfig, run_edit, solve_update
from grom.closed_form.collect import collect_keys
from grom.closed_form.directions import suppression_directions
from grom.closed_form.pipeline import prepare
from grom.model.arch import edited_matrix, unembedding
from tests.conftest import FORGET, RETAIN, tiny_gpt2, tiny_llama, tiny_neox

BUILDERS = [tiny_llama, tiny_gpt2, tiny_neox]


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


def answer_logprob(model, tokenizer, examples):
    """Mean log-probability of the answer tokens, teacher-forced."""
    from grom.data.encoding import encode_examples, make_batches
    enc = encode_examples(tokenizer, examples)
    total, count = 0.0, 0
    with torch.no_grad():
        for b in make_batches(enc, 8, 0):
            logp = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.log_softmax(-1)
            total += float(logp[b.rows, b.cols, b.gold].sum())
            count += b.gold.numel()
    return total / count


def reference_edit(model, tokenizer, config, band):
    """Edit layer by layer with full forward passes and the public solve (no streaming)."""
    model = copy.deepcopy(model)
    prep = prepare(tokenizer, FORGET, RETAIN, config, unembedding(model).shape[0])
    patches = {}
    for l in band:
        t = edited_matrix(model, config.matrix, l)
        module = model.get_submodule(t.module_name)
        Xf = collect_keys(model, prep.forget, module, "cpu")
        Xr = collect_keys(model, prep.retain, module, "cpu")
        D = suppression_directions(Xf.gold, prep.alpha[Xf.gold], unembedding(model).detach(), config.beta)
        P = solve_update(Xf.X, Xr.X, D, w_r=config.w_r, rho=config.rho)
        param = model.get_parameter(t.param_name)
        with torch.no_grad():
            param.add_(t.to_param(P))
        patches[t.param_name] = t.to_param(P)
    return patches


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("matrix,band", [("down_proj", (1, 2, 3)), ("o_proj", (0, 2)), ("down_proj", (2,))])
def test_streamed_edit_equals_sequential_reference(tokenizer, build, matrix, band):
    model = build(len(tokenizer))
    config = EditConfig(matrix=matrix, layers=band, beta=4.0, w_r=10.0, rho=0.05)
    edit = run_edit(model, tokenizer, FORGET, RETAIN, config)
    replayed = run_edit(model, tokenizer, FORGET, RETAIN, config.replace(stream=False))
    ref = reference_edit(model, tokenizer, config, band)
    assert edit.patches.keys() == ref.keys() == replayed.patches.keys()
    for name, P in ref.items():
        torch.testing.assert_close(edit.patches[name], P, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(replayed.patches[name], P, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("config", [
    EditConfig(k=2, beta=5.0, w_r=10.0),
    EditConfig(matrix="o_proj", k=2, beta=5.0, w_r=10.0),
    EditConfig(matrix="lm_head", beta=5.0, w_r=10.0),
    EditConfig(layers=(1,), target="corruption", c=5.0, w_r=10.0),
])
def test_run_edit_leaves_model_unchanged_and_revert_is_exact(tokenizer, build, config):
    model = build(len(tokenizer))
    before = state(model)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    edit = run_edit(model, tokenizer, FORGET, RETAIN, config)
    assert_same_state(model, before)
    assert edit.patches and all(p.device.type == "cpu" for p in edit.patches.values())
    with edit.applied(model):
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
        assert changed
    assert_same_state(model, before)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied


def test_run_edit_leaves_model_unchanged_when_it_fails(tokenizer, monkeypatch):
    model = tiny_llama(len(tokenizer))
    before = state(model)
    import grom.closed_form.solve

    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("solver exploded")
        return real(*a, **k)

    real = grom.closed_form.solve.factor
    monkeypatch.setattr(grom.closed_form.solve, "factor", failing)
    with pytest.raises(RuntimeError, match="exploded"):
        run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0))
    assert_same_state(model, before)


def _movement(edit, name):
    keys, P = edit.keys[name], edit.patches[name]
    moved, D = P @ keys.Xf, keys.directions.dense  # forget outputs go W Xf -> W Xf + P Xf
    fit = float((moved - D).norm() / D.norm())  # 1.0 for P = 0
    cos = float((moved * D).sum() / (moved.norm() * D.norm()))
    rms = lambda M: float(M.norm() / M.shape[1] ** 0.5)  # noqa: E731
    return fit, cos, rms(moved), rms(P @ keys.Xr)


def test_edited_layer_moves_forget_outputs_toward_target_and_keeps_retain(tokenizer):
    model = tiny_llama(len(tokenizer))
    name = "model.layers.2.mlp.down_proj.weight"
    runs = [run_edit(model, tokenizer, FORGET, RETAIN,
                     EditConfig(layers=(2,), beta=3.0, w_r=w_r, rho=0.01, use_alpha=False, keep_keys=True))
            for w_r in (0.1, 10.0)]
    (fit_lo, cos_lo, f_lo, r_lo), (fit_hi, cos_hi, f_hi, r_hi) = [_movement(e, name) for e in runs]
    assert fit_lo < 0.7 and cos_lo > 0.7 and cos_hi > 0.5  # toward W Xf + D
    assert r_hi < 0.5 * f_hi  # with weight on retain, retain outputs move much less
    assert r_hi < 0.2 * r_lo and fit_lo < fit_hi  # the w_r trade-off goes the right way


@pytest.mark.parametrize("fixture", ["trained_llama", "trained_gpt2"])
def test_forget_logprob_falls_more_than_retain(tokenizer, fixture, request):
    model = request.getfixturevalue(fixture)  # memorised FORGET + RETAIN
    f0, r0 = answer_logprob(model, tokenizer, FORGET), answer_logprob(model, tokenizer, RETAIN)
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(k=2, beta=30.0, w_r=30.0))
    with edit.applied(model):
        f1, r1 = answer_logprob(model, tokenizer, FORGET), answer_logprob(model, tokenizer, RETAIN)
    assert f0 - f1 > 1.0
    assert f0 - f1 > 5 * abs(r0 - r1)


def test_gauge_invariance_end_to_end(tokenizer):
    model = tiny_llama(len(tokenizer))
    a = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), w_r=10.0, w_f=1.0, beta=5.0))
    b = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), w_r=40.0, w_f=4.0, beta=5.0))
    for name in a.patches:
        torch.testing.assert_close(a.patches[name], b.patches[name], rtol=1e-4, atol=1e-6)


def test_beta_zero_gives_zero_patch(tokenizer):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1,), beta=0.0))
    assert all(torch.count_nonzero(p) == 0 for p in edit.patches.values())


def test_save_load_roundtrip(tokenizer, tmp_path):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(k=2, beta=5.0))
    loaded = Edit.load(edit.save(tmp_path / "edit"))
    assert loaded.settings == edit.settings and loaded.band == edit.band
    assert loaded.scores.band == edit.scores.band
    for k in edit.patches:
        assert torch.equal(loaded.patches[k], edit.patches[k])
    before = state(model)
    with loaded.applied(model):
        pass
    assert_same_state(model, before)


def test_apply_twice_and_wrong_model_are_errors(tokenizer):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1,), beta=5.0))
    edit.apply(model)
    with pytest.raises(RuntimeError, match="already applied"):
        edit.apply(model)
    edit.revert(model)
    other = tiny_llama(len(tokenizer), layers=2)
    bigger = tiny_llama(len(tokenizer) + 5)
    with pytest.raises(Exception):
        edit.apply(other) if False else edit.apply(bigger.__class__(bigger.config.__class__(
            **{**bigger.config.to_dict(), "intermediate_size": 48})))
    assert not edit.is_applied


def test_scores_are_reused_and_band_validated(tokenizer):
    model = tiny_llama(len(tokenizer))
    first = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(k=2, beta=5.0))
    again = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(k=2, beta=5.0), scores=first.scores)
    assert "scores" not in again.timings and again.band == first.band
    with pytest.raises(ValueError, match="outside the model"):
        run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(3, 4), beta=5.0))
    with pytest.raises(ValueError, match="retain set is empty"):
        run_edit(model, tokenizer, FORGET, [], EditConfig(layers=(1,)))


def test_subsampling_respects_budgets(tokenizer):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN,
                    EditConfig(layers=(1,), forget_budget=7, retain_budget=9, beta=5.0))
    rec = edit.layers[0]
    assert (rec.n_forget_keys, rec.n_retain_keys) == (7, 9)
    again = run_edit(model, tokenizer, FORGET, RETAIN,
                     EditConfig(layers=(1,), forget_budget=7, retain_budget=9, beta=5.0))
    assert torch.equal(next(iter(edit.patches.values())), next(iter(again.patches.values())))


def test_a_stream_cache_skips_the_pass_and_gives_the_same_patches(tokenizer, trained_llama):
    """Edits of the same data and band reuse the hidden states entering the band: the
    patches equal the uncached edit's exactly, at any beta and w_r."""
    from grom import EditConfig, run_edit
    from tests.conftest import FORGET, RETAIN

    cache: dict = {}
    for beta, w_r in ((30.0, 30.0), (60.0, 10.0)):
        cfg = EditConfig(layers=(1, 2), beta=beta, w_r=w_r)
        plain = run_edit(trained_llama, tokenizer, FORGET, RETAIN, cfg)
        cached = run_edit(trained_llama, tokenizer, FORGET, RETAIN, cfg, stream_cache=cache)
        assert len(cache) == 1  # one entry: same band, same batches
        for name, P in plain.patches.items():
            assert torch.equal(P, cached.patches[name]), name
    run_edit(trained_llama, tokenizer, FORGET[:2], RETAIN, EditConfig(layers=(1, 2)), stream_cache=cache)
    assert len(cache) == 2  # other data: another entry
