"""Registering a trained method (a `Method` row, grom.methods.trained.method) in the one
method registry, run by the shared trainer's `run_baseline` (grom.methods.trained.trained_edit):
above both, so that neither imports the other back. Each method's file calls
`register_method` when imported, with its place in every list of methods (`order`).

A trained method's row: its edits record the resolved `Settings`; its two boxes are the
epochs and the learning rate, starting from the model family's measured values
(grom.methods.trained.starting_points) or the recipe's; a run resumes (its
checkpoint carries it from one device call to the next: it is stepwise)."""
from __future__ import annotations

from functools import partial

from grom import registry
from grom.methods.trained.method import Method, trainable_reason
from grom.methods.trained.recipes import recipe_for_task
from grom.methods.trained.settings import RunSettings, Settings
from grom.methods.trained.sizes import trained_flops, trained_holds
from grom.methods.trained.starting_points import starting_point
from grom.methods.trained.trained_edit import run_baseline
from grom.registry import Box, MethodEntry

__all__ = ["register_method", "unregister_method"]

MAX_EPOCHS = 1000.0  # a box's bound; a server bounds a run further (the studio's GROM_MAX_EPOCHS)

def trained_boxes(method: str, model_name: str | None = None) -> tuple[Box, Box]:
    """Epochs (fractions run part of an epoch) and learning rate, from the model's starting point."""
    start = starting_point(model_name, method)
    recipe = f"OpenUnlearning's recipe: {starting_point(None, 'ga').epochs:g}"
    return (Box("Epochs", "epochs", start.epochs, 0.0, MAX_EPOCHS, above_low=True,
                upstream=f"{recipe}; fractions run part of an epoch"),
            Box("Learning rate", "lr", start.lr, 0.0, 1.0, above_low=True,
                upstream="OpenUnlearning's recipe: 1e-5; the demo: about 1e-3"))

def trained_settings(model, data, values, band=None) -> RunSettings:
    """A run on `data` for the boxes' epochs at their learning rate, under its benchmark's
    recipe (`band`: a trained method trains where its row says, not on GROM's band)."""
    return RunSettings(recipe=recipe_for_task(getattr(data, "task", None)).name, epochs=values["epochs"],
                       lr=values["lr"], prompt_format=getattr(data, "prompt_format", None))

def describe_training(label: str, edit, values) -> str:
    """"**NPO**, 5 epochs (40 optimizer steps of 8 × 4 examples, lr 5e-05, OpenUnlearning's
    TOFU recipe)": what a finished run did."""
    info, epochs = edit.info, float(values["epochs"])
    return (f"**{label}**, {epochs:g} epoch{'' if epochs == 1 else 's'} ({info.get('steps', '?')} optimizer steps "
            f"of {info.get('batch_size', '?')} × {info.get('grad_accum', '?')} examples, lr {float(values['lr']):g}, "
            f"OpenUnlearning's {str(info.get('recipe', 'tofu')).upper()} recipe)")


def register_method(row: Method, order: int) -> Method:
    """Add `row` to the registry as a trained method, at `order` in every list of methods; a
    name already registered is refused (unregister_method it first)."""
    registry.register(MethodEntry(
        row.name, row.label, "trained", row.description,
        can_run=lambda model, data: trainable_reason(row, model, data), defaults=row.defaults_for,
        run=partial(run_baseline, row.name), settings=Settings, order=order, kind="trained method",
        boxes=partial(trained_boxes, row.name), configure=trained_settings, stepwise=True,
        flops=partial(trained_flops, row.name), holds=partial(trained_holds, row.name),
        describe=partial(describe_training, row.label), detail=row))
    return row

def unregister_method(name: str) -> Method:
    """Remove the trained method `name` from the registry and return its row."""
    return registry.unregister(name, "trained").detail
