"""`Edit`: the result of a GROM edit, as data, with a clear life cycle.

An Edit holds per-parameter patches P on the CPU (in each weight's dtype and layout).
`apply` adds them to a model after a finite check, keeping the original weights;
`revert` copies the originals back, bit for bit; `applied` does both around a block.
Nothing of the model is kept between `revert` and the next `apply`.

On disk (`save`, `load`): ``edit.json`` (the settings, the run, and ``patch_sha256``, the
hash of the patches as computed) and ``patch.safetensors``, each patch either the full
matrix under its parameter's name (exact) or, with ``save(..., factored=True)`` where
that is smaller, float32 factors ``<name>.U`` (m, r) and ``<name>.V`` (r, n) whose
product is the patch to its dtype's rounding (the header's ``grom.factors`` lists them).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from grom.arch import lm_head_is_tied, retie_lm_head, untie_lm_head
from grom.attribution import LayerScores
from grom.config import EditConfig
from grom.data.sources import MAX_JSON_DEPTH, json_depth
from grom.editable import NotEditable, weight_problem

log = logging.getLogger(__name__)

PATCH_FILE, META_FILE = "patch.safetensors", "edit.json"


@dataclass
class LayerKeys:
    """What the diagnostics need of one edited matrix, on the CPU.

    Xf (n, s) forget keys with `forget_example` (s,) in 0..n_forget-1; Xr (n, r) retain
    keys with `retain_example` (r,); `target` the D used (a grom.targets.Target).
    """

    Xf: torch.Tensor
    forget_example: torch.Tensor
    Xr: torch.Tensor
    retain_example: torch.Tensor
    target: object
    n_forget: int
    n_retain: int


@dataclass
class LayerRecord:
    """One edited matrix: where, how strong, and how large the patch is."""

    param_name: str
    layer: int | None
    beta: float  # the beta used (absolute, after any relative scaling)
    mu: float
    n_forget_keys: int
    n_retain_keys: int
    patch_norm: float
    weight_norm: float
    solve_seconds: float = 0.0
    transposed: bool = False  # the parameter stores W^T (GPT-2 Conv1D)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Edit:
    """A GROM edit: patches by parameter name plus what produced them."""

    config: EditConfig
    patches: dict[str, torch.Tensor]
    layers: list[LayerRecord] = field(default_factory=list)
    scores: LayerScores | None = None
    timings: dict[str, float] = field(default_factory=dict)
    unties_lm_head: bool = False
    model_name: str | None = None
    keys: dict[str, LayerKeys] = field(default_factory=dict)  # by param name, if kept
    method: str = "grom"  # what made it: "grom" or a grom.baselines method ("ga", "npo", ...)
    info: dict = field(default_factory=dict)  # method-specific, JSON-able (baselines: settings, losses)
    # How to reproduce it beyond the config, JSON-able (the studio: the model by name, the
    # benchmark, split, retain sample size and seed, the band mode and preset)
    run: dict = field(default_factory=dict)
    world_size: int = 1  # processes that computed it (torch.distributed ranks)
    # A loaded edit: the patch_sha256 its edit.json recorded, and the rank of each patch its
    # file held as factors (those patches are the factors' product: the computed patch to
    # its dtype's rounding, not bit for bit)
    recorded_sha256: str | None = None
    stored_ranks: dict[str, int] = field(default_factory=dict)
    _saved: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _untied: bool = field(default=False, repr=False)

    @property
    def band(self) -> list[int]:
        return [r.layer for r in self.layers if r.layer is not None]

    @property
    def is_applied(self) -> bool:
        return bool(self._saved)

    def apply(self, model: nn.Module) -> None:
        """W <- W + P for every patch, keeping the originals for `revert`."""
        if self._saved:
            raise RuntimeError("this edit is already applied; revert it first")
        for name, P in self.patches.items():
            if not torch.isfinite(P).all():
                raise ValueError(f"the patch for {name} has non-finite values; not applied")
        check_patchable(model, self.patches)
        if self.unties_lm_head and lm_head_is_tied(model):
            self._untied = untie_lm_head(model)
        try:
            with torch.no_grad():
                for name, P in self.patches.items():
                    W = model.get_parameter(name)
                    if W.shape != P.shape:
                        raise ValueError(f"patch {name} has shape {tuple(P.shape)}, the model's "
                                         f"weight {tuple(W.shape)}: is this the model it was made for?")
                    self._saved[name] = W.detach().clone()
                    W.add_(P.to(W.device, W.dtype))
        except Exception:
            self.revert(model)
            raise

    def revert(self, model: nn.Module) -> None:
        """Restore the original weights exactly (copied back, not subtracted)."""
        with torch.no_grad():
            for name, W0 in self._saved.items():
                model.get_parameter(name).copy_(W0)
        self._saved.clear()
        if self._untied:
            retie_lm_head(model)
            self._untied = False

    @contextmanager
    def applied(self, model: nn.Module):
        """``with edit.applied(model): ...`` runs the block on the edited model."""
        self.apply(model)
        try:
            yield model
        finally:
            self.revert(model)

    def patch_norm(self) -> float:
        return float(sum(float(P.double().norm()) ** 2 for P in self.patches.values()) ** 0.5)

    def sha256(self) -> str:
        """`patch_sha256` of the patches as computed. An edit loaded from factors holds their
        product, not the computed patch bit for bit: it answers with the hash recorded."""
        if self.stored_ranks and self.recorded_sha256:
            return self.recorded_sha256
        return patch_sha256(self.patches)

    def metadata(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "layers": [r.to_dict() for r in self.layers],
            "scores": self.scores.to_dict() if self.scores else None,
            "timings": self.timings,
            "unties_lm_head": self.unties_lm_head,
            "model_name": self.model_name,
            "method": self.method,
            "info": self.info,
            "run": self.run,
            "world_size": self.world_size,
            "patch_sha256": self.sha256(),
        }

    def save(self, path: str | Path, factored: bool = False) -> Path:
        """Write ``patch.safetensors`` and ``edit.json`` into the folder `path`. `factored`:
        each patch whose float32 factors are smaller is stored as them (`factor_patch`), and
        loads back equal to its dtype's rounding; otherwise every patch loads bit for bit."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors, factors = {}, {}
        for name, P in self.patches.items():
            UV = factor_patch(P, self._rank_bound(name)) if factored else None
            if UV is None:
                tensors[name] = P.contiguous()
            else:
                tensors[f"{name}.U"], tensors[f"{name}.V"] = UV
                factors[name] = str(P.dtype).removeprefix("torch.")
        header = {FACTORS_KEY: json.dumps(factors)} if factors else None
        save_file(tensors, str(path / PATCH_FILE), metadata=header)
        (path / META_FILE).write_text(json.dumps(self.metadata(), indent=2))
        return path

    def _rank_bound(self, name: str) -> int | None:
        """s, the forget keys of the matrix `name`: P = (w_f/s) D Xf^T A^-1 has rank <= s."""
        s = [r.n_forget_keys for r in self.layers if r.param_name == name]
        return s[0] if s and self.method == "grom" else None

    @classmethod
    def load(cls, path: str | Path) -> "Edit":
        """The edit saved in the folder `path`: full patches bit for bit, factored ones as
        their product. A patch file that is not the one edit.json describes (its hash, or
        for factors the patch norms, differ) is a ValueError."""
        path = Path(path)
        if not (path / PATCH_FILE).exists() or not (path / META_FILE).exists():
            raise FileNotFoundError(f"{path} holds no saved edit (expected {PATCH_FILE} and {META_FILE})")
        meta = read_metadata((path / META_FILE).read_text())
        patches, ranks = read_patches(path / PATCH_FILE)
        edit = cls(
            config=EditConfig.from_dict(meta["config"]),
            patches=patches,
            layers=[LayerRecord(**r) for r in meta.get("layers", [])],
            scores=LayerScores.from_dict(meta["scores"]) if meta.get("scores") else None,
            timings=meta.get("timings", {}),
            unties_lm_head=meta.get("unties_lm_head", False),
            model_name=meta.get("model_name"),
            method=meta.get("method", "grom"),
            info=meta.get("info", {}),
            run=meta.get("run") or {},
            world_size=int(meta.get("world_size") or 1),
            recorded_sha256=meta.get("patch_sha256"),
            stored_ranks=ranks,
        )
        edit._check_patches()
        return edit

    def _check_patches(self) -> None:
        """That the patches are those edit.json describes: the same hash, or for patches
        loaded from factors (which no hash can name) the recorded norms within 1e-4."""
        mismatch = f"{PATCH_FILE} is not the patch {META_FILE} describes: keep the two files of one export together"
        if self.recorded_sha256 and not self.stored_ranks and patch_sha256(self.patches) != self.recorded_sha256:
            raise ValueError(f"{mismatch} (the patches' sha256 differs from the one recorded).")
        for r in self.layers:
            P = self.patches.get(r.param_name)
            if r.param_name in self.stored_ranks and P is not None and \
                    abs(float(P.double().norm()) - r.patch_norm) > 1e-4 * max(r.patch_norm, 1e-30):
                raise ValueError(f"{mismatch} ({r.param_name}'s norm is not the one recorded).")


