"""The refusal target: its keys, its D, its closed form, and what the edit does."""
import pytest
import torch

from grom import Edit, EditConfig, run_edit
from grom.cli import build_parser, config_from_args
from grom.closed_form.directions import head_promotion_directions, promotion_directions
from grom.closed_form.refusal import REFUSALS, choose_refusals, encode_refusals, refusal_examples
from grom.data.prompts import encode_qa
from grom.data.schema import TextExample
from grom.eval.metrics import answer_class
from grom.model.arch import unembedding
from tests.conftest import FORGET, RETAIN, tiny_llama

REFUSAL = "I don't know."
LAYER = 2
NAME = f"model.layers.{LAYER}.mlp.down_proj.weight"


def hooked_keys(model, sequences):
    """Inputs of layer LAYER's down_proj at the given positions, one sequence at a time
    (no padding, no batching): sequences [(ids, positions)] -> (n, total)."""
    grabbed = []
    module = model.model.layers[LAYER].mlp.down_proj
    handle = module.register_forward_pre_hook(lambda mod, args: grabbed.append(args[0][0]))
    cols = []
    try:
        with torch.no_grad():
            for ids, positions in sequences:
                model(input_ids=torch.tensor([ids]))
                cols.append(grabbed.pop()[list(positions)])
    finally:
        handle.remove()
    return torch.cat(cols).double().T


def direct_solve(Xf, Xr, D, w_r, rho):
    """argmin_P (w_r/r)||P Xr||^2 + (1/s)||P Xf - D||^2 + mu ||P||^2 as ONE stacked least
    squares (no normal equations), mu = rho * mean diag of the data Gram matrix."""
    s, r, n = Xf.shape[1], Xr.shape[1], Xf.shape[0]
    mu = rho * float(torch.diagonal(w_r / r * Xr @ Xr.T + Xf @ Xf.T / s).mean())
    M = torch.cat([(w_r / r) ** 0.5 * Xr.T, Xf.T / s ** 0.5, mu ** 0.5 * torch.eye(n, dtype=Xf.dtype)])
    B = torch.cat([torch.zeros(r, D.shape[0], dtype=D.dtype), D.T / s ** 0.5,
                   torch.zeros(n, D.shape[0], dtype=D.dtype)])
    return torch.linalg.lstsq(M, B).solution.T


def test_refusal_solve_equals_a_direct_least_squares_of_its_objective(tokenizer):
    model = tiny_llama(len(tokenizer))
    cfg = EditConfig(target="refusal", refusal=REFUSAL, layers=(LAYER,), beta=4.0, w_r=10.0, rho=0.05)
    edit = run_edit(model, tokenizer, FORGET, RETAIN, cfg)
    eos = tokenizer.eos_token_id
    forget, gold = [], []
    for ex in FORGET:  # prompt + refusal; keys from the last prompt token to the refusal's last
        ids, start = encode_qa(tokenizer, ex.question, REFUSAL)
        forget.append((ids, range(start - 1, len(ids))))
        gold += ids[start:] + [eos]
    retain = []
    for ex in RETAIN:
        ids, start = encode_qa(tokenizer, ex.question, ex.answer)
        retain.append((ids, range(start - 1, len(ids) - 1)))
    Xf, Xr = hooked_keys(model, forget), hooked_keys(model, retain)
    U = unembedding(model).detach().double()
    v = U[gold] - U.mean(0)
    D = cfg.beta * (v / v.norm(dim=1, keepdim=True)).T  # (m, s): toward each next refusal token
    P = direct_solve(Xf, Xr, D, cfg.w_r, cfg.rho)
    scale = float(P.abs().max())
    assert scale > 0.01  # a real update, compared to float32 rounding of keys and patch
    torch.testing.assert_close(edit.patches[NAME].double(), P, rtol=1e-4, atol=1e-5 * scale)


def test_promotion_target_by_hand_and_the_head_form():
    U = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]])  # mean row (0, 1)
    D = promotion_directions(torch.tensor([0, 1]), U, beta=3.0).dense
    torch.testing.assert_close(D, torch.tensor([[3 / 2 ** 0.5, 0.0], [-3 / 2 ** 0.5, 3.0]]))
    head = head_promotion_directions(torch.tensor([2, 0]), 3, beta=5.0)
    torch.testing.assert_close(head.columns(torch.arange(2)), torch.tensor([[0.0, 5.0], [0, 0], [5.0, 0]],
                                                                             dtype=torch.float64))


