"""LUNAR (grom.methods.lunar) against hand computations and a transcription of upstream's
training loop (facebookresearch/LUNAR, commit dfa56eb0291a93e967284a9ec2d28d5572d235b1,
`run_lunar.py`, `src/estimated_net_utils.py`), on the tiny test models: the direction is
the difference of hooked means, the AdamW fit reproduces upstream's loop loss for loss, the
closed form is the least-squares solution of the same objective, and a run is one
down_proj patch that applies and reverts bit for bit."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

from grom.data.encoding import pad_id
from grom.data.prompts import encode_prompt
from grom.data.schema import QAExample, TextExample
from grom.methods import ALL, can_run, family_of, get
from grom.methods.lunar import (
    LunarConfig,
    Rows,
    closed_form_patch,
    encode_instructions,
    fit_adamw,
    lunar_layer,
    mse,
    read_activations,
    refusal_direction,
    refusal_prompts,
    run_lunar,
    training_rows,
)
from grom.methods.lunar.run import reach
from tests.conftest import FORGET, RETAIN, assert_bit_exact, snapshot

LAYER = 2  # of the tiny models' 4 blocks


def hand_activations(model, tokenizer, questions, layer):
    """One unpadded pass per prompt (upstream's batch of 1): down_proj's input and output at
    every token, block `layer`'s output at the last token (hidden_states[layer + 1]: the
    input of block layer + 1, where upstream's pre-hook reads it)."""
    down = model.model.layers[layer].mlp.down_proj
    keys, outs, last = [], [], []
    for q in questions:
        ids = torch.tensor([encode_prompt(tokenizer, q)])
        got = {}
        h1 = down.register_forward_pre_hook(lambda m, a: got.__setitem__("k", a[0][0]))
        h2 = down.register_forward_hook(lambda m, a, o: got.__setitem__("o", o[0]))
        try:
            with torch.no_grad():
                hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        finally:
            h1.remove()
            h2.remove()
        keys.append(got["k"])
        outs.append(got["o"])
        last.append(hs[layer + 1][0, -1].double())
    return torch.cat(keys), torch.cat(outs), torch.stack(last)


def test_the_direction_and_rows_are_the_hooked_means(llama, tokenizer):
    forget = [e.question for e in FORGET]
    refusals = list(refusal_prompts("unverifiable")[:5])
    f = read_activations(llama, encode_instructions(tokenizer, FORGET), LAYER, pad_id(tokenizer), batch_size=3)
    r = read_activations(llama, encode_instructions(tokenizer, refusals), LAYER, pad_id(tokenizer), keys=False)
    fk, fo, fl = hand_activations(llama, tokenizer, forget, LAYER)
    _, _, rl = hand_activations(llama, tokenizer, refusals, LAYER)
    assert torch.allclose(f.keys, fk, atol=1e-5) and torch.allclose(f.outputs, fo, atol=1e-5)
    assert torch.allclose(f.last, fl, atol=1e-5) and r.keys is None
    hand = rl.mean(0) - fl.mean(0)  # upstream's get_mean_diff at one block and position
    assert torch.allclose(refusal_direction(r.last, f.last), hand, atol=1e-6)
    assert f.keys.shape[0] == sum(len(encode_prompt(tokenizer, q)) for q in forget)  # every prompt token


# ---- a transcription of upstream's training (src/estimated_net_utils.py, run_lunar.py) ----
class EstimatedNet(torch.nn.Module):
    def __init__(self, in_features, out_features, bias, original_down_proj_weight):
        super().__init__()
        self.down_proj = torch.nn.Linear(in_features=in_features, out_features=out_features, bias=bias)
        with torch.no_grad():
            self.down_proj.weight.copy_(original_down_proj_weight)

    def forward(self, x):
        return self.down_proj(x)


class ActivationDataset_multiple_layers(Dataset):
    def __init__(self, inputs_list, targets_list):
        self.inputs_list, self.targets_list = inputs_list, targets_list

    def __len__(self):
        return self.inputs_list[0].size(0)

    def __getitem__(self, idx):
        return [inputs[idx] for inputs in self.inputs_list], [targets[idx] for targets in self.targets_list]


class EpochPermutations(Sampler):
    def __init__(self, n, seed):
        self.n, self.g = n, torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.g).tolist())


