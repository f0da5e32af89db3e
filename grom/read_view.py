"""`ReadView`: a read-only mapping whose contents a function gives at each read. The
registries show themselves through it (`grom.data.BENCHMARKS`, `grom.eval.tasks.TASKS`, the
metric facts' one tables): filled on their first read, never written through."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["ReadView"]


class ReadView(Mapping):
    """`read()`'s mapping, read-only, read again at every access; `name` is how it prints."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], name: str):
        self._read, self._name = read, name

    def __getitem__(self, key: str) -> Any:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._read()))  # a copy: a registration while iterating changes nothing here

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(map(str, self._read()))})"
