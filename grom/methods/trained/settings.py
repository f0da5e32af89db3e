"""The settings of a trained method's run: what the caller asks for (`RunSettings`, every
field optional) and every setting resolved and validated from it (`Settings`,
`resolve_settings`): the training settings the caller left out from the method's own recipe
and then the run's recipe (grom.methods.trained.recipes, OpenUnlearning's per benchmark),
the method's hyperparameters from its registry row fitted to the model."""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Mapping, Sequence

from grom.data.prompts import PromptFormat
from grom.methods.trained.method import Method, get_method
from grom.methods.trained.recipes import DEFAULT_RECIPE, SCHEDULES, get_recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSettings:
    """What a caller asks of a trained run (`run_baseline`'s settings); None takes the
    method's own recipe, then the benchmark's recipe (`recipe`: "tofu" (None), "muse",
    "wmdp"). method_args: the method's hyperparameters by name (beta, alpha, gamma, ...);
    its row's defaults, fitted to the model, fill the rest. `epochs` over the forget set, or
    `max_steps` optimizer steps (overrides epochs, as in HF). params: None trains the
    method's default parameters (every one, RMU's few layers), else those whose name
    contains one of the substrings (e.g. ["mlp"]). master_weights, retain_loss: as
    `Settings`. alternates: for a method that trains toward alternate answers (IDK-NLL,
    IDK-DPO, AltPO), one answer per forget example, or a list of answers each; None: the
    method's own (a seeded "I don't know", AltPO's written by the model)."""

    recipe: str | None = None
    epochs: float | None = None
    seed: int = 0
    lr: float | None = None
    batch_size: int | None = None
    prompt_format: PromptFormat | None = None
    method_args: Mapping[str, float] | None = None
    params: Sequence[str] | None = None
    max_steps: int | None = None
    grad_accum: int | None = None
    warmup_epochs: float | None = None
    weight_decay: float | None = None
    max_grad_norm: float | None = None
    max_length: int | None = None
    schedule: str | None = None
    chunk_corpus: bool | None = None
    master_weights: bool = False
    retain_loss: str = "nll"
    alternates: Sequence[str | Sequence[str]] | None = None

    def replace(self, **kw) -> "RunSettings":
        """A copy with `kw` changed; a name that is no setting is refused, naming the settings
        (a method's hyperparameter goes in method_args)."""
        return with_settings(self, kw)


def with_settings(base: RunSettings | None, kw: Mapping[str, object]) -> RunSettings:
    """`base` (None: the defaults) with the settings `kw` changed; a TypeError names a key
    that is no setting."""
    names = [f.name for f in fields(RunSettings)]
    unknown = sorted(set(kw) - set(names))
    if unknown:
        raise TypeError(f"{unknown[0]!r} is no run setting (a method's hyperparameter goes in "
                        f"method_args={{{unknown[0]!r}: ...}}); the settings: {', '.join(names)}")
    return replace(base or RunSettings(), **kw)


