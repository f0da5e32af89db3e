"""No progress bar past 100% (issue 49): every progress callback of a long job, driven for
real, reports fractions in [0, 1] that never go backwards, and every "a of b" (or "a/b")
it writes has a <= b. Seen before: "43 of 30 answers - 121.7%" on the card, "158 of 79"
on the comparison, "158 of 109" after NPO's training: each decoding loop of a row handed
its own size to the count as if it were the answers already done."""
from __future__ import annotations

import re

import pytest

from grom.data.schema import Benchmark, QAExample, TextExample
from grom.eval import report as R
from grom.eval.report import evaluate
from grom.methods.trained.checkpoint import Part, Paused
from grom.methods.trained.trained_edit import run_baseline
from tests.conftest import FORGET, RETAIN

COUNT = re.compile(r"(\d+) (?:of|/) ?(\d+)\b|(\d+)/(\d+)")


class Bar:
    """A progress callback that checks each report as it comes: the fraction in [0, 1] and
    not below the last one, each count in the message at most its total."""

    def __init__(self):
        self.calls: list[tuple[float, str]] = []

    def __call__(self, fraction, message=None, **kw):
        message = str(kw.get("desc", message) or "")
        assert fraction is None or 0.0 <= fraction <= 1.0, (fraction, message)
        if fraction is not None:
            assert not self.calls or fraction >= self.calls[-1][0] - 1e-12, (self.calls[-1], fraction, message)
            self.calls.append((float(fraction), message))
        for m in COUNT.finditer(message):
            a, b = (int(g) for g in m.groups() if g is not None)
            assert a <= b, message

    def said(self, text: str) -> list[str]:
        return [m for _, m in self.calls if text in m]

    def counted_to_the_end(self, row: str) -> bool:
        """Whether `row`'s answers were counted and its last count is its total."""
        counts = [COUNT.search(m).groups()[:2] for m in self.said(f"{row}: ") if "answers" in m]
        return bool(counts) and counts[-1][0] == counts[-1][1]


def knowledge_bench() -> Benchmark:
    """tests/test_eval_knowledge.py's: 4 forget facts (paraphrased), 4 neighbours, 4 general."""
    fact = lambda ex: ex.answer.rstrip(".").split()[-1]  # noqa: E731
    qa = lambda ex: QAExample(ex.question, ex.answer, paraphrased_question=ex.question,  # noqa: E731
                              fact=fact(ex), subject="x")
    return Benchmark("real-knowledge", "t", tuple(map(qa, FORGET)), tuple(map(qa, RETAIN)),
                     eval_sets={"forget": tuple(map(qa, FORGET)), "neighbours": tuple(map(qa, RETAIN[:4])),
                                "general": tuple(map(qa, RETAIN[4:])),
                                "fluency": (TextExample("Odo Brask was born in Quenford."),)},
                     task="knowledge")


@pytest.fixture
def every_step(monkeypatch):
    """Every decoding step reported (not twice a second): the counts a slow CPU shows."""
    monkeypatch.setattr(R, "ANSWERED_EVERY_S", 0.0)


def test_the_answers_counted_never_pass_their_total(trained_llama, tokenizer, every_step):
    """The card's two steps and the comparison after them, on a CPU (two decoding loops a
    row: the forget side's questions, then the rest), in batches of 2 (several batches a
    loop): each count ends at its total, none passes it."""
    from grom import EditConfig, run_edit

    bench = knowledge_bench()
    edit = run_edit(trained_llama, tokenizer, bench.forget, bench.retain, EditConfig(layers=(1, 2), beta=30.0))
    first = evaluate(trained_llama, tokenizer, bench, edit, batch_size=2, stage="forget", progress=(bar := Bar()))
    assert bar.counted_to_the_end("Edited") and bar.calls[-1][0] == 1.0  # the forget questions alone
    answers = evaluate(trained_llama, tokenizer, bench, edit, batch_size=2, stage="answers", reuse=first,
                       answers=first, progress=(bar := Bar()))
    assert bar.counted_to_the_end("Edited")  # the paraphrases and the kept sets; the Base row its own, after its
    assert bar.counted_to_the_end("Base")    # forget side's answers (the first step's, lent)
    evaluate(trained_llama, tokenizer, bench, edit, batch_size=2, progress=(bar := Bar()))
    assert bar.counted_to_the_end("Base") and bar.counted_to_the_end("Edited")
    evaluate(trained_llama, tokenizer, bench, edit, batch_size=2, reuse=answers, answers=answers,
             progress=(bar := Bar()))  # the answers given: nothing decoded, the bar still ends at 1
    assert bar.calls[-1][0] == 1.0


