"""Benchmarks for GROM: one schema, prompt formats, and `load_benchmark` for the bundled
demo and real-knowledge benchmarks, TOFU, MUSE, WMDP, zsRE and a user's own files."""
from grom.data.custom import load_custom_file
from grom.data.knowledge import load_knowledge
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
    "get_spec", "load_benchmark", "load_custom_file", "load_knowledge",
]
