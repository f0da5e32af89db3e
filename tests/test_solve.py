"""The closed-form solve and the influence audit against independent references."""
import pytest
import torch

from grom import (
    best_window,
    example_influence,
    example_influence_bruteforce,
    ridge_mu,
    solve_update,
    specificity_weights,
)
from grom.closed_form.directions import corruption_directions, head_suppression_directions


def problem(n=10, m=6, s=24, r=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, s, generator=g, dtype=torch.float64),
            torch.randn(n, r, generator=g, dtype=torch.float64),
            torch.randn(m, s, generator=g, dtype=torch.float64))


def lstsq_reference(Xf, Xr, D, w_r, rho, w_f=1.0):
    """argmin_P (w_f/s)||P Xf - D||^2 + (w_r/r)||P Xr||^2 + mu ||P||^2 by stacked lstsq."""
    n, s, r = Xf.shape[0], Xf.shape[1], Xr.shape[1]
    mu = ridge_mu(Xf, Xr, w_r=w_r, rho=rho, w_f=w_f)
    rows = torch.cat([Xf.T * (w_f / s) ** 0.5, Xr.T * (w_r / r) ** 0.5,
                      torch.eye(n, dtype=torch.float64) * mu ** 0.5])
    rhs = torch.cat([D.T * (w_f / s) ** 0.5, torch.zeros(r + n, D.shape[0], dtype=torch.float64)])
    return torch.linalg.lstsq(rows, rhs).solution.T


@pytest.mark.parametrize("w_r,rho", [(1.0, 0.03), (100.0, 0.03), (5.0, 1.0), (0.0, 0.5)])
def test_solve_matches_lstsq(w_r, rho):
    Xf, Xr, D = problem()
    P = solve_update(Xf, Xr, D, w_r=w_r, rho=rho)
    assert P.shape == (6, 10) and P.dtype == torch.float64
    torch.testing.assert_close(P, lstsq_reference(Xf, Xr, D, w_r, rho), rtol=1e-8, atol=1e-10)


def test_ridge_mu_is_rho_times_mean_diagonal():
    Xf, Xr, _ = problem()
    A = (3.0 / Xr.shape[1]) * Xr @ Xr.T + (1.0 / Xf.shape[1]) * Xf @ Xf.T
    assert ridge_mu(Xf, Xr, w_r=3.0, rho=0.1) == pytest.approx(0.1 * float(torch.diagonal(A).mean()))


def test_only_the_ratio_of_weights_matters():
    Xf, Xr, D = problem()
    P1 = solve_update(Xf, Xr, D, w_r=50.0, rho=0.03, w_f=1.0)
    P2 = solve_update(Xf, Xr, D, w_r=350.0, rho=0.03, w_f=7.0)
    torch.testing.assert_close(P1, P2)
    assert not torch.allclose(P1, solve_update(Xf, Xr, D, w_r=350.0, rho=0.03, w_f=1.0))


def test_zero_target_gives_zero_update():
    Xf, Xr, D = problem()
    assert torch.count_nonzero(solve_update(Xf, Xr, 0 * D, w_r=10.0, rho=0.03)) == 0


def test_output_dtype_follows_keys():
    Xf, Xr, D = problem()
    assert solve_update(Xf.float(), Xr.float(), D.float(), w_r=1.0, rho=0.1).dtype == torch.float32


def test_mismatched_target_is_an_error():
    Xf, Xr, D = problem()
    with pytest.raises(ValueError, match="columns"):
        solve_update(Xf, Xr, D[:, :-1], w_r=1.0, rho=0.1)


def test_sparse_head_target_equals_dense():
    Xf, Xr, _ = problem(s=12)
    gold = torch.randint(0, 50, (12,))
    alpha = torch.rand(12)
    sparse = head_suppression_directions(gold, alpha, 50, beta=3.0)
    dense = torch.zeros(50, 12, dtype=torch.float64)
    dense[gold, torch.arange(12)] = -3.0 * alpha.double()
    torch.testing.assert_close(sparse.right_product(Xf), dense @ Xf.T)
    torch.testing.assert_close(solve_update(Xf, Xr, sparse, w_r=2.0, rho=0.1),
                               solve_update(Xf, Xr, dense, w_r=2.0, rho=0.1), rtol=1e-5, atol=1e-6)


def test_corruption_target_is_seeded_and_scaled():
    a, b = corruption_directions(5, 8, 45.0, seed=1), corruption_directions(5, 8, 45.0, seed=1)
    torch.testing.assert_close(a.dense, b.dense)
    torch.testing.assert_close(a.dense.norm(dim=0), torch.full((5,), 45.0))
    assert not torch.allclose(a.dense, corruption_directions(5, 8, 45.0, seed=2).dense)


def test_specificity_weights_by_hand():
    forget = torch.tensor([1, 1, 2, 3])  # ff: 1->.5, 2->.25, 3->.25
    retain = torch.tensor([1, 2, 2, 2, 4, 4, 4, 4])  # rf: 1->.125, 2->.375, 4->.5
    alpha = specificity_weights(forget, retain, 6)
    torch.testing.assert_close(alpha, torch.tensor([0, 0.75, 0, 1, 0, 0]))


def test_specificity_weights_without_retain_are_one():
    alpha = specificity_weights(torch.tensor([0, 2]), torch.tensor([], dtype=torch.long), 3)
    torch.testing.assert_close(alpha, torch.tensor([1.0, 0.0, 1.0]))


def test_best_window():
    scores = [0.1, 0.5, 0.9, 0.8, 0.0, 1.5]
    assert best_window(scores, 2) == [2, 3]
    assert best_window(scores, 1) == [5]
    assert best_window(scores, 2, candidates=[0, 1, 2]) == [1, 2]
    assert best_window([1.0, 1.0, 1.0], 2) == [0, 1]  # ties go to the earliest
    with pytest.raises(ValueError, match="candidates"):
        best_window(scores, 3, candidates=[0, 2, 4])
    with pytest.raises(ValueError, match="between 1"):
        best_window(scores, 7)


@pytest.mark.parametrize("seed,w_r,rho", [(0, 10.0, 0.03), (1, 0.5, 0.3), (2, 100.0, 0.01)])
def test_influence_matches_bruteforce_for_every_example(seed, w_r, rho):
    Xf, Xr, D = problem(n=9, m=5, s=30, r=25, seed=seed)
    example_index = torch.arange(30) % 7  # 7 examples with 4-5 columns each, interleaved
    fast = example_influence(Xf, Xr, D, example_index, w_r=w_r, rho=rho)
    slow = example_influence_bruteforce(Xf, Xr, D, example_index, w_r=w_r, rho=rho)
    assert fast.shape == (7,)
    torch.testing.assert_close(fast, slow, rtol=1e-7, atol=1e-10)


def test_influence_with_sparse_head_target():
    Xf, Xr, _ = problem(s=16)
    target = head_suppression_directions(torch.randint(0, 30, (16,)), torch.rand(16), 30, beta=2.0)
    idx = torch.arange(16) // 4
    torch.testing.assert_close(example_influence(Xf, Xr, target, idx, w_r=3.0, rho=0.1),
                               example_influence_bruteforce(Xf, Xr, target, idx, w_r=3.0, rho=0.1))


def test_influence_of_an_example_with_zero_target_and_no_keys_elsewhere():
    # An example whose target is zero still changes P (through A), so its influence is > 0
    Xf, Xr, D = problem(s=8)
    D[:, :2] = 0
    idx = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    infl = example_influence(Xf, Xr, D, idx, w_r=1.0, rho=0.1)
    assert infl[0] > 0
