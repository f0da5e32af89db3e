"""Issue 36, item 4: what a visitor may load on a public host. The start model is pinned
(no visitor's load unloads it, whatever GROM_RESIDENT_MODELS), a Space allows only the
studio's small set unless its host widens it (GROM_MODELS), a visitor's free choice is
sized from its config.json before any weight is downloaded (GROM_MAX_MODEL_PARAMS), and a
download holds no lock: another visitor's request is answered meanwhile.

The size estimate is checked against the parameter count of models built here (tiny ones
with weights, real-sized ones on the meta device). The Hub cannot be reached here: its
path is tested with the download functions of grom.model.loading serving local files and
recording every call. Then gradio_client against the app on the bundled demo model, the
server's memory (`rss`) measured around the hostile requests.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

from components.server import limits  # noqa: E402
from components.server import model_choices as core_models  # noqa: E402
from components.server.session import REGISTRY, ModelKey, ModelRegistry  # noqa: E402
from grom.demo import load_demo_model  # noqa: E402
from grom.model import loading as grom_models  # noqa: E402
from grom.model.loading import ModelLoadError, config_params, model_size  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.conftest import tiny_gpt2, tiny_llama, tiny_neox  # noqa: E402
from tests.test_app import QUICK, new_client  # noqa: E402
from tests.test_hostile import Measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20

# Real models' shapes (their config.json's fields), to build on the meta device.
SHAPES = {
    "SmolLM2-135M": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True),
    "GPT-2": dict(model_type="gpt2"),
    "Pythia-160M": dict(model_type="gpt_neox", vocab_size=50304, hidden_size=768, num_hidden_layers=12,
                        num_attention_heads=12, intermediate_size=3072, tie_word_embeddings=False),
    "Llama-3.2-1B": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         tie_word_embeddings=True),
    "Llama-2-7B": dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       tie_word_embeddings=False),
    "Qwen2-0.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       tie_word_embeddings=True),
    "Gemma2-2B": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                      num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                      tie_word_embeddings=True),
    "Mixtral-8x7B": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, tie_word_embeddings=False),
}


def built(shape: dict):
    """(the model `shape` describes, built on the meta device: no memory; its config.json)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(shape)
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model, json.loads(config.to_json_string(use_diff=True))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("name", SHAPES)
def test_the_size_read_from_a_config_is_the_built_models(name):
    """Within 0.1% (exact for Llama, GPT-2, NeoX, Qwen2 and Mixtral; Gemma2's extra norms
    are the difference), a mixture of experts counted with all its experts."""
    model, config = built(SHAPES[name])
    assert abs(config_params(config) - n_params(model)) <= 1e-3 * n_params(model), (config_params(config),
                                                                                   n_params(model))
    if name == "SmolLM2-135M":  # the published 134.5 M, and the registry's record (no download)
        assert config_params(config) == 134_515_008 == model_size("smollm2-135m-instruct").params


def test_the_size_of_a_local_folder_is_read_from_its_config(tmp_path):
    """The bundled demo, and tiny Llama, GPT-2 and NeoX models saved here: exact."""
    demo, _ = load_demo_model("full")
    assert model_size(ROOT / "assets" / "demo-full").params == n_params(demo) == 1_836_672
    for make in (tiny_llama, tiny_gpt2, tiny_neox):
        model = make(300)
        model.save_pretrained(tmp_path / make.__name__)
        size = model_size(tmp_path / make.__name__)
        assert size.params == n_params(model) and size.source == "its config.json", make.__name__


@pytest.mark.parametrize("change, message", [
    (dict(num_hidden_layers=-80), "num_hidden_layers"),
    (dict(hidden_size=True), "hidden_size"),
    (dict(vocab_size="32000"), "vocab_size"),
    (dict(head_dim=0), "head_dim"),
])
def test_a_config_that_hides_its_size_is_refused(change, message):
    _, config = built(SHAPES["Llama-2-7B"])
    with pytest.raises(ModelLoadError, match=message):
        config_params(config | change)
    with pytest.raises(ModelLoadError, match="vocab_size"):
        config_params({k: v for k, v in config.items() if k != "vocab_size"})


