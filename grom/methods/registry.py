"""The registry of every unlearning method: GROM, the trained methods and the
locate-then-edit editors, one row (`MethodEntry`) each, registered by the method's own
module when it is imported.

A row says what the method is (name, label, family, a sentence for a UI), what it can run
on (`can_run(model, data)`: None, or the `Reason` it cannot, in the words its run would be
refused with), its defaults fitted to a model (`defaults(model)`), and how to run it
(`run(model, tokenizer, forget, retain, settings, **kw) -> Edit`; every family's run takes
`progress` and `between`, the step boundary of `grom.turns`). `detail` is the
family's own row: the trained method's `Method` (its loss, what it needs), the editor's
`EditorMethod` (its update rule), None for GROM.

The families' tables `METHODS` (trained) and `EDITORS` are views of this one registry
(`FamilyView`): registering a trained method or an editor adds its row here.

`data` is what a method would run on: anything with ``forget`` and ``retain`` example
sequences (a `grom.data.Split`, the studio's benchmark); its ``name`` and ``split``, where
it has them, name it in the reasons.
"""
from __future__ import annotations

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


CanRun = Callable[[Any, Any], "Reason | None"]  # (model or None, data) -> None or why not
Defaults = Callable[[Any], Mapping[str, Any]]  # model or None -> the method's settings' defaults
Run = Callable[..., Any]  # (model, tokenizer, forget, retain, settings, **kw) -> Edit


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
    detail: Any = None

    def __post_init__(self):
        if not self.name or self.name != self.name.strip().lower():
            raise ValueError(f"method name {self.name!r}: use a non-empty lower-case name")
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name}: family {self.family!r}; use one of {', '.join(FAMILIES)}")


class UnknownMethod(ValueError):
    """No method of that name is registered (in the family asked for)."""


_ROWS: dict[str, MethodEntry] = {}
# Every registered method, in registration order; read-only (register / unregister change it).
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
    return entry


def get(name, family: str | None = None) -> MethodEntry:
    """The registered method `name` (case and spaces ignored), of `family` where given."""
    entry = _ROWS.get(key(name))
    if entry is None or (family is not None and entry.family != family):
        known = names(family)
        kind = {"trained": "unlearning method", "editor": "editor"}.get(family or "", "method")
        raise UnknownMethod(f"unknown {kind} {name!r}; use one of {', '.join(known)}")
    return entry


def unregister(name, family: str | None = None) -> MethodEntry:
    """Remove the method `name` and return its row."""
    return _ROWS.pop(get(name, family).name)


def names(family: str | None = None) -> tuple[str, ...]:
    """The registered names (of `family`), in registration order."""
    return tuple(n for n, e in _ROWS.items() if family is None or e.family == family)


def family_of(name) -> str | None:
    """The family of the method `name`, or None where no method has that name."""
    entry = _ROWS.get(key(name))
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
