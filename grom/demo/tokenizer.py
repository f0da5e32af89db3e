"""The demo tokenizer: a small byte-level BPE trained on the world, with a chat template.

Byte-level BPE decodes back to the exact text (spaces and punctuation included), so
edited models still read normally. The tokenizer adds `<|bos|>` when asked for special
tokens (like Llama's) and carries a chat template, so the demo model goes through the
same prompt code (`grom.data.prompts`) as real chat models.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from grom.demo.world import World

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS) + ROLES
VOCAB_SIZE = 1024

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<|assistant|>{{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def world_texts(world: World):
    """Every piece of text in the world, for training the BPE merges."""
    for author in world.authors:
        yield author.bio
        for qa in author.qa:
            yield from (qa.question, qa.answer, qa.paraphrased_question, qa.paraphrased_answer)
    for qa in world.real_authors + world.world_facts:
        yield from (qa.question, qa.answer)


def train_bpe(world: World, vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A raw `tokenizers.Tokenizer` (byte-level BPE) trained on the world's text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(world_texts(world), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def build_tokenizer(world: World, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The Hugging Face fast tokenizer of the demo (BOS/EOS/PAD set, chat template)."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(world, vocab_size),
        bos_token=BOS, eos_token=EOS, pad_token=PAD,
        extra_special_tokens=list(ROLES), clean_up_tokenization_spaces=False,
        model_max_length=512)
    tok.chat_template = CHAT_TEMPLATE
    return tok
