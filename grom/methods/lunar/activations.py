"""LUNAR's forward passes: the prompts' tokens, the down_proj rows it fits, and the
refusal direction.

Upstream (facebookresearch/LUNAR, commit dfa56eb0291a93e967284a9ec2d28d5572d235b1):

- every prompt is the instruction alone in the chat template, up to the assistant turn
  (`instructions_only=True`; `tokenize_instructions_fn`), no answer;
- the direction (`src/generate_directions.py` `get_mean_diff`, `run_lunar.py`): a forward
  pre-hook on decoder block l+1 reads its input, i.e. the residual stream after block l
  (`candidate_directions[positions, layer_index + 1]`, "+1 because direction is calculated
  using pre-hook"), at the prompt's last token (`positions: -1`, the last end-of-instruction
  token), accumulated in float64; the direction is the mean over the refusal prompts
  (grom.methods.lunar.direction_prompts) minus the mean over the forget prompts;
- the rows it fits (`src/hook_for_unlearn.py` `get_activations`, one prompt a batch): at
  EVERY token of each forget and retain prompt, the input of block l's mlp.down_proj and
  the MLP's contribution to the residual, read as block l's output minus the input of its
  post_attention_layernorm (for Llama, exactly down_proj's output).

Here one right-padded forward pass per batch reads all three with hooks (the padding is
masked, so every real token reads what upstream's unpadded pass reads), up to block l
(`stop_after`). The MLP's contribution is read as down_proj's output times the model's
residual gain (`grom.model.arch.residual_gain`: 1 for Llama, Granite's multiplier), which
is upstream's difference without its rounding; a model that normalises its MLP output
before the residual add (OLMo2, Gemma2) has no such gain and is refused by the method.
Keys use the shared encoding (grom.data.encoding.Encoded / make_batches, the same hooks as
grom.closed_form.collect): only their positions differ from GROM's (every prompt token, not
the answer-predicting ones).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from grom.closed_form.collect import forward
from grom.data.encoding import Encoded, make_batches
from grom.data.encoding import question_of as example_question
from grom.data.prompts import PromptFormat, encode_prompt
from grom.data.schema import TextExample
from grom.model.arch import decoder_layers, edited_matrix
from grom.model.hooks import capture_inputs, capture_outputs, stop_after
from grom.turns import Between, give


def instruction_of(example) -> str:
    """The instruction LUNAR reads from an example: a QA question, a fact's prompt, a
    multiple-choice question with its options; a plain string is its own instruction. A
    text corpus has no instruction (TypeError)."""
    if isinstance(example, str):
        return example
    question = example_question(example)
    if question is not None:
        return question
    if isinstance(example, TextExample):
        raise TypeError("LUNAR redirects the activations of questions (instructions); a text corpus has none")
    raise TypeError(f"LUNAR cannot read an instruction from a {type(example).__name__}")


def encode_instructions(tokenizer, examples: Sequence, fmt: PromptFormat | None = None,
                        max_length: int = 512) -> list[Encoded]:
    """Each example's formatted prompt (the question alone, as `encode_prompt` writes it:
    the chat template up to the assistant turn where the model has one), its last
    `max_length` tokens, with a key at every token (the gold tokens are unused: 0)."""
    out = []
    for i, ex in enumerate(examples):
        ids = encode_prompt(tokenizer, instruction_of(ex), fmt)[-max_length:]
        out.append(Encoded(tuple(ids), tuple(range(len(ids))), (0,) * len(ids), i))
    return out


@dataclass
class Activations:
    """What one set of prompts gives at block `layer`.

    keys: down_proj's input at every prompt token, (N, n) in the model's dtype (rows in
    prompt order, tokens in order, as upstream concatenates them); outputs: down_proj's
    output there, (N, m); last: block `layer`'s output (the residual stream after it) at
    each prompt's last token, (P, d) float64; example: each row's prompt, (N,)."""

    keys: torch.Tensor | None
    outputs: torch.Tensor | None
    last: torch.Tensor
    example: torch.Tensor


def last_rows(example: torch.Tensor) -> torch.Tensor:
    """The index of each prompt's last row, for rows grouped by prompt in token order."""
    change = torch.ones_like(example, dtype=torch.bool)
    change[:-1] = example[1:] != example[:-1]
    return torch.nonzero(change).flatten()


def read_activations(model: nn.Module, encoded: Sequence[Encoded], layer: int, pad_id: int,
                     batch_size: int = 16, keys: bool = True, between: Between | None = None) -> Activations:
    """`Activations` of the prompts `encoded` at block `layer` (keys=False: the last-token
    residual alone, for the direction), on CPU. between: a step boundary (`grom.turns`)
    between two batches (nothing here changes the model)."""
    block = decoder_layers(model)[layer]
    down = model.get_submodule(edited_matrix(model, "down_proj", layer).module_name)
    ks, outs, resid, example = [], [], [], []
    with torch.no_grad():
        for b, batch in enumerate(make_batches(list(encoded), batch_size, pad_id)):
            if b:
                give(between)
            with capture_inputs(down, batch.select) as k, capture_outputs(down, batch.select) as o, \
                    capture_outputs(block, batch.select) as h, stop_after(block):
                forward(model, batch)
            if keys:
                ks.extend(x.cpu() for x in k)
                outs.extend(x.cpu() for x in o)
            resid.append(h[0].cpu()[last_rows(batch.example)])
            example.append(batch.example)
    return Activations(torch.cat(ks) if keys else None, torch.cat(outs) if keys else None,
                       torch.cat(resid).double(), torch.cat(example))


def refusal_direction(refusal_last: torch.Tensor, forget_last: torch.Tensor) -> torch.Tensor:
    """Upstream's `get_mean_diff` at one block and position: the mean residual over the
    refusal prompts minus the mean over the forget prompts, (d,) float64."""
    return refusal_last.double().mean(0) - forget_last.double().mean(0)