@pytest.mark.parametrize("stage", ["forget", "answers"])
def test_one_decoding_loop_a_row_counts_the_same(trained_llama, tokenizer, every_step, monkeypatch, stage):
    """On a GPU a row decodes its answers in one loop (`split_decoding` false)."""
    from grom.tasks import knowledge as K

    monkeypatch.setattr(K, "split_decoding", lambda model: False)
    evaluate(trained_llama, tokenizer, knowledge_bench(), batch_size=3, stage=stage, progress=(bar := Bar()))
    assert bar.counted_to_the_end("Base") and bar.calls[-1][0] == 1.0


def test_a_training_split_into_parts_reports_one_rising_bar(trained_llama, tokenizer, tmp_path):
    """NPO's training as ZeroGPU runs it, in parts resumed from a checkpoint: one bar for the
    whole run, each step "k/total" with k <= total."""
    bar, path, until, out = Bar(), str(tmp_path / "state.pt"), 0, None
    while not out or isinstance(out, Paused):
        until += 2
        out = run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, epochs=3, batch_size=2, grad_accum=1,
                           lr=1e-4, progress=bar, part=Part(path, until))
    steps = out.info["steps"]
    assert bar.said(f"step {steps}/{steps}") and bar.calls[-1][0] == 1.0
    assert not bar.said(f"step {steps + 1}/")


def test_a_training_in_gpu_calls_relays_one_rising_bar(trained_llama, tokenizer):
    """`train_in_calls` (ZeroGPU's split training): the worker's steps and the count of calls
    between them, one bar."""
    from components.server.gpu_time import TrainPlan
    from components.server.train_parts import train_in_calls

    def call(part, watch):
        return run_baseline("npo", trained_llama, tokenizer, FORGET, RETAIN, epochs=3, batch_size=2, grad_accum=1,
                            lr=1e-4, progress=watch, part=part)

    bar = Bar()
    edit = train_in_calls(call, TrainPlan(total_steps=6, step_s=1.0, call_s=0.0, cap=2), "NPO", bar,
                          cancelled=lambda: False)
    assert edit.info["steps"] == 6 and bar.said("after GPU call 2 of 3") and bar.calls[-1][0] <= 1.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """tests/test_attack_estimates.py's session: the demo model, an upload with 8 held-out
    probes, GROM's demo edit."""
    from tests.test_attack_estimates import demo as made

    return made.__wrapped__(tmp_path_factory)


def test_the_attack_suites_bar_stays_within_its_bounds(demo):
    from components import attack_panel as ap

    ap.on_run_attacks.__wrapped__(["heldout", "relearn", "mia"], False, "npo", 1, 1e-3, demo, progress=(bar := Bar()))
    assert bar.said("GROM: attack 3/3") and bar.calls[-1][0] == 1.0


def test_a_baselines_bar_from_its_training_to_its_row(demo):
    """NPO trained, then the comparison's rows (where "158 of 109" was seen on real knowledge): one bar."""
    from components import baseline_panel as bp

    bp.on_run_baseline.__wrapped__("npo", 1, 1e-3, 5, False, demo, progress=(bar := Bar()))
    assert bar.said("NPO step 1/1") and bar.said("Edited") and bar.calls[-1][0] == 1.0
