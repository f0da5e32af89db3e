"""The locate-then-edit editors (grom.methods.editors.update_rules, values, editing): each update rule
against a direct numerical check, the shared value optimisation, and the whole run on a
tiny trained model (the model comes back bit for bit)."""
from __future__ import annotations

import pytest
import torch

from grom.data.encoding import pad_id
from grom.data.schema import FactRecord, QAExample
from grom.methods.editors import update_rules as rules
from grom.methods.editors.locate_then_edit import EDITORS, EditorConfig, run_editor
from grom.methods.editors.value_optimisation import ValueSettings, encode_fact, optimise_values
from tests.conftest import FORGET, RETAIN

torch.set_default_dtype(torch.float32)
FACTS = [QAExample(e.question, e.answer, subject=s, fact=f) for e, s, f in zip(
    FORGET, ["Zorvath Quill", "Zorvath Quill", "Ilsa Varn", "Ilsa Varn"],
    ["Pellmoor", "The Glass Orchard", "Tessaly Medal", "1874"])]


def _spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3 * n, generator=g, dtype=torch.float64)
    return X @ X.T / (3 * n)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_rome_is_rank_one_maps_the_key_and_is_the_constrained_minimum():
    m, n = 6, 8
    W, k, r, C = _rand(m, n, seed=1), _rand(n, 1, seed=2), _rand(m, 1, seed=3), _spd(n, 4)
    P = rules.rome_update(W, k, r, C)
    s = torch.linalg.svdvals(P)
    assert s[1] < 1e-12 * s[0]
    assert torch.allclose((W + P) @ k, W @ k + r, atol=1e-12)
    # independent: each row p minimises p^T C p subject to p . k = r_i (its KKT system)
    kkt = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    kkt[:n, :n], kkt[:n, n], kkt[n, :n] = 2 * C, k[:, 0], k[:, 0]
    for i in range(m):
        rhs = torch.zeros(n + 1, dtype=torch.float64)
        rhs[n] = r[i, 0]
        assert torch.allclose(P[i], torch.linalg.solve(kkt, rhs)[:n], atol=1e-12)


def test_rome_applies_facts_one_after_another():
    W, K, R, C = _rand(6, 8, seed=1), _rand(8, 3, seed=2), _rand(6, 3, seed=3), _spd(8, 4)
    P = rules.rome_update(W, K, R, C)
    assert torch.linalg.matrix_rank(P) == 3
    assert torch.allclose((W + P) @ K[:, 2], W @ K[:, 2] + R[:, 2], atol=1e-12)  # the last lands exactly


def test_memit_one_layer_one_fact_is_rome_up_to_its_soft_constraint():
    W, k, r, C0 = _rand(6, 8, seed=1), _rand(8, 1, seed=2), _rand(6, 1, seed=3), _spd(8, 5)
    rome = rules.rome_update(W, k, r, C0)
    # hard constraint (w_r -> 0): ROME's closed form
    assert torch.allclose(rules.memit_update(k, r, C0, 1e-6, 0.0), rome, rtol=1e-5, atol=1e-9)
    # any w_r: the same rank-one direction scaled by k.u / (w_r + k.u), u = C0^-1 k (Sherman-Morrison)
    u = torch.linalg.solve(C0, k)
    kU = float(k.T @ u)
    assert torch.allclose(rules.memit_update(k, r, C0, 3.0, 0.0), rome * kU / (3.0 + kU), atol=1e-12)


def test_alphaedit_leaves_the_retain_outputs_unchanged_up_to_the_threshold():
    n, m, thr = 10, 6, 2e-2
    g = torch.Generator().manual_seed(0)
    Xr = torch.randn(n, 4, generator=g, dtype=torch.float64) @ torch.randn(4, 300, generator=g, dtype=torch.float64)
    Xr += 1e-2 * torch.randn(n, 300, generator=g, dtype=torch.float64)  # small but not null directions
    C0 = rules.retain_covariance(Xr)
    Pn = rules.null_space_projector(C0, thr)
    evals = torch.linalg.eigvalsh(C0)
    assert int((evals < thr).sum()) == 6 and torch.allclose(Pn @ Pn, Pn, atol=1e-12)
    K, R = _rand(n, 2, seed=7), _rand(m, 2, seed=8)
    P = rules.alphaedit_update(K, R, Pn, 10.0)
    assert torch.allclose(P @ Pn, P, atol=1e-12)
    bound = torch.linalg.matrix_norm(P, 2) * (Xr.shape[1] * evals[evals < thr].sum()).sqrt()
    assert torch.linalg.norm(P @ Xr) <= bound * (1 + 1e-9)
    free = rules.alphaedit_update(K, R, torch.eye(n, dtype=torch.float64), 10.0)  # no projector: they move
    assert torch.linalg.norm(P @ Xr) < 0.05 * torch.linalg.norm(free @ Xr)


