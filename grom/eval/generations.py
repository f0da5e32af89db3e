"""Before and after an edit, question by question: `compare_generations` (the greedy answers
of the base and the edited model, with the reference answer's probability under each) and
`answer_probabilities` (a fast, teacher-forced measure of what a model still knows)."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np

from grom.data.prompts import PromptFormat
from grom.eval.runner import generate, score_answers


def compare_generations(model, tokenizer, questions: Sequence[str], edit, *,
                        prompt_format: PromptFormat | None = None,
                        answers: Sequence[str] | None = None, max_new_tokens: int = 48,
                        batch_size: int = 32) -> list[dict]:
    """Greedy answers of the base and the edited model to each question, with the
    reference answer's probability (exp of its mean token log-likelihood) under each
    where `answers` are given. Returns dicts: question, answer, before, after,
    prob_before, prob_after."""
    questions = list(questions)
    if answers is not None and len(answers) != len(questions):
        raise ValueError(f"{len(questions)} questions but {len(answers)} answers")

    def side():
        gens = generate(model, tokenizer, questions, prompt_format=prompt_format,
                        max_new_tokens=max_new_tokens, batch_size=batch_size)
        probs = ([float(np.exp(-s.avg_loss)) for s in
                  score_answers(model, tokenizer, list(zip(questions, answers)),
                                prompt_format=prompt_format, batch_size=batch_size)]
                 if answers is not None else [None] * len(questions))
        return gens, probs

    before, p_before = side()
    with (edit.applied(model) if edit is not None else nullcontext()):
        after, p_after = side()
    return [{"question": q, "answer": answers[i] if answers is not None else None,
             "before": before[i], "after": after[i], "prob_before": p_before[i],
             "prob_after": p_after[i]} for i, q in enumerate(questions)]


def answer_probabilities(model, tokenizer, examples: Sequence, *,
                         prompt_format: PromptFormat | None = None, batch_size: int = 32) -> np.ndarray:
    """exp(-mean NLL) of each QA example's answer (with EOS) after its question: a fast,
    teacher-forced measure of how much the model still knows (for sweeps)."""
    pairs = [(ex.question, ex.answer) for ex in examples]
    scores = score_answers(model, tokenizer, pairs, prompt_format=prompt_format, batch_size=batch_size)
    return np.array([np.exp(-s.avg_loss) for s in scores])
