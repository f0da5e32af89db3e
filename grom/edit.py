"""`Edit`: the result of any method's edit (GROM's, a trained method's, an editor's, LUNAR's),
as data, with a clear life cycle.

An Edit holds per-parameter patches P on the CPU (in each weight's dtype and layout).
`apply` adds them to a model after a finite check, keeping the original weights;
`revert` copies the originals back, bit for bit; `applied` does both around a block.
Nothing of the model is kept between `revert` and the next `apply`.

A computed edit holds every patch in full (a dict). A loaded one holds each patch as its
file did (`Patches`): a patch stored as factors stays float32 factors U (m, r), V (r, n)
(`Factors`), expanded only while it is used: `apply` adds it into its weight a block of
rows at a time, and reading ``edit.patches[name]`` gives the full matrix on demand, not
kept. So a session holding an imported factored edit holds its factors, not a copy of
the weights. `edit.held` answers each patch's shape, dtype, rank and norm without
expanding any (the norm of U V from the r x r Gram matrices U^T U and V V^T).

On disk (`save`, `load`): ``edit.json`` (the settings, the run, and ``patch_sha256``, the
hash of the patches as computed) and ``patch.safetensors``, each patch either the full
matrix under its parameter's name (exact) or, with ``save(..., factored=True)`` where
that is smaller, float32 factors ``<name>.U`` (m, r) and ``<name>.V`` (r, n) whose
product is the patch to its dtype's rounding (the header's ``grom.factors`` lists them).
An edit loaded from factors saves them back as they were. ``edit.json`` records each
patch's norm (``patch_norms``), which `load` checks for every patch of every method.

What a file may hold for a given model (`grom.patch_policy.check_stored_patches`, from the
header and edit.json alone, before any tensor is read): patches of the model's own weights, with
their shapes; for GROM and the editors (ROME, MEMIT, AlphaEdit, ZeroUnlearn) only the
matrix kind they edit (GROM: its config's `matrix`; the editors: down_proj) in the layers
edit.json's rows name, one row per patch; for a trained method (GA, NPO, ...) any of the
model's floating parameters, expanding to at most the model's own parameter count.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from grom import registry
from grom.data.readers import MAX_JSON_DEPTH, json_depth
from grom.model.arch import lm_head_is_tied, retie_lm_head, untie_lm_head
from grom.model.editable import NotEditable, weight_problem

log = logging.getLogger(__name__)

PATCH_FILE, META_FILE = "patch.safetensors", "edit.json"


@dataclass(frozen=True)
class LayerScores:
    """The logit-lens scores S_l, F_l and R_l per layer, with the suggested band: what GROM's
    band was chosen from (`grom.closed_form.layer_scores` computes them)."""

    S: tuple[float, ...]
    F: tuple[float, ...]
    R: tuple[float, ...]
    band: tuple[int, ...]
    matrix: str = "down_proj"
    k: int = 5
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"S": list(self.S), "F": list(self.F), "R": list(self.R), "band": list(self.band),
                "matrix": self.matrix, "k": self.k}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerScores":
        return cls(tuple(d["S"]), tuple(d["F"]), tuple(d["R"]), tuple(d["band"]),
                   d.get("matrix", "down_proj"), d.get("k", len(d["band"])))


@dataclass
class LayerKeys:
    """What the diagnostics need of one edited matrix, on the CPU.

    Xf (n, s) forget keys with `forget_example` (s,) in 0..n_forget-1; Xr (n, r) retain
    keys with `retain_example` (r,); `directions` the D used (a grom.closed_form.directions.Directions).
    """

    Xf: torch.Tensor
    forget_example: torch.Tensor
    Xr: torch.Tensor
    retain_example: torch.Tensor
    directions: object
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
    """An edit of any method: patches by parameter name, the method that made them and that
    method's own settings object (GROM's `EditConfig`, a trained method's `Settings`, an
    editor's `EditorConfig`, LUNAR's `LunarConfig`: the registry row's `settings` class),
    and what the run recorded.

    `patches` reads as {name: full patch}: a dict for a computed edit, a `Patches` for a
    loaded one (factored patches expanded on each read, not kept). `held` gives their
    shapes, dtypes, ranks and norms without expanding anything."""

    settings: object  # the method's own settings (its registry row's `settings` class), with to_dict
    patches: Mapping[str, torch.Tensor]
    layers: list[LayerRecord] = field(default_factory=list)
    scores: LayerScores | None = None
    timings: dict[str, float] = field(default_factory=dict)
    unties_lm_head: bool = False
    model_name: str | None = None
    keys: dict[str, LayerKeys] = field(default_factory=dict)  # by param name, if kept
    method: str = "grom"  # what made it: a registered method's name ("grom", "npo", "rome", "lunar", ...)
    info: dict = field(default_factory=dict)  # method-specific, JSON-able (a trained run: its steps, losses)
    # How to reproduce it beyond the settings, JSON-able (the studio: the model by name, the
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
    def prompt_format(self):
        """The prompt format the method asked its questions in (every method's settings hold one)."""
        return getattr(self.settings, "prompt_format", None)

    @property
    def matrix(self) -> str | None:
        """The kind of matrix the edit patches, where it edits one kind (GROM: its settings';
        the editors and LUNAR: down_proj); None for a trained method's patches."""
        if getattr(self.settings, "matrix", None):
            return self.settings.matrix
        return "down_proj" if self.layers else None

    @property
    def band(self) -> list[int]:
        return [r.layer for r in self.layers if r.layer is not None]

    @property
    def is_applied(self) -> bool:
        return bool(self._saved)

    @property
    def held(self) -> "Patches":
        """The patches as held (full or factors): shape, dtype, rank and norm of each
        without expanding any; ``held.held(name)`` the tensor or `Factors` itself."""
        return self.patches if isinstance(self.patches, Patches) else Patches(self.patches)

    def patch(self, name: str) -> torch.Tensor:
        """The full patch of `name` (a factored one expanded now, and not kept)."""
        return self.patches[name]

    def apply(self, model: nn.Module) -> None:
        """W <- W + P for every patch, keeping the originals for `revert`. A factored patch
        is expanded a block of rows at a time into its weight (the same float64 product,
        rounded once to its dtype, as `expand_factors`), never whole."""
        if self._saved:
            raise RuntimeError("this edit is already applied; revert it first")
        held = self.held
        for name in held:
            if not held.finite(name):
                raise ValueError(f"the patch for {name} has non-finite values; not applied")
        check_patchable(model, held)
        if self.unties_lm_head and lm_head_is_tied(model):
            self._untied = untie_lm_head(model)
        try:
            with torch.no_grad():
                for name in held:
                    W = model.get_parameter(name)
                    if W.shape != held.shape(name):
                        raise ValueError(f"patch {name} has shape {tuple(held.shape(name))}, the model's "
                                         f"weight {tuple(W.shape)}: is this the model it was made for?")
                    self._saved[name] = W.detach().clone()
                    held.add_into(name, W)
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
        """||P||_F over every patch (factored ones from their factors, not expanded)."""
        return float(sum(n ** 2 for n in self.patch_norms().values()) ** 0.5)

    def patch_norms(self) -> dict[str, float]:
        """||P||_F of each patch, by name (factored ones from their factors)."""
        held = self.held
        return {name: held.norm(name) for name in held}

    def sha256(self) -> str:
        """`patch_sha256` of the patches as computed. An edit loaded from factors holds their
        product, not the computed patch bit for bit: it answers with the hash recorded."""
        if self.stored_ranks and self.recorded_sha256:
            return self.recorded_sha256
        return patch_sha256(self.patches)

    def metadata(self) -> dict:
        return {
            "settings": self.settings.to_dict(),
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
            "patch_norms": self.patch_norms(),
        }

    def save(self, path: str | Path, factored: bool = False) -> Path:
        """Write ``patch.safetensors`` and ``edit.json`` into the folder `path`. `factored`:
        each patch whose float32 factors are smaller is stored as them (`factor_patch`; a
        patch held as factors, those factors), and loads back equal to its dtype's rounding;
        otherwise every patch loads bit for bit (as held: a factored one, expanded)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors, factors = {}, {}
        held = self.held
        for name in held:
            kept = held.held(name)
            if factored and isinstance(kept, Factors):
                tensors[f"{name}.U"], tensors[f"{name}.V"] = kept.U.contiguous(), kept.V.contiguous()
                factors[name] = str(kept.dtype).removeprefix("torch.")
                continue
            P = held[name]
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
        """The edit saved in the folder `path`: full patches bit for bit, factored ones kept
        as their factors (read as their product). A patch file that is not the one edit.json
        describes (its hash, or a patch's recorded norm, differ) is a ValueError."""
        path = Path(path)
        if not (path / PATCH_FILE).exists() or not (path / META_FILE).exists():
            raise FileNotFoundError(f"{path} holds no saved edit (expected {PATCH_FILE} and {META_FILE})")
        meta = read_metadata((path / META_FILE).read_text())
        patches, ranks = read_patches(path / PATCH_FILE)
        method = meta.get("method", "grom")
        edit = cls(
            settings=read_settings(method, meta),
            patches=patches,
            layers=[LayerRecord(**r) for r in meta.get("layers", [])],
            scores=LayerScores.from_dict(meta["scores"]) if meta.get("scores") else None,
            timings=meta.get("timings", {}),
            unties_lm_head=meta.get("unties_lm_head", False),
            model_name=meta.get("model_name"),
            method=method,
            info=meta.get("info", {}),
            run=meta.get("run") or {},
            world_size=int(meta.get("world_size") or 1),
            recorded_sha256=meta.get("patch_sha256"),
            stored_ranks=ranks,
        )
        edit._check_patches(meta.get("patch_norms") or {})
        return edit

    def _check_patches(self, norms: Mapping[str, float] = {}) -> None:  # noqa: B006  (read only)
        """That the patches are those edit.json describes, whatever method made them: the
        same hash where every patch is stored full, and every patch's norm within 1e-4 of
        the one recorded (`norms`, edit.json's patch_norms, else its layer's row), give or
        take its dtype's rounding (2 eps). A patch stored as factors (which no hash can
        name) with no recorded norm is refused."""
        mismatch = f"{PATCH_FILE} is not the patch {META_FILE} describes: keep the two files of one export together"
        if self.recorded_sha256 and not self.stored_ranks and patch_sha256(self.patches) != self.recorded_sha256:
            raise ValueError(f"{mismatch} (the patches' sha256 differs from the one recorded).")
        recorded = {r.param_name: r.patch_norm for r in self.layers} | dict(norms)
        held = self.held
        for name in held:
            want = recorded.get(name)
            if want is None:
                if name in self.stored_ranks:
                    raise ValueError(f"{META_FILE} records no norm for {name}, which {PATCH_FILE} stores as "
                                     "factors (no hash can name them): export the edit again.")
                continue
            # in the patch's dtype: rounding moves a norm by up to eps/2 of it (|<P, dP>| <= ||P|| ||dP||;
            # a factored norm is the exact product's, an editor records its float32 patch's) and the
            # factors drop at most eps of it (`factor_patch`): 1.6% in bfloat16, 1e-4 in float32
            slack = 1e-4 + 2 * torch.finfo(held.dtype(name)).eps
            if abs(held.norm(name) - want) > slack * max(want, 1e-30):
                raise ValueError(f"{mismatch} ({name}'s norm is not the one recorded).")


def read_settings(method: str, meta: Mapping):
    """The settings object of an edit.json's method (`registry.settings_from`): its
    "settings"; in a file written before edits carried their method's settings, GROM's
    "config", or a trained run's settings in its "info" (the config such a file holds is a
    default GROM config, not what the run used). A method no registry row names, or
    settings its class cannot read, is a ValueError that says so."""
    recorded = meta.get("settings")
    try:
        if recorded is None and method == "grom":
            recorded = meta.get("config")
        elif recorded is None and registry.family_of(method) == "trained":
            recorded = {**(meta.get("info") or {}), "method": method}
        elif recorded is None:  # an editor's or LUNAR's: the GROM settings of their keys, as far as they go
            known = {f.name for f in dataclasses.fields(registry.get(method).settings)}
            recorded = {k: v for k, v in (meta.get("config") or {}).items() if k in known}
        return registry.settings_from(method, recorded or {})
    except registry.UnknownMethod:
        raise ValueError(f"{META_FILE}: the method {method!r} is none this server knows (one of "
                         f"{', '.join(registry.names())}).") from None
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"{META_FILE}'s settings of {method} cannot be read: {err}") from None


def check_patchable(model: nn.Module, patches: dict[str, torch.Tensor]) -> None:
    """`NotEditable` for the first patched weight that cannot take a float patch in place
    (quantized, offloaded: `grom.model.editable.weight_problem`), before anything is changed."""
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


_ROW_NEEDS = ("param_name", "layer", "beta", "mu", "n_forget_keys", "n_retain_keys", "patch_norm", "weight_norm")


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def read_metadata(text: str) -> dict:
    """The contents of an ``edit.json``, checked: valid JSON no deeper than an edit.json
    can be, an object, with valid "settings" of its "method" (in a file written before, a
    "config"): ValueError saying what is wrong otherwise."""
    depth = json_depth(text)  # before json.loads, which would recurse through it
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{META_FILE} is nested {depth} levels deep, too deep to be an edit.json (an "
                         "object holding \"settings\", \"layers\", \"scores\", \"run\" and a few more, "
                         "nested a few levels at most): "
                         "upload the edit.json an export wrote.")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{META_FILE} is not valid JSON ({err.msg}, line {err.lineno} column "
                         f"{err.colno}): upload the edit.json an export wrote.") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE} must hold a JSON object with \"settings\", not a "
                         f"{type(meta).__name__}.")
    if not isinstance(meta.get("settings", meta.get("config")), dict):
        raise ValueError(f"{META_FILE} has no \"settings\" object (the edit's settings): upload the "
                         "edit.json an export wrote.")
    if not isinstance(meta.get("method", "grom"), str):
        raise ValueError(f"{META_FILE}: \"method\" must be a method's name.")
    read_settings(meta.get("method", "grom"), meta)
    for key, kind in (("run", dict), ("layers", list), ("info", dict), ("timings", dict)):
        if meta.get(key) is not None and not isinstance(meta[key], kind):
            raise ValueError(f"{META_FILE}: \"{key}\" must be a JSON {kind.__name__.replace('dict', 'object')}.")
    ws = meta.get("world_size")
    if ws is not None and not (isinstance(ws, int) and not isinstance(ws, bool) and ws >= 1):
        raise ValueError(f"{META_FILE}: \"world_size\" must be a whole number of processes (1 or more).")
    layers = meta.get("layers") or []
    for row in layers:
        if not (isinstance(row, dict) and isinstance(row.get("param_name"), str)
                and set(_ROW_NEEDS) <= set(row) <= set(LayerRecord.__dataclass_fields__)
                and (row.get("layer") is None or _whole(row["layer"]))
                and all(_number(row[k]) for k in _ROW_NEEDS[2:])):
            raise ValueError(f"{META_FILE}: every row of \"layers\" must be an object with "
                             f"{', '.join(_ROW_NEEDS)} (a name, a layer number or null, numbers): "
                             "upload the edit.json an export wrote.")
    if not isinstance(meta.get("method", "grom"), str):
        raise ValueError(f"{META_FILE}: \"method\" must be the name of the method that made the edit "
                         "(\"grom\", \"ga\", ...).")
    norms = meta.get("patch_norms")
    if norms is not None and not (isinstance(norms, dict) and all(_number(v) for v in norms.values())):
        raise ValueError(f"{META_FILE}: \"patch_norms\" must map patch names to numbers (their norms).")
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
    """The patch U V (m, n) in `dtype`, multiplied in float64 and rounded once (a block of
    rows at a time, as `Edit.apply` adds it: the same numbers)."""
    return Factors(U, V, dtype).expand()


