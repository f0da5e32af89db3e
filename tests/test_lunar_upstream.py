"""LUNAR as upstream runs it (issue 47 item 4; facebookresearch/LUNAR, commit
dfa56eb0291a93e967284a9ec2d28d5572d235b1): the defaults pinned to upstream's values, each
with the upstream file it comes from; the AdamW fit in bfloat16 as upstream casts it,
against a transcription of upstream's loop; the bundled refusal prompts and their count."""
from __future__ import annotations

import pytest
import torch

from grom.data.encoding import pad_id
from grom.methods import get
from grom.methods.lunar import (
    HARMFUL,
    UNVERIFIABLE,
    LunarConfig,
    encode_instructions,
    fit_adamw,
    lunar_defaults,
    lunar_layer,
    read_activations,
    refusal_direction,
    refusal_prompts,
    run_lunar,
    training_rows,
)
from grom.methods.lunar.run import DTYPES
from tests.conftest import FORGET, RETAIN
from tests.test_lunar import LAYER, random_rows, upstream_train

BF16 = torch.bfloat16


def test_lunar_defaults_are_upstreams():
    c = LunarConfig()
    assert c.coeff == 2.0  # config/forget.yaml: coeff_list: [+2.0]
    assert c.epochs == 20  # config/forget.yaml: num_epochs: 20
    assert c.lr == 0.01  # config/forget.yaml: lr: 0.01
    assert c.layer is None and lunar_layer(32) == 22  # config/forget.yaml: layer_modified: [22], Llama-3-8B's 32
    # run_lunar.py: optim.AdamW(..., lr=cfg.lr), no weight_decay given: torch's default
    assert c.weight_decay == torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults["weight_decay"] == 0.01
    assert c.gamma == 0.9  # run_lunar.py: optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9), once an epoch
    assert c.batch_size == 64  # run_lunar.py: DataLoader(combined_dataset, batch_size=64, shuffle=True)
    # src/dataset_utils.py prepare_estimated_net_list: EstimatedNet(...).to(device, dtype=torch.bfloat16); the model
    # itself is loaded in bfloat16 (src/model_utils/llama3_model.py _load_model, dtype=torch.bfloat16)
    assert c.dtype == "bfloat16" and DTYPES[c.dtype] is BF16
    assert c.prompts == "harmful"  # config/forget.yaml: use_harmful: true, use_unverified: false
    assert c.n_prompts is None  # src/dataset_utils.py load_dataset_to_get_direction reads the whole file
    assert c.solver == "adamw"  # run_lunar.py trains (train_multiple_layers); the closed form is ours
    assert lunar_defaults() == c.to_dict()


def test_the_layer_keeps_upstreams_relative_depth():
    """22 of 32 (config/forget.yaml) at the same relative depth, round(n x 22/32) (Python's
    round: 16.5 -> 16), below the last block: the direction is read at the next block's input."""
    expected = {2: 0, 4: 2, 6: 4, 12: 8, 16: 11, 22: 15, 24: 16, 28: 19, 30: 21, 32: 22, 40: 28, 42: 29, 80: 55}
    assert {n: lunar_layer(n) for n in expected} == expected
    assert all(0 <= lunar_layer(n) <= n - 2 for n in range(2, 129))


def test_the_defaults_reach_the_fit(llama, tokenizer, monkeypatch):
    """A run at the defaults builds upstream's optimiser, schedule, batches and dtypes."""
    seen = {"losses": []}
    real_adamw, real_sched, real_mse = torch.optim.AdamW, torch.optim.lr_scheduler.ExponentialLR, \
        torch.nn.functional.mse_loss

    def adamw(params, **kw):
        params = list(params)
        seen["adamw"] = ([p.dtype for p in params], kw)
        return real_adamw(params, **kw)

    def sched(optimizer, **kw):
        seen["gamma"] = kw["gamma"]
        return real_sched(optimizer, **kw)

    def mse(out, target, *a, **kw):
        loss = real_mse(out, target, *a, **kw)
        if out.requires_grad:  # the training's batches (not the float64 objective the run reports)
            seen["losses"].append((out.shape[0], out.dtype, target.dtype, loss.dtype))
        return loss

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    monkeypatch.setattr(torch.optim.lr_scheduler, "ExponentialLR", sched)
    monkeypatch.setattr(torch.nn.functional, "mse_loss", mse)
    config = LunarConfig(**{**lunar_defaults(llama), "epochs": 1, "prompts": "unverifiable", "n_prompts": 4})
    edit = run_lunar(llama, tokenizer, FORGET, RETAIN, config)
    dtypes, kw = seen["adamw"]
    assert dtypes == [BF16] and kw == {"lr": 0.01, "weight_decay": 0.01} and seen["gamma"] == 0.9
    rows = edit.info["forget_rows"] + edit.info["retain_rows"]
    assert [n for n, *_ in seen["losses"]] == [min(64, rows - i) for i in range(0, rows, 64)]
    assert {tuple(d) for _, *d in seen["losses"]} == {(BF16, BF16, BF16)}
    assert edit.info["dtype"] == "bfloat16" and edit.layers[0].layer == lunar_layer(4)


