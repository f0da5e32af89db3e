"""What a patch.safetensors may hold for a given model, by the method that made it (an
import's check, from the file's header and edit.json alone, before any tensor is read).

It sits above `grom.edit` and `grom.methods` (it asks the method registry which methods
exist and of which family each is: what each edits), so that `grom.edit` need not reach up into them.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from grom.edit import META_FILE, PATCH_FILE, StoredPatch, read_settings
from grom.methods import ALL, names
from grom.model.arch import edited_matrix


def check_stored_patches(layout: Mapping[str, StoredPatch], model: nn.Module, meta: dict) -> None:
    """That a patch file's patches (`read_patch_layout`: its header, no tensor read yet) are
    ones the edit `meta` describes (`read_metadata`'s edit.json) may hold on `model`; a
    ValueError that says which is not, and why, otherwise.

    Every patch is one of the model's weights, with its shape. GROM and the editors edit
    one matrix kind (GROM: its settings' matrix; ROME, MEMIT, AlphaEdit, ZeroUnlearn: down_proj)
    in the layers of their band: each patch has its row in edit.json's "layers", naming
    that kind's matrix of a layer (of its settings' layers, where they name them), and a
    GROM patch's factors are of rank at most its row's forget keys (its rank bound). A
    trained method (GA, NPO, ...) may change any floating parameter (those whose names
    hold one of its settings' "params", where it names them), and its patches expand to at
    most the model's own parameter count. A method this library does not know is refused."""
    method = meta.get("method", "grom")
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    for name, stored in layout.items():
        W = params.get(name)
        if W is None or tuple(W.shape) != tuple(stored.shape):
            why = ("is not one of its weights" if W is None else
                   f"has shape {tuple(stored.shape)}, the model {tuple(W.shape)}")
            raise ValueError(f"{PATCH_FILE} does not fit the loaded model: {name} {why}.")
        if not W.is_floating_point():
            raise ValueError(f"{PATCH_FILE} patches {name}, which is not a floating weight.")
    entry = ALL.get(method)
    closed_form = entry is not None and entry.family == "closed-form"  # GROM
    if entry is not None and entry.family != "trained":
        settings = read_settings(method, meta)
        kind = settings.matrix if closed_form else "down_proj"
        # the layers its settings name: GROM's and an editor's band, LUNAR's one layer (None: chosen by the run)
        band = getattr(settings, "layers", None)
        if band is None and getattr(settings, "layer", None) is not None:
            band = (settings.layer,)
        label = entry.label
        rows = {r["param_name"]: r for r in meta.get("layers") or []}
        for name, stored in layout.items():
            if name not in rows:
                raise ValueError(f"{PATCH_FILE} patches {name}, which {META_FILE} has no row for in its "
                                 f"\"layers\": a {label} edit patches only the matrices its rows name.")
            layer, keys = rows[name].get("layer"), rows[name]["n_forget_keys"]
            if closed_form and stored.rank is not None and stored.rank > keys:
                raise ValueError(f"{PATCH_FILE} stores {name} as factors of rank {stored.rank}, and GROM's patch "
                                 f"of {keys} forget keys has rank {keys} at most (its row in {META_FILE}).")
            try:
                expected = edited_matrix(model, kind, layer).param_name
            except ValueError as err:
                raise ValueError(f"{META_FILE}: the row of {name}: {err}.") from None
            if expected != name or (kind != "lm_head" and band is not None and layer not in band):
                raise ValueError(f"{PATCH_FILE} patches {name}: a {label} edit changes only the {kind} matrix "
                                 f"of the layers of its band ({expected} for layer {layer}"
                                 + (f"; its settings' layers are {list(band)}" if band else "")
                                 + ").")
        return
    if entry is None:
        raise ValueError(f"{META_FILE}: the method {method!r} is none this server knows "
                         f"({', '.join(names('closed-form'))}, the editors {', '.join(names('editor'))}, "
                         f"the trained methods {', '.join(names('trained'))}).")
    wanted = (meta.get("info") or {}).get("params")
    if isinstance(wanted, list) and wanted and all(isinstance(w, str) for w in wanted):
        stray = [name for name in layout if not any(w in name for w in wanted)]
        if stray:
            raise ValueError(f"{PATCH_FILE} patches {stray[0]}, which the run's trained parameters "
                             f"({', '.join(wanted)}) do not include.")
    total = sum(torch.Size(stored.shape).numel() for stored in layout.values())
    own = sum(p.numel() for p in model.parameters())
    if total > own:
        raise ValueError(f"{PATCH_FILE}'s patches expand to {total:,} numbers, more than the loaded model's own "
                         f"{own:,} parameters: a {entry.label} edit changes each weight once.")