EXPAND_BLOCK = 1 << 22  # float64 elements of one block of an expanded patch (32 MB)


class Factors(NamedTuple):
    """A patch held as float32 factors: the full patch is U V, multiplied in float64 and
    rounded once to `dtype`. Expanded a block of rows at a time (`blocks`), so a whole
    float64 copy of it never exists."""

    U: torch.Tensor  # (m, r) float32
    V: torch.Tensor  # (r, n) float32
    dtype: torch.dtype  # the full patch's

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.U.shape[0], self.V.shape[1]))

    @property
    def rank(self) -> int:
        return int(self.U.shape[1])

    @property
    def nbytes(self) -> int:
        return self.U.numel() * self.U.element_size() + self.V.numel() * self.V.element_size()

    def blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, those rows of the full patch in `dtype`), EXPAND_BLOCK elements at most."""
        rows = max(1, EXPAND_BLOCK // max(1, self.V.shape[1]))
        V = self.V.double()
        for i in range(0, self.U.shape[0], rows):
            yield i, (self.U[i:i + rows].double() @ V).to(self.dtype)

    def expand(self) -> torch.Tensor:
        """The full patch (m, n) in `dtype`."""
        out = torch.empty(self.shape, dtype=self.dtype)
        for i, block in self.blocks():
            out[i:i + len(block)] = block
        return out

    def norm(self) -> float:
        """||U V||_F from the r x r Gram matrices: sum((U^T U) * (V V^T)), in float64,
        without forming U V. It is the exact product's norm: rounding the product to
        `dtype` moves the norm by at most eps(dtype)/2 of it."""
        U, V = self.U.double(), self.V.double()
        return float(((U.T @ U) * (V @ V.T)).sum().clamp(min=0.0).sqrt())

    def finite(self) -> bool:
        """Every entry of the full patch finite: the factors finite and their largest
        product |U_i||V_j| below `dtype`'s range, else the expansion checked block by block."""
        if not (bool(torch.isfinite(self.U).all()) and bool(torch.isfinite(self.V).all())):
            return False
        if self.U.numel() == 0 or self.V.numel() == 0:
            return True
        bound = float(self.U.double().norm(dim=1).max()) * float(self.V.double().norm(dim=0).max())
        if bound < torch.finfo(self.dtype).max:
            return True
        return all(bool(torch.isfinite(block).all()) for _, block in self.blocks())