def test_zerounlearn_is_orthogonal_to_the_forget_outputs_and_is_its_least_squares():
    m, n, u, r = 6, 8, 2, 40
    W, K, R, Xr = _rand(m, n, seed=1), _rand(n, u, seed=2), _rand(m, u, seed=3), _rand(n, r, seed=4)
    C0 = rules.retain_covariance(Xr)
    Q = torch.linalg.qr(W @ K).Q  # the original forget outputs' span
    P0 = rules.zerounlearn_update(W, K, R, C0, w_r=5.0, w_f=50.0, lam=1.0, eps=0.0)
    x = _rand(n, 30, seed=5)
    assert torch.linalg.norm(Q.T @ (W + P0) @ x) < 1e-9 * torch.linalg.norm((W + P0) @ x)
    Pf = rules.forget_output_projector(W @ K, 0.01)
    assert torch.allclose(torch.linalg.eigvalsh(Pf), torch.tensor([0.01] * u + [1.01] * (m - u), dtype=torch.float64))
    # independent: D W minimises the weighted least squares the docstring states
    P = rules.zerounlearn_update(W, K, R, C0, w_r=5.0, w_f=50.0, lam=1.0, eps=0.01)
    A = torch.cat([(5.0 / r) ** 0.5 * W @ Xr, 50.0 ** 0.5 * W @ K, W], dim=1)
    B = Pf @ torch.cat([(5.0 / r) ** 0.5 * W @ Xr, 50.0 ** 0.5 * (W @ K + R), W], dim=1)
    D = torch.linalg.lstsq(A.T, B.T).solution.T
    assert torch.allclose(W + P, D @ W, atol=1e-9)


@pytest.fixture(scope="module")
def facts(tokenizer):
    return [encode_fact(tokenizer, ex, None, 512) for ex in FACTS]


def test_facts_key_on_the_subject_and_score_the_object(tokenizer, facts):
    f = facts[0]
    assert f.subject_last and tokenizer.decode(f.ids[:f.key + 1]).endswith("Zorvath Quill") and f.key < f.objects[0]
    assert "Pellmoor" in tokenizer.decode([f.ids[j] for j in f.objects])
    rec = encode_fact(tokenizer, FactRecord("Odo Brask", "Odo Brask was born in", "Quenford"), None, 512)
    assert rec.subject_last and tokenizer.decode([rec.ids[j] for j in rec.objects]).strip() == "Quenford"


def test_the_value_optimisation_lowers_the_answer_and_leaves_the_weights(trained_llama, tokenizer, facts):
    before = {k: v.clone() for k, v in trained_llama.state_dict().items()}
    grads = [None if p.grad is None else p.grad.clone() for p in trained_llama.parameters()]
    s = ValueSettings(steps=8, lr=0.5, clamp_norm_factor=2.0)
    v = optimise_values(trained_llama, facts, 2, pad_id(tokenizer), s)
    # the memorised tiny model reads each subject again in its answer, so not every fact moves
    assert v.p_before.min() > 0.9 and (v.p_after <= v.p_before + 1e-3).all()
    assert v.p_after.mean() < v.p_before.mean() - 0.02
    assert (v.delta.norm(dim=1) <= s.clamp_norm_factor * v.h.norm(dim=1) * (1 + 1e-5)).all()
    assert all(torch.equal(t, before[k]) for k, t in trained_llama.state_dict().items())
    assert all((g is None and p.grad is None) or torch.equal(g, p.grad)
               for g, p in zip(grads, trained_llama.parameters()))


def test_a_split_without_subjects_is_refused_before_any_work():
    with pytest.raises(ValueError, match="has no subject"):
        run_editor("rome", None, None, FORGET, RETAIN)  # no model needed to refuse
    with pytest.raises(ValueError, match="unknown editor 'romex'; use one of rome, memit"):
        run_editor("romex", None, None, FACTS, RETAIN)
    with pytest.raises(ValueError, match="needs a retain set"):
        run_editor("memit", None, None, FACTS, [])
    with pytest.raises(ValueError, match="l2"):
        EditorConfig(l2=-1.0)


@pytest.mark.parametrize("name", list(EDITORS))
def test_each_editor_forgets_and_the_model_comes_back_bit_for_bit(name, trained_llama, tokenizer):
    before = {k: v.clone() for k, v in trained_llama.state_dict().items()}
    cfg = EditorConfig(layers=(1, 2), w_r=1.0, values=ValueSettings(steps=8, lr=0.5, clamp_norm_factor=2.0))
    edit = run_editor(name, trained_llama, tokenizer, FACTS, RETAIN, cfg)
    assert all(torch.equal(v, before[k]) for k, v in trained_llama.state_dict().items())
    assert edit.method == name and edit.info["subject_last_keys"] == len(FACTS)
    assert sorted(edit.patches) == [f"model.layers.{l}.mlp.down_proj.weight"
                                    for l in ((2,) if name == "rome" else (1, 2))]
    p0, p1 = torch.tensor(edit.info["p_answer_before"]), torch.tensor(edit.info["p_answer_edited"])
    assert p1.mean() < p0.mean(), (p0, p1)
    with edit.applied(trained_llama):
        assert not torch.equal(trained_llama.state_dict()["model.layers.2.mlp.down_proj.weight"],
                               before["model.layers.2.mlp.down_proj.weight"])
    assert all(torch.equal(v, before[k]) for k, v in trained_llama.state_dict().items())
