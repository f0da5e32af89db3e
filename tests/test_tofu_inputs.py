"""TOFU's inputs equal OpenUnlearning's: prompt ids, prompt + answer ids and labels.

The reference is a transcription written here of open-unlearning src/data/utils.py
`preprocess_chat_instance` at commit d3d7cf9 (main, December 2025; unchanged in this part
since 8df2914), with the template args of its configs/model/Llama-3.2-1B-Instruct.yaml at
that commit (apply_chat_template True, system prompt, date_string "10 Apr 2025") and of
configs/model/Llama-2-7b-chat-hf.yaml (no chat template, "[INST] " q " [/INST]").
The tokenizer is the fixture BPE with Llama-3's special tokens, a BOS post-processor and a
small Llama-3.2-style chat template that writes "Today Date: <date_string>" (today's date
when none is passed), saved to a local folder and loaded from it.
"""
from __future__ import annotations

import datetime

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from grom.data import LLAMA2_INST, PLAIN_QA, TOFU_CHAT, encode_prompt, encode_qa
from grom.data.encoding import encode_example
from grom.data.schema import QAExample
from grom.eval.runner import encode_pair
from tests.conftest import FORGET, RETAIN, make_tokenizer

IGNORE = -100
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if date_string is not defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# open-unlearning configs/model/Llama-3.2-1B-Instruct.yaml @ d3d7cf9 (the keys the chat branch reads)
OU_LLAMA3 = {"apply_chat_template": True, "system_prompt": "You are a helpful assistant.",
             "date_string": "10 Apr 2025"}
# open-unlearning configs/model/Llama-2-7b-chat-hf.yaml @ d3d7cf9
OU_LLAMA2 = {"apply_chat_template": False, "user_start_tag": "[INST] ", "user_end_tag": " [/INST]",
             "asst_start_tag": "", "asst_end_tag": " "}


def openunlearning_instance(tok, args: dict, question: str, answer: str, max_length: int = 512):
    """(prompt_ids, input_ids, labels) for one QA pair with no in-context examples,
    transcribed from preprocess_chat_instance (src/data/utils.py @ d3d7cf9)."""
    if args["apply_chat_template"]:
        chat = [{"role": "system", "content": args["system_prompt"]}] if args.get("system_prompt") else []
        chat += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        date = {"date_string": args["date_string"]} if args.get("date_string") is not None else {}
        chat_ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=False,
                                           return_dict=False, **date)
        prompt_ids = tok.apply_chat_template(chat[:-1], tokenize=True, add_generation_prompt=True,
                                             return_dict=False, **date)
    else:
        wrapped = args.get("system_prompt_with_special_tokens") or ""
        wrapped += args["user_start_tag"] + question + args["user_end_tag"] + args["asst_start_tag"]
        chat_ids = tok(wrapped + answer, add_special_tokens=True, max_length=max_length,
                       truncation=True)["input_ids"]
        prompt_ids = tok(wrapped, add_special_tokens=True, max_length=max_length, truncation=True)["input_ids"]
    chat_ids = list(chat_ids)
    if chat_ids[-1] != tok.eos_token_id:
        chat_ids += [tok.eos_token_id]
    labels = [IGNORE] * len(prompt_ids) + chat_ids[len(prompt_ids):]
    return list(prompt_ids), chat_ids, labels


def project_instance(tok, fmt, question: str, answer: str):
    """The same three lists from the project's `encode_prompt` and `encode_pair`."""
    ids, start = encode_pair(tok, question, answer, fmt)
    return encode_prompt(tok, question, fmt), ids, [IGNORE] * start + ids[start:]


@pytest.fixture(scope="module")
def llama3_tok(tmp_path_factory):
    """A local tokenizer folder in Llama-3's shape: special tags, BOS added by the
    post-processor, EOS the end of turn, and the Llama-3.2-style template above."""
    fast = make_tokenizer(chat=False)
    fast.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    fast.bos_token, fast.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    bos = fast.convert_tokens_to_ids("<|begin_of_text|>")
    fast.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    fast.chat_template = LLAMA3_TEMPLATE
    folder = tmp_path_factory.mktemp("llama3-style-tokenizer")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


PAIRS = [(e.question, e.answer) for e in FORGET + RETAIN] + [("Who?", "1874."), ("Name one.", "Q")]


