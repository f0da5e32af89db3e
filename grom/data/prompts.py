"""Prompt formatting: how a question becomes the text the model continues.

By default the tokenizer's chat template is used where it has one, else the plain
``Question: ...\\nAnswer: `` template. A benchmark or a config may fix another format
(e.g. the Llama-2 ``[INST] q [/INST]`` format of the TOFU Llama-2 models).
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TEMPLATE = "Question: {question}\nAnswer: "


@dataclass(frozen=True)
class PromptFormat:
    """How to turn a question into a prompt.

    kind: "auto" (chat template if the tokenizer has one, else `template`), "chat"
        (the tokenizer's chat template; an error if it has none) or "template".
    template: a str.format pattern with a ``{question}`` field, used for kind "template".
    system_prompt: a system message for chat templates (None: none).
    """

    kind: str = "auto"
    template: str = DEFAULT_TEMPLATE
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "chat", "template"):
            raise ValueError(f"prompt format kind {self.kind!r}: use 'auto', 'chat' or 'template'")
        if "{question}" not in self.template:
            raise ValueError("a prompt template needs a '{question}' field")


# The formats of the OpenUnlearning TOFU models, as in its configs/model/*.yaml
# (`apply_chat_template: false`: the tags are written out, so Llama-3.2's chat template, which
# adds "Cutting Knowledge Date ..." lines to the system message, is NOT what they were tuned
# on). The tokenizer adds the BOS token (OpenUnlearning's own string starts with
# <|begin_of_text|> and the tokenizer adds another; here there is one).
LLAMA3_CHAT = PromptFormat(
    kind="template",
    template=(
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    system_prompt="You are a helpful assistant.",
)
LLAMA2_INST = PromptFormat(kind="template", template="[INST] {question} [/INST]")
PLAIN_QA = PromptFormat(kind="template")
# The question is the prompt itself (a text prefix, a zsRE prompt); answers of such sets
# start with the separating space, so prompt + answer is the original text.
RAW_TEXT = PromptFormat(kind="template", template="{question}")


def uses_chat_template(tokenizer, fmt: PromptFormat | None) -> bool:
    fmt = fmt or PromptFormat()
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if fmt.kind == "chat" and not has_template:
        raise ValueError("this prompt format needs a chat template, and the tokenizer has none")
    return fmt.kind == "chat" or (fmt.kind == "auto" and has_template)


def format_prompt(tokenizer, question: str, fmt: PromptFormat | None = None) -> str:
    """The prompt text for `question`, ready to tokenize with ``add_special_tokens=False``
    when a chat template was used (the template writes its own BOS), else with them."""
    fmt = fmt or PromptFormat()
    if uses_chat_template(tokenizer, fmt):
        messages = []
        if fmt.system_prompt:
            messages.append({"role": "system", "content": fmt.system_prompt})
        messages.append({"role": "user", "content": question})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return fmt.template.format(question=question)


def encode_prompt(tokenizer, question: str, fmt: PromptFormat | None = None) -> list[int]:
    """Token ids of the formatted prompt, special tokens included exactly once."""
    text = format_prompt(tokenizer, question, fmt)
    chat = uses_chat_template(tokenizer, fmt)
    return list(tokenizer(text, add_special_tokens=not chat)["input_ids"])
