"""`Edit`: the result of a GROM edit, as data, with a clear life cycle.

An Edit holds per-parameter patches P on the CPU (in each weight's dtype and layout).
`apply` adds them to a model after a finite check, keeping the original weights;
`revert` copies the originals back, bit for bit; `applied` does both around a block.
Nothing of the model is kept between `revert` and the next `apply`.
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from grom.arch import lm_head_is_tied, retie_lm_head, untie_lm_head
from grom.attribution import LayerScores
from grom.config import EditConfig
from grom.data.sources import MAX_JSON_DEPTH, json_depth

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
        if self.unties_lm_head and lm_head_is_tied(model):
            self._untied = untie_lm_head(model)
        try:
            with torch.no_grad():
                for name, P in self.patches.items():
                    W = model.get_parameter(name)
                    if W.device.type == "meta":
                        raise ValueError(f"{name} is offloaded (on the meta device); load the model "
                                         "so that the edited layers live on a real device")
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
        }

    def save(self, path: str | Path) -> Path:
        """Write ``patch.safetensors`` and ``edit.json`` into the folder `path`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.patches.items()}, str(path / PATCH_FILE))
        (path / META_FILE).write_text(json.dumps(self.metadata(), indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Edit":
        path = Path(path)
        if not (path / PATCH_FILE).exists() or not (path / META_FILE).exists():
            raise FileNotFoundError(f"{path} holds no saved edit (expected {PATCH_FILE} and {META_FILE})")
        meta = read_metadata((path / META_FILE).read_text())
        return cls(
            config=EditConfig.from_dict(meta["config"]),
            patches=load_file(str(path / PATCH_FILE)),
            layers=[LayerRecord(**r) for r in meta.get("layers", [])],
            scores=LayerScores.from_dict(meta["scores"]) if meta.get("scores") else None,
            timings=meta.get("timings", {}),
            unties_lm_head=meta.get("unties_lm_head", False),
            model_name=meta.get("model_name"),
            method=meta.get("method", "grom"),
            info=meta.get("info", {}),
            run=meta.get("run") or {},
        )


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
    return meta
