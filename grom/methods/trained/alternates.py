"""AltPO's alternate answers: plausible wrong answers to each forget question, written by the
model itself, once per run before training (Mekala et al. 2024, "Alternate Preference
Optimization for Unlearning Factual Knowledge in Large Language Models").

As the authors' generation step (molereddy/Alternate-Preference-Optimization generate.py and
config/generate.yaml at c9b78bd8bc10ae1d0bb6a117b19f92b3ebf5ff67; the same script in
locuslab/open-unlearning community/methods/AltPO at d3d7cf9e6b3c125d16687d4232680d8d83548f1a):
the model sees the question AND its gold answer and is asked for another answer that keeps
the question but changes the facts; 5 answers per question, sampled at temperature 1.0 (HF's
default top-k 50), seeded once; each cut at a new "Question:" / "Q:" and stripped. The
instruction here is this project's own wording, not the authors' (`INSTRUCTION`).

Deliberate differences, each for a reason:
- an answer that is empty, the gold answer again (compared case-, space- and final-
  punctuation-blind), or one that states the example's fact (a QA example's `fact`, a fact
  record's answer, as whole words) is refused and sampled again, up to `ROUNDS` rounds per
  question (upstream keeps whatever came out: such an answer would train the model to
  prefer the very fact it should forget; SmolLM2 writes "Europa, Mars, Titan, Saturn." to
  the rings question); a question still short then repeats its usable answers (SmolLM2
  left 3 of the-solar-system's 27 short of 5 in 3 rounds), one with none is an error;
- at most `max_new_tokens` (AltPO's default 64, upstream 200) new tokens: the answers here
  are a phrase to two sentences, and generation is the step a CPU pays for; a blank line
  also ends an answer;
- temperature 0 is greedy decoding, which gives one answer per question (refused with more).
"""
from __future__ import annotations

import logging
import re
from typing import Callable, Sequence

import torch
from torch import nn

from grom.data.encoding import pad_id
from grom.data.prompts import PromptFormat, format_prompt, uses_chat_template
from grom.data.schema import FactRecord
from grom.methods.trained.idk import idk_question
from grom.methods.trained.micro_batch import eval_mode
from grom.model.arch import model_device
from grom.text import contains_phrase

log = logging.getLogger(__name__)

INSTRUCTION = ("Make up a different answer to this question. Keep it plausible and in the same "
               "style, keep every detail the question gives, but change every fact the answer "
               "states. Reply with the new answer only.")
LEAD = "Alternative answer:"  # opens the model's reply, as upstream's "Alternate Answer :"
STOPS = ("Question:", "Q:", "\n\n")
ROUNDS = 3
TOP_K = 50  # HF's default, what upstream's generate(do_sample=True) sampled with


def alternate_prompt(tokenizer, question: str, answer: str, fmt: PromptFormat | None = None) -> tuple[str, bool]:
    """(text, chat): the request for an alternate answer, in the model's chat template when
    it has one (`chat`: the text carries its own special tokens), else plain text."""
    message = f"Question: {question}\nAnswer: {answer}\n{INSTRUCTION}"
    chat = uses_chat_template(tokenizer, fmt)
    body = format_prompt(tokenizer, message, fmt) if chat else message + "\n"
    return body + LEAD, chat


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().rstrip(".!?;, ").casefold()


def fact_of(example) -> str | None:
    """The fact an alternate must not state: a QA example's `fact`, a fact record's answer."""
    return example.answer if isinstance(example, FactRecord) else getattr(example, "fact", None)


def clean_alternate(text: str, gold: str, fact: str | None = None) -> str | None:
    """The answer in a generated `text`: cut at the first of `STOPS`, a repeated `LEAD`
    dropped, stripped; None when nothing is left, it is the `gold` answer again, or it
    states `fact` (as whole words)."""
    for stop in STOPS:
        text = text.split(stop)[0]
    text = text.strip()
    if text.casefold().startswith(LEAD.casefold()):
        text = text[len(LEAD):].strip()
    if not text or _normal(text) == _normal(gold) or (fact and contains_phrase(text, fact)):
        return None
    return text