def test_a_space_allows_the_studios_small_set_unless_its_host_widens_it(monkeypatch):
    import gradio as gr

    from components.model_panel import build_model_panel
    from components.server.model_choices import MODEL_CHOICES, model_choices

    monkeypatch.delenv("GROM_MODELS", raising=False)
    monkeypatch.delenv("GROM_MODEL", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert limits.ModelPolicy.from_env().allowed is None  # a private machine: a free choice
    monkeypatch.setenv("SPACE_ID", "someone/grom-studio")
    policy = limits.ModelPolicy.from_env()
    assert policy.allowed == limits.SPACE_MODELS
    offered = [name for _, name in model_choices(policy)]
    assert offered[:3] == ["smollm2-135m-instruct", "demo", "open-unlearning/tofu_Llama-3.2-1B-Instruct_full"]
    assert not any("7b" in n.lower() or "8B" in n or "MUSE" in n for n in offered)
    with gr.Blocks():  # the page's model box: those only, nothing typed
        box = build_model_panel("demo").choice
    assert [v for _, v in box.choices][:3] == list(limits.SPACE_MODELS) and not box.allow_custom_value
    assert {v for _, v in box.choices} <= set(limits.SPACE_MODELS) | core_models.pinned_names()
    monkeypatch.setenv("GROM_MODEL", "org/start-model")  # the host's start model is allowed too
    assert limits.ModelPolicy.from_env().allowed[0] == "org/start-model"
    monkeypatch.setenv("GROM_MODELS", "*")  # the host widens it to any model
    assert limits.ModelPolicy.from_env().allowed is None and model_choices(limits.ModelPolicy(None)) == MODEL_CHOICES
    monkeypatch.setenv("GROM_MODELS", "demo,org/extra")
    assert limits.ModelPolicy.from_env().allowed == ("demo", "org/extra")


def test_the_registry_never_unloads_a_pinned_model(monkeypatch):
    """GROM_RESIDENT_MODELS bounds the visitors' models beside the pinned one; the pinned
    name in another dtype is a visitor's model."""
    monkeypatch.setenv("GROM_RESIDENT_MODELS", "1")
    registry = ModelRegistry()
    start = ModelKey("demo", "cpu", "float32")
    loads = []

    def loader(key):
        loads.append(key)
        return load_demo_model("full", dtype=getattr(torch, key.dtype))

    registry.load(start, loader)
    registry.pin(start)
    for key in [ModelKey("demo", "cpu", "bfloat16"), ModelKey("a", "cpu", "float32"),
                ModelKey("b", "cpu", "float32"), ModelKey("demo", "cpu", "float16")]:
        registry.load(key, loader)
        assert registry.resident() == [start, key]  # the start model and the latest visitor's
    assert registry.get(start) is not None and loads.count(start) == 1


# ---------------------------------------------------------------- through the app

@pytest.fixture
def start_key(url):  # noqa: F811
    """The app's start model, pinned as the app was built (app.build_app)."""
    key = core_models.model_key("demo", "cpu", "float32")
    assert REGISTRY.pinned == {key}, REGISTRY.pinned
    return key


def generate(client) -> float:
    """Seconds of one /generate of `client` (its session's model answering)."""
    t0 = time.perf_counter()
    html = client.predict("Where was Zorvath Quill born?", api_name="/generate")
    assert "Zorvath" in html
    return time.perf_counter() - t0


def test_no_visitor_load_unloads_the_start_model(url, start_key, monkeypatch):  # noqa: F811
    """One model beside the start model (GROM_RESIDENT_MODELS=1), and visitor B loads four
    others, the start model in two other dtypes among them: A's session (its edit kept),
    and a new API session that never loaded a model, keep working on the start model."""
    monkeypatch.setenv("GROM_RESIDENT_MODELS", "1")
    a, b = new_client(url), new_client(url)
    a.predict(api_name="/run_edit", **QUICK)
    for choice, dtype in [("demo-retain", "float32"), ("demo", "bfloat16"), ("demo-retain", "bfloat16"),
                          ("demo", "float16")]:
        status, _, _ = b.predict(choice, "cpu", dtype, api_name="/load_model")
        assert dtype in status
        assert start_key in REGISTRY.resident() and len(REGISTRY.resident()) == 2, REGISTRY.resident()
        generate(a)
    text, *_ = a.predict(max_examples=5, api_name="/compare")
    assert "Final score" in text  # A's edit, on the start model, still there
    fresh = Client(url, verbose=False)  # a new API session: opens on the start model
    generate(fresh)
    c = new_client(url)
    c.predict("demo-retain", "cpu", "bfloat16", api_name="/load_model")  # B's model goes, not the start model
    with pytest.raises(Exception, match="was unloaded to make room"):
        generate(b)
    generate(a)


def test_on_a_space_a_visitor_may_load_only_the_allow_list(url, start_key, monkeypatch):  # noqa: F811
    b = new_client(url)
    monkeypatch.setenv("SPACE_ID", "someone/grom-studio")
    monkeypatch.delenv("GROM_MODELS", raising=False)
    for choice in ("demo-retain", "open-unlearning/tofu_Llama-2-7b-chat-hf_full",
                   "meta-llama/Meta-Llama-3-8B-Instruct"):
        with pytest.raises(Exception, match="offers only these models: smollm2-135m-instruct, demo.*GROM_MODELS"):
            b.predict(choice, "cpu", "float32", api_name="/load_model")
    status, _, _ = b.predict("demo", "cpu", "bfloat16", api_name="/load_model")  # on the list
    assert "bfloat16" in status
    monkeypatch.setenv("GROM_MODELS", "*")  # the host widens it
    status, _, _ = b.predict("demo-retain", "cpu", "float32", api_name="/load_model")
    assert "demo-retain" in status


class FakeHub:
    """grom.model.loading' Hub functions, serving local files and recording every call: the
    config of `shape` as the repository's config.json, the demo-retain folder as its
    snapshot (after `gate` opens, when given)."""

    def __init__(self, monkeypatch, tmp_path: Path, config: dict, gate: threading.Event | None = None):
        self.calls: list = []
        self.config = tmp_path / "config.json"
        self.config.write_text(json.dumps(config))
        self.gate, self.started = gate, threading.Event()
        monkeypatch.setattr(grom_models, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(grom_models, "hub_files", self.hub_files)
        monkeypatch.setattr(grom_models, "snapshot_download", self.snapshot_download)
        monkeypatch.setattr(core_models, "require_hub", lambda *a: None)

    def hf_hub_download(self, repo, filename, **kw):
        self.calls.append(("hf_hub_download", repo, filename))
        assert filename == "config.json"
        return str(self.config)

    def hub_files(self, repo):
        self.calls.append(("hub_files", repo))
        weights = (ROOT / "assets" / "demo-retain" / "model.safetensors").stat().st_size
        return "0" * 40, {"config.json": 700, "model.safetensors": weights, "pytorch_model.bin": weights,
                          "tokenizer.json": 1000, "README.md": 10}

    def snapshot_download(self, repo, **kw):
        self.calls.append(("snapshot_download", repo, sorted(kw.get("allow_patterns") or ())))
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(60), "the test never let the download finish"
        return str(ROOT / "assets" / "demo-retain")


def test_a_hub_model_too_large_is_refused_from_its_config_alone(url, start_key, monkeypatch, tmp_path):  # noqa: F811
    """Llama-2-7B's config on a stand-in Hub: refused with its size and the limit, having
    downloaded config.json and nothing else; the server's memory unchanged."""
    _, config = built(SHAPES["Llama-2-7B"])
    hub = FakeHub(monkeypatch, tmp_path, config)
    b = new_client(url)
    with Measured() as cost:
        with pytest.raises(Exception) as err:
            b.predict("some-org/big-model", "cpu", "float32", api_name="/load_model")
    text = str(err.value)
    assert "6.74 B parameters (6,738,415,616" in text and "at most 2,000,000,000" in text, text
    assert "GROM_MAX_MODEL_PARAMS" in text
    assert hub.calls == [("hf_hub_download", "some-org/big-model", "config.json")]  # no weight asked for
    assert cost.grew < 50 * MB and cost.seconds < 10, (cost.grew / MB, cost.seconds)
    monkeypatch.setenv("GROM_MAX_MODEL_PARAMS", str(7 * 10**9))  # a host that raised it: the download goes on
    hub.config.write_text(json.dumps(json.loads((ROOT / "assets/demo-retain/config.json").read_text())))
    status, _, _ = b.predict("some-org/big-model", "cpu", "float32", api_name="/load_model")
    assert "some-org/big-model" in status
    assert hub.calls[-1] == ("snapshot_download", "some-org/big-model",
                             ["config.json", "model.safetensors", "tokenizer.json"])  # no .bin copy


def test_a_local_folder_too_large_is_refused_from_its_config(url, start_key, monkeypatch, tmp_path):  # noqa: F811
    """A folder of models/ whose config.json says 7 B (no weights beside it), and the demo's
    retain model under a limit lowered below its 1.8 M: refused, naming the sizes."""
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path))
    _, config = built(SHAPES["Llama-2-7B"])
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(json.dumps(config))
    b = new_client(url)
    with Measured() as cost:
        with pytest.raises(Exception, match=r"big has 6.74 B parameters \(6,738,415,616, read from its "
                                            r"config.json\).*at most 2,000,000,000.*GROM_MAX_MODEL_PARAMS"):
            b.predict("big", "cpu", "float32", api_name="/load_model")
    assert cost.grew < 50 * MB and cost.seconds < 10, (cost.grew / MB, cost.seconds)
    monkeypatch.setenv("GROM_MAX_MODEL_PARAMS", "1000000")
    with pytest.raises(Exception, match=r"assets/demo-retain has 1.8 M parameters \(1,836,672.*at most 1,000,000"):
        b.predict("demo-retain", "cpu", "float16", api_name="/load_model")
    status, _, _ = b.predict("demo", "cpu", "float32", api_name="/load_model")  # the start model: always
    assert "bundled demo" in status


def test_another_visitors_request_is_answered_while_a_model_downloads(url, start_key, monkeypatch, tmp_path):  # noqa: F811
    """B's model downloads (a stand-in Hub whose download waits until the test lets it
    go): A's /generate and /layer_scores answer meanwhile; then B's model loads."""
    gate = threading.Event()
    hub = FakeHub(monkeypatch, tmp_path, json.loads((ROOT / "assets/demo-retain/config.json").read_text()), gate)
    a, b = new_client(url), new_client(url)
    job = b.submit("some-org/slow-model", "cpu", "float32", "none", "", api_name="/load_model")
    try:
        assert hub.started.wait(30), "the download never started"
        with Measured() as waited:
            generate(a)
            a.predict(k=3, band_mode="suggested", api_name="/layer_scores", **QUICK)
        assert not job.done()  # the download was still going on
        assert waited.seconds < 20, waited.seconds
    finally:
        gate.set()
    status, _, _ = job.result(timeout=60)
    assert "some-org/slow-model" in status
    generate(a)  # and A still on the start model
