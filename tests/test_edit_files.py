"""An edit on disk: patches stored as low-rank factors where smaller (and reconstructed to
their dtype's rounding), the sha256 that names the computed patch, the check that a patch
file is the one its edit.json describes, and files written before factors and hashes
existed, which still load bit for bit."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from grom import Edit, EditConfig, run_edit
from grom.edit import FACTORS_KEY, META_FILE, PATCH_FILE, expand_factors, factor_patch, patch_sha256, read_patch_layout
from tests.conftest import FORGET, RETAIN, tiny_llama


def low_rank(m: int, n: int, r: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, r, generator=g, dtype=torch.float64)
            @ torch.randn(r, n, generator=g, dtype=torch.float64)).to(dtype)


def relative_error(P: torch.Tensor, R: torch.Tensor) -> float:
    """max |R - P| / ||P||_F, the reconstruction bound of `factor_patch`."""
    return float((R.double() - P.double()).abs().max() / P.double().norm())


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-6), (torch.bfloat16, 8 * 2**-7)])
def test_a_low_rank_patch_is_factored_at_its_rank_and_reconstructed(dtype, bound):
    P = low_rank(96, 200, 7, dtype)
    U, V = factor_patch(P, max_rank=40)
    assert U.shape == (96, 7) and V.shape == (7, 200) and U.dtype == V.dtype == torch.float32
    R = expand_factors(U, V, dtype)
    assert R.dtype == dtype and relative_error(P, R) < bound
    assert factor_patch(P, max_rank=5) is None  # the rank bound is below P's rank: no factors


def test_factors_are_not_used_where_they_are_not_smaller():
    assert factor_patch(torch.randn(64, 80)) is None  # full rank: the full matrix is smaller
    assert factor_patch(low_rank(64, 80, 40)) is None  # factors 40 x (64 + 80) = 5760 > 64 x 80 = 5120
    assert factor_patch(low_rank(64, 80, 30)) is not None  # 30 x 144 = 4320: smaller
    assert factor_patch(low_rank(8, 8, 2, torch.float64)) is None  # float64: kept exact
    assert factor_patch(torch.full((64, 80), float("nan"))) is None


@pytest.fixture(scope="module")
def edit(tokenizer):
    """A real GROM edit of a tiny Llama whose patches have rank <= 8 (8 forget keys)."""
    model = tiny_llama(len(tokenizer))
    return model, run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0,
                                                                         forget_budget=8))


def test_a_factored_edit_loads_back_to_float32_rounding_and_keeps_its_hash(edit, tmp_path):
    model, e = edit
    full = e.save(tmp_path / "full")
    small = e.save(tmp_path / "small", factored=True)
    layout = read_patch_layout(small / PATCH_FILE)
    ranks = {n: int((torch.linalg.svdvals(P.double()) > 1e-5 * P.double().norm()).sum())  # an SVD's count
             for n, P in e.patches.items()}
    assert {name: p.rank for name, p in layout.items()} == ranks and all(0 < r <= 8 for r in ranks.values())
    assert all(p.shape == tuple(e.patches[n].shape) for n, p in layout.items())
    assert (small / PATCH_FILE).stat().st_size < 0.7 * (full / PATCH_FILE).stat().st_size
    tensors = load_file(str(small / PATCH_FILE))
    assert set(tensors) == {f"{r.param_name}.{f}" for r in e.layers for f in "UV"}
    back = Edit.load(small)
    assert back.stored_ranks == ranks
    for name, P in e.patches.items():
        assert back.patches[name].dtype == P.dtype and relative_error(P, back.patches[name]) < 1e-6
    meta = json.loads((small / META_FILE).read_text())
    assert meta["patch_sha256"] == e.sha256() == back.sha256()  # the computed patch's, kept
    assert back.recorded_sha256 == e.sha256() != patch_sha256(back.patches)  # not bit for bit
    again = Edit.load(back.save(tmp_path / "again", factored=True))  # saved again: the same hash
    assert json.loads((tmp_path / "again" / META_FILE).read_text())["patch_sha256"] == e.sha256()
    assert again.stored_ranks == back.stored_ranks
    exact = Edit.load(full)  # the full form: bit for bit
    assert not exact.stored_ranks and all(torch.equal(exact.patches[k], P) for k, P in e.patches.items())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with back.applied(model):
        pass
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_hash_names_the_patches_bit_for_bit(edit, tokenizer):
    model, e = edit
    again = run_edit(model, tokenizer, FORGET, RETAIN, e.settings)  # the same edit, computed again
    assert all(torch.equal(again.patches[k], P) for k, P in e.patches.items())
    assert again.sha256() == e.sha256() == patch_sha256(dict(reversed(list(e.patches.items()))))
    name = next(iter(e.patches))
    nudged = dict(e.patches)
    nudged[name] = e.patches[name].clone()
    nudged[name].view(-1)[0] = torch.nextafter(nudged[name].view(-1)[0], torch.tensor(1.0))  # one last bit
    assert patch_sha256(nudged) != e.sha256()
    renamed = {("x" + k if k == name else k): P for k, P in e.patches.items()}
    assert patch_sha256(renamed) != e.sha256()
    P = low_rank(6, 4, 2, torch.bfloat16)
    assert patch_sha256({"w": P}) == patch_sha256({"w": P.float()})  # float32 holds bfloat16 exactly
    assert patch_sha256({"w": P.float()}) != patch_sha256({"w": P.float().T.contiguous()})  # the layout counts


def test_a_file_written_before_factors_and_hashes_still_loads_bit_for_bit(edit, tmp_path):
    _, e = edit
    folder = tmp_path / "old"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in e.patches.items()}, str(folder / PATCH_FILE))  # as before
    meta = e.metadata()
    del meta["patch_sha256"]
    (folder / META_FILE).write_text(json.dumps(meta))
    old = Edit.load(folder)
    assert old.recorded_sha256 is None and not old.stored_ranks
    assert all(torch.equal(old.patches[k], P) for k, P in e.patches.items()) and old.sha256() == e.sha256()


def test_a_patch_file_that_is_not_its_edit_json_s_is_refused(edit, tmp_path):
    _, e = edit
    full = e.save(tmp_path / "full")
    other = {k: 2 * v for k, v in e.patches.items()}
    save_file(other, str(full / PATCH_FILE))
    with pytest.raises(ValueError, match="not the patch edit.json describes.*sha256"):
        Edit.load(full)
    small = e.save(tmp_path / "small", factored=True)
    tensors = load_file(str(small / PATCH_FILE))
    header = {FACTORS_KEY: json.dumps({r.param_name: "float32" for r in e.layers})}
    save_file({k: 2 * v if k.endswith(".U") else v for k, v in tensors.items()}, str(small / PATCH_FILE),
              metadata=header)
    with pytest.raises(ValueError, match="not the patch edit.json describes.*norm"):
        Edit.load(small)


@pytest.mark.parametrize("header,tensors,message", [
    ("not json", {}, "must map patch names"),
    (json.dumps({"w": "int8"}), {}, "must map patch names"),
    (json.dumps({"w": "float32"}), {"w.U": torch.zeros(4, 2)}, "factors of w are missing"),
    (json.dumps({"w": "float32"}), {"w.U": torch.zeros(4, 2), "w.V": torch.zeros(3, 5)}, "do not fit"),
    ("[" * 5000 + "]" * 5000, {}, "must map patch names"),
])
def test_a_bad_factor_header_is_named(tmp_path, header, tensors, message):
    path = tmp_path / PATCH_FILE
    save_file(tensors or {"x": torch.zeros(1)}, str(path), metadata={FACTORS_KEY: header})
    with pytest.raises(ValueError, match=message):
        read_patch_layout(path)
