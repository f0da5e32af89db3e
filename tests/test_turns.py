"""Issue 45, item 3: every long model job gives a turn at its step boundaries (`grom.turns`):
`between(as_found)` is called at least once per step unit (a passage batch and decoding
step written, a LUNAR epoch, an editor's value step and layer, a generation or
teacher-forced batch inside an evaluation row, a relearning step), the model inside
`as_found()` is exactly as the job found it (weights bit for bit, modes, grad flags, no
hook left recording), and the job's result is the same whether another job used the model
in between or not."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from grom.data.schema import QAExample
from grom.turns import Held, inside
from tests.conftest import FORGET, RETAIN, assert_bit_exact, snapshot, tiny_llama


class Lender:
    """A `between` that lends the model to another job at every step boundary: inside
    `as_found()` the model must be as found (checked against its state when the job
    started), and the other job draws random numbers and runs forward passes on it."""

    def __init__(self, model, every: int = 1):
        self.model, self.every, self.calls = model, every, 0
        self.found = snapshot(model)
        self.modes = [m.training for m in model.modules()]
        self.flags = [p.requires_grad for p in model.parameters()]

    def __call__(self, as_found) -> None:
        self.calls += 1
        with as_found():
            assert_bit_exact(self.model, self.found)
            assert [m.training for m in self.model.modules()] == self.modes
            assert [p.requires_grad for p in self.model.parameters()] == self.flags
            if self.calls % self.every == 0:
                torch.rand(257)  # another job's random numbers (sampling, dropout)
                with torch.no_grad():
                    self.model(input_ids=torch.tensor([[5, 6, 7, 8, 9]]), use_cache=False)


def quiet(as_found) -> None:
    """A `between` that lends nothing."""


FACTS = [QAExample(e.question, e.answer, subject=s, fact=f) for e, s, f in zip(
    FORGET, ["Zorvath Quill", "Zorvath Quill", "Ilsa Varn", "Ilsa Varn"],
    ["Pellmoor", "The Glass Orchard", "Tessaly Medal", "1874"])]


# ---------------------------------------------------------------- the convention


def test_held_is_left_for_a_turn_and_taken_again_in_the_same_order():
    log = []

    def ctx(name):
        @contextmanager
        def cm():
            log.append(f"+{name}")
            yield name
            log.append(f"-{name}")
        return cm

    with Held(ctx("edit"), None, ctx("hooks")) as held:
        assert held.entered == ["edit", "hooks"] and log == ["+edit", "+hooks"]
        with held.left():
            assert log[2:] == ["-hooks", "-edit"]
        assert log[4:] == ["+edit", "+hooks"]
    assert log[6:] == ["-hooks", "-edit"]
    with held.left():  # not held: nothing to leave
        pass
    assert len(log) == 8 and inside(None, held.left) is None


def test_a_step_inside_a_part_undoes_its_own_state_then_the_parts_and_back_in_reverse():
    log = []

    def ctx(name):
        @contextmanager
        def cm():
            log.append(f"leave {name}")
            yield
            log.append(f"back {name}")
        return cm

    seen = []

    def between(as_found):
        with as_found():
            seen.append("lent")

    inside(between, ctx("row"))(ctx("step"))
    assert log[:2] == ["leave step", "leave row"] and log[2:] == ["back row", "back step"] and seen == ["lent"]


# ---------------------------------------------------------------- the jobs


def test_the_name_only_writer_gives_turns_per_batch_and_token_and_writes_the_same(llama, tokenizer):
    from grom.tasks.name_only import WritingConfig, write_name_only

    config = WritingConfig(passages=3, questions=2, neighbours=1, neighbour_passages=1, neighbour_questions=1,
                           passage_tokens=6, question_tokens=6, answer_tokens=4, batch_size=2)
    plain = write_name_only(llama, tokenizer, "the-solar-system", config)
    lender = Lender(llama)
    lent = write_name_only(llama, tokenizer, "the-solar-system", config, between=lender)
    assert lent == plain and len(plain) >= 4
    assert lender.calls >= 3 * config.passage_tokens  # every decoding step of the passages, and more
    assert write_name_only(llama, tokenizer, "the-solar-system", config, between=quiet) == plain


def test_lunar_gives_turns_per_activation_batch_and_epoch_with_the_same_patch(tokenizer):
    from grom.methods.lunar import LunarConfig, fit_adamw, run_lunar, training_rows

    model = tiny_llama(len(tokenizer))
    config = LunarConfig(layer=1, epochs=4, batch_size=8, forward_batch=2)
    plain = run_lunar(model, tokenizer, FORGET, RETAIN, config)
    lender = Lender(model)
    lent = run_lunar(model, tokenizer, FORGET, RETAIN, config, between=lender)
    (name, patch), = plain.patches.items()
    assert torch.equal(lent.patches[name], patch) and lent.info["epoch_losses"] == plain.info["epoch_losses"]
    batches = -(-len(FORGET) // 2) + -(-len(RETAIN) // 2)  # the refusal prompts' batches come on top
    assert lender.calls >= batches + config.epochs - 1

    X, Y = torch.randn(40, 6), torch.randn(40, 5)
    rows = training_rows(X[:10], Y[:10], X[10:], Y[10:], torch.randn(5), 2.0)
    W0, turns = torch.randn(5, 6), []
    W, losses = fit_adamw(W0, rows, epochs=5, batch_size=8, between=turns.append)
    assert len(turns) == 4  # after every epoch but the last
    assert torch.equal(fit_adamw(W0, rows, epochs=5, batch_size=8)[0], W)


@pytest.mark.parametrize("name", ["memit", "rome"])
def test_an_editor_gives_turns_per_value_step_and_layer_with_the_same_patch(name, trained_llama, tokenizer,
                                                                          monkeypatch):
    """Between value steps and the chunks of facts inside one (VALUE_CHUNK, 2 here), after
    them, between the key batches of the band's streams and between its layers (the layers
    edited so far reverted for the turn)."""
    from grom.methods.editors import value_optimisation
    from grom.methods.editors.locate_then_edit import EditorConfig, run_editor
    from grom.methods.editors.value_optimisation import ValueSettings

    monkeypatch.setattr(value_optimisation, "VALUE_CHUNK", 2)
    steps = 5
    config = EditorConfig(layers=(1, 2), w_r=1.0, batch_size=2,
                          values=ValueSettings(steps=steps, lr=0.5, clamp_norm_factor=2.0, stop_loss=0.0))
    plain = run_editor(name, trained_llama, tokenizer, FACTS, RETAIN, config)
    lender = Lender(trained_llama)
    lent = run_editor(name, trained_llama, tokenizer, FACTS, RETAIN, config, between=lender)
    assert plain.patches.keys() == lent.patches.keys()
    assert all(torch.equal(plain.patches[n], lent.patches[n]) for n in plain.patches)
    assert lent.info["p_answer_edited"] == plain.info["p_answer_edited"]
    chunks = len(FACTS) // 2
    assert lender.calls >= (chunks - 1) + steps * chunks + 2  # capture, steps and chunks, after, streams


def test_the_value_steps_in_chunks_are_the_steps_of_one_batch(trained_llama, tokenizer, monkeypatch):
    from grom.data.encoding import pad_id
    from grom.methods.editors import value_optimisation
    from grom.methods.editors.value_optimisation import ValueSettings, encode_fact, optimise_values

    facts = [encode_fact(tokenizer, ex, None, 512) for ex in FACTS]
    settings = ValueSettings(steps=4, lr=0.5, clamp_norm_factor=2.0)
    whole = optimise_values(trained_llama, facts, 2, pad_id(tokenizer), settings)
    monkeypatch.setattr(value_optimisation, "VALUE_CHUNK", 3)
    chunked = optimise_values(trained_llama, facts, 2, pad_id(tokenizer), settings)
    # the same keys up to float rounding: a forward of 3 rows and one of 4 need not round alike (bit-equal on
    # the Intel Xeon; 2026-11-29 on an AMD EPYC they differed in the last bits)
    assert chunked.steps == whole.steps
    torch.testing.assert_close(chunked.h, whole.h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked.delta, whole.delta, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(chunked.p_before, whole.p_before)


def test_an_evaluation_gives_turns_inside_its_rows_the_edit_reverted_and_the_cache_untouched():
    """Inside a row: between generation batches, decoding steps and teacher-forced batches,
    the Edited row's edit reverted and the prefix cache's hooks off (the other job's
    forward passes record nothing), the same report and the same cache."""
    from grom import EditConfig, run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model
    from grom.eval import evaluate
    from grom.eval.prefix import PrefixCache

    model, tok = load_demo_model("full")
    bench = load_benchmark("demo", "forget10")
    edit = run_edit(model, tok, bench.forget, bench.retain[:100], EditConfig(layers=(3, 4)))
    runs = {}
    for name, between in (("plain", None), ("lent", Lender(model, every=3))):
        cache = PrefixCache()
        runs[name] = (evaluate(model, tok, bench, edit=edit, max_examples=6, batch_size=4, prefix=cache,
                               record_at=(3,), between=between), cache, between)
    (plain, plain_cache, _), (lent, lent_cache, lender) = runs["plain"], runs["lent"]
    assert lent.table().equals(plain.table())
    assert all(lent.rows[k].examples[s].equals(plain.rows[k].examples[s]) for k in plain.rows
               for s in plain.rows[k].examples)
    assert (len(lent_cache), lent_cache.hits, lent_cache.misses) == (len(plain_cache), plain_cache.hits,
                                                                     plain_cache.misses)
    assert plain_cache.hits > 0 and not edit.is_applied
    assert lender.calls > 2 * 6  # far more than the one turn between the two rows


def test_an_evaluation_row_gives_a_turn_per_teacher_forced_batch(tokenizer, trained_llama):
    from grom.eval.runner import score_answers

    pairs = [(ex.question, ex.answer) for ex in FORGET + RETAIN]
    turns = []
    lent = score_answers(trained_llama, tokenizer, pairs, batch_size=2, between=turns.append)
    plain = score_answers(trained_llama, tokenizer, pairs, batch_size=2)
    assert len(turns) == -(-len(pairs) // 2) - 1
    assert all((a.logprobs == b.logprobs).all() for a, b in zip(lent, plain))


def test_the_attack_suite_gives_turns_inside_each_attack_with_the_same_results(trained_llama, tokenizer):
    """Probe batches and decoding steps, relearning steps (base and edited), the quantized
    and the edited scorings, the lens's and the membership attack's batches: each turn on
    the model as found (no patch, no trained or quantized weight), the same results."""
    from grom.closed_form.config import EditConfig
    from grom.closed_form.pipeline import run_edit
    from grom.robustness.result import Probe
    from grom.robustness.suite import run_attacks

    probes = tuple(Probe(ex.question, ex.answer, fact, id=f"f/{i}") for i, (ex, fact) in
                   enumerate(zip(FORGET, ["Pellmoor", "Glass Orchard", "Tessaly Medal", "1874"])))
    edit = run_edit(trained_llama, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0, w_r=10.0))
    attacks = "heldout,relearn,quant4,logit_lens,mia"
    kw = dict(fitted=FORGET, holdout=RETAIN, attacks=attacks)
    plain = run_attacks(trained_llama, tokenizer, edit, probes, **kw)
    lender = Lender(trained_llama)
    lent = run_attacks(trained_llama, tokenizer, edit, probes, between=lender, **kw)
    for name in plain:
        a, b = plain[name], lent[name]
        assert (a.base, a.edited, a.base_answers, a.edited_answers) == (b.base, b.edited, b.base_answers,
                                                                        b.edited_answers), name
        assert {k: v for k, v in a.details.items()} == b.details, name
    relearn_steps = 2 * (10 - 1)  # between the optimizer steps of the base's and the edit's relearning
    assert lender.calls > relearn_steps + len(plain)
    assert not edit.is_applied


def test_quantized_weights_kept_for_a_turn_are_copied_back_not_computed_again(tokenizer, monkeypatch):
    """A quantized row or attack left for a turn enters `quantized` again on the same
    weights: with `keep` it copies the values it had instead of rounding every matrix
    again (15-40 s for SmolLM2 on a busy CPU)."""
    from grom.eval import quant

    model = tiny_llama(len(tokenizer))
    found, keep = snapshot(model), {}
    with quant.quantized(model, "rtn", group_size=16, keep=keep):
        first = snapshot(model)
    assert_bit_exact(model, found)
    assert keep
    monkeypatch.setattr(quant, "rtn_quantize", lambda *a, **k: pytest.fail("quantized again"))
    with quant.quantized(model, "rtn", group_size=16, keep=keep) as info:
        assert_bit_exact(model, first)
        assert info.n_matrices == len(keep)
    assert_bit_exact(model, found)


# ---------------------------------------------------------------- GROM's own edit


class TieChecked(Lender):
    """A `Lender` that also finds the LM head tied to the embeddings, as the model had it."""

    def __call__(self, as_found) -> None:
        from grom.model.arch import lm_head_is_tied

        @contextmanager
        def checked():
            with as_found():
                assert lm_head_is_tied(self.model)
                yield
        super().__call__(checked)


def _same_edit(a, b) -> None:
    assert a.patches.keys() == b.patches.keys() and a.patches
    assert all(torch.equal(a.patches[n], b.patches[n]) for n in a.patches)
    assert [(r.param_name, r.beta, r.mu, r.patch_norm, r.n_forget_keys, r.n_retain_keys) for r in a.layers] == \
        [(r.param_name, r.beta, r.mu, r.patch_norm, r.n_forget_keys, r.n_retain_keys) for r in b.layers]
    assert a.scores == b.scores


@pytest.mark.parametrize("case", ["stream", "rerun", "replayed", "gaps", "replay", "lm_head"])
def test_grom_gives_turns_per_key_batch_and_layer_the_patches_reverted_with_the_same_edit(case, tokenizer,
                                                                                         monkeypatch):
    """On a band of several layers: between the batches of the stream's first pass, of
    each layer's keys (and of the passes re-running a patched layer: `rerun`; of the
    batches replayed from the embeddings: `replayed`; across a band with a gap: `gaps`),
    between layers; the same by full forward passes (`replay`, the model found in train
    mode) and on a tied LM head (untied by the edit, tied inside the turns)."""
    from grom.closed_form import pipeline
    from grom.closed_form.config import EditConfig
    from grom.closed_form.pipeline import run_edit

    model = tiny_llama(len(tokenizer), tie=case == "lm_head")
    config, kw = EditConfig(layers=(1, 2, 3), beta=5.0, w_r=10.0, batch_size=2), {}
    if case == "rerun":  # no shortcut: each patched layer is run again over the stream
        monkeypatch.setattr(pipeline, "MAX_INPUT_CACHE_BYTES", -1)
    elif case == "replayed":
        kw["hidden_budget"] = 0
    elif case == "gaps":
        config = config.replace(layers=(0, 2, 3))
    elif case == "replay":
        config = config.replace(stream=False)
        model.train()
    elif case == "lm_head":
        config = config.replace(matrix="lm_head", layers=None)
    plain = run_edit(model, tokenizer, FORGET, RETAIN, config, **kw)
    lender = (TieChecked if case == "lm_head" else Lender)(model)
    lent = run_edit(model, tokenizer, FORGET, RETAIN, config, between=lender, **kw)
    _same_edit(plain, lent)
    assert_bit_exact(model, lender.found)
    assert [m.training for m in model.modules()] == lender.modes
    batches = -(-len(FORGET) // 2) + -(-len(RETAIN) // 2)
    layers = len(plain.patches)
    assert lender.calls >= layers * (batches - 1) + (layers - 1)  # each layer's keys, and between layers
    quiet_edit = run_edit(model, tokenizer, FORGET, RETAIN, config, between=quiet, **kw)
    _same_edit(plain, quiet_edit)


def test_grom_on_the_demo_gives_turns_in_its_layer_scores_and_stream_with_the_same_edit():
    """The automatic band: the layer scores' batches, the stream's first pass (also ahead
    of the edit, `warm_stream`), each layer's keys; the same scores, band and patches."""
    from grom import EditConfig, run_edit
    from grom.closed_form.pipeline import warm_stream
    from grom.data import load_benchmark
    from grom.demo import load_demo_model

    model, tok = load_demo_model("full")
    bench = load_benchmark("demo", "forget10")
    forget, retain = bench.forget[:24], bench.retain[:48]
    config = EditConfig(k=3, batch_size=8)
    plain = run_edit(model, tok, forget, retain, config)
    lender = Lender(model, every=2)
    lent = run_edit(model, tok, forget, retain, config, between=lender)
    _same_edit(plain, lent)
    batches = 24 // 8 + 48 // 8
    assert lender.calls >= 2 * (batches - 2) + 3 * (batches - 1) + 2  # scores, each layer's keys, layers
    assert_bit_exact(model, lender.found)

    cache, warmed = {}, Lender(model)
    warm_stream(model, tok, forget, retain, config, plain.band, cache, between=warmed)
    assert warmed.calls == batches - 1 and cache
    _same_edit(plain, run_edit(model, tok, forget, retain, config, scores=plain.scores, stream_cache=cache,
                               between=Lender(model)))


