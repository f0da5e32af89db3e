"""Prompt formatting: how a question becomes the text the model continues.

By default the tokenizer's chat template is used where it has one, else the plain
``Question: ...\\nAnswer: `` template. A benchmark or a config may fix another format
(e.g. the Llama-2 ``[INST] q [/INST]`` format of the TOFU Llama-2 models).

`encode_qa` tokenises a prompt and its answer as ONE string and splits it where the
prompt's tokens end, as OpenUnlearning does (src/data/utils.py `preprocess_chat_instance`),
so the answer's first token is the one the model sees after its prompt (SentencePiece and
byte-level BPE may merge the boundary: "[/INST]" + "Paris", "Answer: " + "He").

A chat template is code that comes with the model, and it runs while the device is held:
each prompt is rendered once per tokenizer (later calls reuse the text), and a template
that takes too long or writes too much is refused (`TemplateError`) and not run again.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TEMPLATE = "Question: {question}\nAnswer: "
MAX_TEMPLATE_CHARS = 64 * 1024  # what a chat template may add to the question and system prompt
MAX_RENDER_SECONDS = 0.05  # CPU seconds per render (real templates: well under a millisecond)
FIRST_RENDER_SECONDS = 0.25  # the first render of a template also compiles it (~5 ms)
RENDER_TRIES = 3  # a template is refused only when each of this many renders of a prompt is over the limit
CACHE_CHARS = 32 * 2**20  # rendered prompts kept per tokenizer


class TemplateError(ValueError):
    """The tokenizer's chat template is too slow or writes too much to be used."""


@dataclass(frozen=True)
class PromptFormat:
    """How to turn a question into a prompt.

    kind: "auto" (chat template if the tokenizer has one, else `template`), "chat"
        (the tokenizer's chat template; an error if it has none) or "template".
    template: a str.format pattern with a ``{question}`` field, used for kind "template".
    system_prompt: a system message for chat templates (None: none).
    date_string: passed to the chat template as ``date_string`` (Llama-3.x templates write
        "Today Date: ..." into the system message, TODAY's date when it is not given, so a
        fixed one keeps prompts the same from day to day); None: not passed.
    """

    kind: str = "auto"
    template: str = DEFAULT_TEMPLATE
    system_prompt: str | None = None
    date_string: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "chat", "template"):
            raise ValueError(f"prompt format kind {self.kind!r}: use 'auto', 'chat' or 'template'")
        if "{question}" not in self.template:
            raise ValueError("a prompt template needs a '{question}' field")


# OpenUnlearning's TOFU model Llama-3.2-1B-Instruct, PINNED to its main branch from commit
# 8df2914 (2025-04-24, "bunch of tokenization related bug-fixes") to the December 2025 head
# d3d7cf9: configs/model/Llama-3.2-1B-Instruct.yaml has `apply_chat_template: True`, the
# system prompt "You are a helpful assistant." and `date_string: 10 Apr 2025`, and
# src/data/utils.py renders the chat template with that date. OpenUnlearning's released
# retain-model logs (open-unlearning/eval on the Hub) and the leaderboard were recomputed in
# that commit, and the OpenUnlearning paper (June 2025) and GROM's tables compare with them.
# "auto": a model without a chat template gets the plain template instead; templates that
# take no date ignore it. The same args are in its Llama-3.1-8B / 3.2-3B configs.
TOFU_CHAT = PromptFormat(kind="auto", system_prompt="You are a helpful assistant.",
                         date_string="10 Apr 2025")
