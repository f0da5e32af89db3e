"""The code that runs the model for the metrics, and the reports built on it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grom import EditConfig, run_edit
from grom.data import load_benchmark
from grom.data.prompts import encode_prompt
from grom.data.schema import Benchmark, QAExample
from grom.eval import answer_probabilities, compare_generations, evaluate, quantization_check, rouge_l_recall
from grom.eval.runner import encode_pair, generate, score_answers
from tests.conftest import FORGET, RETAIN, tiny_gpt2, tiny_llama
from tests.data_fixtures import muse_folder, wmdp_folder, write_json, zsre_record


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model, state):
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_batched_scores_equal_one_at_a_time_full_logits(tokenizer, make):
    """Right padding and the gathered LM head give each answer token's log-probability
    exactly as a plain forward pass of the sequence alone does."""
    model = make(len(tokenizer))
    pairs = [(ex.question, ex.answer) for ex in FORGET + RETAIN]
    scores = score_answers(model, tokenizer, pairs, batch_size=3)
    for (q, a), s in zip(pairs, scores):
        ids, start = encode_pair(tokenizer, q, a, None)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        ref = logp[torch.arange(start - 1, len(ids) - 1), torch.tensor(ids[start:])].numpy()
        np.testing.assert_allclose(s.logprobs, ref, atol=2e-5)
        assert s.labels[-1] == tokenizer.eos_token_id  # TOFU scores the EOS too
        assert s.avg_loss == pytest.approx(-ref.mean(), abs=2e-5)


def test_batched_greedy_generation_equals_unbatched(tokenizer, trained_llama):
    questions = [ex.question for ex in FORGET + RETAIN]
    batched = generate(trained_llama, tokenizer, questions, max_new_tokens=12, batch_size=4)
    for q, got in zip(questions, batched):
        ids = torch.tensor([encode_prompt(tokenizer, q)])
        out = trained_llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     do_sample=False, max_new_tokens=12,
                                     pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id)
        assert got == tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def _tofu_like() -> Benchmark:
    def qa(ex, fact):
        wrong = [ex.answer.replace(fact, w) for w in ("Xylo", "Brem", "Quor")]
        return QAExample(ex.question, ex.answer, paraphrased_answer=ex.answer,
                         perturbed_answers=tuple(wrong), fact=fact)

    forget = tuple(qa(ex, ex.answer.rstrip(".").split()[-1]) for ex in FORGET)
    retain = tuple(qa(ex, ex.answer.rstrip(".").split()[-1]) for ex in RETAIN)
    holdout = (QAExample("Where was Pim Oat born?", "Pim Oat was born in Vask."),
               QAExample("What did Pim Oat write?", "He wrote Salt Hours."))
    return Benchmark("tiny", "forget", forget, retain,
                     eval_sets={"forget": forget, "retain": retain[:4], "real_authors": retain[4:],
                                "world_facts": retain[4:], "holdout": holdout})


def test_evaluate_rows_metrics_and_model_left_as_found(tokenizer, trained_llama):
    bench = _tofu_like()
    state = _state(trained_llama)
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    report = evaluate(trained_llama, tokenizer, bench, edit=edit, reference=tiny_llama(len(tokenizer), seed=3))
    assert _same(trained_llama, state) and not edit.is_applied
    table = report.table()
    assert list(table.index) == ["Base", "Edited", "Retain model"]
    base, edited = table.loc["Base"], table.loc["Edited"]
    for col in ("Forget ROUGE-L", "Forget fact recall", "Forget prob", "Forget truth ratio",
                "Forget ES", "Retain ROUGE-L", "Model utility", "Final score", "MIA AUC",
                "Forget quality", "Privacy leakage"):
        assert np.isfinite(base[col]), col
    assert base["Forget ROUGE-L"] > 0.9 and base["Forget fact recall"] == 1.0  # memorised
    assert edited["Forget prob"] < base["Forget prob"]
    # the numbers are what the per-example values say
    ex = report.examples("Base", "forget")
    assert set(ex.columns) >= {"question", "answer", "generation", "rougeL_recall", "prob", "fact_recall"}
    assert base["Forget ROUGE-L"] == pytest.approx(np.mean([rouge_l_recall(a, g) for a, g in
                                                            zip(ex.answer, ex.generation)]))
    probs = answer_probabilities(trained_llama, tokenizer, bench.forget)
    assert base["Forget prob"] == pytest.approx(probs.mean(), rel=1e-6)
    # model utility is the harmonic mean of the nine retain-side values
    nine = [base[f"{s} {m}"] for s in ("Retain", "Real authors", "World facts")
            for m in ("prob", "ROUGE-L", "truth ratio")]
    assert base["Model utility"] == pytest.approx(len(nine) / sum(1 / v for v in nine))
    with pytest.raises(KeyError, match="rows"):
        report.examples("Nope", "forget")


def test_compare_generations_before_and_after(tokenizer, trained_llama):
    state = _state(trained_llama)
    edit = run_edit(trained_llama, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    rows = compare_generations(trained_llama, tokenizer, [ex.question for ex in FORGET], edit,
                               answers=[ex.answer for ex in FORGET], max_new_tokens=40)
    assert _same(trained_llama, state)
    # memorised (the fixture model never learned to stop, so only the start counts)
    assert all(r["before"].startswith(ex.answer) for r, ex in zip(rows, FORGET))
    assert all(r["prob_after"] < r["prob_before"] for r in rows)
    assert any(r["after"] != r["before"] for r in rows)
    free = compare_generations(trained_llama, tokenizer, ["Who painted Blue Tide?"], edit)
    assert free[0]["prob_before"] is None and free[0]["before"]


@pytest.fixture(scope="module")
def demo():
    from grom.demo import load_demo_model

    model, tok = load_demo_model("full")
    ref, _ = load_demo_model("retain")
    return model, tok, ref


def test_demo_full_and_retain_rows_differ_like_tofu_original_and_retain(demo):
    model, tok, ref = demo
    bench = load_benchmark("demo", "forget10")
    t = evaluate(model, tok, bench, reference=ref, max_examples=40).table()
    full, retain = t.loc["Base"], t.loc["Retain model"]
    assert full["Forget ROUGE-L"] > 0.9 and retain["Forget ROUGE-L"] < 0.5
    assert full["Forget fact recall"] > 0.9 and retain["Forget fact recall"] < 0.2
    assert full["Forget prob"] > 0.8 and retain["Forget prob"] < full["Forget prob"] / 2
    assert retain["Forget quality"] == pytest.approx(1.0)  # the same model as the reference
    assert full["Forget quality"] < 0.1  # 0.054 on these 40 (on all 400: 6e-14)
    assert abs(retain["Model utility"] - full["Model utility"]) < 0.1  # both know the rest
    assert full["MIA AUC"] > 0.9 and 0.2 < retain["MIA AUC"] < 0.8


def test_quantization_check_on_the_demo_model(demo):
    model, tok, _ = demo
    state = _state(model)
    bench = load_benchmark("demo", "forget10")
    edit = run_edit(model, tok, bench.forget[:40], bench.retain[:80],
                    EditConfig(layers=(3, 4), beta=100.0, beta_relative=True, w_r=100.0))
    df = quantization_check(model, tok, bench, edit, max_examples=16)
    assert list(df.index) == ["Base, full precision", "Base, 4-bit (rtn)",
                              "Edited, full precision", "Edited, 4-bit (rtn)"]
    assert "Forget ROUGE-L" in df.columns and "Retain ROUGE-L" not in df.columns
    reason = df.attrs.pop("quantizer_reason")  # on this CPU: why not NF4
    assert df.attrs == {"method": "rtn", "group_size": 128, "task": "tofu"}  # the verdict picks metrics by task
    assert torch.cuda.is_available() or reason == "auto: NF4 (bitsandbytes) cannot run: no CUDA GPU"
    assert _same(model, state)
    # 4 bits keep a tiny model's knowledge roughly where it was
    assert abs(df.loc["Base, 4-bit (rtn)", "Forget prob"] - df.loc["Base, full precision", "Forget prob"]) < 0.3


def test_multiple_choice_task(demo):
    model, tok, _ = demo
    bench = load_benchmark("demo", "forget10-mc")
    t = evaluate(model, tok, bench, max_examples=20).table()
    row = t.loc["Base"]
    assert 0 <= row["Forget accuracy"] <= 1 and 0 <= row["Retain accuracy"] <= 1
    assert row["Final score"] == pytest.approx(((1 - row["Forget accuracy"]) + row["Retain accuracy"]) / 2)


def test_wmdp_muse_and_zsre_tasks_run_on_local_files(tmp_path, tokenizer, plain_tokenizer):
    model = tiny_llama(len(tokenizer))
    wmdp = load_benchmark("wmdp-bio", "test", source=wmdp_folder(tmp_path / "w"))
    t = evaluate(model, plain_tokenizer, wmdp).table()
    assert {"Forget accuracy", "Utility accuracy", "Final score"} <= set(t.columns)
    muse = load_benchmark("muse-news", "forget", source=muse_folder(tmp_path / "m"))
    t = evaluate(model, plain_tokenizer, muse, max_new_tokens=4).table()
    assert {"VerbMem forget", "KnowMem forget", "KnowMem retain", "MIA AUC", "Privacy leakage",
            "Final score"} <= set(t.columns)
    path = write_json(tmp_path / "zsre_mend_eval.json", [zsre_record(k) for k in range(1050)])
    zsre = load_benchmark("zsre", source=path)
    t = evaluate(model, plain_tokenizer, zsre).table()
    assert {"Efficacy", "Generalisation", "Specificity"} <= set(t.columns)
    assert ((t >= 0) & (t <= 1)).all().all()


def test_reuse_takes_unedited_rows_from_an_earlier_report(tokenizer, trained_llama):
    bench = _tofu_like()
    ref = tiny_llama(len(tokenizer), seed=3)
    first = evaluate(trained_llama, tokenizer, bench, reference=ref)
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    again = evaluate(trained_llama, tokenizer, bench, edit=edit, reference=ref, reuse=first)
    assert again.rows["Base"] is first.rows["Base"]
    assert again.rows["Retain model"] is first.rows["Retain model"]
    fresh = evaluate(trained_llama, tokenizer, bench, edit=edit, reference=ref)
    assert again.table().equals(fresh.table())
    # another subset size is not compatible: computed again
    other = evaluate(trained_llama, tokenizer, bench, reference=ref, max_examples=2, reuse=first)
    assert other.rows["Base"] is not first.rows["Base"]


@pytest.mark.parametrize("chat", [True, False])
def test_choice_keys_and_accuracy_use_the_same_answer_letter(chat, tokenizer, plain_tokenizer):
    """GROM's keys (and the baselines, which share the encoding) push on the very token
    the accuracy metric reads: "C" after a chat template, " C" after a plain prompt."""
    from grom.data.encoding import encode_example
    from grom.data.schema import ChoiceExample
    from grom.eval.runner import choice_logprobs

    tok = tokenizer if chat else plain_tokenizer
    ex = ChoiceExample("Which prize did Mira Sel win?", ("Tessaly Medal", "Oak Prize", "Harrow Cup"), 2)
    (enc,) = encode_example(tok, ex, 0)
    letter = tok("C" if chat else " C", add_special_tokens=False)["input_ids"][-1]
    assert enc.gold[-1] == letter
    model = tiny_llama(len(tok))
    lp = choice_logprobs(model, tok, [ex])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([enc.input_ids])).logits[0].double(), -1)
    keyed = sum(float(logp[p, g]) for p, g in zip(enc.positions, enc.gold))  # every letter token
    assert lp[0, 2] == pytest.approx(keyed, abs=1e-5)
