"""Memory bounded by the model: the system summed batch by batch equals the solve from the
whole key matrices; the hidden-state budget replays batches without changing the patches;
the CLI's key budgets."""
import pytest
import torch

from grom import EditConfig, run_edit, solve_update
from grom.cli import build_parser, config_from_args
from grom.closed_form.collect import LayerStream
from grom.closed_form.directions import Directions
from grom.closed_form.solve import SystemSums, build_system
from grom.model.arch import ARCHITECTURES
from tests.conftest import FORGET, RETAIN
from tests.test_solve import lstsq_reference
from tests.test_stream_families import relative_error, tiny_model


def _batches(X: torch.Tensor, sizes):
    at = 0
    for k in sizes:
        yield X[:, at:at + k]
        at += k


@pytest.mark.parametrize("sizes_f,sizes_r", [((3, 0, 5, 1), (4, 4, 2)), ((9,), (10,)), ((2, 7), ())])
def test_sums_by_batch_equal_the_whole_solve_and_least_squares(sizes_f, sizes_r):
    g = torch.Generator().manual_seed(0)
    n, m, s, r = 12, 7, sum(sizes_f), sum(sizes_r)
    Xf, Xr = torch.randn(n, s, generator=g), torch.randn(n, r, generator=g)
    D = torch.randn(m, s, generator=g, dtype=torch.float64)
    sums = SystemSums(m, n, s, r, w_r=3.0, w_f=1.0)
    at = 0
    for X in _batches(Xf, sizes_f):
        sums.add_forget(X, Directions(m, dense=D[:, at:at + X.shape[1]]))
        at += X.shape[1]
    for X in _batches(Xr, sizes_r):
        sums.add_retain(X)
    sums.reduce()  # one process: nothing to add
    DXt, system = sums.DXt, sums.system(0.05)
    P = system.update(DXt)
    whole = build_system(Xf, Xr if r else None, w_r=3.0, rho=0.05)
    assert system.mu == pytest.approx(whole.mu, rel=1e-12)
    P_whole = whole.update(Directions(m, dense=D).right_product(Xf))
    assert relative_error(P, P_whole) < 1e-12
    if r:
        assert relative_error(P, lstsq_reference(Xf.double(), Xr.double(), D, 3.0, 0.05)) < 1e-10
    assert sums.A is None and system.chol.shape == (n, n)  # A_data's memory became the factor


def _per_layer_reference(edit, config) -> dict:
    """Each edited matrix's P solved from its kept keys as whole matrices (grom.closed_form.solve)."""
    out = {}
    for rec in edit.layers:
        k = edit.keys[rec.param_name]
        P = solve_update(k.Xf.double(), k.Xr.double(), k.directions, w_r=config.w_r, rho=config.rho)
        out[rec.param_name] = P.T if rec.transposed else P
    return out


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_family_patches_equal_the_whole_key_solve(tokenizer, model_type):
    """Float64 models (gemma2 in float32: its float64 forward is not finite here), batches
    of 2 so every sum crosses batches; the keys kept for the reference change nothing."""
    model = tiny_model(model_type, len(tokenizer))
    model, tol = (model, 1e-6) if model_type == "gemma2" else (model.double(), 1e-10)
    for config in (EditConfig(layers=(1, 2), beta=4.0, w_r=10.0, rho=0.05, batch_size=2, keep_keys=True),
                   EditConfig(layers=(2,), beta=0.5, beta_relative=True, w_r=10.0, rho=0.05, batch_size=3,
                              keep_keys=True)):
        edit = run_edit(model, tokenizer, FORGET, RETAIN, config)
        plain = run_edit(model, tokenizer, FORGET, RETAIN, config.replace(keep_keys=False))
        assert plain.keys == {} and edit.world_size == 1
        for name, P in _per_layer_reference(edit, config).items():
            assert relative_error(edit.patches[name], P) < tol, (model_type, name)
            assert torch.equal(plain.patches[name], edit.patches[name])


def test_head_and_corruption_edits_equal_the_whole_key_solve(tokenizer):
    model = tiny_model("llama", len(tokenizer)).double()
    for config in (EditConfig(matrix="lm_head", beta=2.0, w_r=10.0, rho=0.05, batch_size=2, keep_keys=True),
                   EditConfig(layers=(2,), target="corruption", c=3.0, w_r=10.0, batch_size=2, keep_keys=True)):
        edit = run_edit(model, tokenizer, FORGET, RETAIN, config)
        for name, P in _per_layer_reference(edit, config).items():
            assert relative_error(edit.patches[name], P) < 1e-10


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gemma2"])
def test_a_tiny_hidden_budget_replays_batches_and_keeps_the_patches(tokenizer, model_type, monkeypatch):
    model = tiny_model(model_type, len(tokenizer))
    model, tol = (model, 1e-5) if model_type == "gemma2" else (model.double(), 1e-10)
    config = EditConfig(layers=(0, 2, 3), beta=4.0, w_r=10.0, rho=0.05, batch_size=2)
    replayed = []
    real_init = LayerStream.__init__

    def counting(self, *a, **k):
        real_init(self, *a, **k)
        replayed.append(self.replayed)
    monkeypatch.setattr(LayerStream, "__init__", counting)
    whole = run_edit(model, tokenizer, FORGET, RETAIN, config, hidden_budget=None)
    for budget in (1, 100_000):  # nothing kept; some batches kept (tens of kB each)
        small = run_edit(model, tokenizer, FORGET, RETAIN, config, hidden_budget=budget)
        for name, P in whole.patches.items():
            assert relative_error(small.patches[name], P) < tol, (budget, name)
    assert replayed[0] == 0 and replayed[1] == 5 and 0 < replayed[2] < 5  # 2 forget + 3 retain batches


def test_cli_key_budgets():
    parse = lambda *a: config_from_args(build_parser().parse_args(["edit", "--model", "m", "--out", "o", *a]))  # noqa: E731
    assert parse().forget_budget == 20000 and parse().retain_budget == 40000
    cfg = parse("--forget-budget", "none", "--retain-budget", "123")
    assert cfg.forget_budget is None and cfg.retain_budget == 123
    assert parse("--retain-budget", "None").retain_budget is None
    for bad in ("0", "-3", "lots"):
        with pytest.raises(SystemExit):
            parse("--forget-budget", bad)
