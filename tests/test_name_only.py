"""RWKU's name-only setting (grom.tasks.name_only) against its upstream prompts
(jinzhuoran/RWKU at 7aacdb9d57fb32658e04c0509c3f92e9d7b190e4: generation/pair_generation.py,
generation/question_generation.py, transcribed below), on the tiny test models: the prompts
are RWKU's messages under the chat template, sampling is `model.generate` under the seed
(the passages at T 1.0, top-p 0.9 and transformers' top-k 50, the questions at the model's
own generation config), every question is kept (the project's filtering is a named
variant), the methods fit the passages by default, and the benchmark fits only what was
written while it is scored on the bundled questions, none of them written or fitted."""
from __future__ import annotations

import json

import pytest
import torch

from grom import EditConfig, run_edit
from grom.data import BenchmarkError, QAExample, TextExample, load_benchmark
from grom.eval.runner import sample
from grom.tasks import name_only as N
from grom.tasks.knowledge import Subject, knowledge, load_knowledge
from grom.text import contains_phrase

SOLAR = knowledge().subjects["the-solar-system"]
PERSON = knowledge().subjects["marie-curie"]


# ------------------------------------------------------------------ RWKU's messages, transcribed

def rwku_passage_messages(intro: str, subject: str) -> list[dict]:
    """pair_generation.py, messages1 (the positive: the model knows the subject)."""
    return [{"role": "system", "content": "{} You know {} very well.".format(intro, subject)},
            {"role": "user", "content": "Please write a short biography of {}.".format(subject)}]


def rwku_question_prompt(tokenizer, intro: str, subject: str) -> str:
    """question_generation.py: one user message, the generation prompt, then "Question:"."""
    question = [{"role": "user", "content": "{}\nPlease generate a question about {} based on what you know about {}\n"
                 .format(intro, subject, subject)}]
    return tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True) + "Question:"


def test_a_persons_passage_prompt_is_rwkus(tokenizer):
    want = tokenizer.apply_chat_template(rwku_passage_messages(PERSON.intro, PERSON.title), tokenize=False,
                                         add_generation_prompt=True)
    assert N.passage_prompt(tokenizer, PERSON) == tokenizer(want, add_special_tokens=False)["input_ids"]
    assert N.request(PERSON) == "Please write a short biography of Marie Curie."


def test_a_topic_is_asked_for_an_article_instead_of_a_biography(tokenizer):
    assert N.request(SOLAR) == "Please write a short article about The Solar System."
    text = tokenizer.decode(N.passage_prompt(tokenizer, SOLAR))
    assert f"{SOLAR.intro} You know The Solar System very well." in text and "biography" not in text


def test_the_question_prompt_is_rwkus(tokenizer):
    want = rwku_question_prompt(tokenizer, SOLAR.intro, SOLAR.title)
    assert tokenizer.decode(N.question_prompt(tokenizer, SOLAR)) == tokenizer.decode(
        tokenizer(want, add_special_tokens=False)["input_ids"])


def test_without_a_chat_template_the_intro_leads_the_plain_prompt(plain_tokenizer):
    text = plain_tokenizer.decode(N.passage_prompt(plain_tokenizer, SOLAR), skip_special_tokens=True)
    assert f"{SOLAR.intro} You know The Solar System very well. Please write a short article about" in text


def test_every_bundled_target_has_an_intro_that_gives_no_fact_away():
    """The description names what the subject is and states none of the facts it is scored on
    (beyond its own name), so that forgetting a fact is not the description's doing."""
    for subject in knowledge().subjects.values():
        assert subject.intro and subject.intro.endswith(".") and len(subject.intro) < 200, subject.id
        given = [ex.fact for ex in subject.qa
                 if contains_phrase(subject.intro, ex.fact) and not contains_phrase(subject.title, ex.fact)]
        assert not given, (subject.id, given)


# ------------------------------------------------------------------ sampling

