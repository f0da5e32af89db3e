"""Issue 36, item 3: a small patch file must not grow into a full copy of the weights per
session. A patch stored as factors stays factors in memory (`grom.edit.Factors` in a
`Patches`), expanded a block of rows at a time only while it is applied; applying it gives
the weights the expanded patch gives, and reverting gives the originals bit for bit. An
import is bounded by what it may expand to (GROM_MAX_PATCH_RANK, the matrices its method
may change, the model's parameter count), and every method's patch gets the checks
GROM's get (finite, shapes against the model, the norm edit.json records).

Through the real endpoint: a 1e-6 rank-1 patch of every 2-D weight of the demo model,
edit.json's method "ga", imported in several sessions, with the server's memory (this
process's rss) and another visitor's /generate timed around it.
"""
from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from grom import Edit, EditConfig
from grom.edit import (
    FACTORS_KEY,
    META_FILE,
    PATCH_FILE,
    Factors,
    Patches,
    StoredPatch,
    expand_factors,
    read_patch_layout,
)
from grom.methods import ALL, Settings
from grom.patch_policy import check_stored_patches
from tests.conftest import tiny_llama, weights_hash

MB = 1 << 20


def rank1(m: int, n: int, r: int = 1, seed: int = 0, scale: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(m, r, generator=g), scale * torch.randn(r, n, generator=g)


# ---------------------------------------------------------------- the library: held as factors

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_factored_patch_is_applied_as_its_expansion_and_reverted_bit_for_bit(dtype, monkeypatch):
    model = tiny_llama(96).to(dtype)
    names = [n for n, p in model.named_parameters() if p.ndim == 2]
    held = {n: Factors(*rank1(*model.get_parameter(n).shape, r=2, seed=i), dtype) for i, n in enumerate(names)}
    monkeypatch.setattr("grom.edit.EXPAND_BLOCK", 1000)  # several row blocks per matrix
    factored = Edit(settings=Settings(method="ga"), patches=Patches(held), method="ga")
    full = Edit(settings=Settings(method="ga"), patches={n: expand_factors(f.U, f.V, dtype) for n, f in held.items()},
                method="ga")
    before = weights_hash(model)
    with full.applied(model):
        want = {n: model.get_parameter(n).detach().clone() for n in names}
    with factored.applied(model):
        assert all(torch.equal(model.get_parameter(n), want[n]) for n in names)  # the same weights, exactly
    assert weights_hash(model) == before  # reverted bit for bit
    # what the session holds: the factors, not the weights
    assert factored.held.nbytes() == sum(f.nbytes for f in held.values())
    assert factored.held.nbytes() < 0.25 * full.held.nbytes()  # 32-wide matrices: rank 2 is a tenth in float32
    assert factored.held.numel() == full.held.numel() and factored.held.rank(names[0]) == 2
    for n in names:  # the norm from the factors' Gram matrices, the patch on demand
        # the exact product's norm: within eps/2 of the rounded patch's (first order, |<P, dP>| <= ||P|| ||dP||)
        assert abs(factored.held.norm(n) - full.held.norm(n)) <= torch.finfo(dtype).eps / 2 * full.held.norm(n)
        assert torch.equal(factored.patch(n), full.patches[n]) and factored.held.shape(n) == full.patches[n].shape
    assert abs(factored.patch_norm() - full.patch_norm()) <= torch.finfo(dtype).eps / 2 * full.patch_norm()


def test_an_imported_factored_edit_is_saved_back_as_its_factors(tmp_path):
    model = tiny_llama(96)
    names = [n for n, p in model.named_parameters() if p.ndim == 2][:3]
    held = {n: Factors(*rank1(*model.get_parameter(n).shape, seed=i), torch.float32) for i, n in enumerate(names)}
    edit = Edit(settings=Settings(method="ga"), patches=Patches(held), method="ga")
    folder = edit.save(tmp_path / "a", factored=True)
    tensors = load_file(str(folder / PATCH_FILE))
    assert set(tensors) == {f"{n}.{f}" for n in names for f in "UV"}
    assert all(torch.equal(tensors[f"{n}.U"], held[n].U) and torch.equal(tensors[f"{n}.V"], held[n].V) for n in names)
    back = Edit.load(folder)  # norms recorded for every patch of every method: checked
    assert isinstance(back.patches, Patches) and all(isinstance(back.held.held(n), Factors) for n in names)
    assert back.held.nbytes() == edit.held.nbytes()
    assert json.loads((folder / META_FILE).read_text())["patch_norms"] == pytest.approx(edit.patch_norms())
    full = Edit.load(edit.save(tmp_path / "b"))  # not factored: the full form, as held
    assert all(torch.equal(full.patches[n], edit.patch(n)) for n in names) and not full.stored_ranks


def test_every_method_s_factored_patch_needs_the_norm_edit_json_records(tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    edit = Edit(settings=Settings(method="ga"), patches=Patches({name: Factors(*rank1(64, 32), torch.float32)}),
                method="ga")
    folder = edit.save(tmp_path / "a", factored=True)
    meta = json.loads((folder / META_FILE).read_text())
    meta["patch_norms"][name] *= 2
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="norm is not the one recorded"):
        Edit.load(folder)
    del meta["patch_norms"]  # a trained method's factors with no norm at all: nothing names them
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records no norm for .*export the edit again"):
        Edit.load(folder)


def test_what_a_file_may_hold_depends_on_the_method_that_made_it():
    model = tiny_llama(96)
    down = {f"model.layers.{l}.mlp.down_proj.weight": (32, 64) for l in range(4)}
    row = dict(beta=1.0, mu=0.0, n_forget_keys=4, n_retain_keys=4, patch_norm=1.0, weight_norm=1.0)
    grom = {"method": "grom", "config": EditConfig(layers=(1, 2)).to_dict(),
            "layers": [dict(row, param_name=f"model.layers.{l}.mlp.down_proj.weight", layer=l) for l in (1, 2)]}
    ok = {n: StoredPatch(s) for n, s in down.items() if ".1." in n or ".2." in n}
    check_stored_patches(ok, model, grom)  # its band's down_proj: fine
    factored = {n: StoredPatch(down[n], 5, torch.float32) for n in ok}
    with pytest.raises(ValueError, match="rank 5.*4 forget keys"):  # GROM's rank bound: its forget keys
        check_stored_patches(factored, model, grom)
    with pytest.raises(ValueError, match="no row for"):
        check_stored_patches({n: StoredPatch(s) for n, s in down.items()}, model, grom)
    moved = copy.deepcopy(grom)  # a row that names another kind of matrix
    moved["layers"][0]["param_name"] = "model.layers.1.self_attn.o_proj.weight"
    with pytest.raises(ValueError, match="changes only the down_proj matrix"):
        check_stored_patches({"model.layers.1.self_attn.o_proj.weight": StoredPatch((32, 32))}, model, moved)
    outside = copy.deepcopy(grom)  # a row of a layer outside the config's band
    outside["layers"][0].update(param_name="model.layers.3.mlp.down_proj.weight", layer=3)
    with pytest.raises(ValueError, match="layers are \\[1, 2\\]"):
        check_stored_patches({"model.layers.3.mlp.down_proj.weight": StoredPatch((32, 64))}, model, outside)
    rome = dict(grom, method="rome")
    with pytest.raises(ValueError, match="ROME edit changes only the down_proj"):
        check_stored_patches({"model.layers.1.self_attn.o_proj.weight": StoredPatch((32, 32))}, model,
                             dict(moved, method="rome"))
    check_stored_patches(ok, model, rome)
    every = {n: StoredPatch(tuple(p.shape)) for n, p in model.named_parameters()}
    check_stored_patches(every, model, {"method": "ga", "config": {}, "info": {}})  # a trained method: any weight
    with pytest.raises(ValueError, match="do not include"):
        check_stored_patches(every, model, {"method": "ga", "config": {}, "info": {"params": [".mlp."]}})
    with pytest.raises(ValueError, match="none this server knows"):
        check_stored_patches(ok, model, {"method": "mine", "config": {}})
    with pytest.raises(ValueError, match="does not fit the loaded model"):
        check_stored_patches({"model.layers.1.mlp.down_proj.weight": StoredPatch((64, 32))}, model,
                             {"method": "ga", "config": {}})
    tied = tiny_llama(96, tie=True)  # a tied head under its own name: the patches expand past the model
    both = {n: StoredPatch(tuple(p.shape)) for n, p in tied.named_parameters(remove_duplicate=False)}
    with pytest.raises(ValueError, match="more than the loaded model's own"):
        check_stored_patches(both, tied, {"method": "ga", "config": {}})


# ---------------------------------------------------------------- through the app

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import handle_file  # noqa: E402

from components.server.session import REGISTRY, SESSIONS  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.test_app import new_client  # noqa: E402
from tests.test_hostile import Measured, exported, rss  # noqa: E402,F401  (exported: the fixture)

QUESTION = "Where was Sina Cheithnu born?"


def hostile_files(folder: Path, meta: dict, model, rank: int = 1, norms: bool = True,
                  method: str = "ga") -> list:
    """The issue's file: 1e-6 factors of rank `rank` for every 2-D weight of `model`, and
    an edit.json of `method` (with every patch's norm, as an export writes it, if `norms`)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors, dtypes, patch_norms = {}, {}, {}
    for n, p in model.named_parameters():
        if p.ndim == 2:
            U, V = torch.full((p.shape[0], rank), 1e-6), torch.full((rank, p.shape[1]), 1e-6)
            tensors[f"{n}.U"], tensors[f"{n}.V"] = U, V
            dtypes[n] = str(p.dtype).removeprefix("torch.")
            patch_norms[n] = Factors(U, V, p.dtype).norm()
    save_file(tensors, str(folder / PATCH_FILE), metadata={FACTORS_KEY: json.dumps(dtypes)})
    meta = copy.deepcopy(meta) | {"method": method, "layers": []}
    row = ALL.get(method)  # the method's own settings, as its export writes them (a GROM export relabelled)
    if row is not None and row.family != "closed-form":
        meta["settings"] = (Settings(method=method) if row.family == "trained" else row.settings()).to_dict()
    meta.pop("patch_norms", None)
    if norms:
        meta["patch_norms"] = patch_norms
    (folder / META_FILE).write_text(json.dumps(meta))
    return [handle_file(str(folder / META_FILE)), handle_file(str(folder / PATCH_FILE))]


def session_edits(method: str) -> list[Edit]:
    sessions = [r() for r in list(SESSIONS._order.values())]
    return [s.edit for s in sessions if s is not None and s.edit is not None and s.edit.method == method]


def timed_generate(client, out: dict) -> threading.Thread:
    def ask():
        t0 = time.perf_counter()
        client.predict(QUESTION, api_name="/generate")
        out.setdefault("seconds", []).append(time.perf_counter() - t0)
    return threading.Thread(target=ask)


def test_an_imported_factored_patch_of_every_weight_costs_its_factors_not_the_weights(url, exported, tmp_path):  # noqa: F811
    model = REGISTRY.current.model
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    files = hostile_files(tmp_path / "h", exported, model)
    assert (tmp_path / "h" / PATCH_FILE).stat().st_size < 0.05 * model_bytes
    clients, other = [new_client(url) for _ in range(6)], new_client(url)
    other.predict(QUESTION, api_name="/generate")
    before, base, lat = weights_hash(model), rss(), {}
    for c in clients:
        waiting = timed_generate(other, lat)  # another visitor, asking while the import runs
        with Measured() as cost:
            waiting.start()
            out = c.predict(files, api_name="/import_run")
            waiting.join()
        assert "edit is loaded" in out[-1] and "as rank-1 factors" in out[-1], out[-1][:300]
        assert cost.seconds < 20
    grew = rss() - base
    held = session_edits("ga")
    assert len(held) >= len(clients)
    for edit in held[-len(clients):]:  # each session holds the factors: kilobytes, not the model's MB
        assert isinstance(edit.patches, Patches) and edit.held.numel() <= sum(p.numel() for p in model.parameters())
        assert edit.held.nbytes() < 0.05 * model_bytes
    # six copies of the weights would be 6 x model_bytes (about 44 MB on the demo); the factors are ~90 kB each
    assert grew < 3 * model_bytes, (grew / MB, model_bytes / MB)
    assert max(lat["seconds"]) < 20, lat
    asked = clients[0].predict(QUESTION, api_name="/generate")  # a later use: applied block by block, reverted
    assert "after the edit" in asked and weights_hash(model) == before
    exported_files, note, _ = clients[0].predict(api_name="/export")  # written back as the factors it came as
    patch = next(Path(f) for f in exported_files if f.endswith(PATCH_FILE))
    assert ({p.rank for p in read_patch_layout(patch).values()} == {1}
            and f"{len(held[-1].patches)} as rank-1 factors" in note)
    assert patch.stat().st_size < 2 * (tmp_path / "h" / PATCH_FILE).stat().st_size
    print(f"\n6 imports: rss +{grew / MB:.1f} MB (model {model_bytes / MB:.1f} MB); held per session "
          f"{held[-1].held.nbytes() / 1024:.0f} kB; another visitor's /generate {max(lat['seconds']):.2f} s at most")


def refused(client, files) -> tuple[str, Measured]:
    with Measured() as cost:
        with pytest.raises(Exception) as err:
            client.predict(files, api_name="/import_run")
    return str(err.value), cost


def test_a_patch_of_rank_above_the_host_limit_is_refused_from_its_header(url, exported, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GROM_MAX_PATCH_RANK", "4")
    c = new_client(url)
    text, cost = refused(c, hostile_files(tmp_path / "h", exported, REGISTRY.current.model, rank=8))
    assert "rank 8" in text and "GROM_MAX_PATCH_RANK" in text and "at most 4" in text, text
    assert cost.seconds < 10 and cost.grew < 50 * MB


def test_a_factored_trained_patch_without_its_norms_is_refused(url, exported, tmp_path):  # noqa: F811
    c = new_client(url)
    text, _ = refused(c, hostile_files(tmp_path / "h", exported, REGISTRY.current.model, norms=False))
    assert "records no norm" in text and "export the edit again" in text, text


@pytest.mark.parametrize("method, message", [("grom", "no row for"), ("memit", "no row for"),
                                             ("mine", "none this server knows")])
def test_an_edit_method_s_file_may_hold_only_the_matrices_it_edits(url, exported, tmp_path, method, message):  # noqa: F811
    c = new_client(url)
    text, cost = refused(c, hostile_files(tmp_path / "h", exported, REGISTRY.current.model, method=method))
    assert message in text and len(text) < 800, text
    assert cost.seconds < 10
