"""Sharded loading (issue 26 item 5): --device-map / --max-memory parsed and checked, a tiny
model loaded through accelerate on the CPU gives the plain load's edit, and a budget that
sends band layers to disk is refused before any forward pass, naming the layer (library
and CLI)."""
from __future__ import annotations

import json

import pytest
import torch

from grom import EditConfig, cli, run_edit
from grom.model.editable import NotEditable
from grom.model.loading import ModelLoadError, load_model
from grom.model.sharding import (
    ShardingError,
    format_max_memory,
    parse_device_map,
    parse_max_memory,
    parse_size,
    placement,
    sharded_room,
)
from tests.conftest import FORGET, RETAIN
from tests.test_editable import counting_forwards
from tests.test_library import save_tiny

CFG = EditConfig(beta=5.0, w_r=10.0)
# The tiny Llama's weights: 225,408 bytes in float32, 37,120 a decoder layer. With 160,000
# bytes for the CPU, accelerate's "sequential" map keeps the embeddings and the first layers
# there and sends the rest to disk (measured; the tests read the map, not this number).
SMALL_CPU = 160_000


def test_parse_sizes_by_hand():
    assert parse_size("20GiB") == 20 * 2**30 and parse_size("500MB") == 500_000_000
    assert parse_size("1.5 KiB") == 1536 and parse_size("1024") == 1024 and parse_size("7b") == 7
    for bad in ("20 GiBs", "lots", "-1GB", ""):
        with pytest.raises(ShardingError, match="20GiB or 500MB"):
            parse_size(bad)


def _gpus(monkeypatch, count: int) -> None:
    """This machine seen as one with `count` CUDA GPUs (0: none), whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_parse_max_memory_and_device_map(monkeypatch):
    _gpus(monkeypatch, 0)  # no GPU to check the indices against (on a GPU machine, see below)
    got = parse_max_memory("0=20GiB, cuda:1=10GB ,cpu=60GiB")
    assert got == {0: 20 * 2**30, 1: 10**10, "cpu": 60 * 2**30}
    assert format_max_memory(got) == format_max_memory(parse_max_memory("cpu=60GiB,1=10GB,0=20GiB"))
    assert parse_max_memory("") is None and parse_max_memory(None) is None
    for bad, match in (("0:20GiB", "device=size"), ("gpu=1GB", "not a GPU index"), ("cpu=1GB,cpu=2GB", "twice"),
                       ("cpu=many", "20GiB")):
        with pytest.raises(ShardingError, match=match):
            parse_max_memory(bad)
    assert [parse_device_map(t) for t in ("auto", " Balanced", "sequential", "cpu", "cuda:1", "none", "")] == \
        ["auto", "balanced", "sequential", "cpu", "cuda:1", None, None]
    with pytest.raises(ShardingError, match="auto, balanced or sequential"):
        parse_device_map("everywhere")
    _gpus(monkeypatch, 1)  # a GPU machine: an index it does not have is named (seen on an H100)
    assert parse_max_memory("0=20GiB,cpu=60GiB") == {0: 20 * 2**30, "cpu": 60 * 2**30}
    with pytest.raises(ShardingError, match="names GPU 1 but this machine has 1 GPU"):
        parse_max_memory("0=20GiB, cuda:1=10GB")


def test_sharded_room_counts_devices_and_the_weights_beyond_the_budgets(monkeypatch):
    _gpus(monkeypatch, 0)
    free = {"cpu": 1000}.get
    assert sharded_room(300, "cpu", None, free) == 1000  # all weights fit: the plan against what is free
    assert sharded_room(300, "sequential", {"cpu": 100}, free) == 1000 + 200  # 200 bytes of weights on disk
    assert sharded_room(3000, "auto", None, free) == 1000 + 2000  # more weights than memory: disk again
    _gpus(monkeypatch, 1)  # "auto" may use the GPU too: its free memory counts, and its budget
    free = {"cpu": 1000, "cuda:0": 500}.get
    assert sharded_room(300, "auto", None, free) == 1500
    assert sharded_room(300, "auto", {0: 100, "cpu": 100}, free) == 1500 + 100
    assert sharded_room(300, "cuda:0", None, free) == 500


def test_device_map_cpu_gives_the_plain_loads_edit(tmp_path, tokenizer):
    folder = save_tiny(tmp_path, tokenizer)
    plain, _ = load_model(folder)
    mapped, _ = load_model(folder, device_map="cpu")
    assert all(p.device.type == "cpu" for p in mapped.parameters())
    a = run_edit(plain, tokenizer, FORGET, RETAIN, CFG.replace(layers=(2,)))
    b = run_edit(mapped, tokenizer, FORGET, RETAIN, CFG.replace(layers=(2,)))
    assert a.patches.keys() == b.patches.keys()
    for name in a.patches:
        assert torch.equal(a.patches[name], b.patches[name]), name
    with pytest.raises(ModelLoadError, match="needs a device_map"):
        load_model(folder, max_memory={"cpu": SMALL_CPU})


def _offloading_load(tmp_path, tokenizer):
    folder = save_tiny(tmp_path, tokenizer)
    model, _ = load_model(folder, device_map="sequential", max_memory={"cpu": SMALL_CPU},
                          offload_folder=tmp_path / "offload")
    where = placement(model)
    on_disk = [l for l in range(4) if where.get(f"model.layers.{l}") == "disk"]
    on_cpu = [l for l in range(4) if where.get(f"model.layers.{l}") == "cpu"]
    assert on_disk and on_cpu, where  # the budget splits the layers
    return folder, model, on_disk, on_cpu


def test_a_band_layer_offloaded_to_disk_is_refused_before_any_forward(tmp_path, tokenizer):
    _, model, on_disk, _ = _offloading_load(tmp_path, tokenizer)
    layer = on_disk[0]
    assert model.model.layers[layer].mlp.down_proj.weight.device.type == "meta"
    with counting_forwards(model) as calls, pytest.raises(NotEditable) as err:
        run_edit(model, tokenizer, FORGET, RETAIN, CFG.replace(layers=(layer,)))
    assert calls == [] and f"model.layers.{layer}.mlp.down_proj is offloaded" in str(err.value)
    assert "max_memory" in str(err.value)  # what to do


def test_cli_device_map_refuses_an_offloaded_band_layer(tmp_path, tokenizer, capsys):
    folder, _, on_disk, _ = _offloading_load(tmp_path, tokenizer)
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"question": e.question, "answer": e.answer}) for e in rows))
    args = ["edit", "--model", str(folder), "--forget", str(tmp_path / "forget.jsonl"), "--retain",
            str(tmp_path / "retain.jsonl"), "--beta", "5", "--w-r", "10", "--device-map", "sequential",
            "--max-memory", f"cpu={SMALL_CPU}B", "--layers", str(on_disk[0]), "--out", str(tmp_path / "e")]
    with pytest.raises(SystemExit, match=rf"model\.layers\.{on_disk[0]}\.mlp\.down_proj is offloaded"):
        cli.main(args)
    assert not (tmp_path / "e").exists()
    with pytest.raises(SystemExit):  # argparse: a bad budget is refused with the form to use
        cli.main(args[:-4] + ["--max-memory", "cpu:1GB", "--out", str(tmp_path / "e")])
    assert "device=size" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs --device-map"):
        cli.main([a for a in args if a not in ("--device-map", "sequential")])