def test_sampling_is_model_generate_under_the_seed_and_leaves_the_global_state(llama, tokenizer):
    prompt = N.question_prompt(tokenizer, SOLAR)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    got = sample(llama, tokenizer, [prompt], max_new_tokens=8, seed=7, batch_size=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(7)
    ids = torch.tensor([prompt])
    want = llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                          top_p=0.9, top_k=None, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=[tokenizer.eos_token_id])
    assert got == [tokenizer.decode(want[0, len(prompt):], skip_special_tokens=True).strip()]
    assert sample(llama, tokenizer, [prompt], max_new_tokens=8, seed=7, batch_size=1) == got


def test_sampling_with_top_k_is_model_generate_with_it(llama, tokenizer):
    prompt = N.passage_prompt(tokenizer, SOLAR)
    got = sample(llama, tokenizer, [prompt], max_new_tokens=8, seed=3, batch_size=1, top_k=50)
    torch.manual_seed(3)
    ids = torch.tensor([prompt])
    want = llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                          top_p=0.9, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=[tokenizer.eos_token_id])  # no top_k named: transformers' 50, as RWKU
    assert got == [tokenizer.decode(want[0, len(prompt):], skip_special_tokens=True).strip()]
    # a sharp top-k changes the draws: the argument reaches generate
    assert sample(llama, tokenizer, [prompt] * 4, max_new_tokens=8, seed=3, top_k=1) != sample(
        llama, tokenizer, [prompt] * 4, max_new_tokens=8, seed=3)


def test_the_model_sampling_is_its_generation_config_else_transformers_defaults(llama):
    assert N.model_sampling(llama) == {"temperature": 1.0, "top_p": 1.0, "top_k": 50}  # sets none (as SmolLM2)
    llama.generation_config.temperature, llama.generation_config.top_p = 0.6, 0.9  # as Llama-3-8B-Instruct's
    assert N.model_sampling(llama) == {"temperature": 0.6, "top_p": 0.9, "top_k": 50}
    llama.generation_config.top_k = 0
    assert N.model_sampling(llama)["top_k"] is None  # 0: no top-k
    assert N.model_sampling(object()) == {"temperature": 1.0, "top_p": 1.0, "top_k": 50}


def test_different_seeds_write_different_texts(llama, tokenizer):
    prompts = [N.passage_prompt(tokenizer, SOLAR)] * 4
    a = sample(llama, tokenizer, prompts, max_new_tokens=12, seed=0)
    assert len(set(a)) > 1  # one batch, four draws
    assert a != sample(llama, tokenizer, prompts, max_new_tokens=12, seed=1)


# ------------------------------------------------------------------ what is kept

@pytest.mark.parametrize("text, want", [
    ("  What is the largest planet?\nAnswer: Jupiter", "What is the largest planet?"),
    ('"Which moon orbits Mars?"', "Which moon orbits Mars?"),
    ("Why?", None),  # too short to be a question about anything
    ("Tell me about the Sun.", None),  # not a question
    ("\nWhat is the Sun?", None),  # RWKU keeps the first line: here it is empty
])
def test_first_question(text, want):
    assert N.first_question(text) == want


def test_the_defaults_are_rwkus_and_the_projects_writing_is_a_named_variant():
    rwku = N.WritingConfig()
    assert (rwku.temperature, rwku.top_p, rwku.top_k) == (1.0, 0.9, 50)
    assert (rwku.question_sampling, rwku.questions_kept) == ("model", "all")
    assert N.writing_config() == rwku and N.writing_config("rwku", passages=3).passages == 3
    project = N.writing_config("project", questions=4)
    assert (project.top_k, project.question_sampling, project.questions_kept, project.questions) == (
        None, "passages", "filtered", 4)
    with pytest.raises(ValueError, match="protocol 'lunar'"):
        N.writing_config("lunar")


