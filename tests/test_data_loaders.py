"""The registry: names, splits, aliases and options are validated with helpful messages."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import grom.data as data
from grom.data import BENCHMARKS, BenchmarkError, get_spec, load_benchmark
from grom.data.loaders import register_benchmark
from grom.data.prompts import LLAMA2_INST, LLAMA3_CHAT, PLAIN_QA, format_prompt


def test_every_benchmark_is_registered_with_its_splits():
    assert list(BENCHMARKS) == ["demo", "real-knowledge", "name-only", "tofu", "muse-news", "muse-books", "wmdp-bio",
                                "wmdp-chem", "wmdp-cyber", "zsre", "custom"]
    assert BENCHMARKS["name-only"].splits == BENCHMARKS["real-knowledge"].splits[:-1]  # the subjects, not forget3
    assert BENCHMARKS["demo"].splits == ("forget01", "forget05", "forget10", "forget10-mc", "forget10-text")
    assert BENCHMARKS["tofu"].splits == ("forget01", "forget05", "forget10")
    assert get_spec(" TOFU ") is BENCHMARKS["tofu"]


def test_the_registry_is_read_only_and_refuses_a_second_name():
    with pytest.raises(TypeError):
        BENCHMARKS["mine"] = BENCHMARKS["tofu"]  # type: ignore[index]
    with pytest.raises(ValueError, match="'tofu' is already registered"):
        register_benchmark(BENCHMARKS["tofu"])


def test_data_imports_neither_the_demo_nor_the_metrics():
    """grom.data sits below grom.demo and grom.eval: the demo registers itself, the text
    normalisation both need lives in grom.text."""
    for path in (Path(data.__file__).parent).glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in names if m.startswith(("grom.demo", "grom.eval", "grom.methods"))], path


def test_the_demo_is_registered_when_only_grom_data_is_imported():
    code = ("from grom.data import BENCHMARKS, load_benchmark\n"
            "b = load_benchmark('demo', 'forget01')\n"
            "print(next(iter(BENCHMARKS)), b.name, len(b.forget))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(data.__file__).parents[2]).stdout.split()
    assert out == ["demo", "demo-authors", "40"]


def test_an_unknown_benchmark_lists_the_known_ones():
    with pytest.raises(BenchmarkError,
                       match=r"unknown benchmark 'tofu2'; known: demo, real-knowledge, name-only, tofu, muse-news"):
        load_benchmark("tofu2", "forget10")


def test_an_unknown_split_lists_the_valid_ones():
    with pytest.raises(BenchmarkError,
                       match=r"tofu: unknown split 'forget20'; valid splits: forget01, forget05, forget10"):
        load_benchmark("tofu", "forget20")


def test_an_unknown_option_lists_the_accepted_ones():
    with pytest.raises(BenchmarkError, match=r"tofu: unknown option\(s\) retain; it takes: prompt_format"):
        load_benchmark("tofu", "forget10", retain="wikitext")
    with pytest.raises(BenchmarkError, match=r"demo: unknown option\(s\) prompt_format; it takes: none"):
        load_benchmark("demo", "forget10", prompt_format=None)


def test_benchmark_error_is_a_value_error():
    assert issubclass(BenchmarkError, ValueError)
    assert {"load_benchmark", "BENCHMARKS", "QAExample", "PromptFormat"} <= set(data.__all__)


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