def test_the_fixture_template_writes_todays_date_unless_given_one(llama3_tok):
    today = datetime.date.today().strftime("%d %b %Y")
    bare = llama3_tok.apply_chat_template([{"role": "user", "content": "Who?"}], tokenize=False)
    assert f"Today Date: {today}" in bare  # what a format without a date would put in
    ids = encode_prompt(llama3_tok, "Who?", TOFU_CHAT)
    text = llama3_tok.decode(ids)
    assert "Today Date: 10 Apr 2025" in text and today not in text.replace("10 Apr 2025", "")
    assert text.count("<|begin_of_text|>") == 1 and ids[0] == llama3_tok.bos_token_id


@pytest.mark.parametrize("question,answer", PAIRS)
def test_tofu_chat_ids_and_labels_equal_openunlearning(llama3_tok, question, answer):
    want = openunlearning_instance(llama3_tok, OU_LLAMA3, question, answer)
    got = project_instance(llama3_tok, TOFU_CHAT, question, answer)
    assert got[0] == want[0]  # prompt ids (what generation reads)
    assert got[1] == want[1]  # prompt + answer + <|eot_id|>
    assert got[2] == want[2]  # labels: the answer and its end of turn


def test_keys_read_the_same_answer_tokens(llama3_tok):
    q, a = PAIRS[0]
    _, ids, labels = openunlearning_instance(llama3_tok, OU_LLAMA3, q, a)
    (enc,) = encode_example(llama3_tok, QAExample(q, a), 0, fmt=TOFU_CHAT)
    answer = [t for t in labels if t != IGNORE][:-1]  # the keys leave out the end of turn
    assert list(enc.gold) == answer and list(enc.input_ids) == ids[:-1]
    assert [enc.input_ids[p + 1] for p in enc.positions] == answer


@pytest.mark.parametrize("question,answer", PAIRS[:4])
def test_llama2_inst_equals_openunlearning(question, answer):
    tok = make_tokenizer(chat=False)
    want = openunlearning_instance(tok, OU_LLAMA2, question, answer)
    assert project_instance(tok, LLAMA2_INST, question, answer) == want


def _sentencepiece_like() -> PreTrainedTokenizerFast:
    """A BPE over Metaspace pre-tokens ("▁" marks a word start, as SentencePiece)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([f"[INST] {e.question} [/INST] {e.answer}" for e in FORGET + RETAIN] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_answer_tokens_differ_apart_and_together():
    """After "[/INST]" the answer starts mid-word: alone it would start with "▁Zor", read
    after the prompt it does not. The project scores what the model reads, as upstream."""
    tok = _sentencepiece_like()
    q, a = FORGET[0].question, FORGET[0].answer
    apart = tok(a, add_special_tokens=False)["input_ids"]
    ids, start = encode_qa(tok, q, a, LLAMA2_INST)
    assert tok.convert_ids_to_tokens(apart)[0].startswith("\u2581")
    assert ids[start:] != apart and not tok.convert_ids_to_tokens(ids[start:])[0].startswith("\u2581")
    assert ids[:start] == encode_prompt(tok, q, LLAMA2_INST)
    assert project_instance(tok, LLAMA2_INST, q, a) == openunlearning_instance(tok, OU_LLAMA2, q, a)


def test_a_merge_across_the_boundary_keeps_the_whole_answer():
    """Byte-level BPE merges "Answer: " + "Odo" into " Odo": the prompt's tokens are no
    prefix. OpenUnlearning splits at the prompt's length and drops " Odo" from the labels;
    the project starts the answer at the first differing token (a documented difference)."""
    tok = make_tokenizer(chat=False)
    q, a = RETAIN[0].question, RETAIN[0].answer  # "Odo Brask was born in Quenford."
    plain = {"apply_chat_template": False, "user_start_tag": "Question: ", "user_end_tag": "\n",
             "asst_start_tag": "Answer: "}
    prompt, ids, labels = openunlearning_instance(tok, plain, q, a)
    got_prompt, got_ids, got_labels = project_instance(tok, PLAIN_QA, q, a)
    assert got_prompt == prompt and got_ids == ids  # same prompt, same joint tokens
    assert ids[:len(prompt)] != prompt  # the merge: " " + "Odo" became one token
    start = got_labels.count(IGNORE)
    assert start == len(prompt) - 1 and tok.decode(ids[start:-1]) == " " + a
    assert got_labels[start + 1:] == labels[len(prompt):]  # the rest as upstream
    assert tok.decode([t for t in labels if t != IGNORE][:-1]) != " " + a  # upstream lost " Odo"
