"""The states below an edit that a greedy decoding keeps (`grom.eval.prefix.LowerStates`),
and the judge's teacher-forced pass that starts from them: each kept state is the one a
plain forward pass over the prompt and the answer gives at that layer; a pass over a
prompt and an answer read there scores what the whole pass scores; the knowledge task's
judge reads them for the Edited row alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grom import EditConfig, run_edit
from grom.data.prompts import encode_prompt
from grom.eval import evaluate
from grom.eval.prefix import LowerStates
from grom.eval.report import BASE, EDITED
from grom.eval.runner import eos_ids, greedy_answers, greedy_until, left_padded, score_sequences
from grom.model.arch import decoder_layers
from grom.tasks import knowledge as K
from tests.conftest import FORGET, RETAIN
from tests.test_eval_knowledge import _knowledge_bench

LAYER, BUDGET = 2, 12


def _entering(model, ids: list[int], layer: int) -> torch.Tensor:
    """The states entering `layer` at every position of one unpadded sequence."""
    got = []
    handle = decoder_layers(model)[layer - 1].register_forward_hook(lambda _m, _a, out: got.append(out))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return got[0][0]


@pytest.mark.parametrize("drafted", [False, True])
def test_the_states_kept_are_those_of_a_plain_pass_over_prompt_and_answer(trained_llama, tokenizer, drafted):
    questions = [ex.question for ex in FORGET + RETAIN]
    facts = [ex.answer.rstrip(".").split()[-1] for ex in FORGET + RETAIN]
    facts[0], facts[1] = "Nowhere", None  # never stated: the budget ends them, their last token fed once more
    prompts = [encode_prompt(tokenizer, q) for q in questions]
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    eos = eos_ids(trained_llama, tokenizer)
    plain = greedy_until(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts)
    drafts = None
    if drafted:  # right, wrong and empty guesses
        wrong = tokenizer(" the the", add_special_tokens=False)["input_ids"]
        drafts = [a if r % 3 == 0 else a[:2] + wrong if r % 3 == 1 else [] for r, a in enumerate(plain)]
    lower = LowerStates(LAYER)
    new, done = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, facts, drafts=drafts, lower=lower)
    assert new == plain and all(done)  # the answers are the same with the states kept
    assert len(lower) == len(prompts)
    for prompt, answer in zip(prompts, new):
        want = _entering(trained_llama, prompt + answer, LAYER)
        got = lower.states_for(prompt + answer)
        assert got is not None, "every answer token was fed, the last one too"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert lower.states_for(prompt + answer + [5]) is None  # a token never fed: no states
        torch.testing.assert_close(lower.states_for(prompt[:3]), want[:3])  # a start: its states


def test_a_pass_started_from_kept_states_scores_what_the_whole_pass_does(trained_llama, tokenizer):
    prompts = [encode_prompt(tokenizer, ex.question) for ex in FORGET]
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    eos = eos_ids(trained_llama, tokenizer)
    lower = LowerStates(LAYER)
    new, _ = greedy_answers(trained_llama, tokenizer, ids, mask, BUDGET, eos, [None] * len(prompts), lower=lower)
    sequences = [(p + a + [tokenizer.eos_token_id], len(p)) for p, a in zip(prompts, new)]
    sequences.append((prompts[0] + [7, 8, 9], len(prompts[0])))  # never decoded: the whole pass
    whole = score_sequences(trained_llama, tokenizer, sequences)
    fast = score_sequences(trained_llama, tokenizer, sequences, lower=lower)
    assert lower.hits == len(prompts)
    for w, f in zip(whole, fast):
        np.testing.assert_allclose(f.logprobs, w.logprobs, rtol=1e-4, atol=1e-5)
        assert (f.labels == w.labels).all()


def test_the_judge_reads_them_for_the_edited_row_alone(trained_llama, tokenizer, monkeypatch):
    bench = _knowledge_bench()
    config = EditConfig(layers=(1, 2), beta=30.0, w_r=30.0)
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain, config)
    seen = []
    real = K._judge_row

    def judge(model, tok, frames, fmt, batch_size, needed, between=None, lower=None):
        seen.append(lower)
        return real(model, tok, frames, fmt, batch_size, needed, between, lower)
    monkeypatch.setattr(K, "_judge_row", judge)
    both = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8)
    assert seen[0] is None and isinstance(seen[-1], LowerStates) and seen[-1].layer == 1 and seen[-1].hits
    alone = evaluate(trained_llama, tokenizer, bench, batch_size=8)  # the unedited row on its own
    for name, df in alone.rows[BASE].examples.items():
        assert both.rows[BASE].examples[name].equals(df), name  # its numbers never depend on the edit beside it
    monkeypatch.setattr(LowerStates, "states_for", lambda self, ids: None)
    plain = evaluate(trained_llama, tokenizer, bench, edit, batch_size=8)
    for name, df in plain.rows[EDITED].examples.items():
        mine = both.rows[EDITED].examples[name]
        assert list(mine.get("answer_class", [])) == list(df.get("answer_class", [])), name
        if "answer_perplexity" in df:
            np.testing.assert_allclose(mine["answer_perplexity"], df["answer_perplexity"], rtol=1e-4)
