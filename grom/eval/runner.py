"""Running the model for the metrics: teacher-forced answer scores (right padding) and
greedy generations (left padding), batched, on whatever device the model is on.

These functions only produce the inputs of the pure metric functions in
`grom.eval.metrics`: per-token log-probabilities and argmax predictions of an answer
after its prompt, generated text, and the log-probabilities of lettered options.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from grom.arch import model_device
from grom.data.prompts import PromptFormat, encode_prompt
from grom.keys import answer_letter, choice_question, pad_id


@dataclass(frozen=True)
class TokenScores:
    """One answer scored teacher-forced: each label token's log-probability under the
    model and whether the model's argmax predicted it."""

    logprobs: np.ndarray  # (T,) float64
    correct: np.ndarray  # (T,) bool
    predicted: np.ndarray  # (T,) int64, the argmax token at each answer position
    labels: np.ndarray  # (T,) int64

    @property
    def avg_loss(self) -> float:
        """Mean negative log-likelihood per answer token (TOFU's length normalisation)."""
        return float(-self.logprobs.mean()) if len(self.logprobs) else float("nan")


def _eos_ids(model, tokenizer) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_pair(tokenizer, prompt: str, answer: str, fmt: PromptFormat | None,
                add_eos: bool = True, max_length: int = 1024) -> tuple[list[int], int]:
    """(ids, start): the formatted prompt followed by the answer tokens (and EOS, as TOFU
    scores it); the answer's label tokens are ids[start:]. Long prompts lose their start."""
    p = encode_prompt(tokenizer, prompt, fmt)
    a = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if add_eos and tokenizer.eos_token_id is not None:
        a.append(tokenizer.eos_token_id)
    a = a[: max_length - 1]
    p = p[-(max_length - len(a)):]
    return p + a, len(p)


def _final_hidden(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The last hidden state (after the final norm), so the LM head is applied only at the
    positions that are scored: a full (B, T, vocab) logit tensor of a 128k-vocab model
    would not fit."""
    out = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


@torch.no_grad()
def score_sequences(model: nn.Module, tokenizer, sequences: Sequence[tuple[list[int], int]],
                    batch_size: int = 32) -> list[TokenScores]:
    """Teacher-forced scores of ids[start:] for each (ids, start), right-padded batches,
    longest first (less padding)."""
    device = model_device(model)
    head = model.get_output_embeddings()
    pad = pad_id(tokenizer)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    out: list[TokenScores | None] = [None] * len(sequences)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
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
        hidden = _final_hidden(model, ids.to(device), mask.to(device))
        rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        logits = head(hidden[rows_t, cols_t].to(head.weight.device)).float()
        logp = torch.log_softmax(logits, dim=-1)
        lab = torch.tensor(labels, device=logits.device)
        tok_lp = logp.gather(1, lab[:, None])[:, 0].double().cpu().numpy()
        pred = logits.argmax(-1).cpu().numpy()
        lab_np = lab.cpu().numpy()
        at = 0
        for r, i in enumerate(idx):
            seq, start = sequences[i]
            n = len(seq) - start
            sl = slice(at, at + n)
            out[i] = TokenScores(tok_lp[sl], pred[sl] == lab_np[sl], pred[sl], lab_np[sl])
            at += n
    return out  # type: ignore[return-value]


def score_answers(model: nn.Module, tokenizer, pairs: Sequence[tuple[str, str]], *,
                  prompt_format: PromptFormat | None = None, add_eos: bool = True,
                  batch_size: int = 32, max_length: int = 1024) -> list[TokenScores]:
    """Teacher-forced scores of each answer after its formatted question."""
    seqs = [encode_pair(tokenizer, q, a, prompt_format, add_eos, max_length) for q, a in pairs]
    return score_sequences(model, tokenizer, seqs, batch_size)


def score_texts(model: nn.Module, tokenizer, texts: Sequence[str], *, batch_size: int = 16,
                max_length: int = 1024) -> list[TokenScores]:
    """Every token of each text after the first (MIA scores on raw documents)."""
    seqs = []
    for t in texts:
        ids = list(tokenizer(t, add_special_tokens=True)["input_ids"])[:max_length]
        seqs.append((ids, 1) if len(ids) >= 2 else (ids + [pad_id(tokenizer)], 1))
    return score_sequences(model, tokenizer, seqs, batch_size)


@torch.no_grad()
def generate(model: nn.Module, tokenizer, prompts: Sequence[str], *,
             prompt_format: PromptFormat | None = None, max_new_tokens: int = 64,
             batch_size: int = 32, max_length: int = 1024) -> list[str]:
    """Greedy continuations of the formatted prompts (left padding; stops at EOS)."""
    device = model_device(model)
    pad = pad_id(tokenizer)
    eos = _eos_ids(model, tokenizer)
    encoded = [encode_prompt(tokenizer, p, prompt_format)[-(max_length - max_new_tokens):]
               for p in prompts]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    out: list[str] = [""] * len(encoded)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            n = len(encoded[i])
            ids[r, width - n:] = torch.tensor(encoded[i])
            mask[r, width - n:] = 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=eos or None, temperature=None, top_p=None, top_k=None)
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        for r, i in enumerate(idx):
            out[i] = texts[r].strip()
    return out


def answer_budget(tokenizer, answers: Sequence[str], cap: int = 200) -> int:
    """New tokens to generate for a set: room for its longest reference answer plus a
    margin, at most `cap` (OpenUnlearning generates up to 200 and stops at EOS; a model
    that stops at EOS gives the same text, one that rambles is cut where ROUGE-L recall
    no longer changes)."""
    longest = max((len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers), default=16)
    return int(min(cap, 2 * longest + 16))


def choice_logprobs(model: nn.Module, tokenizer, examples, *,
                    prompt_format: PromptFormat | None = None, batch_size: int = 32) -> np.ndarray:
    """(N, max options) log-likelihood of each option's letter after the standard lettered
    prompt ("...\\nAnswer:"), -inf where an item has fewer options.

    The letter is `grom.keys.answer_letter` (" A" after a plain prompt, as the
    lm-evaluation-harness scores WMDP and MMLU; "A" after a chat template), the same
    answer GROM's keys and the baselines train on; its tokens' log-probabilities are
    summed (one token with most tokenizers)."""
    width = max(len(ex.choices) for ex in examples)
    letters = [tokenizer(answer_letter(tokenizer, prompt_format, i), add_special_tokens=False)["input_ids"]
               for i in range(width)]
    seqs, where = [], []
    for n, ex in enumerate(examples):
        prompt = encode_prompt(tokenizer, choice_question(ex), prompt_format)
        for i in range(len(ex.choices)):
            seqs.append((prompt + letters[i], len(prompt)))
            where.append((n, i))
    out = np.full((len(examples), width), -np.inf)
    for (n, i), s in zip(where, score_sequences(model, tokenizer, seqs, batch_size)):
        out[n, i] = s.logprobs.sum()
    return out