class Patches(Mapping):
    """Patches by parameter name, each held as a full tensor or as `Factors`. Read as a
    mapping, it gives every patch in full: a factored one expanded on each read, not kept
    (read one at a time, and drop it). `shape`, `dtype`, `rank`, `norm`, `finite` and
    `add_into` answer without a full copy; `nbytes` is what is held."""

    def __init__(self, held: Mapping[str, "torch.Tensor | Factors"] = ()):
        self._held = dict(held)

    def held(self, name: str) -> "torch.Tensor | Factors":
        return self._held[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        kept = self._held[name]
        return kept.expand() if isinstance(kept, Factors) else kept

    def __contains__(self, name) -> bool:
        return name in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"Patches({', '.join(self._held)})"

    def shape(self, name: str) -> torch.Size:
        return self._held[name].shape

    def dtype(self, name: str) -> torch.dtype:
        return self._held[name].dtype

    def rank(self, name: str) -> int | None:
        """The rank of the factors `name` is held as; None: held in full."""
        kept = self._held[name]
        return kept.rank if isinstance(kept, Factors) else None

    def norm(self, name: str) -> float:
        kept = self._held[name]
        return kept.norm() if isinstance(kept, Factors) else float(kept.double().norm())

    def finite(self, name: str) -> bool:
        kept = self._held[name]
        if isinstance(kept, Factors):
            return kept.finite()
        return not kept.is_floating_point() or bool(torch.isfinite(kept).all())

    def is_float(self, name: str) -> bool:
        return isinstance(self._held[name], Factors) or self._held[name].is_floating_point()

    def add_into(self, name: str, W: torch.Tensor) -> None:
        """W += the patch `name` (W a weight of its shape, under no_grad): a factored one
        a block of rows at a time, each the product rounded to the patch's dtype first."""
        kept = self._held[name]
        if not isinstance(kept, Factors):
            W.add_(kept.to(W.device, W.dtype))
            return
        for i, block in kept.blocks():
            W[i:i + len(block)].add_(block.to(W.device, W.dtype))

    def nbytes(self) -> int:
        """Bytes held (a factored patch: its factors)."""
        return sum(k.nbytes if isinstance(k, Factors) else k.numel() * k.element_size() for k in self._held.values())

    def numel(self) -> int:
        """Elements of every patch in full."""
        return sum(self._held[name].shape.numel() for name in self._held)


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


def read_patches(file: str | Path) -> tuple[Patches, dict[str, int]]:
    """(the patches by name, the rank of those stored as factors) of a patch.safetensors
    of either form; factored patches stay factors (`Patches` expands them when read)."""
    layout, tensors = read_patch_layout(file), load_file(str(file))
    patches = Patches({name: tensors[name] if p.rank is None
                       else Factors(tensors[f"{name}.U"].float(), tensors[f"{name}.V"].float(), p.dtype)
                       for name, p in layout.items()})
    return patches, {name: p.rank for name, p in layout.items() if p.rank is not None}

