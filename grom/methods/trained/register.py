"""Registering a trained method (a `Method` row, grom.methods.trained.method) in the one
method registry, run by the shared trainer's `run_baseline` (grom.methods.trained.trained_edit):
above both, so that neither imports the other back. Each method's file calls
`register_method` when imported."""
from __future__ import annotations

from functools import partial

from grom.methods import registry
from grom.methods.registry import MethodEntry
from grom.methods.trained.method import Method, trainable_reason
from grom.methods.trained.trained_edit import run_baseline

__all__ = ["register_method", "unregister_method"]


def register_method(row: Method) -> Method:
    """Add `row` to the registry as a trained method; a name already registered is refused
    (unregister_method it first)."""
    registry.register(MethodEntry(row.name, row.label, "trained", row.description,
                                  can_run=lambda model, data: trainable_reason(row, model, data),
                                  defaults=row.defaults_for, run=partial(run_baseline, row.name), detail=row))
    return row


def unregister_method(name: str) -> Method:
    """Remove the trained method `name` from the registry and return its row."""
    return registry.unregister(name, "trained").detail
