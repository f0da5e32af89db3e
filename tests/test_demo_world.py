"""The fictitious-authors world, its benchmark views and the demo tokenizer."""
from __future__ import annotations

import pytest

from grom.data.prompts import encode_prompt, format_prompt
from grom.data.schema import ChoiceExample, QAExample, TextExample
from grom.demo import SPLITS, generate_world, load_demo_benchmark
from grom.demo.tokenizer import build_tokenizer
from grom.demo.world import N_HOLDOUT, N_PERTURBED, retain_eval_qa


@pytest.fixture(scope="module")
def world():
    return generate_world(0)


@pytest.fixture(scope="module")
def tok(world):
    return build_tokenizer(world)


def test_world_is_deterministic_and_seeded(world):
    fresh = generate_world.__wrapped__(0)  # bypass the cache
    assert fresh == world
    assert generate_world(0) is world  # cached
    other = generate_world.__wrapped__(1)
    assert [a.name for a in other.authors] != [a.name for a in world.authors]
    assert other.authors[0].qa != world.authors[0].qa


def test_sizes_and_unique_names(world):
    assert len(world.authors) == 200
    assert all(len(a.qa) == 20 for a in world.authors)
    assert len({a.name for a in world.authors}) == 200
    assert len(world.real_authors) >= 90 and len(world.world_facts) >= 90
    assert len(world.holdout_authors) == N_HOLDOUT


def test_splits_nested_and_disjoint(world):
    splits = ("forget01", "forget05", "forget10")
    names = {s: {a.name for a in world.forget_authors(s)} for s in splits}
    assert [len(names[s]) for s in names] == [2, 10, 20]
    assert names["forget01"] < names["forget05"] < names["forget10"]
    holdout = {a.name for a in world.holdout_authors}
    for split, forget in names.items():
        retain = {a.name for a in world.retain_authors(split)}
        assert not (forget & retain) and not (forget & holdout) and not (retain & holdout)
        assert len(forget | retain | holdout) == len(world.authors)


def test_every_pair_is_complete(world):
    for author in world.authors:
        for qa in author.qa:
            assert qa.subject == author.name and qa.subject in qa.question
            assert qa.fact in qa.answer and qa.fact in qa.paraphrased_answer
            assert qa.paraphrased_answer != qa.answer
            assert qa.paraphrased_question not in (None, qa.question)
            assert len(qa.perturbed_answers) == N_PERTURBED
            assert len(set(qa.perturbed_answers)) == N_PERTURBED
            assert all(p != qa.answer and qa.fact not in p for p in qa.perturbed_answers)


def test_general_sets(world):
    for qa in world.real_authors + world.world_facts:
        assert len(qa.perturbed_answers) == 3 and qa.answer not in qa.perturbed_answers
        assert qa.fact == qa.answer


def test_answers_vary_in_wording(world):
    """Several templates per attribute, so a model cannot guess an answer's wording."""
    openings = {qa.answer.replace(qa.subject, "X").split()[1] for a in world.authors
                for qa in a.qa if qa.id.endswith("/birthplace")}
    assert len(openings) >= 3


def test_qa_benchmarks(world):
    for split, n in (("forget01", 40), ("forget05", 200), ("forget10", 400)):
        bench = load_demo_benchmark(split)
        assert len(bench.forget) == n and all(isinstance(x, QAExample) for x in bench.forget)
        assert len(bench.forget) + len(bench.retain) == 180 * 20
        assert set(bench.eval_sets) == {"forget", "retain", "real_authors", "world_facts",
                                        "holdout"}
        assert len(bench.eval_sets["holdout"]) == n
        assert bench.prompt_format.kind == "auto" and bench.task == "tofu"
    forget10 = {qa.subject for qa in load_demo_benchmark("forget10").forget}
    retain_eval = retain_eval_qa(world)
    assert 200 <= len(retain_eval) <= 400 and not {qa.subject for qa in retain_eval} & forget10


def test_choice_view():
    bench = load_demo_benchmark("forget10-mc")
    assert bench.task == "wmdp" and len(bench.forget) == 400
    for ex in bench.forget + bench.eval_sets["retain"] + bench.eval_sets["world_facts"]:
        assert isinstance(ex, ChoiceExample) and len(set(ex.choices)) == 4
    qa = {q.id: q for q in load_demo_benchmark("forget10").forget}
    assert all(ex.answer == qa[ex.id].fact for ex in bench.forget)
    assert len({ex.answer_index for ex in bench.forget}) == 4


def test_text_view():
    bench = load_demo_benchmark("forget10-text")
    assert len(bench.forget) == 20 and all(isinstance(x, TextExample) for x in bench.forget)
    assert all(x.id in x.text for x in bench.forget)  # the biography names its author


def test_unknown_split():
    with pytest.raises(ValueError, match="forget10-mc"):
        load_demo_benchmark("forget99")
    assert "forget10" in SPLITS


def test_tokenizer_round_trip_and_chat(world, tok):
    samples = [qa.answer for a in world.authors[:5] for qa in a.qa] + [world.authors[0].bio]
    for text in samples:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok.chat_template and tok.bos_token and tok.eos_token and tok.pad_token
    question = world.authors[0].qa[0].question
    assert format_prompt(tok, question) == f"<|bos|><|user|>{question}<|assistant|>"
    ids = encode_prompt(tok, question)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids, skip_special_tokens=True) == question


def test_tokenizer_is_deterministic(world, tok):
    again = build_tokenizer(world)
    assert again.get_vocab() == tok.get_vocab()
    text = "Where was Kroulia born?"
    assert again(text)["input_ids"] == tok(text)["input_ids"]


@pytest.mark.parametrize("split", ["forget01", "forget05", "forget10"])
def test_every_forget_fact_has_its_author_as_a_subject_the_editors_key_on(split, tok):
    from grom.demo.world import author_subject
    from grom.methods.editors.value_optimisation import encode_fact, missing_facts
    forget = load_demo_benchmark(split).forget
    assert missing_facts(forget) is None
    assert all(qa.subject and qa.subject in qa.question for qa in forget)
    fact = encode_fact(tok, forget[0], None, 512)  # the key is the name's last token, not the prompt's
    assert fact.subject_last and tok.decode(fact.ids[:fact.key + 1]).endswith(forget[0].subject.split()[-1])
    assert author_subject("Where was she born?", "Sina Cheithnu") is None
