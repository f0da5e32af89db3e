"""The registry of every unlearning method: GROM, the trained methods, the locate-then-edit
editors and LUNAR, one row (`MethodEntry`) each, registered by the method's own module when
it is imported, in an explicit order (`order`: the order of every list of methods).

A row holds everything a caller asks of a method, so that no caller asks which family it is:

- what it is: `name`, `label`, `family`, `description`, `kind` (its kind in a few words, for
  a list or a glossary), `order`;
- what it can run on: `can_run(model, data)`, None or the `Reason` it cannot, in the words
  its run would be refused with;
- its settings: `settings`, the class of its settings object (with ``to_dict`` and
  ``from_dict``: an edit records them, `grom.edit.Edit.settings`), `defaults(model)`;
- the two number boxes a UI shows for it (`boxes(model_name)`: each a `Box` with its label,
  default, bounds and the words of a refusal) and `configure(model, data, values, band)`,
  its settings object from those boxes' values;
- where it runs: `on_grom_band`, whether its settings take GROM's band of the session's
  edit (the editors: the same keys and retain covariance, another update rule);
- its cost: `flops(model, data, values)` of a whole run (a device's time is priced from
  it), `holds(model, data, values)` the bytes its run keeps between two turns on the device,
  and `stepwise`: the run is optimizer steps over the model's weights, so it can stop after
  any step and go on from its checkpoint in another call (a trained method), and its time
  is priced per step;
- its words: `describe(edit, values)`, what a finished run did, in a sentence (markdown);
- its run: `run(model, tokenizer, forget, retain, settings, **kw) -> Edit`; every run takes
  `progress` and `between`, the step boundary of `grom.turns`; a stepwise one `part`.

`detail` is the family's own row: a trained method's `Method` (its loss, what it needs), an
editor's `EditorMethod` (its update rule), None for GROM and LUNAR. The families' tables
`METHODS` (trained) and `EDITORS` are views of this one registry (`FamilyView`).

`data` is what a method would run on: anything with ``forget`` and ``retain`` example
sequences (a `grom.data.Split`, the studio's benchmark); its ``name`` and ``split``, where
it has them, name it in the reasons.

The rows are filled before the first read: the `grom` package hands `fill_before_reading`
the import of `grom.methods`, whose modules register their rows (and import this module,
which therefore imports none of them). So `get("npo")` answers after `import grom` alone,
and `grom.edit` reads a saved edit's settings back with its method's class.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterator, Literal, Mapping, NamedTuple

Family = Literal["closed-form", "trained", "editor", "redirection"]
# redirection: a method that refits one matrix so that forward-pass activations move to targets (LUNAR)
FAMILIES: tuple[str, ...] = ("closed-form", "trained", "editor", "redirection")


class Reason(NamedTuple):
    """Why a method cannot run on some data: a few words (for a method box) and the whole
    message its run is refused with."""

    words: str
    message: str

    def __str__(self) -> str:
        return self.message


class BadSetting(ValueError):
    """A value a method's box cannot take, in words that say what it can."""


@dataclass(frozen=True)
class Box:
    """One number box a UI shows for a method: its label, the settings value it sets
    (`name`, a key of `configure`'s values), its default, and the values it takes: from
    `low` (above it where `above_low`) to `high`, whole numbers where `whole`; `upstream`
    says in a refusal what the method's authors take ("upstream: 20")."""

    label: str
    name: str
    default: float
    low: float
    high: float
    whole: bool = False
    above_low: bool = False
    upstream: str = ""

    def read(self, value, high: float | None = None) -> float:
        """`value` as this box's number (`high`: a tighter bound of the caller's, a server's
        limit); a `BadSetting` that says which values it takes."""
        top = self.high if high is None else min(self.high, high)
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise BadSetting(f"{self.label} must be a number (got {str(value)[:40]!r}).") from None
        low_ok = x > self.low if self.above_low else x >= self.low
        if not (math.isfinite(x) and low_ok and x <= top and (not self.whole or x == int(x))):
            what = "a whole number" if self.whole else "a number"
            span = f"above {self.low:g} and at most {top:g}" if self.above_low else f"from {self.low:g} to {top:g}"
            said = f" ({self.upstream})" if self.upstream else ""
            name = self.label.split(" (")[0]  # "Value steps (per-fact vector)" says "Value steps = ..."
            raise BadSetting(f"{name} = {str(value)[:40]}: {what} {span}{said}.")
        return float(int(x)) if self.whole else x


CanRun = Callable[[Any, Any], "Reason | None"]  # (model or None, data) -> None or why not
Defaults = Callable[[Any], Mapping[str, Any]]  # model or None -> the method's settings' defaults
Run = Callable[..., Any]  # (model, tokenizer, forget, retain, settings, **kw) -> Edit
Boxes = Callable[["str | None"], "tuple[Box, ...]"]  # model name or None -> its boxes, defaults fitted
Configure = Callable[..., Any]  # (model, data, {box name: value}, band) -> the settings object
Cost = Callable[[Any, Any, Mapping[str, float]], float]  # (model, data, {box name: value}) -> FLOPs or bytes


def _nothing(*_args) -> float:
    return 0.0


