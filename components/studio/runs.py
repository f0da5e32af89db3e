"""A run's settings as plain data, and the widget values that bring them back.

Every GROM edit of the studio carries `edit.run` (saved as "run" in edit.json): the model
by its name, the benchmark, split and local source, the retain sample (size and seed),
the preset, the band mode, k and the band. With `edit.settings` that is everything needed
to run it again; the run history, the sweep and the import restore the Edit panel from
these two (`components.studio.form.restore_values`). An imported run's edit, computed again,
is compared with the exported one (`recompute_verdict`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from components.server.allowed_sources import DEMO, MAX_NAME_CHARS, allowed_dirs
from components.server.errors import REPO_ROOT, UserError, shorten
from components.server.files import storage
from grom import Edit

# what edit.json's "run" must hold to reproduce the edit
RUN_KEYS = ("model", "benchmark", "split", "retain_examples", "seed")


def portable_model_name(name: str) -> str:
    """How a file names the model: "demo", a registry name or a Hub id as they are; a local
    folder by its path relative to the folder it was found in (models/x -> "x",
    assets/demo-retain -> "assets/demo-retain"), never the server's absolute path."""
    path = Path(name)
    if not path.is_absolute():
        return name
    for folder in allowed_dirs("model"):
        if path == folder or folder in path.parents:
            if folder == (REPO_ROOT / "assets").resolve():
                return DEMO if path.name == "demo-full" else str(path.relative_to(REPO_ROOT))
            return str(path.relative_to(folder))
    return path.name


def run_record(model_name: str, bench_label: str, source: str, retain_examples, seed: int,
               n_retain: int, preset: str, band_mode: str, k: int, band) -> dict:
    """The "run" of an edit: what, besides its EditConfig, reproduces it."""
    benchmark, _, split = (bench_label or "").partition("/")
    return {"model": portable_model_name(model_name), "benchmark": benchmark, "split": split,
            "source": (source or "").strip(), "retain_examples": int(retain_examples or 0),
            "n_retain": int(n_retain), "seed": int(seed), "preset": preset, "band_mode": band_mode,
            "k": int(k), "band": [int(layer) for layer in band]}


def check_run(run) -> dict:
    """`run` from a file, checked to hold every key `RUN_KEYS` names, of the right kind."""
    if not isinstance(run, dict) or not run:
        raise UserError('edit.json has no "run" (the model, benchmark, split, retain sample and '
                        "seed): it was written by an older version; export the edit again.")
    missing = [key for key in RUN_KEYS if key not in run]
    if missing:
        raise UserError(f'edit.json\'s "run" lacks {", ".join(missing)}: export the edit again.')
    for key in ("model", "benchmark", "split", "source", "preset", "band_mode"):
        value = run.get(key, "")
        if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
            raise UserError(f'edit.json\'s "run.{key}" must be text of at most {MAX_NAME_CHARS} '
                            f"characters (got {shorten(value)}).")
    if any(mark in run["split"] for mark in ("/", "\\", "..")):
        raise UserError(f'edit.json\'s "run.split" must be a split\'s name, not a path (got {shorten(run["split"])}).')
    for key in ("retain_examples", "seed", "k", "n_retain"):
        value = run.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise UserError(f'edit.json\'s "run.{key}" must be a whole number from 0 (got {shorten(value)}).')
    band = run.get("band", [])
    if not isinstance(band, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in band):
        raise UserError(f'edit.json\'s "run.band" must be a list of layer numbers (got {shorten(band)}).')
    return run


def band_text(band) -> str:
    """[3, 4, 5] -> "3-5"; [2, 7] -> "2,7"."""
    band = [int(b) for b in band]
    if not band:
        return ""
    if len(band) > 1 and all(b - a == 1 for a, b in zip(band, band[1:])):  # never lists a range
        return f"{band[0]}-{band[-1]}"
    return ",".join(map(str, band))


def max_relative_difference(edit: Edit, reference: Edit) -> float | None:
    """max over matrices of ||P - P_ref||_F / ||P_ref||_F (None: not the same matrices)."""
    def shapes(e: Edit) -> dict:
        return {name: tuple(e.held.shape(name)) for name in e.patches}

    if shapes(edit) != shapes(reference):
        return None
    return max((float((P.double() - reference.patches[k].double()).norm())
                / max(float(reference.patches[k].double().norm()), 1e-300) for k, P in edit.patches.items()),
               default=0.0)


def rounding_tolerance(edit: Edit) -> float:
    """The largest ||dP||/||P|| that last-bit differences explain: 1e-3 for float32 patches
    (another thread count gave 1.3e-6 on SmolLM2's 5 layers), 8 eps for 16-bit ones."""
    held = edit.held  # dtypes only: no factored patch expanded
    return max([1e-3] + [8 * torch.finfo(held.dtype(n)).eps for n in held if held.dtype(n).is_floating_point])


def recompute_verdict(edit: Edit, recorded: str | None, seconds: float, reference: Edit | None) -> str:
    """What a recomputed edit is to the exported one.

    Identical: the sha256 edit.json records, the same patches bit for bit. The machine
    that exported it gives that (same code, data, seed, a deterministic solve, the same
    torch threads). Another torch, BLAS library, device or thread count changes the last
    bits, and a hash can only say "different": how different needs the exported patch
    (`reference`, the uploaded patch.safetensors), then within `rounding_tolerance` or not."""
    sha = edit.sha256()
    if recorded is None and reference is not None:
        recorded = reference.sha256()
    done = f"**Recomputed** in {seconds:.1f} s"
    if recorded is None:
        return (f"{done} (its edit.json records no patch sha256, as exports made before it had one: "
                "nothing to compare with).")
    if sha == recorded:
        return f"{done}, identical to the exported edit bit for bit (sha256 `{sha[:16]}…`)."
    diff = None if reference is None else max_relative_difference(edit, reference)
    bits = "another torch, BLAS library, device or thread count changes the last bits of a solve"
    how = (f"the numbers differ ({bits}; upload its patch.safetensors with edit.json to see by how much)"
           if reference is None else "the uploaded patch holds other matrices" if diff is None else
           f"it differs from the uploaded patch by at most {diff:.1e} of a matrix's norm (‖ΔP‖/‖P‖), "
           + (f"which is rounding: {bits}" if diff <= rounding_tolerance(edit) else
              "more than rounding: its settings or data are not those of the exported edit"))
    return (f"{done}, **not identical** to the exported edit: its sha256 `{sha[:16]}…` is not the "
            f"`{recorded[:16]}…` edit.json records; {how}. The recomputed edit is loaded.")


def file_verdict(edit: Edit, name: str) -> str:
    """What an edit loaded from its file is to the exported one (`Edit.load` has checked
    that the file is the one its edit.json describes)."""
    if edit.stored_ranks:
        return (f"**Loaded** from {shorten(name)}: {storage({k: edit.stored_ranks.get(k) for k in edit.patches})}, "
                "equal to the exported patches up to rounding (their factors' product, not bit for bit).")
    if edit.recorded_sha256:
        return (f"**Loaded** from {shorten(name)}, identical to the exported edit "
                f"(sha256 `{edit.recorded_sha256[:16]}…`).")
    return f"**Loaded** from {shorten(name)}."
