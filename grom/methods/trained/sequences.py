"""The training sequences of the gradient baselines and their per-sequence answer NLL.

QA items are the formatted prompt (grom.data.prompts, the same code as grom.data.encoding) followed
by the answer and the EOS token; the loss is on the answer tokens and EOS only (the prompt
is masked with -100), as OpenUnlearning's ``preprocess_chat_instance``. Text items are
plain LM on every token after the first. Choice items are QA on the correct option's
letter (grom.data.encoding.choice_question).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from grom.data.encoding import Encoded, encode_example, pad_id
from grom.data.prompts import PromptFormat
from grom.data.schema import TextExample, as_examples
from grom.methods.trained.losses import IGNORE_INDEX, sequence_nll
from grom.model.arch import model_device


def encode_chunk(tokenizer, text: str, max_length: int, i: int) -> list[Encoded]:
    """A corpus chunk (grom.methods.trained.recipes.chunk_texts) as one LM sequence, as
    OpenUnlearning's ``preprocess_pretraining_instance(tokenizer, "", chunk, max_length)``:
    tokenized with the special tokens, cut at ``len(tokenizer("")) + max_length`` tokens
    (the chunk's max_length after the BOS, if any), a loss on every token but the first.
    [] when that leaves no labelled token."""
    prefix = len(tokenizer("", add_special_tokens=True)["input_ids"])
    ids = tuple(tokenizer(text, add_special_tokens=True)["input_ids"])[:prefix + max_length]
    if len(ids) < 2:
        return []
    return [Encoded(ids, tuple(range(len(ids) - 1)), ids[1:], i)]


def encode_sequences(tokenizer, examples: Sequence, fmt: PromptFormat | None, max_length: int,
                     add_eos: bool = True, chunked: bool = False) -> list[Encoded]:
    """Training sequences of `examples`: QA on the answer (+ EOS), text as plain LM.

    Uses grom.data.encoding.encode_example ("qa" mode for QA / choice / fact examples, "corpus" for
    text), so prompts are formatted exactly as for GROM's forget keys; the EOS token is
    appended to QA answers as OpenUnlearning's ``preprocess_chat_instance`` does.
    chunked: the text examples are corpus chunks, each cut to one sequence (`encode_chunk`)
    instead of windowed.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    out: list[Encoded] = []
    for i, ex in enumerate(as_examples(examples)):
        text = isinstance(ex, TextExample)
        encoded = (encode_chunk(tokenizer, ex.text, max_length, i) if text and chunked else
                   encode_example(tokenizer, ex, i, mode="corpus" if text else "qa", fmt=fmt,
                                  max_length=max_length))
        for e in encoded:
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


def batch_logits(model: nn.Module, batch: LMBatch, params=None) -> torch.Tensor:
    """The model's logits on the batch, (B, T, V); `params` {name: tensor}: run with these
    weights in place of the model's (torch.func.functional_call), e.g. the unedited ones."""
    dev = model_device(model)
    kw = dict(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev), use_cache=False)
    if params is None:
        return model(**kw).logits
    return torch.func.functional_call(model, params, args=(), kwargs=kw).logits


def batch_forward(model: nn.Module, batch: LMBatch, params=None,
                  hidden: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits (B, T, V), hidden (B, T, d) or None): as `batch_logits`, and with `hidden` =
    l + 1 the output of decoder layer l (HF's ``hidden_states[l + 1]``; the last entry,
    after the final norm, is refused)."""
    if hidden is None:
        return batch_logits(model, batch, params), None
    dev = model_device(model)
    kw = dict(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
              use_cache=False, output_hidden_states=True)
    out = model(**kw) if params is None else torch.func.functional_call(model, params, args=(), kwargs=kw)
    if not 1 <= hidden < len(out.hidden_states) - 1:
        raise ValueError(f"layer {hidden - 1}: use a decoder layer from 0 to {len(out.hidden_states) - 3} "
                         "(the last one's output passes the final norm)")
    return out.logits, out.hidden_states[hidden]


def batch_nll(model: nn.Module, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of each sequence's label tokens and their number, (B,) each."""
    logits = batch_logits(model, batch)
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
