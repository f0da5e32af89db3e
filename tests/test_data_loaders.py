"""The registry: names, splits, aliases and options are validated with helpful messages."""
from __future__ import annotations

import pytest

import grom.data as data
from grom.data import BENCHMARKS, BenchmarkError, get_spec, load_benchmark
from grom.data.prompts import LLAMA2_INST, LLAMA3_CHAT, PLAIN_QA, format_prompt


def test_every_benchmark_is_registered_with_its_splits():
    assert list(BENCHMARKS) == ["demo", "real-knowledge", "tofu", "muse-news", "muse-books", "wmdp-bio", "wmdp-chem",
                                "wmdp-cyber", "zsre", "custom"]
    assert BENCHMARKS["demo"].splits == ("forget01", "forget05", "forget10", "forget10-mc", "forget10-text")
    assert BENCHMARKS["tofu"].splits == ("forget01", "forget05", "forget10")
    assert get_spec(" TOFU ") is BENCHMARKS["tofu"]


def test_an_unknown_benchmark_lists_the_known_ones():
    with pytest.raises(BenchmarkError, match=r"unknown benchmark 'tofu2'; known: demo, real-knowledge, tofu, muse-news"):
        load_benchmark("tofu2", "forget10")


def test_an_unknown_split_lists_the_valid_ones():
    with pytest.raises(BenchmarkError, match=r"tofu: unknown split 'forget20'; valid splits: forget01, forget05, forget10"):
        load_benchmark("tofu", "forget20")


def test_an_unknown_option_lists_the_accepted_ones():
    with pytest.raises(BenchmarkError, match=r"tofu: unknown option\(s\) retain; it takes: prompt_format"):
        load_benchmark("tofu", "forget10", retain="wikitext")
    with pytest.raises(BenchmarkError, match=r"demo: unknown option\(s\) prompt_format; it takes: none"):
        load_benchmark("demo", "forget10", prompt_format=None)


def test_benchmark_error_is_a_value_error():
    assert issubclass(BenchmarkError, ValueError)
    assert {"load_benchmark", "BENCHMARKS", "QAExample", "PromptFormat", "load_custom_file"} <= set(data.__all__)


class _Tok:
    chat_template = "{{ messages }}"


def test_the_openunlearning_prompt_strings():
    """As in open-unlearning configs/model/Llama-3.2-1B-Instruct.yaml and Llama-2-7b-chat-hf.yaml."""
    assert format_prompt(_Tok(), "Who?", LLAMA3_CHAT) == (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert format_prompt(_Tok(), "Who?", LLAMA2_INST) == "[INST] Who? [/INST]"
    assert format_prompt(_Tok(), "Who?", PLAIN_QA) == "Question: Who?\nAnswer: "