def refusal_logprob(model, tokenizer, first: int | None = None):
    """Mean log-probability of REFUSAL's tokens (the first `first` of them) after each
    forget prompt, teacher-forced."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in FORGET:
            ids, start = encode_qa(tokenizer, ex.question, REFUSAL)
            end = len(ids) if first is None else start + first
            logp = model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
            total += float(sum(logp[t - 1, ids[t]] for t in range(start, end)))
            count += end - start
    return total / count


def test_after_the_edit_the_refusal_is_more_likely_and_retain_answers_keep(tokenizer, trained_llama):
    from tests.test_editing import answer_logprob

    model = trained_llama  # memorised FORGET + RETAIN: it answers, it never refuses
    before = refusal_logprob(model, tokenizer, 2), refusal_logprob(model, tokenizer)
    r0 = answer_logprob(model, tokenizer, RETAIN)
    edit = run_edit(model, tokenizer, FORGET, RETAIN,
                    EditConfig(target="refusal", refusal=REFUSAL, k=2, beta=30.0, w_r=30.0))
    with edit.applied(model):
        after = refusal_logprob(model, tokenizer, 2), refusal_logprob(model, tokenizer)
        r1 = answer_logprob(model, tokenizer, RETAIN)
    rise_first, rise_all = after[0] - before[0], after[1] - before[1]
    assert rise_first > 1.0 and rise_all > 1.0
    assert rise_all > 5 * abs(r0 - r1)  # the bound test_editing's suppression test uses


def test_edit_json_round_trip_keeps_the_refusal(tokenizer, tmp_path):
    model = tiny_llama(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN,
                    EditConfig(target="refusal", refusal="No comment.", layers=(1,), beta=5.0))
    loaded = Edit.load(edit.save(tmp_path / "edit"))
    assert loaded.settings == edit.settings and loaded.settings.refusal == "No comment."
    assert torch.equal(loaded.patches[edit.layers[0].param_name], edit.patches[edit.layers[0].param_name])
    assert EditConfig.from_dict(EditConfig(target="refusal").to_dict()).refusal is None


def test_refusals_are_seeded_per_question_and_read_as_refusals():
    a, b = choose_refusals(50, seed=3), choose_refusals(50, seed=3)
    assert a == b and set(a) <= set(REFUSALS) and len(set(a)) > 1
    assert a != choose_refusals(50, seed=4)
    assert choose_refusals(3, seed=0, refusal="No.") == ["No."] * 3
    assert all(answer_class("Pellmoor", r) == "refusal" for r in REFUSALS)
    qa = refusal_examples(FORGET, seed=3)
    assert [q.question for q in qa] == [e.question for e in FORGET] and [q.answer for q in qa] == a[:4]


def test_refusal_keys_end_with_eos_and_keep_example_numbers(tokenizer):
    enc = encode_refusals(tokenizer, FORGET, seed=0, refusal=REFUSAL)
    assert [e.example for e in enc] == [0, 1, 2, 3]
    for e in enc:
        assert tokenizer.decode(list(e.gold)) == REFUSAL + tokenizer.eos_token
        assert e.positions[-1] == len(e.input_ids) - 1 and len(e.positions) == len(e.gold)


@pytest.mark.parametrize("bad, message", [
    (dict(target="refusal", key_mode="corpus"), "key_mode auto, qa, subject, last_prompt"),
    (dict(refusal="   "), "must not be empty"),
    (dict(refusal="x" * 501), "under 500"),
])
def test_bad_refusal_settings_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        EditConfig(**bad)


def test_a_corpus_has_no_question_to_refuse(tokenizer):
    with pytest.raises(ValueError, match="needs questions"):
        run_edit(tiny_llama(len(tokenizer)), tokenizer, [TextExample("Zorvath Quill was born in Pellmoor.")],
                 RETAIN, EditConfig(target="refusal", layers=(1,)))


def test_the_cli_takes_the_refusal_target():
    args = build_parser().parse_args(["edit", "--model", "m", "--out", "o", "--target", "refusal",
                                      "--refusal", "No idea."])
    cfg = config_from_args(args)
    assert cfg.target == "refusal" and cfg.refusal == "No idea."


def test_the_edit_form_offers_the_refusal_target():
    from components.studio.form import TARGETS

    assert "refusal" in TARGETS


def test_the_band_is_scored_on_the_forget_answers_as_for_suppression(tokenizer):
    from grom.closed_form.pipeline import prepare, score_prepared

    model = tiny_llama(len(tokenizer))
    vocab = unembedding(model).shape[0]
    sup, ref = EditConfig(k=2), EditConfig(k=2, target="refusal")
    prep = prepare(tokenizer, FORGET, RETAIN, ref, vocab)
    assert torch.equal(prep.alpha, torch.ones(vocab))  # every refusal token promoted alike
    assert (score_prepared(model, prep, ref).S
            == score_prepared(model, prepare(tokenizer, FORGET, RETAIN, sup, vocab), sup).S)