def check_patchable(model: nn.Module, patches: dict[str, torch.Tensor]) -> None:
    """`NotEditable` for the first patched weight that cannot take a float patch in place
    (quantized, offloaded: `grom.editable.weight_problem`), before anything is changed."""
    for name in patches:
        module_name, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue  # an unknown name: apply's shape check says so
        if attr == "weight":
            problem = weight_problem(module, module_name)
            if problem:
                raise NotEditable(f"this edit cannot be applied: {problem}")


def read_metadata(text: str) -> dict:
    """The contents of an ``edit.json``, checked: valid JSON no deeper than an edit.json
    can be, an object, with a valid "config" (ValueError saying what is wrong otherwise)."""
    depth = json_depth(text)  # before json.loads, which would recurse through it
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{META_FILE} is nested {depth} levels deep, too deep to be an edit.json (an "
                         "object holding \"config\", \"layers\", \"scores\", \"run\" and a few more, "
                         "nested a few levels at most): "
                         "upload the edit.json an export wrote.")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{META_FILE} is not valid JSON ({err.msg}, line {err.lineno} column "
                         f"{err.colno}): upload the edit.json an export wrote.") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE} must hold a JSON object with a \"config\", not a "
                         f"{type(meta).__name__}.")
    if not isinstance(meta.get("config"), dict):
        raise ValueError(f"{META_FILE} has no \"config\" object (the edit's settings): upload the "
                         "edit.json an export wrote.")
    try:
        EditConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{META_FILE}: its config is not valid ({err}).") from None
    for key, kind in (("run", dict), ("layers", list), ("info", dict), ("timings", dict)):
        if meta.get(key) is not None and not isinstance(meta[key], kind):
            raise ValueError(f"{META_FILE}: \"{key}\" must be a JSON {kind.__name__.replace('dict', 'object')}.")
    ws = meta.get("world_size")
    if ws is not None and not (isinstance(ws, int) and not isinstance(ws, bool) and ws >= 1):
        raise ValueError(f"{META_FILE}: \"world_size\" must be a whole number of processes (1 or more).")
    sha = meta.get("patch_sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch("[0-9a-f]{64}", sha)):
        raise ValueError(f"{META_FILE}: \"patch_sha256\" must be 64 hexadecimal digits (a sha256).")
    return meta


# ---------------------------------------------------------------- the patches on disk

FACTORS_KEY = "grom.factors"  # patch.safetensors' header: JSON {name: the patch's dtype} of the factored
_FACTOR_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def patch_sha256(patches: dict[str, torch.Tensor]) -> str:
    """sha256 of full patches in a canonical form: by name (sorted), each as one line of
    JSON ``[name, shape]`` then its values in float32, little-endian, row-major (float32
    holds bfloat16 and float16 exactly). Equal hashes: equal patches, bit for bit."""
    h = hashlib.sha256()
    for name in sorted(patches):
        P = patches[name].detach().to("cpu", torch.float32).contiguous()
        h.update(json.dumps([name, list(P.shape)]).encode() + b"\n")
        h.update(P.numpy().astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def _row_blocks(P: torch.Tensor, rows: int = 4096):
    """(first row, block of P in float64): P is never copied whole in float64."""
    for i in range(0, P.shape[0], rows):
        yield i, P[i:i + rows].double()


def factor_patch(P: torch.Tensor, max_rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Float32 factors U (m, r), V (r, n) of a patch P (m, n), or None where they would not
    be smaller than P or would not give it back.

    GROM's P = (w_f/s) D Xf^T A^-1 has rank at most s (`max_rank`, the forget keys) and at
    most the number of distinct target directions. r is the smallest rank whose dropped
    singular values weigh at most eps(P.dtype) ||P||_F (below P's own rounding), found by a
    seeded Gaussian sketch of P's range (Halko, Martinsson, Tropp 2011) of width under the
    break-even rank, so no full SVD; U V is checked against P: max |U V - P| at most
    8 eps ||P||_F (float32: 9.5e-7 ||P||_F).
    """
    if P.ndim != 2 or P.dtype not in _FACTOR_DTYPES.values() or not bool(torch.isfinite(P).all()):
        return None
    m, n = P.shape
    even = m * n * P.element_size() // (4 * (m + n))  # float32 factors of this rank weigh as much as P
    k = min(even - 1, max_rank or even)
    if k < 1:
        return None
    omega = torch.randn(n, min(k + 8, n), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Q = torch.linalg.qr(torch.cat([Pb @ omega for _, Pb in _row_blocks(P)])).Q  # (m, w) spans P's range
    B = sum(Q[i:i + len(Pb)].T @ Pb for i, Pb in _row_blocks(P))  # (w, n): P = Q B
    Ub, S, Vt = torch.linalg.svd(B, full_matrices=False)
    eps, norm = torch.finfo(P.dtype).eps, float(S.norm())
    tail = S.flip(0).square().cumsum(0).flip(0).sqrt()  # tail[i]: the error of keeping i values
    r = max(1, int((tail > eps * norm).sum()))
    if r > k:
        return None
    U, V = ((Q @ Ub[:, :r]) * S[:r]).float().contiguous(), Vt[:r].float().contiguous()
    err = max(float((U[i:i + len(Pb)].double() @ V.double() - Pb).abs().max()) for i, Pb in _row_blocks(P))
    return (U, V) if err <= 8 * eps * norm else None


def expand_factors(U: torch.Tensor, V: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The patch U V (m, n) in `dtype`, multiplied in float64 and rounded once."""
    return (U.double() @ V.double()).to(dtype)


class StoredPatch(NamedTuple):
    """One patch as patch.safetensors holds it."""

    shape: tuple[int, ...]  # of the full patch
    rank: int | None = None  # of its factors; None: stored as the full matrix
    dtype: torch.dtype | None = None  # the patch's, where stored as factors (they are float32)


def read_patch_layout(file: str | Path) -> dict[str, StoredPatch]:
    """Every patch of a patch.safetensors, by name, from its header alone (no tensor is
    read: a caller checks the shapes against its model before `read_patches` builds them);
    a ValueError if the header is not consistent."""
    with safe_open(str(file), framework="pt") as f:
        raw = (f.metadata() or {}).get(FACTORS_KEY, "{}")
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    try:
        named = json.loads(raw) if json_depth(raw) <= 2 else None
    except json.JSONDecodeError:
        named = None
    if not isinstance(named, dict) or not all(isinstance(d, str) and d in _FACTOR_DTYPES for d in named.values()):
        raise ValueError(f"{PATCH_FILE}: its header's {FACTORS_KEY} must map patch names to "
                         f"{', '.join(_FACTOR_DTYPES)}.")
    layout = {}
    for name, dtype in named.items():
        U, V = shapes.pop(f"{name}.U", None), shapes.pop(f"{name}.V", None)
        if U is None or V is None or len(U) != 2 or len(V) != 2 or U[1] != V[0]:
            raise ValueError(f"{PATCH_FILE}: the factors of {name} are missing or do not fit "
                             f"(shapes {U} and {V}).")
        layout[name] = StoredPatch((U[0], V[1]), U[1], _FACTOR_DTYPES[dtype])
    return layout | {name: StoredPatch(shape) for name, shape in shapes.items()}


def read_patches(file: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """(the full patches by name, the rank of those stored as factors) of a
    patch.safetensors of either form."""
    layout, tensors = read_patch_layout(file), load_file(str(file))
    patches = {name: tensors[name] if p.rank is None
               else expand_factors(tensors[f"{name}.U"], tensors[f"{name}.V"], p.dtype)
               for name, p in layout.items()}
    return patches, {name: p.rank for name, p in layout.items() if p.rank is not None}