def test_a_pages_warm_up_stops_once_its_page_chose_another_benchmark(monkeypatch):
    """A page's warm-up (the stream and the unedited rows of its default split) stops at its
    next step boundary once the page loads another benchmark: the page's own Run edit on
    the new split, which waits for its session's earlier job, does not wait minutes for
    rows nobody will read."""
    from types import SimpleNamespace

    import components.page as page
    from components.server.device import UNWANTED, Superseded, give_turn
    from components.server.session import Session

    session = Session()
    session.model_key = SimpleNamespace(name=page.REAL)
    session.benchmark = first = object()
    steps, rows = [], []

    def warm_edit(k, retain_examples, seed, s):
        for step in range(5):
            if step == 2:
                s.benchmark = object()  # the page loads another benchmark meanwhile
            try:
                give_turn()
            except Superseded:
                return None
            steps.append(step)
        return [1, 2]

    monkeypatch.setattr(page, "warm_edit", warm_edit)
    monkeypatch.setattr(page, "warm_base_rows", lambda *a: rows.append(a))
    page.on_warm_comparison(10, 3, 64, 0, session)
    assert steps == [0, 1] and rows == []
    assert UNWANTED.get() is None  # the check does not outlive the warm-up
    session.benchmark = first
    give_turn()  # outside a warm-up nothing stops