def upstream_train(W0, Xf, Yf, Xr, Yr, lr, num_epochs, seed, dtype=None):
    """dtype: upstream's cast (src/dataset_utils.py `prepare_estimated_net_list` moves the
    EstimatedNet to bfloat16; the activations are bfloat16 as its model is); None: none."""
    model_list = [EstimatedNet(W0.shape[1], W0.shape[0], False, W0)]
    if dtype is not None:
        model_list = [model.to(dtype=dtype) for model in model_list]
        Xf, Yf, Xr, Yr = (x.to(dtype) for x in (Xf, Yf, Xr, Yr))
    combined = ConcatDataset([ActivationDataset_multiple_layers([Xf], [Yf]),
                              ActivationDataset_multiple_layers([Xr], [Yr])])
    # upstream: shuffle=True, one random permutation per epoch; drawn here from a seeded
    # generator as fit_adamw draws them, so the two runs see the rows in one order
    train_loader = DataLoader(combined, batch_size=64, sampler=EpochPermutations(len(combined), seed))
    optimizer = torch.optim.AdamW(model_list[0].parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    criterion = torch.nn.MSELoss()
    epoch_losses = []
    for _epoch in range(num_epochs):
        running_loss = 0.0
        for inputs_list, targets_list in train_loader:
            optimizer.zero_grad()
            outputs_list = [model(inputs) for model, inputs in zip(model_list, inputs_list)]
            loss = sum([criterion(outputs, target) for outputs, target in zip(outputs_list, targets_list)])
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
        scheduler.step()
        epoch_losses.append(running_loss / len(train_loader))
    return model_list[0].down_proj.weight.detach(), epoch_losses


def random_rows(n_f=150, n_r=110, n=24, m=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    W0 = torch.randn(m, n, generator=g) / n ** 0.5
    Xf, Xr = torch.randn(n_f, n, generator=g), torch.randn(n_r, n, generator=g)
    r = torch.randn(m, generator=g, dtype=torch.float64)
    return W0, Xf, Xr, r


def test_the_adamw_fit_is_upstreams_training_loop():
    """In float32 (our variant; upstream's bfloat16 in tests/test_lunar_upstream.py)."""
    W0, Xf, Xr, r = random_rows()
    rows = training_rows(Xf, Xf @ W0.T, Xr, Xr @ W0.T, r, coeff=2.0)
    W, losses = fit_adamw(W0, rows, lr=0.01, epochs=3, seed=7)
    W_up, losses_up = upstream_train(W0, rows.X[:150], rows.Y[:150], rows.X[150:], rows.Y[150:], 0.01, 3, 7)
    assert losses == pytest.approx(losses_up, rel=1e-5)
    assert torch.allclose(W, W_up, atol=1e-6)
    assert losses[-1] < losses[0]


def test_the_closed_form_is_the_least_squares_solution():
    coeff = 2.0
    for n_f, n_r in ((150, 110), (6, 5)):  # over- and underdetermined (24 inputs)
        W0, Xf, Xr, r = random_rows(n_f, n_r)
        rows = training_rows(Xf, Xf @ W0.T, Xr, Xr @ W0.T, r, coeff)
        P = closed_form_patch(Xf, Xr, r, coeff, rho=1e-9)  # a ridge this small: the limit, least norm
        X, R = rows.X.double(), rows.Y.double() - rows.X.double() @ W0.double().T
        exact = torch.cat([(coeff * r).expand(n_f, -1), torch.zeros(n_r, r.numel(), dtype=torch.float64)])
        assert torch.allclose(R, exact, atol=1e-5)  # the rows' residual targets, up to float32 rounding
        R = exact
        P_ls = torch.linalg.lstsq(X, R, driver="gelsd").solution.T  # least norm where underdetermined
        assert torch.allclose(P, P_ls, atol=1e-5), (n_f, n_r)
        assert mse(W0.double() + P, rows) <= mse(W0.double() + P_ls, rows) + 1e-9
    # where the system allows (fewer rows than inputs) the forget rows move by coeff r, the retain rows not at all
    moved = reach(P, Xf, Xr, r, coeff)
    assert moved["forget_reach"] == pytest.approx(1.0, abs=1e-5) and moved["retain_shift"] < 1e-5
    assert torch.allclose(Xf.double() @ P.T, (coeff * r).expand(6, -1), atol=1e-5)


def test_adamw_approaches_the_closed_form():
    W0, Xf, Xr, r = random_rows()
    rows = training_rows(Xf, Xf @ W0.T, Xr, Xr @ W0.T, r, 2.0)
    best = mse(W0.double() + closed_form_patch(Xf, Xr, r, 2.0, rho=1e-12), rows)
    W, _ = fit_adamw(W0, rows, lr=0.01, epochs=40, weight_decay=0.0, gamma=0.97)
    assert best <= mse(W, rows) < mse(W0, rows)
    assert mse(W, rows) - best < 0.2 * (mse(W0, rows) - best)


def test_lunar_is_registered_with_what_it_needs(llama):
    assert "lunar" in ALL and family_of("LUNAR") == "redirection" and get("lunar").label == "LUNAR"
    qa = SimpleNamespace(name="mine", split="forget", forget=tuple(FORGET), retain=tuple(RETAIN))
    assert can_run("lunar", llama, qa) is None
    assert can_run("lunar", None, SimpleNamespace(forget=tuple(FORGET), retain=())).words == "no retain set"
    texts = SimpleNamespace(name="mine", split="forget", forget=(TextExample("a text"),), retain=tuple(RETAIN))
    assert can_run("lunar", None, texts).words == "needs questions"
    assert can_run("lunar", None, SimpleNamespace(forget=(), retain=())).words == "no forget set"
    assert get("lunar").defaults(llama)["layer"] == lunar_layer(4) == 2
    assert lunar_layer(32) == 22 and lunar_layer(30) == 21 and lunar_layer(6) == 4
    with pytest.raises(ValueError, match="solver"):
        LunarConfig(solver="sgd")


@pytest.mark.parametrize("solver", ["adamw", "closed-form"])
def test_a_run_is_one_down_proj_patch_that_applies_and_reverts(trained_llama, tokenizer, solver):
    model, snap = trained_llama, snapshot(trained_llama)
    config = LunarConfig(layer=LAYER, solver=solver, epochs=3, prompts="unverifiable")
    edit = get("lunar").run(model, tokenizer, FORGET, RETAIN, config)
    assert_bit_exact(model, snap)  # the run leaves the model as it found it
    name = f"model.layers.{LAYER}.mlp.down_proj.weight"
    assert list(edit.patches) == [name] and edit.method == "lunar" and edit.band == [LAYER]
    assert edit.info["loss_after"] < edit.info["loss_before"] and edit.info["forget_reach"] > 0
    if solver == "adamw":
        assert len(edit.info["epoch_losses"]) == 3
    prompts = encode_instructions(tokenizer, FORGET)
    before = read_activations(model, prompts, LAYER, pad_id(tokenizer))
    with edit.applied(model):
        after = read_activations(model, prompts, LAYER, pad_id(tokenizer))
        assert torch.allclose(after.outputs, before.keys @ (snap[name] + edit.patches[name]).T, atol=1e-4)
    assert_bit_exact(model, snap)


def test_a_gpt2_conv1d_run_patches_in_the_parameters_layout(gpt2, tokenizer):
    edit = run_lunar(gpt2, tokenizer, FORGET, RETAIN, LunarConfig(layer=1, solver="closed-form"))
    (name,) = edit.patches
    assert name == "transformer.h.1.mlp.c_proj.weight"
    assert edit.patches[name].shape == gpt2.get_parameter(name).shape and edit.layers[0].transposed


def test_lunar_refuses_a_text_corpus(llama, tokenizer):
    with pytest.raises(ValueError, match="text corpus"):
        run_lunar(llama, tokenizer, [TextExample("a text")], RETAIN)
    assert isinstance(Rows(torch.zeros(1, 2), torch.zeros(1, 3), 1), Rows)
    assert QAExample("q", "a").question == "q"


def test_the_glossary_says_what_lunar_is_and_where_it_comes_from():
    from components.views.text import BASELINE, GLOSSARY
    from grom.methods.lunar import SOURCE

    assert "**LUNAR**" in GLOSSARY and SOURCE in GLOSSARY and "LUNAR" in BASELINE
    assert "dfa56eb0291a93e967284a9ec2d28d5572d235b1" in SOURCE and "facebookresearch/LUNAR" in SOURCE