@dataclass(frozen=True)
class Settings:
    """Every setting of one run, resolved (the defaults are TOFU's recipe). method_args: the
    method's hyperparameters (its row's defaults, overridden by the caller's).

    recipe: the recipe the unset training settings came from. schedule: "linear" (warm-up,
    then linear decay) or "constant". chunk_corpus: text examples are joined and cut into
    max_length-token chunks. master_weights: False trains low-precision (bf16 / fp16)
    weights in their own dtype, every step rounded to it, as OpenUnlearning does; True
    keeps float32 master copies (the weights get the rounded masters). float32 models
    train the same either way. retain_loss: the retain term of the methods that have one,
    "nll" (the retain answers' NLL) or "kl" (KL from the unedited model's next-token
    distributions on the retain sequences; OpenUnlearning's ``retain_loss_type: KL``).
    """

    method: str
    epochs: float = 10
    lr: float = 1e-5
    batch_size: int = 8
    grad_accum: int = 4
    warmup_epochs: float = 1.0
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    seed: int = 0
    max_length: int = 512
    recipe: str = DEFAULT_RECIPE
    schedule: str = "linear"
    chunk_corpus: bool = False
    master_weights: bool = False
    retain_loss: str = "nll"
    method_args: Mapping[str, float] = field(default_factory=dict)
    params: tuple[str, ...] | None = None
    prompt_format: PromptFormat | None = None

    def to_dict(self) -> dict:
        """JSON-able, with the method's hyperparameters at the top level (``info["beta"]``)."""
        d = asdict(self)
        d.update(d.pop("method_args"))
        d["params"] = list(self.params) if self.params is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "Settings":
        """The settings `to_dict` wrote: every key that is no setting is one of the method's
        hyperparameters (a trained edit's record may hold more: its steps, losses and
        history, which are not its settings and are left out)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and k != "method_args"}
        if not d.get("method"):
            raise ValueError("a trained run's settings name its method, and these name none")
        row = get_method(str(d["method"]))
        kw["method_args"] = {k: float(d[k]) for k in row.defaults if k in d}
        if kw.get("params") is not None:
            kw["params"] = tuple(kw["params"])
        if isinstance(kw.get("prompt_format"), dict):
            kw["prompt_format"] = PromptFormat(**kw["prompt_format"])
        return cls(**kw)


def _method_args(row: Method, given: Mapping[str, float | None]) -> dict[str, float]:
    """The row's defaults, overridden by the `given` values that are not None; one the
    method does not take is ignored, with a warning."""
    for key in sorted(k for k, v in given.items() if v is not None and k not in row.defaults):
        log.warning("%s does not use %s; ignored", row.name, key)
    return {k: float(given[k]) if given.get(k) is not None else v for k, v in row.defaults.items()}


RECIPE_FIELDS = ("epochs", "lr", "batch_size", "grad_accum", "warmup_epochs", "weight_decay",
                 "max_grad_norm", "max_steps", "max_length", "schedule", "chunk_corpus")
RETAIN_LOSSES = ("nll", "kl")


def _from_recipe(recipe: str, kw: dict, own: Mapping[str, object] | None = None) -> dict:
    """`kw` with the training settings it leaves out (or gives as None) taken from the
    method's `own` recipe (its row's), then from the benchmark's recipe. Epochs given
    without max_steps run those epochs, also under a recipe that counts steps (WMDP's
    max_steps 80)."""
    r = get_recipe(recipe)
    out = {k: v for k, v in kw.items() if v is not None}
    if "epochs" in out and "max_steps" not in out:  # epochs given: the recipe's max_steps does not override it
        out["max_steps"] = None
    for name, value in (own or {}).items():
        out.setdefault(name, value)
    for name in RECIPE_FIELDS:
        out.setdefault(name, getattr(r, name))
    out["recipe"] = r.name
    return out


def resolve_settings(method: str, settings: RunSettings | None = None, *, model=None, **kw) -> Settings:
    """Validate `method` and the settings (`settings` with `kw` changed; `alternates` is not
    read here). Training settings absent or None take the method's own recipe, then the
    `recipe`'s (grom.methods.trained.recipes.RECIPES; None: TOFU's); method_args the
    method's defaults, fitted to `model` where given (`Method.fitted`)."""
    given_settings = with_settings(settings, kw)
    kw = {f.name: getattr(given_settings, f.name) for f in fields(RunSettings)}
    recipe, method_args = kw.pop("recipe"), kw.pop("method_args")
    kw.pop("alternates")
    row = get_method(method).fitted(model)
    bad = sorted(set(row.recipe) - set(RECIPE_FIELDS) - {"params"})
    if bad:
        raise ValueError(f"{row.name}: its recipe sets {bad[0]!r}, which is no training setting")
    kw = _from_recipe(recipe or DEFAULT_RECIPE, kw, row.recipe)
    args = _method_args(row, dict(method_args or {}))
    row.check_args(args)
    clash = sorted(set(args) & {f.name for f in fields(Settings)})
    if clash:
        raise ValueError(f"{row.name}: its hyperparameter {clash[0]!r} has the name of a training "
                         "setting; rename it in the method's row")
    params = kw.get("params")
    if isinstance(params, str):
        params = (params,)
    kw["params"] = tuple(params) if params is not None else None
    s = Settings(method=row.name, method_args=args, **kw)
    checks = [
        (s.epochs > 0 or (s.max_steps or 0) > 0, "epochs must be > 0 (or give max_steps)"),
        (s.max_steps is None or s.max_steps >= 1, "max_steps must be None or >= 1"),
        (s.lr >= 0, "lr must be >= 0"),
        (s.batch_size >= 1 and s.grad_accum >= 1, "batch_size and grad_accum must be >= 1"),
        (s.warmup_epochs >= 0 and s.weight_decay >= 0 and s.max_grad_norm >= 0,
         "warmup_epochs, weight_decay and max_grad_norm must be >= 0"),
        (s.max_length >= 2, "max_length must be >= 2"),
        (args.get("beta", 1.0) > 0, "beta must be > 0"),
        (s.schedule in SCHEDULES, f"schedule {s.schedule!r}: use one of {', '.join(SCHEDULES)}"),
        (s.retain_loss in RETAIN_LOSSES, f"retain_loss {s.retain_loss!r}: use one of {', '.join(RETAIN_LOSSES)}"),
        (s.retain_loss == "nll" or row.needs_retain,
         "it has no retain term, so retain_loss='kl' does not apply (GradDiff, NPO and SimNPO have one)"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"{row.name}: {msg}")
    return s
