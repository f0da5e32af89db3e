"""GROM, registered as the closed-form method: its runner is `grom.closed_form.pipeline.run_edit` with
an `EditConfig` (grom.closed_form.config), its defaults `EditConfig()`'s (the automatic band, read from
the model's layer scores, so they fit any model)."""
from __future__ import annotations

from grom.closed_form.config import EditConfig
from grom.closed_form.pipeline import run_edit
from grom.registry import MethodEntry, Reason, register, where


def grom_reason(model, data) -> Reason | None:
    """What GROM lacks on `data` (None: nothing): examples to forget."""
    if not (getattr(data, "forget", None) or ()):
        return Reason("no forget set", f"GROM needs examples to forget: {where(data)} has none.")
    return None


def grom_defaults(model=None) -> dict:
    """GROM's settings by default (`EditConfig()`; its band is chosen on the model)."""
    return EditConfig().to_dict()


def run_grom(model, tokenizer, forget, retain, settings: EditConfig | None = None, between=None, **kw):
    """GROM's edit (`grom.closed_form.pipeline.run_edit`) with `settings` (None: `EditConfig()`).
    `between` (every method's run takes it, `grom.turns`): between the forward batches of
    the layer scores and of each layer's keys, and between layers (`run_edit`)."""
    return run_edit(model, tokenizer, forget, retain, settings or EditConfig(), between=between, **kw)


GROM = register(MethodEntry(
    "grom", "GROM", "closed-form", "Closed-form per-layer edit of the MLP output matrices: pushes "
    "the forget keys toward a target while a ridge term holds the retain keys in place; needs "
    "the forget set, and a retain set to keep.", can_run=grom_reason, defaults=grom_defaults,
    run=run_grom, settings=EditConfig, order=0, kind="closed-form edit"))
