"""Benchmarks for GROM: one schema, prompt formats, readers, the benchmark registry and
`load_benchmark` for the bundled demo and real-knowledge benchmarks, TOFU, MUSE, WMDP, zsRE
and a user's own files. Each benchmark's loader lives with its task, in grom/tasks/<name>.py
(which registers it here); the bundled real-knowledge files are package data in knowledge/."""
from grom.data.loaders import BENCHMARKS, BenchmarkSpec, get_spec, load_benchmark
from grom.data.prompts import (
    LLAMA2_INST,
    LLAMA3_CHAT,
    PLAIN_QA,
    RAW_TEXT,
    TOFU_CHAT,
    PromptFormat,
    encode_prompt,
    encode_qa,
    format_prompt,
)
from grom.data.readers import MAX_FILE_BYTES, BenchmarkError
from grom.data.schema import (
    Benchmark,
    ChoiceExample,
    Example,
    FactRecord,
    QAExample,
    TextExample,
    as_examples,
)

__all__ = [
    "BENCHMARKS", "Benchmark", "BenchmarkError", "BenchmarkSpec", "ChoiceExample", "Example",
    "FactRecord", "LLAMA2_INST", "LLAMA3_CHAT", "MAX_FILE_BYTES", "PLAIN_QA", "PromptFormat",
    "QAExample", "RAW_TEXT", "TOFU_CHAT", "TextExample", "as_examples", "encode_prompt", "encode_qa",
    "format_prompt",
    "get_spec", "load_benchmark",
]