@dataclass(frozen=True)
class MethodEntry:
    """One method of the registry (see the module docstring)."""

    name: str
    label: str
    family: Family
    description: str
    can_run: CanRun
    defaults: Defaults
    run: Run
    settings: type
    order: int
    kind: str = ""
    boxes: Boxes = lambda _model_name: ()
    configure: Configure | None = None
    on_grom_band: bool = False
    flops: Cost = _nothing
    holds: Cost = _nothing
    stepwise: bool = False
    describe: Callable[[Any, Mapping[str, float]], str] | None = None
    detail: Any = None

    def __post_init__(self):
        if not self.name or self.name != self.name.strip().lower():
            raise ValueError(f"method name {self.name!r}: use a non-empty lower-case name")
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name}: family {self.family!r}; use one of {', '.join(FAMILIES)}")
        for need in ("to_dict", "from_dict"):
            if not callable(getattr(self.settings, need, None)):
                raise ValueError(f"method {self.name}: its settings class {self.settings.__name__} needs {need}")

    def read_boxes(self, values: Mapping[str, Any], model_name: str | None = None,
                   high: Mapping[str, float] | None = None) -> dict[str, float]:
        """`values` (by box name; a box left out takes its default) read by this method's
        boxes, each at most `high`'s bound for it where given; a `BadSetting` names the
        first a box cannot take."""
        high = high or {}
        return {b.name: b.read(values.get(b.name, b.default), high.get(b.name)) for b in self.boxes(model_name)}

    def settings_for(self, model, data, values: Mapping[str, Any], band=None):
        """The settings object of a run on `data` from the boxes' `values` (read first)."""
        if self.configure is None:
            raise ValueError(f"{self.label} takes its settings whole, not from boxes")
        return self.configure(model, data, self.read_boxes(values, getattr(model, "name_or_path", None)), band)


class UnknownMethod(ValueError):
    """No method of that name is registered (in the family asked for)."""


_ROWS: dict[str, MethodEntry] = {}
# Every registered method, in order (`MethodEntry.order`); read-only (register / unregister change it).
ALL: Mapping[str, MethodEntry] = MappingProxyType(_ROWS)


def key(name) -> str:
    """A method's registry key: its name, lower case, surrounding spaces removed."""
    return str(name or "").strip().lower()


def register(entry: MethodEntry) -> MethodEntry:
    """Add `entry`; a name already registered is refused (unregister it first)."""
    if entry.name in _ROWS:
        raise ValueError(f"a method named {entry.name!r} ({_ROWS[entry.name].label}) is already "
                         "registered; unregister it first or choose another name")
    _ROWS[entry.name] = entry
    ordered = sorted(_ROWS.values(), key=lambda e: e.order)  # stable: equal orders keep registration's
    _ROWS.clear()
    _ROWS.update((e.name, e) for e in ordered)
    return entry


_fills: list[Callable[[], None]] = []


def fill_before_reading(fill: Callable[[], None]) -> None:
    """Have `fill` called before the registry's next read (the `grom` package gives one that
    imports the methods: they register their rows and import this module)."""
    _fills.append(fill)


def _filled() -> dict[str, MethodEntry]:
    for fill in list(_fills):  # a read during a fill (the methods' own import) finds what is there so far
        _fills.remove(fill)
        fill()
    return _ROWS


def settings_from(name, recorded: Mapping[str, Any]):
    """The settings object of the method `name` from what an edit recorded of them."""
    return get(name).settings.from_dict(dict(recorded))


def get(name, family: str | None = None) -> MethodEntry:
    """The registered method `name` (case and spaces ignored), of `family` where given."""
    entry = _filled().get(key(name))
    if entry is None or (family is not None and entry.family != family):
        known = names(family)
        kind = {"trained": "unlearning method", "editor": "editor"}.get(family or "", "method")
        raise UnknownMethod(f"unknown {kind} {name!r}; use one of {', '.join(known)}")
    return entry


def unregister(name, family: str | None = None) -> MethodEntry:
    """Remove the method `name` and return its row."""
    return _ROWS.pop(get(name, family).name)


def names(family: str | None = None) -> tuple[str, ...]:
    """The registered names (of `family`), in order."""
    return tuple(n for n, e in _filled().items() if family is None or e.family == family)


def family_of(name) -> str | None:
    """The family of the method `name`, or None where no method has that name."""
    entry = _filled().get(key(name))
    return None if entry is None else entry.family


def can_run(name, model, data) -> Reason | None:
    """Why the method `name` cannot run on `data` with `model` (None: it can; `model` None
    checks the data alone)."""
    return get(name).can_run(model, data)


def where(data) -> str:
    """How a reason names `data`: "name/split" where it has both, else "this data"."""
    name, split = getattr(data, "name", None), getattr(data, "split", None)
    return f"{name}/{split}" if name and split else "this data"


class FamilyView(Mapping):
    """The rows of one family, by name, as their `detail` (a read-only view of the registry)."""

    def __init__(self, family: str):
        self.family = family

    def __getitem__(self, name):
        entry = _ROWS.get(name)
        if entry is None or entry.family != self.family:
            raise KeyError(name)
        return entry.detail

    def __iter__(self) -> Iterator[str]:
        return iter(names(self.family))

    def __len__(self) -> int:
        return len(names(self.family))

    def __repr__(self) -> str:
        return f"FamilyView({self.family!r}: {', '.join(self)})"