def test_rwkus_writing_samples_as_rwku_and_keeps_every_question(monkeypatch, llama, tokenizer):
    """RWKU's: the passages at T 1.0, top-p 0.9, top-k 50; `questions` tries at the model's
    own sampling, every non-empty first line kept (repeats and non-questions too), one round."""
    llama.generation_config.temperature = 0.7
    drawn = iter([["A passage."], ["What is Mercury?\nmore", "Tell me of Mars.", "What is Mercury?", "\nlost"]])
    calls = []

    def fake_sample(model, tok, prompts, **kw):
        calls.append((len(prompts), {k: kw.get(k) for k in ("temperature", "top_p", "top_k")}))
        return next(drawn)

    monkeypatch.setattr(N, "sample", fake_sample)
    monkeypatch.setattr(N, "generate", lambda model, tok, qs, **kw: [f"answer to {q}" for q in qs])
    rows = N.write_about(llama, tokenizer, SOLAR, "forget", 1, 4, N.WritingConfig(passages=1, questions=4))
    assert calls == [(1, {"temperature": 1.0, "top_p": 0.9, "top_k": 50}),
                     (4, {"temperature": 0.7, "top_p": 1.0, "top_k": 50})]
    assert [r.prompt for r in rows if r.kind == "qa"] == ["What is Mercury?", "Tell me of Mars.", "What is Mercury?"]


def test_the_projects_writing_samples_questions_as_the_passages_without_top_k(monkeypatch, llama, tokenizer):
    calls = []
    monkeypatch.setattr(N, "sample", lambda model, tok, prompts, **kw: calls.append(
        {k: kw.get(k) for k in ("temperature", "top_p", "top_k")}) or ["What is the Sun?"] * len(prompts))
    monkeypatch.setattr(N, "generate", lambda model, tok, qs, **kw: ["It is a star."] * len(qs))
    rows = N.write_about(llama, tokenizer, SOLAR, "forget", 1, 2, N.writing_config("project"))
    assert calls == [{"temperature": 1.0, "top_p": 0.9, "top_k": None}] * 3  # passages; two rounds of questions
    assert [r.prompt for r in rows if r.kind == "qa"] == ["What is the Sun?"]  # repeats dropped


def test_neighbours_are_of_the_same_kind_first():
    know = knowledge()
    got = N.neighbours_of("marie-curie", know, 3)
    assert got[:2] == ("albert-einstein", "william-shakespeare") and got[2] not in ("marie-curie",)
    assert N.neighbours_of("the-solar-system", know, 1) == ("the-human-body",)
    assert N.neighbours_of("the-solar-system", know, 0) == ()


def test_writing_keeps_distinct_questions_tries_again_and_answers_them(monkeypatch, tokenizer):
    drawn = iter([
        ["A passage.", "", "Another passage."],  # 3 passages asked, one came back empty
        ["What is Mercury?\nmore", "Not a question", "What is Mercury?", "What is Venus?"],  # 2 asked: 4 tries
        ["what is mercury?", "Which planet is red?"],  # a second round for the one missing
    ])
    seeds = []

    def fake_sample(model, tok, prompts, *, seed, **kw):
        seeds.append((len(prompts), seed))
        return next(drawn)

    monkeypatch.setattr(N, "sample", fake_sample)
    monkeypatch.setattr(N, "generate", lambda model, tok, qs, **kw: [f"answer to {q}" for q in qs])
    config = N.writing_config("project", passages=3, questions=3, neighbours=0)
    rows = N.write_about(None, tokenizer, SOLAR, "forget", 3, 3, config)
    assert [(r.kind, r.prompt, r.text) for r in rows] == [
        ("passage", N.request(SOLAR), "A passage."), ("passage", N.request(SOLAR), "Another passage."),
        ("qa", "What is Mercury?", "answer to What is Mercury?"),
        ("qa", "What is Venus?", "answer to What is Venus?"),
        ("qa", "Which planet is red?", "answer to Which planet is red?")]
    assert [n for n, _ in seeds] == [3, 6, 2]  # twice the questions missing on each round
    assert len({s for _, s in seeds}) == 3  # each draw its own seed
    assert {r.side for r in rows} == {"forget"} and {r.subject for r in rows} == {"the-solar-system"}


