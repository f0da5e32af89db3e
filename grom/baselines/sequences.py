"""The training sequences of the gradient baselines and their per-sequence answer NLL.

QA items are the formatted prompt (grom.data.prompts, the same code as grom.keys) followed
by the answer and the EOS token; the loss is on the answer tokens and EOS only (the prompt
is masked with -100), as OpenUnlearning's ``preprocess_chat_instance``. Text items are
plain LM on every token after the first. Choice items are QA on the correct option's
letter (grom.keys.choice_question).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from grom.arch import model_device
from grom.baselines.losses import IGNORE_INDEX, sequence_nll
from grom.data.prompts import PromptFormat
from grom.data.schema import TextExample, as_examples
from grom.keys import Encoded, encode_example, pad_id


def encode_sequences(tokenizer, examples: Sequence, fmt: PromptFormat | None, max_length: int,
                     add_eos: bool = True) -> list[Encoded]:
    """Training sequences of `examples`: QA on the answer (+ EOS), text as plain LM.

    Uses grom.keys.encode_example ("qa" mode for QA / choice / fact examples, "corpus" for
    text), so prompts are formatted exactly as for GROM's forget keys; the EOS token is
    appended to QA answers as OpenUnlearning's ``preprocess_chat_instance`` does.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    out: list[Encoded] = []
    for i, ex in enumerate(as_examples(examples)):
        text = isinstance(ex, TextExample)
        for e in encode_example(tokenizer, ex, i, mode="corpus" if text else "qa", fmt=fmt,
                                max_length=max_length):
            if (add_eos and not text and eos is not None and e.gold[-1] != eos
                    and len(e.input_ids) < max_length):
                e = Encoded(e.input_ids + (int(eos),), e.positions + (len(e.input_ids) - 1,),
                            e.gold + (int(eos),), e.example)
            out.append(e)
    return out


@dataclass
class LMBatch:
    """A right-padded batch with HF-style (unshifted) labels, -100 where there is no loss."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T)


def collate(encoded: Sequence[Encoded], pad: int) -> LMBatch:
    T = max(len(e.input_ids) for e in encoded)
    ids = torch.full((len(encoded), T), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), T), dtype=torch.long)
    labels = torch.full((len(encoded), T), IGNORE_INDEX, dtype=torch.long)
    for b, e in enumerate(encoded):
        ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[b, : len(e.input_ids)] = 1
        labels[b, torch.tensor(e.positions) + 1] = torch.tensor(e.gold)
    return LMBatch(ids, mask, labels)


def batch_nll(model: nn.Module, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of each sequence's label tokens and their number, (B,) each."""
    dev = model_device(model)
    logits = model(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
                   use_cache=False).logits
    return sequence_nll(logits, batch.labels.to(logits.device))


def answer_nll(model: nn.Module, tokenizer, examples: Sequence, *, prompt_format=None,
               batch_size: int = 8, max_length: int = 512, add_eos: bool = True) -> float:
    """Token-mean NLL of the examples' answers (the baselines' training loss), no grad."""
    enc = encode_sequences(tokenizer, examples, prompt_format, max_length, add_eos)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(enc), batch_size):
            nll, n = batch_nll(model, collate(enc[i:i + batch_size], pad_id(tokenizer)))
            total, count = total + float(nll.double().sum()), count + int(n.sum())
    return total / max(count, 1)