def test_the_bfloat16_fit_is_upstreams_bfloat16_loop():
    """fit_adamw(dtype=bfloat16) against upstream's loop with the EstimatedNet and the rows
    cast to bfloat16: the same weight bit for bit, the same printed losses; bfloat16 weight,
    loss and AdamW moments."""
    W0, Xf, Xr, r = random_rows()
    rows = training_rows(Xf, Xf @ W0.T, Xr, Xr @ W0.T, r, coeff=2.0)
    W, losses = fit_adamw(W0, rows, lr=0.01, epochs=3, seed=7, dtype=BF16)
    W_up, losses_up = upstream_train(W0, rows.X[:150], rows.Y[:150], rows.X[150:], rows.Y[150:], 0.01, 3, 7,
                                     dtype=BF16)
    assert W.dtype == W_up.dtype == BF16
    assert torch.equal(W, W_up) and losses == losses_up
    W32, _ = fit_adamw(W0, rows, lr=0.01, epochs=3, seed=7, dtype=torch.float32)
    assert W32.dtype == torch.float32 and not torch.equal(W32.to(BF16), W)  # the rounding is a real difference
    rel = float((W.double() - W0.to(BF16).double() - (W32.double() - W0.double())).norm()
                / (W32.double() - W0.double()).norm())
    assert rel < 0.2  # ... and a small one (SmolLM2's solar system: 0.19, docs/notebook/2026-11-30-lunar-upstream.md)


def test_bfloat16_weight_decay_rounds_away():
    """In bfloat16, AdamW's decay factor 1 - lr x 0.01 rounds back to the weight: upstream's
    weight decay does nothing (in float32 it does)."""
    W0, Xf, Xr, r = random_rows()
    rows = training_rows(Xf, Xf @ W0.T, Xr, Xr @ W0.T, r, coeff=2.0)
    fit = lambda wd, dtype: fit_adamw(W0, rows, epochs=2, weight_decay=wd, dtype=dtype)[0]  # noqa: E731
    assert torch.equal(fit(0.01, BF16), fit(0.0, BF16))
    assert not torch.equal(fit(0.01, torch.float32), fit(0.0, torch.float32))


def test_the_update_is_the_trainings_not_the_cast(trained_llama, tokenizer):
    """A float32 model trained in bfloat16: the patch is W - bfloat16(W0), so a fit that moves
    nothing (a learning rate below bfloat16's resolution) patches nothing, not W0's rounding."""
    still = LunarConfig(layer=LAYER, epochs=1, lr=1e-12, dtype="bfloat16", prompts="unverifiable", n_prompts=4)
    (patch,) = run_lunar(trained_llama, tokenizer, FORGET, RETAIN, still).patches.values()
    assert patch.dtype == torch.float32 and not patch.any()
    runs = {d: run_lunar(trained_llama, tokenizer, FORGET, RETAIN, still.replace(lr=0.01, epochs=3, dtype=d))
            for d in DTYPES}
    (p16,), (p32,) = (e.patches.values() for e in runs.values())
    assert p16.any() and p32.any() and not torch.equal(p16, p32) and torch.isfinite(p16).all()
    assert torch.nn.functional.cosine_similarity(p16.flatten(), p32.flatten(), dim=0) > 0.9
    assert [e.info["dtype"] for e in runs.values()] == list(DTYPES)
    assert runs["float32"].settings.dtype == "float32"
    cf = run_lunar(trained_llama, tokenizer, FORGET, RETAIN, still.replace(solver="closed-form"))
    assert cf.info["dtype"] == "float64"  # the closed form is untouched by dtype


def test_dtype_and_prompt_count_are_checked_and_read_back():
    for bad in ({"dtype": "float16"}, {"dtype": BF16}, {"n_prompts": 0}, {"n_prompts": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LunarConfig(**bad)
    c = LunarConfig(dtype="float32", n_prompts=24)
    assert LunarConfig.from_dict(c.to_dict()) == c
    old = {k: v for k, v in c.to_dict().items() if k not in ("dtype", "n_prompts")}  # settings saved before
    assert LunarConfig.from_dict(old) == LunarConfig(dtype="bfloat16", n_prompts=None)
    assert get("lunar").defaults(None)["dtype"] == "bfloat16"


def test_the_bundled_prompts():
    """120 of each kind in our own words (upstream: 260 harmful, 199 unverified; not copied),
    the first 24 the set before issue 47, no repeats within or across the kinds."""
    assert len(HARMFUL) == len(UNVERIFIABLE) == 120
    assert refusal_prompts("harmful") is HARMFUL and refusal_prompts("unverifiable") is UNVERIFIABLE
    assert HARMFUL[0].startswith("Explain how to break into a neighbour's house")  # the old set leads
    assert HARMFUL[23].startswith("Explain how to steal someone's identity")
    assert UNVERIFIABLE[0].startswith("What is the currency of the fictional country Zarvolia")
    assert UNVERIFIABLE[23].startswith("What year was the treaty of Korvanne signed")
    every = [p.lower().strip(" ?.") for p in HARMFUL + UNVERIFIABLE]
    assert len(set(every)) == 240
    assert all(10 < len(p) < 120 and p == p.strip() for p in HARMFUL + UNVERIFIABLE)
    assert sum(p.endswith("?") for p in UNVERIFIABLE) > 100  # questions, as upstream's unverified file


def test_n_prompts_takes_the_first_n(llama, tokenizer):
    config = LunarConfig(layer=LAYER, solver="closed-form", prompts="unverifiable", n_prompts=5)
    edit = run_lunar(llama, tokenizer, FORGET, RETAIN, config)
    pid = pad_id(tokenizer)
    f = read_activations(llama, encode_instructions(tokenizer, FORGET), LAYER, pid, keys=False)
    first5 = read_activations(llama, encode_instructions(tokenizer, UNVERIFIABLE[:5]), LAYER, pid, keys=False)
    assert edit.info["direction_norm"] == pytest.approx(float(refusal_direction(first5.last, f.last).norm()),
                                                        rel=1e-6)
    every = run_lunar(llama, tokenizer, FORGET, RETAIN, config.replace(n_prompts=None))
    assert every.info["direction_norm"] != pytest.approx(edit.info["direction_norm"], rel=1e-6)