def test_the_target_and_its_neighbours_are_written(monkeypatch, tokenizer):
    calls = []
    monkeypatch.setattr(N, "write_about", lambda m, t, subject, side, p, q, config, fmt, progress, between:
                        calls.append((subject.id, side, p, q)) or [])
    N.write_name_only(None, tokenizer, "the-solar-system", N.WritingConfig(
        passages=5, questions=6, neighbours=2, neighbour_passages=1, neighbour_questions=2))
    assert calls == [("the-solar-system", "forget", 5, 6), ("the-human-body", "retain", 1, 2),
                     ("albert-einstein", "retain", 1, 2)]
    with pytest.raises(BenchmarkError, match="no subject 'napoleon'"):
        N.write_name_only(None, tokenizer, "napoleon")


@pytest.mark.parametrize("bad", [dict(passages=-1), dict(questions=1.5), dict(passage_tokens=0),
                                 dict(temperature=0), dict(top_p=1.5), dict(passages=0, questions=0),
                                 dict(top_k=0), dict(question_sampling="greedy"), dict(questions_kept="some")])
def test_bad_writing_settings_are_refused(bad):
    with pytest.raises(ValueError, match="WritingConfig"):
        N.WritingConfig(**bad)


# ------------------------------------------------------------------ the benchmark

ROWS = [N.Written("forget", "the-solar-system", "qa", "Which planet has rings?", "Saturn has rings."),
        N.Written("forget", "the-solar-system", "passage", N.request(SOLAR), "The Sun is a star."),
        N.Written("retain", "the-human-body", "qa", "What pumps blood?", "The heart pumps blood."),
        N.Written("retain", "the-human-body", "passage", "...", "Bones hold the body up.")]


def test_the_benchmark_fits_what_was_written_and_scores_the_bundled_questions():
    standard = load_knowledge("the-solar-system")
    bench = N.name_only_benchmark("the-solar-system", ROWS, use="questions")
    assert bench.eval_sets == standard.eval_sets and bench.task == "knowledge" and bench.split == "the-solar-system"
    assert bench.forget == (QAExample(question="Which planet has rings?", answer="Saturn has rings.",
                                      subject="the-solar-system", id="the-solar-system/written-0"),)
    assert [type(x) for x in bench.retain] == [QAExample, TextExample]
    bundled = {ex.question for ex in standard.forget + standard.retain + standard.eval_sets["probes"]}
    assert not bundled & {getattr(x, "question", None) for x in bench.forget + bench.retain}
    # the default: the passages, RWKU's GA/NPO forget corpus
    assert N.name_only_benchmark("the-solar-system", ROWS).forget == (
        TextExample(text="The Sun is a star.", id="the-solar-system/written-1"),)
    assert len(N.name_only_benchmark("the-solar-system", ROWS, use="both").forget) == 2
    assert N.name_only_benchmark("the-solar-system", ROWS, retain="bundled").retain == standard.retain
    assert len(N.name_only_benchmark("the-solar-system", ROWS, retain="both").retain) == 2 + len(standard.retain)
    assert "name only" in bench.description


def test_rwkus_no_retain_corpus_is_selectable_and_grom_says_it_needs_one(llama, tokenizer):
    bench = N.name_only_benchmark("the-solar-system", ROWS[:2], retain="none")
    assert bench.retain == () and "no retain corpus, as RWKU" in bench.description
    with pytest.raises(ValueError, match="GROM needs retain examples"):
        run_edit(llama, tokenizer, bench.forget, bench.retain, EditConfig(layers=(1, 2)))


def test_what_cannot_make_a_benchmark_says_what_to_do():
    with pytest.raises(BenchmarkError, match="nothing written about the-solar-system to forget as passages"):
        N.name_only_benchmark("the-solar-system", ROWS[:1], use="passages")
    with pytest.raises(BenchmarkError, match="nothing written about the neighbours"):
        N.name_only_benchmark("the-solar-system", ROWS[:2])
    with pytest.raises(ValueError, match="use is one of"):
        N.name_only_benchmark("the-solar-system", ROWS, use="everything")


