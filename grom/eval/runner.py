"""Running the model for the metrics: teacher-forced answer scores (right padding) and
greedy generations (left padding), batched, on whatever device the model is on; and
`ModelScorer`, one model's scoring settings for an evaluation row.

These functions only produce the inputs of the pure metric functions in
`grom.eval.metrics`: per-token log-probabilities and argmax predictions of an answer
after its prompt, generated text, and the log-probabilities of lettered options.
"""
from __future__ import annotations

import inspect
import re
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

from grom.data.encoding import Batch, answer_letter, choice_question, pad_id
from grom.data.prompts import PromptFormat, encode_prompt, encode_qa
from grom.eval.mia import vocab_moments
from grom.eval.prefix import LowerStates
from grom.eval.upstream import mc_context, mc_continuations, mc_encode_pair
from grom.model.arch import model_device
from grom.model.shared_prefix import PrefixKV, cache_kwarg, common_prefix
from grom.text import contains_phrase
from grom.turns import AsFound, Between, give, random_kept


@dataclass(frozen=True)
class TokenScores:
    """One answer scored teacher-forced: each label token's log-probability under the
    model and whether the model's argmax predicted it."""

    logprobs: np.ndarray  # (T,) float64
    correct: np.ndarray  # (T,) bool
    predicted: np.ndarray  # (T,) int64, the argmax token at each answer position
    labels: np.ndarray  # (T,) int64
    mu: np.ndarray | None = None  # (T,) mean of log p over the next-token distribution (Min-K++)
    sigma2: np.ndarray | None = None  # (T,) its variance (`grom.eval.mia.vocab_moments`)

    @property
    def avg_loss(self) -> float:
        """Mean negative log-likelihood per answer token (TOFU's length normalisation)."""
        return float(-self.logprobs.mean()) if len(self.logprobs) else float("nan")

    def without_last(self) -> "TokenScores":
        """The same scores without the last labelled position (the EOS of an answer, the
        last token of a raw text): the positions OpenUnlearning's ``tokenwise_logprobs`` and
        ``tokenwise_vocab_logprobs`` keep ("-1 to ignore eos prediction"), which Min-K,
        Min-K++, exact memorization and extraction strength read."""
        cut = slice(0, max(0, len(self.labels) - 1))
        return TokenScores(self.logprobs[cut], self.correct[cut], self.predicted[cut], self.labels[cut],
                           None if self.mu is None else self.mu[cut],
                           None if self.sigma2 is None else self.sigma2[cut])


def eos_ids(model, tokenizer) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_pair(tokenizer, prompt: str, answer: str, fmt: PromptFormat | None,
                add_eos: bool = True, max_length: int = 1024) -> tuple[list[int], int]:
    """(ids, start): the formatted prompt and the answer tokenised as one string
    (`grom.data.prompts.encode_qa`, OpenUnlearning's split at the prompt's length), then
    EOS unless the ids end in it already (OpenUnlearning's rule, src/data/utils.py); the
    answer's label tokens are ids[start:]. Long prompts lose their start.

    After a chat template the labels are answer + EOS: with Llama-3's template, whose EOS
    is its end of turn ``<|eot_id|>``, that is OpenUnlearning's label sequence exactly.
    Where the template writes more after the turn's end token (ChatML: "<|im_end|>\n")
    OpenUnlearning also scores that newline and a second EOS; here they are left out (they
    are the template's, not the answer's, and the second EOS is a label no model learned)."""
    ids, start = encode_qa(tokenizer, prompt, answer, fmt)
    p, a = ids[:start], ids[start:]
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (ids[-1:] != [eos] or not a):
        a.append(eos)
    a = a[: max_length - 1]
    p = p[-(max_length - len(a)):]
    return p + a, len(p)


def _final_hidden(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                  opening: PrefixKV | None = None) -> torch.Tensor:
    """The last hidden state (after the final norm), so the LM head is applied only at the
    positions that are scored: a full (B, T, vocab) logit tensor of a 128k-vocab model
    would not fit. opening: the tokens every row begins with, run once
    (`grom.model.shared_prefix`); the states are then those of ids[:, len(opening):]."""
    if opening is None:
        out = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    else:
        out = model.base_model(input_ids=ids[:, len(opening):], attention_mask=mask, use_cache=True,
                               **{opening.kwarg: opening.view()})
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _opening(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, cols: list[int],
             kept: dict) -> PrefixKV | None:
    """The opening every row of a right-padded batch shares, before every scored position
    (`kept`: openings made already, by their tokens); None where there is none to share."""
    batch = Batch(ids, mask, torch.zeros(len(cols), dtype=torch.long), torch.tensor(cols, dtype=torch.long),
                  torch.zeros(len(cols), dtype=torch.long), torch.zeros(len(cols), dtype=torch.long))
    n = common_prefix([batch])
    if not n:
        return None
    key = tuple(ids[0, :n].tolist())
    if key not in kept:
        kept[key] = PrefixKV.of(model, ids[0, :n])
    return kept[key]


_MOMENT_ROWS = 1024  # positions per chunk of Min-K++'s moments (1024 x 128k vocab: 0.5 GB)
CPU_SCORE_TOKENS = 1024
"""On a CPU, at most this many token positions (rows x width) in one teacher-forced pass
(a longer sequence alone): SmolLM2 reads 100-300 tokens a second on a busy 2-core CPU, so
a batch of 32 answers (~3,000 positions) was one 15-25 s pass without a step boundary
(`between`) and 1,024 is 3-7 s. On an accelerator the batches are `batch_size` whole."""