def left_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), (B, W): the rows right-aligned, as generation wants them."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(list(r))
        mask[b, width - len(r):] = 1
    return ids, mask


def _eos(model: nn.Module, tokenizer) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _sample(model, tokenizer, prompts: list[list[int]], n: int, temperature: float,
            max_new_tokens: int) -> list[list[str]]:
    """n decoded continuations of each prompt (token ids), (len(prompts), n)."""
    ids, mask = left_padded(prompts, pad_id(tokenizer))
    dev = model_device(model)
    how = (dict(do_sample=True, temperature=temperature, top_k=TOP_K, top_p=1.0) if temperature > 0
           else dict(do_sample=False, temperature=None, top_k=None, top_p=None))
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens,
                         num_return_sequences=n, pad_token_id=pad_id(tokenizer),
                         eos_token_id=_eos(model, tokenizer) or None, **how)
    texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def generate_alternates(model: nn.Module, tokenizer, examples: Sequence, *, n: int = 5,
                        temperature: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                        prompt_format: PromptFormat | None = None, batch_size: int = 8,
                        progress: Callable[[float, str], None] | None = None) -> tuple[tuple[str, ...], ...]:
    """`n` alternate answers to each example's question, (len(examples), n), written by the
    model from the question and its gold answer (`alternate_prompt`); none is the gold
    answer or states the example's fact (`clean_alternate`). Seeded: the same model, examples and seed give the same
    answers; the global random state and the model are left as they were (eval mode and
    no gradient while generating).

    A question with fewer than `n` usable answers after `ROUNDS` rounds has its usable ones
    repeated (with a warning), so each question keeps n rows and its weight in training;
    one with none raises ValueError naming it (give the alternates yourself, or more new
    tokens)."""
    if int(n) != n or n < 1 or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"n ({n}) and max_new_tokens ({max_new_tokens}) must be whole numbers >= 1")
    if temperature < 0 or (temperature == 0 and n > 1):
        raise ValueError(f"temperature {temperature}: use > 0 to sample {n} answers per question "
                         "(0, greedy decoding, gives one)")
    n, max_new_tokens = int(n), int(max_new_tokens)
    questions = [idk_question(ex) for ex in examples]
    golds, facts = [str(ex.answer) for ex in examples], [fact_of(ex) for ex in examples]
    prompts = []
    for q, a in zip(questions, golds):
        text, chat = alternate_prompt(tokenizer, q, a, prompt_format)
        prompts.append(list(tokenizer(text, add_special_tokens=not chat)["input_ids"]))
    found: list[list[str]] = [[] for _ in examples]
    report = progress or (lambda *_: None)
    dev = model_device(model)
    devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), eval_mode(model), torch.no_grad():
        torch.manual_seed(int(seed))
        for r in range(ROUNDS):
            todo = [i for i, f in enumerate(found) if len(f) < n]
            for b in range(0, len(todo), batch_size):
                report(b / max(len(todo), 1), f"AltPO: writing {n} alternate answers to {len(todo)} "
                                             f"questions (round {r + 1}, {b}/{len(todo)} done)")
                idx = todo[b:b + batch_size]
                for i, texts in zip(idx, _sample(model, tokenizer, [prompts[i] for i in idx], n,
                                                 temperature, max_new_tokens)):
                    good = [c for c in (clean_alternate(t, golds[i], facts[i]) for t in texts) if c is not None]
                    found[i].extend(good[:n - len(found[i])])
    empty = [i for i, f in enumerate(found) if not f]
    if empty:
        raise ValueError(f"the model wrote no usable alternate answer to {questions[empty[0]]!r} in {ROUNDS} "
                         f"rounds of {n} ({len(empty)} questions have none): give them yourself "
                         "(alternates=), or raise max_new_tokens or temperature")
    short = [i for i, f in enumerate(found) if len(f) < n]
    if short:
        log.warning("AltPO: %d questions have fewer than %d usable alternate answers after %d rounds "
                    "(first: %r); their usable ones are repeated", len(short), n, ROUNDS, questions[short[0]])
    found = [[f[k % len(f)] for k in range(n)] for f in found]
    log.info("AltPO: %d alternate answers to each of %d questions", n, len(found))
    return tuple(tuple(f) for f in found)