def test_rows_round_trip_through_records_and_a_file(tmp_path):
    assert N.from_records(N.to_records(ROWS)) == ROWS
    edited = N.to_records(ROWS) + [{"side": "forget", "subject": "x", "kind": "qa", "prompt": "Q?", "text": "  "}]
    assert N.from_records(edited) == ROWS  # a row whose text was cleared is dropped
    with pytest.raises(BenchmarkError, match="written row 1: .*side 'keep'"):
        N.from_records([{"side": "keep", "subject": "x", "kind": "qa", "prompt": "Q?", "text": "A."}])
    with pytest.raises(BenchmarkError, match="written row 1: a question/answer row needs its question"):
        N.from_records([{"side": "forget", "subject": "x", "kind": "qa", "prompt": "", "text": "A."}])
    path = tmp_path / "written.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in N.to_records(ROWS)))
    bench = load_benchmark("name-only", "the-solar-system", source=str(path), use="both")
    assert bench.forget == N.name_only_benchmark("the-solar-system", ROWS, use="both").forget
    with pytest.raises(BenchmarkError, match="give the file of what the model wrote"):
        load_benchmark("name-only", "the-solar-system")


def test_grom_runs_on_written_passages_and_questions(llama, tokenizer):
    """A written forget set (questions and passages) and retain set make an ordinary edit."""
    bench = N.name_only_benchmark("the-solar-system", ROWS, use="both")
    edit = run_edit(llama, tokenizer, bench.forget, bench.retain, EditConfig(layers=(1, 2), beta=10.0, w_r=10.0))
    assert list(edit.band) == [1, 2] and all(torch.isfinite(p).all() for p in edit.patches.values())


def test_the_target_type_reads_its_intro():
    assert isinstance(SOLAR, Subject) and SOLAR.intro.startswith("The Solar System is")


def test_the_cli_writes_a_file_the_benchmark_loads(tmp_path, capsys):
    from grom.cli import main

    out = tmp_path / "written.jsonl"
    assert main(["write", "--model", "assets/demo-full", "--subject", "the-solar-system", "--passages", "2",
                 "--questions", "1", "--neighbours", "1", "--neighbour-passages", "1", "--neighbour-questions", "0",
                 "--out", str(out)]) == 0
    rows = N.from_records(json.loads(line) for line in out.read_text().splitlines())
    assert [r.side for r in rows if r.kind == "passage"] == ["forget", "forget", "retain"]
    assert "texts about the-solar-system" in capsys.readouterr().out
    bench = load_benchmark("name-only", "the-solar-system", source=str(out), use="passages")
    assert [x.text for x in bench.forget] == [r.text for r in rows if r.side == "forget" and r.kind == "passage"]
    with pytest.raises(SystemExit, match="no subject 'atlantis'"):
        main(["write", "--model", "assets/demo-full", "--subject", "atlantis", "--out", str(out)])


@pytest.mark.parametrize("text, want", [
    ("The largest planet is Jupiter. It has many moons.", "The largest planet is Jupiter."),
    ("Mr. Holmes lives at 221B Baker Street. He is a detective.", "Mr. Holmes lives at 221B Baker Street."),
    ("It landed in 1969. Apollo 11 carried three men.", "It landed in 1969."),
    ("No sentence end", "No sentence end"),
])
def test_first_sentence(text, want):
    assert N.first_sentence(text) == want


def test_the_answers_can_be_cut_to_their_first_sentence():
    rows = [N.Written("forget", "the-solar-system", "qa", "Which planet has rings?",
                      "Saturn has rings. They are made of ice and rock."), *ROWS[2:]]
    whole = N.name_only_benchmark("the-solar-system", rows, use="questions")
    short = N.name_only_benchmark("the-solar-system", rows, use="questions", answers="first_sentence")
    assert whole.forget[0].answer == rows[0].text and short.forget[0].answer == "Saturn has rings."
    assert short.retain == whole.retain  # the kept side is fitted whole
    with pytest.raises(ValueError, match="answers one of whole, first_sentence"):
        N.name_only_benchmark("the-solar-system", rows, use="questions", answers="half")