def _score_batches(order: list[int], lengths: list[int], batch_size: int, tokens: int | None) -> list[list[int]]:
    """`order` (longest first) cut into batches of at most `batch_size` sequences and, where
    `tokens` is given, at most `tokens` positions (the first sequence's length times the
    count; at least one sequence a batch)."""
    out, b = [], 0
    while b < len(order):
        n = batch_size if tokens is None else max(1, min(batch_size, tokens // max(lengths[order[b]], 1)))
        out.append(order[b:b + n])
        b += n
    return out


@torch.no_grad()
def score_sequences(model: nn.Module, tokenizer, sequences: Sequence[tuple[list[int], int]],
                    batch_size: int = 32, moments: bool = False, between: Between | None = None,
                    share_opening: bool = False, lower: LowerStates | None = None) -> list[TokenScores]:
    """Teacher-forced scores of ids[start:] for each (ids, start), right-padded batches,
    longest first (less padding), on a CPU of at most CPU_SCORE_TOKENS positions. moments:
    also each position's mean and variance of log p under the model's next-token
    distribution (`TokenScores.mu`, `.sigma2`, for Min-K++; from the same forward pass, in
    float32). between: a step boundary between two batches
    (`grom.turns`; nothing here changes the model). share_opening: run the tokens every
    row of a batch begins with (a chat template's opening) once (`grom.model.shared_prefix`;
    the same scores up to a product's rounding). Off by default: a pass a prefix cache
    could replay (`grom.eval.prefix`: the same batch under an edit) must run whole.
    lower: a sequence whose states entering `lower.layer` a decoding kept
    (`grom.eval.prefix.LowerStates`; valid for this model below that layer) runs only the
    layers from there on; the others as above."""
    device = model_device(model)
    head = model.get_output_embeddings()
    pad = pad_id(tokenizer)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    out: list[TokenScores | None] = [None] * len(sequences)
    tokens = CPU_SCORE_TOKENS if device.type == "cpu" else None
    openings: dict = {}
    known = {}  # sequence -> its states entering lower.layer at every position but the last
    if lower is not None and lower.layer:
        for i, (seq, _) in enumerate(sequences):
            if len(seq) >= 2 and (st := lower.states_for(seq[:-1])) is not None:
                known[i] = st
    lengths = [len(s[0]) for s in sequences]
    batches = _score_batches([i for i in order if i not in known], lengths, batch_size, tokens) + \
        _score_batches([i for i in order if i in known], lengths, batch_size, tokens)
    for b, idx in enumerate(batches):
        if b:
            give(between)
        width = max(len(sequences[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        rows, cols, labels = [], [], []
        for r, i in enumerate(idx):
            seq, start = sequences[i]
            ids[r, :len(seq)] = torch.tensor(seq)
            mask[r, :len(seq)] = 1
            n = len(seq) - start
            rows += [r] * n
            cols += range(start - 1, len(seq) - 1)
            labels += seq[start:]
        opening = _opening(model, ids, mask, cols, openings) if share_opening and idx[0] not in known else None
        if idx[0] in known:  # the last position's states: any (nothing reads them)
            states = torch.zeros((len(idx), width, known[idx[0]].shape[-1]), dtype=known[idx[0]].dtype,
                                 device=known[idx[0]].device)
            for r, i in enumerate(idx):
                states[r, :len(known[i])] = known[i]
            hidden = lower.run(model, ids.to(device), mask.to(device), states)
        else:
            hidden = _final_hidden(model, ids.to(device), mask.to(device), opening)
        # indices where the last hidden state lives: a sharded model (device_map) returns it
        # on its last device, not the first one the inputs went to
        shift = len(opening) if opening is not None else 0
        rows_t, cols_t = torch.tensor(rows, device=hidden.device), torch.tensor(cols, device=hidden.device) - shift
        logits = head(hidden[rows_t, cols_t].to(head.weight.device)).float()
        logp = torch.log_softmax(logits, dim=-1)
        lab = torch.tensor(labels, device=logits.device)
        tok_lp = logp.gather(1, lab[:, None])[:, 0].double().cpu().numpy()
        pred = logits.argmax(-1).cpu().numpy()
        lab_np = lab.cpu().numpy()
        mu = sigma2 = None
        if moments:  # in chunks of positions: two more (N, vocab) tensors at once would not fit
            parts = [vocab_moments(logp[c:c + _MOMENT_ROWS]) for c in range(0, len(logp), _MOMENT_ROWS)]
            mu, sigma2 = (torch.cat(v).double().cpu().numpy() for v in zip(*parts))
        at = 0
        for r, i in enumerate(idx):
            seq, start = sequences[i]
            n = len(seq) - start
            sl = slice(at, at + n)
            out[i] = TokenScores(tok_lp[sl], pred[sl] == lab_np[sl], pred[sl], lab_np[sl],
                                 None if mu is None else mu[sl], None if sigma2 is None else sigma2[sl])
            at += n
    return out  # type: ignore[return-value]


def score_answers(model: nn.Module, tokenizer, pairs: Sequence[tuple[str, str]], *,
                  prompt_format: PromptFormat | None = None, add_eos: bool = True,
                  batch_size: int = 32, max_length: int = 1024, moments: bool = False,
                  between: Between | None = None, share_opening: bool = False,
                  lower: LowerStates | None = None) -> list[TokenScores]:
    """Teacher-forced scores of each answer after its formatted question (moments,
    between, share_opening, lower: see `score_sequences`)."""
    seqs = [encode_pair(tokenizer, q, a, prompt_format, add_eos, max_length) for q, a in pairs]
    return score_sequences(model, tokenizer, seqs, batch_size, moments, between, share_opening, lower)


def score_texts(model: nn.Module, tokenizer, texts: Sequence[str], *, batch_size: int = 16,
                max_length: int = 1024, moments: bool = False, between: Between | None = None) -> list[TokenScores]:
    """Every token of each text after the first (MIA scores on raw documents; moments,
    between: see `score_sequences`)."""
    seqs = []
    for t in texts:
        ids = list(tokenizer(t, add_special_tokens=True)["input_ids"])[:max_length]
        seqs.append((ids, 1) if len(ids) >= 2 else (ids + [pad_id(tokenizer)], 1))
    return score_sequences(model, tokenizer, seqs, batch_size, moments, between)


def tokenwise_logprobs(model: nn.Module, tokenizer, sequences: Sequence[tuple[list[int], int]], *,
                       moments: bool = False, batch_size: int = 32,
                       between: Between | None = None) -> list[TokenScores]:
    """OpenUnlearning's ``tokenwise_logprobs`` (and, with `moments`, what Min-K++ reads of
    ``tokenwise_vocab_logprobs``): for each (ids, start), the log-probability of every
    labelled token ids[start:] but the last (the EOS of an answer; a raw text's last
    token), with each position's `mu`, `sigma2` on request. The inputs of
    `grom.eval.mia.min_k_score` and `min_k_plus_plus_score`."""
    return [s.without_last() for s in score_sequences(model, tokenizer, sequences, batch_size, moments, between)]


class _Turns(StoppingCriteria):
    """A step boundary after each decoding step of `model.generate` (it stops nothing):
    a long generation lends the model between its tokens, its key/value cache its own."""

    def __init__(self, between: Between, as_found: AsFound = nullcontext):
        self.between, self.as_found = between, as_found

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.between(self.as_found)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _turns(between: Between | None, as_found: AsFound = nullcontext) -> dict:
    """`model.generate`'s keyword for a step boundary after each decoding step (none
    without `between`)."""
    return {} if between is None else {"stopping_criteria": StoppingCriteriaList([_Turns(between, as_found)])}


def left_padded(encoded: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both (B, W): the prompts right-aligned, pads on the left."""
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for r, e in enumerate(encoded):
        ids[r, width - len(e):] = torch.tensor(e)
        mask[r, width - len(e):] = 1
    return ids, mask


@torch.no_grad()
def generate(model: nn.Module, tokenizer, prompts: Sequence[str], *,
             prompt_format: PromptFormat | None = None, max_new_tokens: int | Sequence[int] = 64,
             batch_size: int = 32, max_length: int = 1024,
             stop_at: Sequence[str | None] | None = None,
             on_step: Callable[[int, int], None] | None = None, between: Between | None = None,
             drafts: Sequence[str | None] | None = None, lower: LowerStates | None = None) -> list[str]:
    """Greedy continuations of the formatted prompts (left padding; stops at EOS).

    stop_at: per prompt, a phrase (a fact) or None; an answer then ends as soon as it
    states its phrase as whole words (`phrase_settled`), and every answer that ended (the
    phrase, or EOS) leaves the running batch (`greedy_until`): the text is the full-length
    answer's start, so whether the phrase is in it (`grom.eval.metrics.fact_recall`) is
    what the full-length answer gives. Without it, `model.generate` runs every row to
    EOS or the budget. drafts (with stop_at): per prompt, a text its answer is guessed to
    be (another model's answer, None for none), read in one teacher-forced pass
    (`greedy_answers`): the same answers, in fewer decoding steps where the guesses hold.
    max_new_tokens: one budget for every prompt, or (with stop_at) one per prompt, so that
    questions of several budgets share one decoding run. on_step (with stop_at): called
    after each decoding step with (the prompts finished, all prompts), for a progress line.
    between: a step boundary (`grom.turns`) between two batches and after each decoding
    step; the texts are the same with or without it. lower (with stop_at): keeps the
    states entering its layer at every position fed (`greedy_answers`)."""
    return [t for t, _ in answers_until(model, tokenizer, prompts, prompt_format=prompt_format,
                                        max_new_tokens=max_new_tokens, batch_size=batch_size,
                                        max_length=max_length, stop_at=stop_at, on_step=on_step,
                                        between=between, drafts=drafts, lower=lower)]


def draft_ids(tokenizer, text: str | None) -> list[int]:
    """A draft answer's tokens (`greedy_answers`): the text encoded without special tokens
    (an answer as `generate` returns it, decoded and stripped: where that does not give
    back the tokens it was decoded from, the draft departs there and decoding goes on)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


@torch.no_grad()
def answers_until(model: nn.Module, tokenizer, prompts: Sequence[str], *,
                  prompt_format: PromptFormat | None = None, max_new_tokens: int | Sequence[int] = 64,
                  batch_size: int = 32, max_length: int = 1024,
                  stop_at: Sequence[str | None] | None = None,
                  on_step: Callable[[int, int], None] | None = None, between: Between | None = None,
                  drafts: Sequence[str | None] | None = None, decode: bool = True,
                  wanted: Sequence[bool] | None = None, lower: LowerStates | None = None
                  ) -> list[tuple[str, bool]]:
    """`generate`'s texts, each with whether it finished (EOS, its phrase, the budget; with
    `decode` False, after the drafts' pass alone, and those not `wanted` likewise; lower:
    `greedy_answers`)."""
    if stop_at is not None and len(stop_at) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(stop_at)} stop phrases")
    if drafts is not None and (stop_at is None or len(drafts) != len(prompts)):
        raise ValueError("drafts need stop_at and one draft (or None) per prompt")
    budgets = _budgets(max_new_tokens, len(prompts))
    if stop_at is None and len(set(budgets)) > 1:
        raise ValueError("one budget per prompt needs stop_at (model.generate takes one budget)")
    longest = max(budgets, default=0)
    device = model_device(model)
    pad = pad_id(tokenizer)
    eos = eos_ids(model, tokenizer)
    encoded = [encode_prompt(tokenizer, p, prompt_format)[-(max_length - longest):]
               for p in prompts]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    out: list[tuple[str, bool]] = [("", True)] * len(encoded)
    batches = _generation_batches(order, [len(e) for e in encoded], batch_size, device)
    before = 0  # prompts in the batches before this one (on_step's count)
    for idx in batches:
        if before:
            give(between)
        b, before = before, before + len(idx)
        ids, mask = left_padded([encoded[i] for i in idx], pad)
        if stop_at is not None:
            step = None if on_step is None else (lambda done, b=b: on_step(b + done, len(encoded)))
            new, done = greedy_answers(model, tokenizer, ids.to(device), mask.to(device),
                                       [budgets[i] for i in idx], eos, [stop_at[i] for i in idx],
                                       on_step=step, between=between,
                                       drafts=None if drafts is None else [draft_ids(tokenizer, drafts[i])
                                                                           for i in idx], decode=decode,
                                       wanted=None if wanted is None else [wanted[i] for i in idx], lower=lower)
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        else:
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 do_sample=False, max_new_tokens=longest, pad_token_id=pad,
                                 eos_token_id=eos or None, temperature=None, top_p=None, top_k=None,
                                 **_turns(between))
            texts = tokenizer.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
            done = [True] * len(idx)
        for r, i in enumerate(idx):
            out[i] = (texts[r].strip(), done[r])
    return out


PAD_SHARE, MIN_CUT = 0.25, 16
"""On a CPU, the most of a generation batch's prompt slots that may be padding: a prompt
pass there costs the same per position, pad or not (1.6 ms a position for SmolLM2 on two
cores), so the length-sorted prompts are cut where a batch of at least MIN_CUT prompts
would pass this share; fewer rows would pay more in decoding steps, each of which reads
every weight once however few rows it has. On an accelerator a batch is `batch_size`
whole: a step costs about the same for more rows."""


def _generation_batches(order: list[int], lengths: list[int], batch_size: int, device) -> list[list[int]]:
    """`order` (longest first) cut into batches of at most `batch_size` prompts; on a CPU also
    where the next prompt would make the padding of a batch of `MIN_CUT` or more (to its first,
    longest prompt) more than `PAD_SHARE` of its slots."""
    if torch.device(device).type != "cpu":
        return [order[b:b + batch_size] for b in range(0, len(order), batch_size)]
    out: list[list[int]] = []
    for i in order:
        batch = out[-1] if out else None
        if batch and len(batch) < batch_size:
            width, filled = lengths[batch[0]], sum(lengths[j] for j in batch) + lengths[i]
            if len(batch) < MIN_CUT or filled >= (1 - PAD_SHARE) * width * (len(batch) + 1):
                batch.append(i)
                continue
        out.append([i])
    return out


def _budgets(max_new_tokens: int | Sequence[int], n: int) -> list[int]:
    """One budget of new tokens per row: `max_new_tokens` for each, or its own where a
    sequence gives one per row."""
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * n
    budgets = [int(b) for b in max_new_tokens]
    if len(budgets) != n:
        raise ValueError(f"{n} prompts but {len(budgets)} budgets")
    return budgets


@torch.no_grad()
def generate_ids(model: nn.Module, tokenizer, encoded: Sequence[Sequence[int]], *,
                 max_new_tokens: int, batch_size: int = 32, between: Between | None = None) -> list[list[int]]:
    """Greedy new token ids of each prompt given as token ids, fed whole (no truncation),
    left-padded, longest first, each cut before its first EOS: what `model.generate(
    do_sample=False)` produces for the row (as OpenUnlearning generates; its pads after
    EOS decode to nothing). The caller decodes (`grom.eval.upstream.decode`). between: as
    `generate`'s."""
    device = model_device(model)
    pad, eos = pad_id(tokenizer), eos_ids(model, tokenizer)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    out: list[list[int]] = [[] for _ in encoded]
    for b in range(0, len(order), batch_size):
        if b:
            give(between)
        idx = order[b:b + batch_size]
        ids, mask = left_padded([list(encoded[i]) for i in idx], pad)
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=eos or None, temperature=None, top_p=None, top_k=None,
                             **_turns(between))
        for r, i in enumerate(idx):
            new = gen[r, ids.shape[1]:].tolist()
            ends = [n for n, t in enumerate(new) if t in eos]
            out[i] = new[:ends[0]] if ends else new
    return out


@torch.no_grad()
def sample(model: nn.Module, tokenizer, encoded: Sequence[Sequence[int]], *, max_new_tokens: int,
           temperature: float = 1.0, top_p: float = 0.9, seed: int = 0, batch_size: int = 16,
           on_batch: Callable[[int, int], None] | None = None, between: Between | None = None,
           top_k: int | None = None) -> list[str]:
    """Sampled continuations of prompts given as token ids (fed whole, left-padded, in
    the given order), decoded without special tokens: nucleus sampling at `temperature`
    and `top_p` (RWKU writes its forget corpus so, generation/pair_generation.py: 1.0 and
    0.9), after top-k filtering when `top_k` is given (None: none; transformers applies its
    default 50 where a caller names no top_k, as RWKU's does). The same seed, prompts and
    batch size give the same texts; the global random state is left as it was. on_batch:
    called after each batch with (prompts done, all).
    between: a step boundary (`grom.turns`) between two batches and after each decoding
    step, whose as_found keeps this run's random state (`random_kept`): the same texts
    whatever other jobs draw meanwhile."""
    device = model_device(model)
    pad, eos = pad_id(tokenizer), eos_ids(model, tokenizer)
    out: list[str] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for b in range(0, len(encoded), batch_size):
            if b:
                give(between, random_kept)
            ids, mask = left_padded([list(e) for e in encoded[b:b + batch_size]], pad)
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                                 temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, eos_token_id=eos or None, **_turns(between, random_kept))
            out += [t.strip() for t in tokenizer.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)]
            if on_batch is not None:
                on_batch(len(out), len(encoded))
    return out


_UNFINISHED_WORD = re.compile(r"(?:[^\W_]|\ufffd)+$")


def phrase_settled(text: str, phrase: str | None) -> bool:
    """Whether `text` states `phrase` as whole words (`grom.text.contains_phrase`) where
    more text cannot undo it: the text is cut before its last word, which the next token
    may still extend ("Mars" may become "Marsh"), and before a half-decoded character
    (U+FFFD). So a greedy answer that stops here states the phrase exactly when its
    full-length continuation does. None or an empty phrase: never."""
    if not phrase:
        return False
    return contains_phrase(_UNFINISHED_WORD.sub("", text), phrase)


def _cache_kwargs(model: nn.Module) -> tuple[str, bool]:
    """The name the model's forward gives its key/value cache (transformers renamed
    `past_key_values` to `cache`), and whether it takes `logits_to_keep`."""
    return cache_kwarg(model), "logits_to_keep" in inspect.signature(model.forward).parameters


@torch.no_grad()
def greedy_until(model: nn.Module, tokenizer, ids: torch.Tensor, mask: torch.Tensor,
                 max_new_tokens: int, eos: Sequence[int], stops: Sequence[str | None],
                 on_step: Callable[[int], None] | None = None, between: Between | None = None,
                 drafts: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Greedy decoding of a left-padded batch, ids and mask (B, W), that drops each row
    from the batch once it is finished: it produced EOS (not kept), or its new text
    states its phrase in `stops` (`phrase_settled`), or it has `max_new_tokens` tokens.
    A dropped row's key/value cache rows are dropped with it, so the rows still running
    cost what a batch of their size costs. Returns each row's new token ids.

    Each step is `model.generate`'s greedy step: positions from the attention mask
    (cumsum - 1), a dynamic cache built from the config, argmax of the last position's
    logits (no logits processor: the plain greedy answer), so the tokens are those of
    `model.generate(do_sample=False)` on the same prompts, cut where the row finished.
    drafts: per row, tokens its answer is guessed to begin with (`greedy_answers`).
    on_step: called after each step with the number of rows finished so far. between: a
    step boundary (`grom.turns`) between two steps (the cache is this call's own)."""
    return greedy_answers(model, tokenizer, ids, mask, max_new_tokens, eos, stops, drafts=drafts,
                          on_step=on_step, between=between)[0]


def argmax_at(model: nn.Module, hidden: torch.Tensor, rows: list[int], cols: list[int],
               chunk: int = 512) -> list[int]:
    """The LM head's argmax at positions (rows[i], cols[i]) of `hidden` (B, T, d), in
    chunks of positions (a (positions, vocab) logit tensor of a long batch would not fit)."""
    head = model.get_output_embeddings()
    out: list[int] = []
    for c in range(0, len(rows), chunk):
        r = torch.tensor(rows[c:c + chunk], device=hidden.device)
        k = torch.tensor(cols[c:c + chunk], device=hidden.device)
        out += head(hidden[r, k].to(head.weight.device)).float().argmax(-1).tolist()
    return out


def _drafted_pass(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, drafts: list[list[int]], cache,
                  goes_on: Callable[[int, int], bool], fed: "_Fed | None" = None,
                  seen: list | None = None) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """`greedy_answers`' pass over the prompts (left-padded, (B, W)) and their drafts after
    them (right-padded): each row's tokens given to `goes_on` as long as they agree with
    its draft. Returns the rows still running, the mask (B, W + longest draft) with each
    of those rows' draft masked out from its first departing token on, and each row's
    last position in `cache`. fed: the pass watched for its `LowerStates`, what it saw
    appended to `seen` (`greedy_answers`)."""
    seen = [] if seen is None else seen
    n, width = ids.shape
    d_width = max((len(d) for d in drafts), default=0)
    extra = torch.zeros((n, d_width), dtype=ids.dtype)
    extra_mask = torch.zeros((n, d_width), dtype=mask.dtype)
    for r, d in enumerate(drafts):
        extra[r, :len(d)] = torch.tensor(d, dtype=ids.dtype)
        extra_mask[r, :len(d)] = 1
    ids = torch.cat([ids, extra.to(ids.device)], dim=1)
    mask = torch.cat([mask, extra_mask.to(mask.device)], dim=1)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    name = cache_kwarg(model.base_model)
    with fed.watching(model) if fed is not None else nullcontext([]) as got:
        out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                               **{name: cache})
    seen.extend(got)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    guessed = _argmax_agreeing(model, hidden, [width - 1] * n, drafts)  # up to each row's first departure
    live, last = [], pos[:, width - 1].clone()
    for r, d in enumerate(drafts):
        j = 0
        while goes_on(r, guessed[r][j]):
            if j < len(d) and guessed[r][j] == d[j]:
                j += 1
                continue
            mask[r, width + j:] = 0  # the draft from its first departing token on is not this answer
            last[r] = pos[r, width - 1] + j
            live.append(r)
            break
    return live, mask, last


@torch.no_grad()
def greedy_answers(model: nn.Module, tokenizer, ids: torch.Tensor, mask: torch.Tensor,
                   max_new_tokens: int | Sequence[int], eos: Sequence[int], stops: Sequence[str | None], *,
                   drafts: Sequence[Sequence[int]] | None = None, decode: bool = True,
                   wanted: Sequence[bool] | None = None, on_step: Callable[[int], None] | None = None,
                   between: Between | None = None, lower: LowerStates | None = None
                   ) -> tuple[list[list[int]], list[bool]]:
    """`greedy_until`'s answers and, per row, whether it finished (EOS, its phrase settled,
    or the budget: `max_new_tokens`, one for every row or one per row).

    drafts: per row, the tokens its answer is guessed to begin with (e.g. the unedited
    model's answer, for an edited model that mostly leaves it alone). They are read in
    one teacher-forced pass with the prompts (the prompts left-padded, the drafts after
    them right-padded; the pass a `grom.eval.prefix.PrefixCache` can replay, being a
    prompt pass on an empty key/value cache). A row's greedy tokens are then read off that
    pass as long as each agrees with its draft: the argmax after the prompt and the
    draft's first j tokens is the greedy token j exactly when the first j agreed. A row
    that finishes within its agreeing tokens costs no decoding step; one that departs
    from its draft (or runs past it) goes on decoding from the first token that departs,
    its draft's tokens from there on masked out of the cache. So the answers are the
    greedy answers, up to the float rounding of a wider batch (an argmax tie may fall the
    other way); a draft of no use costs its share of one pass. An empty draft is a prompt
    pass for that row. decode: False stops after the draft pass (the rows not finished
    there are marked so, their tokens those read so far, the last one departing).
    wanted: per row, whether to decode it past the first pass (the others stop there, as
    with `decode` False: a row whose answer is known already, kept in the batch so the
    pass is the one a prefix cache recorded).
    lower: where every position fed (a prompt's tokens, each answer token read back) has
    its states entering `lower.layer` kept, by its tokens (`grom.eval.prefix.LowerStates`);
    a row that finished on its budget or its phrase is fed its last token once more for
    it (its answer is the same), so that a pass over the prompt and the whole answer can
    start there."""
    fed = _Fed(lower, ids, mask)
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") \
        else model.config
    cache = DynamicCache(config=config)
    eos = set(eos)
    n = ids.shape[0]
    budget = _budgets(max_new_tokens, n)
    new: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    if n == 0 or max(budget) <= 0:
        return new, [True] * n

    def ends(row: int, tokens: list[int]) -> bool:
        """Whether an answer that has `tokens` so far is finished (after a token not EOS)."""
        return len(tokens) >= budget[row] or phrase_settled(tokenizer.decode(tokens, skip_special_tokens=True),
                                                             stops[row])

    def goes_on(row: int, token: int) -> bool:
        """Take `token` as `row`'s next; whether the row is still running."""
        if token in eos:
            done[row] = True
            return False
        new[row].append(token)
        if ends(row, new[row]):
            done[row] = True
            return False
        return True

    if drafts is not None and len(drafts) != n:
        raise ValueError(f"{n} rows but {len(drafts)} drafts")
    if decode and _read_own(model, fed, n, new, done, budget, eos, wanted, ends):
        if on_step is not None:
            on_step(n)
        return new, done
    if drafts is None:
        live, last = _prompt_pass(model, ids, mask, cache, goes_on, fed, new)
    else:
        cut = [list(d)[:b] for d, b in zip(drafts, budget)]
        seen: list = []
        live, mask, last = _drafted_pass(model, ids, mask, cut, cache, goes_on, fed, seen)
        fed.first_pass(seen, cut, new)
    if not decode:
        live = []
    elif wanted is not None:
        live = [r for r in live if wanted[r]]
    pending: dict[int, list[int]] = {}
    if live and fed.lower is not None and fed.lower.recall is not None:
        give(between)
        live = read_guesses(model, fed, live, new, done, eos, ends, pending=pending)
    if on_step is not None:
        on_step(n - len(live))
    decoded = [decode and (wanted is None or wanted[r]) for r in range(n)]
    finished = [r for r in range(n) if r not in set(live) and decoded[r]]
    tail = fed.unfed([r for r in finished if r not in pending], new) + [r for r in finished if r in pending]
    _decode_steps(model, cache, mask, last, live, tail, new, fed, goes_on, on_step, between, pending)
    fed.hold(new, done)
    return new, done


def _decode_steps(model: nn.Module, cache, mask: torch.Tensor, last: torch.Tensor, live: list[int],
                  tail: list[int], new: list[list[int]], fed: "_Fed", goes_on: Callable[[int, int], bool],
                  on_step: Callable[[int], None] | None, between: Between | None,
                  pending: dict[int, list[int]] | None = None) -> None:
    """`greedy_answers`' decoding after its first pass: a step feeds each running row its
    last token (`live`: still answering; `tail`: finished, fed once more for its states),
    the first one after the tokens `pending` holds for it (`_feed_pending`)."""
    cache_name, keep_arg = _cache_kwargs(model)
    n = len(new)
    running = list(range(n))  # the original row of each row in the batch (cache, mask, last)
    while live or tail:
        give(between)
        going = set(live) | set(tail)
        if len(going) < len(running):
            keep = [r for r in running if r in going]
            at = {r: i for i, r in enumerate(running)}
            sel = torch.tensor([at[r] for r in keep])  # on the CPU: it indexes every layer's cache
            cache.batch_select_indices(sel)
            mask, last = mask[sel.to(mask.device)], last[sel.to(last.device)]
            running = keep
        if pending:
            mask, last = _feed_pending(model, cache, mask, last, running, pending, fed)
            pending = None
        step_ids = torch.tensor([[new[r][-1]] for r in running], dtype=torch.long, device=mask.device)
        last = last + 1
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        kwargs = {cache_name: cache, "logits_to_keep": 1} if keep_arg else {cache_name: cache}
        with fed.watching(model) as seen:
            nxt = model(input_ids=step_ids, attention_mask=mask, position_ids=last[:, None], use_cache=True,
                        **kwargs).logits[:, -1, :].float().argmax(-1).tolist()
        fed.step(seen, running)
        stepping = set(live)  # a tail row was fed its last token: what follows it is not its answer
        live = [r for r, token in zip(running, nxt) if r in stepping and goes_on(r, token)]
        tail = fed.unfed([r for r in stepping if r not in set(live)], new)
        if on_step is not None:
            on_step(n - len(live))


def _prompt_pass(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, cache, goes_on: Callable[[int, int], bool],
                 fed: "_Fed", new: list[list[int]]) -> tuple[list[int], torch.Tensor]:
    """`greedy_answers`' first pass without drafts: each row's first token. Returns the rows
    still running and each row's last position."""
    cache_name, keep_arg = _cache_kwargs(model)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (B, W)
    kwargs = {cache_name: cache, "logits_to_keep": 1} if keep_arg else {cache_name: cache}
    with fed.watching(model) as seen:
        first = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                      **kwargs).logits[:, -1, :].float().argmax(-1).tolist()
    fed.first_pass(seen, [[]] * ids.shape[0], new)
    return [r for r in range(ids.shape[0]) if goes_on(r, first[r])], pos[:, -1]


def _read_own(model: nn.Module, fed: "_Fed", n: int, new: list[list[int]], done: list[bool], budget: list[int],
              eos: set[int], wanted: Sequence[bool] | None, ends: Callable[[int, list[int]], bool]) -> bool:
    """`greedy_answers` on the very edit that gave the recall's answers to every row it
    decodes (the same settings again): those answers read in one pass from the band up
    (`read_guesses`), in place of the drafted pass and the decoding. Whether every row
    finished on them; if not (a tie that another batch's rounding turned), nothing is
    kept of it and the caller decodes as usual."""
    if fed.lower is None or fed.lower.recall is None or fed.lower.tag is None:
        return False
    rows = [r for r in range(n) if wanted is None or wanted[r]]
    if not rows or any(budget[r] <= 0 or fed.lower.extending(fed.prompts[r], same=True) is None for r in rows):
        return False
    if not read_guesses(model, fed, rows, new, done, eos, ends, same=True):
        return True  # the rows not wanted are left unread, not finished (their answers are known elsewhere)
    for r in rows:
        new[r], done[r] = [], False
    fed.known.clear()
    return False


def read_guesses(model: nn.Module, fed: "_Fed", live: list[int], new: list[list[int]], done: list[bool],
                  eos: set[int], ends: Callable[[int, list[int]], bool], same: bool = False,
                  pending: dict[int, list[int]] | None = None) -> list[int]:
    """`greedy_answers`' rows still running after its first pass, read against answers an
    earlier edit of the same band gave (`grom.eval.prefix.Recall`): where an earlier
    decoding went on from a row's answer so far, its tokens are read in one teacher-forced
    pass of the layers from the band up, started from the states it kept entering the band
    (the layers below are the unedited model's whatever the edit). As in the drafted pass,
    the argmax after the answer's first j tokens is the greedy token j exactly when the
    first j agreed, so a row whose guess holds until it finishes (EOS, its budget, its
    phrase) has its greedy answer and leaves the decoding. A row that departs from its
    guess has its greedy tokens up to the one that departs, that one included: with
    `pending`, it takes them (finished if they end it) and `pending[row]` gets the tokens
    the decoding must feed before it goes on (all but the last, which its next step feeds:
    `_feed_pending`); without, it goes on as it was (what this pass read of it dropped).
    Returns the rows still running."""
    guesses = {}
    for r in live:
        hit = fed.lower.extending(fed.prompts[r] + new[r], same=same)
        if hit is not None:
            guesses[r] = hit
    if not guesses:
        return live
    rows = list(guesses)
    device = model_device(model)
    width = max(len(guesses[r][0]) for r in rows)
    d = guesses[rows[0]][1].shape[-1]
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    states = torch.zeros((len(rows), width, d), dtype=guesses[rows[0]][1].dtype)
    for i, r in enumerate(rows):
        seq, held = guesses[r]
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        states[i, :len(seq)] = held
    hidden = fed.lower.run(model, ids.to(device), mask.to(device), states.to(device))
    starts = [len(fed.prompts[r]) + len(new[r]) for r in rows]  # the first guessed token of each row
    tails = [list(guesses[r][0][s:]) for r, s in zip(rows, starts)]
    read = _argmax_agreeing(model, hidden, [s - 1 for s in starts], tails)
    for r, tail, got in zip(rows, tails, read):
        answer, departed = list(new[r]), False
        for j, token in enumerate(got):
            if token in eos:
                break
            departed = j >= len(tail) or token != tail[j]  # departs from the guess, or runs past it
            answer.append(token)
            if departed or ends(r, answer):
                break
        if not departed:
            new[r], done[r] = answer, True
            fed.known.add(r)
        elif pending is not None:  # its greedy tokens so far: fed before the decoding goes on
            pending[r] = answer[len(new[r]) - 1:-1]
            new[r], done[r] = answer, ends(r, answer)
    return [r for r in live if not done[r]]


def _feed_pending(model: nn.Module, cache, mask: torch.Tensor, last: torch.Tensor, running: list[int],
                  pending: dict[int, list[int]], fed: "_Fed") -> tuple[torch.Tensor, torch.Tensor]:
    """Feed each running row the tokens `pending` holds for it (`read_guesses`), in one
    pass on the key/value cache (the rows right-padded, the padding masked out), so that
    its next decoding step goes on after them. Returns the mask and last positions."""
    counts = [len(pending.get(r, ())) for r in running]
    width = max(counts)
    chunk = torch.zeros((len(running), width), dtype=torch.long)
    chunk_mask = torch.zeros((len(running), width), dtype=mask.dtype)
    for i, (r, c) in enumerate(zip(running, counts)):
        chunk[i, :c] = torch.tensor(pending[r][:c], dtype=torch.long) if c else chunk[i, :c]
        chunk_mask[i, :c] = 1
    pos = last[:, None] + 1 + torch.arange(width, device=last.device)[None, :]
    mask = torch.cat([mask, chunk_mask.to(mask.device)], dim=1)
    with fed.watching(model) as seen:
        model.base_model(input_ids=chunk.to(mask.device), attention_mask=mask, position_ids=pos, use_cache=True,
                         **{cache_kwarg(model.base_model): cache})
    fed.fed_chunk(seen, running, counts)
    return mask, last + torch.tensor(counts, device=last.device)


def _argmax_agreeing(model: nn.Module, hidden: torch.Tensor, firsts: list[int], guesses: list[list[int]],
                     window: int = 8) -> list[list[int]]:
    """Per row i of `hidden` (B, T, d), the LM head's argmax at positions firsts[i],
    firsts[i] + 1, ... for as long as each agrees with guesses[i] (the token read at
    position firsts[i] + j is guess j's judge), the first that departs included, and one
    past the guess where it agrees throughout. Read `window` positions a row at a time,
    so a row that departs early costs the head only there."""
    out: list[list[int]] = [[] for _ in firsts]
    going = list(range(len(firsts)))
    while going:
        rows, cols = [], []
        for i in going:
            at = len(out[i])
            for j in range(at, min(at + window, len(guesses[i]) + 1)):
                rows.append(i)
                cols.append(firsts[i] + j)
        read = iter(argmax_at(model, hidden, rows, cols))
        still = []
        for i in going:
            at, g = len(out[i]), guesses[i]
            for j in range(at, min(at + window, len(g) + 1)):
                out[i].append(next(read))
            if all(j < len(g) and out[i][j] == g[j] for j in range(at, len(out[i]))) and len(out[i]) <= len(g):
                still.append(i)
        going = still
    return out


class _Fed:
    """What `greedy_answers` keeps for a `LowerStates` (nothing without one): each row's
    states entering its layer at the prompt's positions, at the answer tokens the first pass
    read back (a draft's agreeing tokens), then at each token a decoding step fed."""

    def __init__(self, lower: LowerStates | None, ids: torch.Tensor, mask: torch.Tensor):
        self.lower = lower if lower is not None and lower.layer else None
        n, self.width = ids.shape
        self.cols = [torch.nonzero(mask[r] == 1)[:, 0] for r in range(n)] if self.lower is not None else []
        self.prompts = [ids[r, c].tolist() for r, c in enumerate(self.cols)]
        self.states: torch.Tensor | None = None  # the first pass's (B, W', d)
        self.read_back = [0] * n
        self.steps: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.known: set[int] = set()  # rows finished on an earlier answer (`read_guesses`): held already

    def watching(self, model: nn.Module):
        return self.lower.watching(model) if self.lower is not None else nullcontext([])

    def first_pass(self, seen: list, drafts: list[list[int]], new: list[list[int]]) -> None:
        """The first pass's states, and how many answer tokens each row's draft gave it."""
        if self.lower is None or not seen or seen[0] is None:
            self.lower = None
            return
        self.states = seen[0]
        self.read_back = [next((i for i, (a, b) in enumerate(zip(t, d)) if a != b), min(len(t), len(d)))
                          for t, d in zip(new, drafts)]

    def step(self, seen: list, running: list[int]) -> None:
        if self.lower is not None and seen and seen[0] is not None:
            for i, r in enumerate(running):
                self.steps[r].append(seen[0][i, -1])

    def fed_chunk(self, seen: list, running: list[int], counts: list[int]) -> None:
        """A pass that fed each running row `counts` tokens (`_feed_pending`)."""
        if self.lower is not None and seen and seen[0] is not None:
            for i, (r, c) in enumerate(zip(running, counts)):
                self.steps[r].extend(seen[0][i, :c])

    def unfed(self, finished: list[int], new: list[list[int]]) -> list[int]:
        """The finished rows whose last answer token was not fed (on their budget or their
        phrase; a row that ended on EOS was fed every token of its answer)."""
        if self.lower is None:
            return []
        return [r for r in finished
                if r not in self.known and self.read_back[r] + len(self.steps[r]) == len(new[r]) - 1]

    def hold(self, new: list[list[int]], done: list[bool]) -> None:
        """Hold each row's states (its prompt and its answer as far as fed), as a whole
        answer where it finished and every token of it was fed."""
        if self.lower is None or self.states is None:
            return
        for r, cols in enumerate(self.cols):
            if r in self.known:
                continue
            k = self.read_back[r] + len(self.steps[r])
            parts = [self.states[r, cols], self.states[r, self.width:self.width + self.read_back[r]]]
            if self.steps[r]:
                parts.append(torch.stack(self.steps[r]))
            self.lower.hold(self.prompts[r] + new[r][:k], torch.cat(parts), whole=done[r] and k == len(new[r]))


def answer_budget(tokenizer, answers: Sequence[str], cap: int = 200) -> int:
    """New tokens to generate for a set: room for its longest reference answer plus a
    margin, at most `cap` (OpenUnlearning generates up to 200 and stops at EOS; a model
    that stops at EOS gives the same text, one that rambles is cut where ROUGE-L recall
    no longer changes)."""
    longest = max((len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers), default=16)
    return int(min(cap, 2 * longest + 16))


def choice_logprobs(model: nn.Module, tokenizer, examples, *,
                    prompt_format: PromptFormat | None = None, batch_size: int = 32,
                    lm_eval: bool = False, between: Between | None = None) -> np.ndarray:
    """(N, max options) log-likelihood of each option's letter after the lettered prompt
    ("...\\nAnswer:"), -inf where an item has fewer options.

    lm_eval=False (the demo's multiple-choice view): the prompt is `grom.data.encoding.choice_question`
    in `prompt_format`, the letter `grom.data.encoding.answer_letter` (" A" after a plain prompt, "A"
    after a chat template), the same answer GROM's keys and the baselines train on.

    lm_eval=True (WMDP, MMLU): the request the lm-evaluation-harness scores for its
    zero-shot `wmdp_*` / `mmlu_*` tasks (`grom.eval.upstream.mc_context`: no chat template,
    whatever `prompt_format` says; the subject line; the question stripped; continuation
    " A" ... " D" tokenised jointly with the context, `mc_encode_pair`). Its accuracy is
    lm-eval's `acc`: argmax of these sums against the gold index (first maximum on ties).
    Deliberate difference: lm-eval left-truncates context + continuation to the model's
    maximum length; here nothing is cut (the questions are far shorter).

    Either way the option's tokens' log-probabilities are summed (one token with most
    tokenizers). between: see `score_sequences`."""
    width = max(len(ex.choices) for ex in examples)
    seqs, where = [], []
    if lm_eval:
        for n, ex in enumerate(examples):
            context = mc_context(ex)
            for i, cont in enumerate(mc_continuations(ex)):
                ctx, tail = mc_encode_pair(tokenizer, context, cont)
                seqs.append((ctx + tail, len(ctx)))
                where.append((n, i))
    else:
        letters = [tokenizer(answer_letter(tokenizer, prompt_format, i), add_special_tokens=False)["input_ids"]
                   for i in range(width)]
        for n, ex in enumerate(examples):
            prompt = encode_prompt(tokenizer, choice_question(ex), prompt_format)
            for i in range(len(ex.choices)):
                seqs.append((prompt + letters[i], len(prompt)))
                where.append((n, i))
    out = np.full((len(examples), width), -np.inf)
    for (n, i), s in zip(where, score_sequences(model, tokenizer, seqs, batch_size, between=between)):
        out[n, i] = s.logprobs.sum()
    return out


class ModelScorer:
    """One model's scoring settings for an evaluation row: its tokenizer, prompt format,
    batch size, generation budget, stage and earlier answers to reuse, and the row's step
    boundary (`between`, `grom.turns`: a row builder passes it to every batched run)."""

    def __init__(self, model, tokenizer, fmt: PromptFormat | None, batch_size: int,
                 max_new_tokens: int | None, stage: str = "full", given: dict | None = None):
        self.model, self.tok, self.fmt = model, tokenizer, fmt
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.stage = stage  # "full", "answers" or "forget" (`grom.eval.report.evaluate`)
        self.given = given or {}  # set name -> an earlier frame of this model's answers to reuse
        self.drafts: dict = {}  # set name -> the unedited model's answers frame, whose answers are read as drafts
        self.unedited = False  # the unedited model's row: its answers run their whole budget in every stage
        self.answered: Callable[[int, int], None] | None = None  # (finished, all) after each decoding step
        self.between: Between | None = None  # the row's step boundary, its as_found the row's state undone
        self.ahead: dict[tuple, dict[str, str]] = {}  # (format, budget) -> prompt -> answer (`answer_ahead`)
        self.lower: LowerStates | None = None  # where the row's decodings keep the states below the edit

    def losses(self, pairs, fmt=None, add_eos=True, moments=False):
        return score_answers(self.model, self.tok, pairs, prompt_format=fmt or self.fmt,
                             add_eos=add_eos, batch_size=self.batch_size, moments=moments, between=self.between)

    def generate(self, prompts, references, fmt=None, budget=None):
        """Greedy answers; `budget` new tokens (None: `answer_budget` of the references),
        unless the evaluation fixed `max_new_tokens`."""
        budget = self.max_new_tokens or budget or answer_budget(self.tok, references)
        known = self.ahead.get((fmt or self.fmt, budget), {})
        if all(p in known for p in prompts):
            return [known[p] for p in prompts]
        return generate(self.model, self.tok, prompts, prompt_format=fmt or self.fmt,
                        max_new_tokens=budget, batch_size=self.batch_size, between=self.between)

    def answer_ahead(self, requests) -> None:
        """Answer, in one batched run per (format, budget), the prompts of every later
        `generate` call a row will make: requests are (prompts, references, fmt, budget) as
        `generate` takes them. A decoding step's cost grows far slower than its rows on a CPU
        (SmolLM2: 151 ms for 10 rows, 278 ms for 50), so a row of six sets of 5 questions with
        200-token answers decodes ~200 steps of 30 rows, not ~1,200 of 5 (BENCHMARKS.md). The
        answers are the ones `generate` gives (greedy; each row's own, whatever else is in its
        batch, up to float noise)."""
        wanted: dict[tuple, dict[str, None]] = {}
        for prompts, references, fmt, budget in requests:
            budget = self.max_new_tokens or budget or answer_budget(self.tok, references)
            wanted.setdefault((fmt or self.fmt, budget), {}).update(dict.fromkeys(prompts))
        for (fmt, budget), prompts in wanted.items():
            known = self.ahead.setdefault((fmt, budget), {})
            todo = [p for p in prompts if p not in known]
            if todo:
                known.update(zip(todo, generate(self.model, self.tok, todo, prompt_format=fmt,
                                                max_new_tokens=budget, batch_size=self.batch_size,
                                                between=self.between)))