# The tags written out with no chat template and no date (`apply_chat_template: false`):
# a contributor's branch of OpenUnlearning (commit 0807fe7, 2025-04-17, never merged into
# main) and a stored copy of the same file (9ee254d). Kept for models tuned on those strings; NOT what
# OpenUnlearning's main branch or its logs use (that is TOFU_CHAT). The tokenizer adds the
# BOS token (OpenUnlearning's own string starts with <|begin_of_text|> and its tokenizer adds
# another; here there is one).
LLAMA3_CHAT = PromptFormat(
    kind="template",
    template=(
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    system_prompt="You are a helpful assistant.",
)
# OpenUnlearning's configs/model/Llama-2-7b-chat-hf.yaml: "[INST] " + q + " [/INST]", the
# answer right after "]" (asst_start_tag "").
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


class _Renders:
    """The chat-template renders of one tokenizer's template: (question, system prompt,
    date string) -> text, least recently used first, at most CACHE_CHARS characters in all."""

    def __init__(self, template: str):
        self.template = template
        self.texts: OrderedDict[tuple[str, str | None, str | None], str] = OrderedDict()
        self.chars = 0
        self.rendered = 0
        self.refused: str | None = None
        self.lock = threading.Lock()

    def get(self, key) -> str | None:
        with self.lock:
            text = self.texts.get(key)
            if text is not None:
                self.texts.move_to_end(key)
            return text

    def put(self, key, text: str) -> None:
        with self.lock:
            self.rendered += 1
            if key not in self.texts:
                self.texts[key] = text
                self.chars += len(text)
            while self.chars > CACHE_CHARS and len(self.texts) > 1:
                self.chars -= len(self.texts.popitem(last=False)[1])


_RENDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> _Renders
_RENDERS_LOCK = threading.Lock()


def _renders(tokenizer) -> _Renders:
    with _RENDERS_LOCK:
        renders = _RENDERS.get(tokenizer)
        if renders is None or renders.template != tokenizer.chat_template:  # a new template
            renders = _RENDERS[tokenizer] = _Renders(tokenizer.chat_template)
        return renders


def render_chat(tokenizer, question: str, system_prompt: str | None = None,
                date_string: str | None = None) -> str:
    """The tokenizer's chat template applied to `question` (rendered once, then reused),
    with ``date_string`` passed to the template where given.
    Raises TemplateError when the template takes more than MAX_RENDER_SECONDS of CPU time
    (FIRST_RENDER_SECONDS for its first render) in each of RENDER_TRIES renders of the prompt,
    or adds more than MAX_TEMPLATE_CHARS."""
    renders, key = _renders(tokenizer), (question, system_prompt, date_string)
    if renders.refused:
        raise TemplateError(renders.refused)
    text = renders.get(key)
    if text is not None:
        return text
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    extra = {} if date_string is None else {"date_string": date_string}
    limit = MAX_RENDER_SECONDS if renders.rendered else FIRST_RENDER_SECONDS
    for _ in range(RENDER_TRIES):  # a render over the limit is timed again: a garbage collection or
        start = time.thread_time()  # a descheduled core can stretch one; a slow template is slow each time
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
        seconds = time.thread_time() - start  # this thread's CPU time: other threads' load does not count
        if seconds <= limit:
            break
    added = len(text) - len(question) - len(system_prompt or "")
    if seconds > limit or added > MAX_TEMPLATE_CHARS:
        renders.refused = _refusal(seconds, limit, added)
        raise TemplateError(renders.refused)
    renders.put(key, text)
    return text


def _refusal(seconds: float, limit: float, added: int) -> str:
    what = (f"took {seconds:.2f} s of CPU time for one prompt" if seconds > limit
            else f"wrote {added:,} characters around one question")
    return (f"The model's chat template {what} (the limits: {limit:g} s, {MAX_TEMPLATE_CHARS:,} "
            "characters), so it is refused. Use a model with an ordinary chat template, or a "
            "plain prompt format (PromptFormat kind 'template').")


def format_prompt(tokenizer, question: str, fmt: PromptFormat | None = None) -> str:
    """The prompt text for `question`, ready to tokenize with ``add_special_tokens=False``
    when a chat template was used (the template writes its own BOS), else with them."""
    fmt = fmt or PromptFormat()
    if uses_chat_template(tokenizer, fmt):
        return render_chat(tokenizer, question, fmt.system_prompt, fmt.date_string)
    return fmt.template.format(question=question)


def encode_prompt(tokenizer, question: str, fmt: PromptFormat | None = None) -> list[int]:
    """Token ids of the formatted prompt, special tokens included exactly once."""
    text = format_prompt(tokenizer, question, fmt)
    chat = uses_chat_template(tokenizer, fmt)
    return list(tokenizer(text, add_special_tokens=not chat)["input_ids"])


def encode_qa(tokenizer, question: str, answer: str, fmt: PromptFormat | None = None) -> tuple[list[int], int]:
    """(ids, start): the formatted prompt and `answer` tokenised as ONE string, and where
    the answer's tokens begin (its labels are ids[start:]; no EOS is added here).

    As OpenUnlearning (src/data/utils.py `preprocess_chat_instance`, commit d3d7cf9):
    prompt + answer are tokenised together and split at the prompt's own token count, so
    the model reads the tokens it was tuned on. After a chat template the answer is
    stripped, as Llama-3's template writes the assistant turn (``content | trim``); the
    template's end of turn is the EOS the callers add (`grom.eval.runner.encode_pair`).

    Deliberate difference: where the joint tokens do not start with the prompt's tokens (a
    merge across the boundary, e.g. byte-level BPE on "Answer: " + "He" gives " He"),
    OpenUnlearning still splits at the prompt's length and so drops the merged token from
    the labels (its "Tokenization mismatch" warning); here the answer starts at the first
    token that differs, so all of its text is scored. Where the prompt's tokens are a
    prefix (chat templates, whose prompts end in a special token or "\n\n"), the two agree.
    """
    text = format_prompt(tokenizer, question, fmt)
    chat = uses_chat_template(tokenizer, fmt)
    if chat:
        answer = answer.strip()
    prompt = list(tokenizer(text, add_special_tokens=not chat)["input_ids"])
    ids = list(tokenizer(text + answer, add_special_tokens=not chat)["input_ids"])
    start = 0
    while start < min(len(prompt), len(ids)) and prompt[start] == ids[start]:
        start += 1
    return ids, start


def settings_from_dict(cls, d: Mapping, tuples: tuple[str, ...] = ()):
    """A frozen settings dataclass `cls` from what its ``to_dict`` wrote: a key that is no field
    is refused (ValueError naming it), the fields `tuples` read back as tuples, a prompt format
    as a `PromptFormat` (`to_dict` writes every field as JSON does)."""
    d = dict(d)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    for key in tuples:
        if d.get(key) is not None:
            d[key] = tuple(d[key])
    if isinstance(d.get("prompt_format"), Mapping):
        d["prompt_format"] = PromptFormat(**d["prompt_format"])
    return cls(**d)
