"""The Edit form, declared once."""
from __future__ import annotations

import math

from components.core.errors import UserError
from components.core.runs import band_text
from components.core.validate import _budget, _check_range, check_seed, parse_band, whole_number
from grom import PRESETS, EditConfig, best_window

# the widgets a restore sets, in the order of `widget_values` (app.py: wire_runs)
RESTORED = ("preset", "target", "beta", "beta_log", "beta_relative", "w_r", "w_r_log", "rho", "rho_log",
            "c", "matrix", "use_alpha", "band_mode", "band_text", "k", "seed", "forget_budget",
            "retain_budget", "batch_size", "retain_examples")


def widget_values(config: dict, run: dict) -> list:
    """The Edit panel's (and the band widgets') values for an EditConfig as a dict and its
    run, in the order of `RESTORED`. The preset becomes "(custom)": choosing a named preset
    would refill the widgets with its own values."""

    band = run.get("band") or list(config.get("layers") or [])
    mode = run.get("band_mode") if run.get("band_mode") in ("suggested", "manual") else "manual"
    if config.get("matrix") == "lm_head":
        mode = "suggested"
    k = int(run.get("k") or len(band) or config.get("k") or 1)
    return [CUSTOM, config["target"], config["beta"], _log(config["beta"]), bool(config["beta_relative"]),
            config["w_r"], _log(config["w_r"]), config["rho"], _log(config["rho"]), config["c"],
            config["matrix"], bool(config["use_alpha"]), mode, band_text(band), k,
            int(run.get("seed", config.get("seed", 0))), config.get("forget_budget") or 0,
            config.get("retain_budget") or 0, config["batch_size"], int(run.get("retain_examples", 0))]


def hidden_differences(config: dict) -> list[str]:
    """The config's settings that no widget holds and that differ from EditConfig()'s (they
    came from a preset): a restore with the "(custom)" preset cannot bring them back."""

    default = EditConfig().to_dict()
    shown = {"target", "beta", "beta_relative", "w_r", "rho", "c", "matrix", "use_alpha", "layers", "k",
             "seed", "forget_budget", "retain_budget", "batch_size", "prompt_format", "candidates",
             "keep_keys"}
    return [f"{key}={config[key]!r}" for key in default if key not in shown and config.get(key) != default[key]]


CUSTOM = "(custom)"


TARGETS = ["suppression", "corruption"]


MATRICES = ["down_proj", "o_proj", "lm_head"]


BAND_MODES = ["suggested", "manual"]


LOG_SLIDERS = {"beta": (-1.0, 4.0), "w_r": (-1.0, 4.0), "rho": (-4.0, 0.0)}


DEFAULT_RETAIN_EXAMPLES = 1600


# A 135M model costs ~2 ms of CPU per key token (the toy: ~0.02 ms): its page starts with a
# smaller seeded retain sample so that Run edit answers in seconds (BENCHMARKS.md).
RETAIN_EXAMPLES_FOR = {"smollm2": 128}


def preset_choices() -> list[tuple[str, str]]:

    return [(CUSTOM, CUSTOM)] + [(name, name) for name in PRESETS]


def edit_config(preset: str, target: str, beta: float, beta_relative: bool, w_r: float, rho: float,
                c: float, matrix: str, use_alpha: bool, band_mode: str, band_text: str, k: int,
                seed: int, forget_budget: int, retain_budget: int, batch_size: int, *,
                n_layers: int, scores=None, prompt_format=None):
    """The EditConfig for the widgets' values (the preset gives the fields with no widget)."""

    if target not in TARGETS or matrix not in MATRICES or band_mode not in BAND_MODES:
        raise UserError(f"target must be one of {TARGETS}, matrix one of {MATRICES}, band one of {BAND_MODES}.")
    k = whole_number(k, f"band width k (the model has {n_layers} layers)", 1, n_layers)
    batch_size = whole_number(batch_size, "batch size", 1, 1024)
    base = PRESETS.get(preset, EditConfig())
    layers = None
    if matrix != "lm_head":
        if band_mode == "manual":
            layers = parse_band(band_text, n_layers)
        elif scores is not None:
            layers = tuple(best_window(scores.S, k))
    return base.replace(
        target=target, beta=_check_range("beta", beta), beta_relative=bool(beta_relative),
        w_r=_check_range("w_r", w_r), rho=_check_range("rho", rho), c=_check_range("c", c),
        matrix=matrix, use_alpha=bool(use_alpha), layers=layers, k=k, seed=check_seed(seed),
        forget_budget=_budget(forget_budget, "forget key budget"),
        retain_budget=_budget(retain_budget, "retain key budget"), batch_size=batch_size,
        prompt_format=prompt_format, candidates=None,
        keep_keys=False)  # a session keeps the patches; a diagnostic makes the keys again


def _log(v: float) -> float:
    return round(math.log10(v), 3) if v and v > 0 else -1.0


def band_widgets(preset: str) -> tuple[str, str, int]:
    """(band mode, band text, k) for a preset: its fixed layers, or the suggested band of k."""

    p = PRESETS[preset]
    if not p.layers:
        return "suggested", "", p.k
    contiguous = list(p.layers) == list(range(p.layers[0], p.layers[-1] + 1))
    text_ = f"{p.layers[0]}-{p.layers[-1]}" if contiguous else ",".join(map(str, p.layers))
    return "manual", text_, len(p.layers)
