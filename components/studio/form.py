"""The Edit form, declared once.

`FIELDS` is the one ordered list of the settings a GROM edit takes from the page: the Edit
panel's widgets and the three band widgets of the Layers panel. Everything else is derived
from it: the handlers' inputs (`NAMES`, in this order, which is also the order of the
`run_edit` endpoint's parameters), the widgets a restore sets (`RESTORED`: each field and
its log slider), the widgets a preset fills (`PRESET_FILLED`), widgets -> config
(`edit_config`), config -> widgets (`restore_values`), and the checks of every value
(`check_values`), which the Edit panel, the history, the sweep and an imported edit.json
share. The choices and ranges are the library's (`grom.closed_form.config`, `grom.model.arch`).
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gradio as gr

from components.server.errors import UserError, shorten
from components.server.validate import (
    MAX_BATCH,
    MAX_COUNT,
    check_budget,
    check_range,
    check_seed,
    parse_band,
    whole_number,
)
from components.studio.runs import band_text
from grom import PRESETS, EditConfig, best_window
from grom.closed_form.config import TARGETS as CONFIG_TARGETS
from grom.closed_form.config import key_positions_of, keyed_at
from grom.data.encoding import KEY_POSITIONS
from grom.model.arch import MATRIX_KINDS

CUSTOM = "(custom)"
TARGETS = list(CONFIG_TARGETS)
MATRICES = list(MATRIX_KINDS)
BAND_MODES = ["suggested", "manual"]
LOG_SLIDERS = {"beta": (-1.0, 4.0), "w_r": (-1.0, 4.0), "rho": (-4.0, 0.0)}  # log10 ranges of the sliders
DEFAULT_RETAIN_EXAMPLES = 1600
# A 135M model costs ~2 ms of CPU per key token (the toy: ~0.02 ms): its preset starts with a
# smaller seeded retain sample so that Run edit answers in seconds (BENCHMARKS.md). The demo's
# presets need their 1600: with 128 the demo edit of forget10 lost 30-34% of its retain facts.
RETAIN_EXAMPLES_FOR = {"smollm2": 128, "smollm2-prompt": 128}
RUN_DEFAULTED = ("batch_size", "forget_budget", "retain_budget", "retain_examples")
"""The settings a preset gives a default for besides those it sets (`PRESET_FILLED`): a preset
chosen, a model loaded or a split loaded puts them back to the preset's (`run_defaults`);
changed by hand they leave the preset's name as it is (they are how the edit runs)."""
FOLLOWS_PRESET = "set by the preset; a model, split or preset chosen puts it back"


@dataclass(frozen=True)
class Field:
    """One setting of the form."""
    name: str
    """The widget's name: `ui.edit.<name>`, or `ui.layers.<name>` where `panel` is "layers"."""
    config: str | None = None
    """The EditConfig field it sets (None: a setting of the run, such as the retain sample)."""
    panel: str = "edit"
    log: bool = False
    """A log10 slider `<name>_log` stands beside its number box."""
    preset: bool = False
    """A preset sets it."""


FIELDS: tuple[Field, ...] = (
    Field("preset"),
    Field("target", "target", preset=True),
    Field("beta", "beta", log=True, preset=True),
    Field("beta_relative", "beta_relative", preset=True),
    Field("w_r", "w_r", log=True, preset=True),
    Field("rho", "rho", log=True, preset=True),
    Field("c", "c", preset=True),
    Field("matrix", "matrix", preset=True),
    Field("use_alpha", "use_alpha", preset=True),
    Field("key_positions", preset=True),  # sets key_mode and retain_key_mode (`keyed_at`)
    Field("band_mode", panel="layers", preset=True),
    Field("band_text", panel="layers", preset=True),
    Field("k", "k", panel="layers", preset=True),
    Field("seed", "seed"),
    Field("forget_budget", "forget_budget"),
    Field("retain_budget", "retain_budget"),
    Field("batch_size", "batch_size"),
    Field("retain_examples"),
)
BY_NAME = {f.name: f for f in FIELDS}
NAMES = tuple(f.name for f in FIELDS)


def _with_logs(fields) -> tuple[str, ...]:
    return tuple(n for f in fields for n in ((f.name, f"{f.name}_log") if f.log else (f.name,)))


RESTORED = _with_logs(FIELDS)  # the widgets a restore sets, in this order
PRESET_FILLED = _with_logs(f for f in FIELDS if f.preset)  # the widgets a preset sets
MAX_BAND_LAYERS = 10_000  # more layers than any model has
SCORE_NAMES = ("matrix", "use_alpha", "key_positions", "k", "band_mode", "band_text")  # what the layer scores read


def widgets(edit, layers, names: Sequence[str] = NAMES) -> list:
    """The components for `names` (a field, or a field's `<name>_log` slider)."""
    def panel(name: str):
        return layers if BY_NAME[name.removesuffix("_log")].panel == "layers" else edit
    return [getattr(panel(name), name) for name in names]


def read(values: Sequence) -> dict[str, Any]:
    """The handler's positional values (in `NAMES` order) by name."""
    if len(values) != len(NAMES):
        raise UserError(f"The edit takes {len(NAMES)} settings ({', '.join(NAMES)}); got {len(values)}.")
    return dict(zip(NAMES, values))


def form_handler(fn: Callable) -> Callable:
    """`fn(values, session, progress)` as a gradio handler that takes the form's widgets
    (`widgets(...)`, in `NAMES` order) and then the session. Its signature names every
    field, so that an API client may pass them by name (`client.predict(beta=..., ...,
    api_name="/run_edit")`) and gradio finds the progress tracker."""
    @functools.wraps(fn)
    def handler(*args):
        *values, session, progress = args
        return fn(read(values), session, progress)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    handler.__signature__ = inspect.Signature(
        [inspect.Parameter(name, kind) for name in NAMES] + [inspect.Parameter("session", kind),
                                                           inspect.Parameter("progress", kind, default=gr.Progress())])
    return handler


def check_values(v: dict, n_layers: int) -> dict:
    """Every value checked against the model (`n_layers`) and the library's bounds, as the
    Edit panel's widgets allow them: the same checks for typed values, a history row and
    an uploaded edit.json. Returns the values as their types (numbers, flags, the band as
    a tuple under "layers" where the band is manual); a `UserError` names the first that
    does not fit."""
    if v["target"] not in TARGETS or v["matrix"] not in MATRICES or v["band_mode"] not in BAND_MODES:
        raise UserError(f"target must be one of {TARGETS}, matrix one of {MATRICES}, band one of "
                        f"{BAND_MODES} (got {shorten(v['target'])}, {shorten(v['matrix'])}, "
                        f"{shorten(v['band_mode'])}).")
    if not isinstance(v["band_text"], str):
        raise UserError(f"The band must be text such as 3-5 (got {shorten(v['band_text'])}).")
    if v.get("key_positions", "answer") not in KEY_POSITIONS:
        raise UserError(f"key positions must be one of {list(KEY_POSITIONS)} (got {shorten(v['key_positions'])}).")
    out = dict(v)
    out["key_positions"] = v.get("key_positions", "answer")
    for name in ("beta", "w_r", "rho", "c"):
        out[name] = check_range(name, v[name])
    for name in ("beta_relative", "use_alpha"):
        if not isinstance(v[name], (bool, int)) or isinstance(v[name], int) and v[name] not in (0, 1):
            raise UserError(f"{name} must be true or false (got {shorten(v[name])}).")
        out[name] = bool(v[name])
    out["k"] = whole_number(v["k"], f"band width k (the model has {n_layers} layers)", 1, n_layers)
    out["seed"] = check_seed(v["seed"])
    out["batch_size"] = whole_number(v["batch_size"], "batch size", 1, MAX_BATCH)
    out["forget_budget"] = check_budget(v["forget_budget"], "forget key budget")
    out["retain_budget"] = check_budget(v["retain_budget"], "retain key budget")
    out["retain_examples"] = whole_number(v.get("retain_examples", 0), "number of retain examples (0: all)",
                                          0, MAX_COUNT, default=0)
    out["layers"] = (parse_band(v["band_text"], n_layers)
                     if v["band_mode"] == "manual" and v["matrix"] != "lm_head" else None)
    return out


def check_band(band, n_layers: int | None = None) -> None:
    """A band from a file: a list of layer numbers, each inside the model where `n_layers`
    is given. Checked entry by entry before anything lists or writes out a range, so a
    band such as [0, 1, 10**9] costs nothing."""
    if not isinstance(band, (list, tuple)) or len(band) > MAX_BAND_LAYERS:
        raise UserError(f"The band must be a list of at most {MAX_BAND_LAYERS:,} layer numbers "
                        f"(got {shorten(band)}).")
    top = n_layers if n_layers is not None else MAX_BAND_LAYERS
    outside = [b for b in band if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < top]
    if outside:
        where = (f"outside the loaded model: it has layers 0..{n_layers - 1}. Load the model the run "
                 "was made with" if n_layers is not None else "not a layer number")
        raise UserError(f"The band has the layer {shorten(outside[0])}, {where}.")


def edit_config(values: dict, *, n_layers: int, scores=None, prompt_format=None) -> EditConfig:
    """The EditConfig for the form's values (the preset gives the fields with no widget)."""
    v = check_values(values, n_layers)
    layers = v["layers"]
    if layers is None and v["matrix"] != "lm_head" and scores is not None:
        layers = tuple(best_window(scores.S, v["k"]))
    base = PRESETS.get(v["preset"], EditConfig())
    config = base.replace(
        **{f.config: v[f.name] for f in FIELDS if f.config}, layers=layers,
        prompt_format=prompt_format, candidates=None,
        keep_keys=False)  # a session keeps the patches; a diagnostic makes the keys again
    return with_key_positions(config, v["key_positions"])


def with_key_positions(config: EditConfig, where: str) -> EditConfig:
    """`config` with its keys at `where`, unless they are already there: a preset's keys of
    no `KEY_POSITIONS` name (ZsRE's subject_last) stay while the box says "answer"."""
    return config if where == (key_positions_of(config) or "answer") else keyed_at(config, where)


def _named_positions(config: dict) -> str | None:
    """The `KEY_POSITIONS` name of an EditConfig-as-a-dict's key modes; None where they are
    another pair (ZsRE's subject_last) or modes no EditConfig takes (the run's check says so)."""
    default = EditConfig()
    modes = {m: config.get(m) or getattr(default, m) for m in ("key_mode", "retain_key_mode")}
    try:
        return key_positions_of(default.replace(**modes))
    except ValueError:
        return None


def key_positions_in(config: dict) -> str:
    """The key positions box's value for an EditConfig as a dict ("answer" where its key
    modes are no `KEY_POSITIONS` pair)."""
    return _named_positions(config) or "answer"


def log10(value: float) -> float:
    """A log slider's position for `value` (its left end for 0)."""
    return round(math.log10(value), 3) if value and value > 0 else -1.0


def from_log10(position) -> float:
    """The value a log slider's position gives its number box (and so Run edit): 10^position,
    to 6 decimals below 1 and 3 above; NaN for anything else (a range check refuses it)."""
    try:
        v = float(position)
        return round(10 ** v, 6 if v < 0 else 3)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def restore_values(config: dict, run: dict, n_layers: int | None = None) -> list:
    """The widgets' values (in `RESTORED` order) for an EditConfig as a dict and its run:
    a history row, a sweep point or an uploaded edit.json. With `n_layers` every value is
    first checked as a typed one is (`check_values`), so nothing the loaded model or the
    widgets cannot hold reaches them. The preset becomes the one whose values these are,
    hidden settings included (`matching_preset`), else "(custom)": a named preset refills
    the widgets with its own values, so only one they equal is named."""
    band = run.get("band") or list(config.get("layers") or [])
    mode = run.get("band_mode") if run.get("band_mode") in BAND_MODES else "manual"
    if config.get("matrix") == "lm_head":
        mode = "suggested"
    check_band(band, n_layers if mode == "manual" else None)
    values = {"preset": CUSTOM, "band_mode": mode, "band_text": band_text(band),
              "k": run.get("k") or len(band) or config.get("k") or 1,
              "seed": run.get("seed", config.get("seed", 0)),
              "retain_examples": run.get("retain_examples", 0)}
    values |= {f.name: config.get(f.config) for f in FIELDS if f.config and f.name not in values}
    values["key_positions"] = key_positions_in(config)
    values["forget_budget"] = values["forget_budget"] or 0
    values["retain_budget"] = values["retain_budget"] or 0
    if n_layers is not None:
        checked = check_values(values, n_layers)
        values |= {name: checked[name] for name in NAMES if name not in ("band_text", "preset")}
        values["forget_budget"] = checked["forget_budget"] or 0
        values["retain_budget"] = checked["retain_budget"] or 0
    values["preset"] = matching_preset(values, hidden=_hidden(config))
    return [values[name] if not name.endswith("_log") else log10(values[name.removesuffix("_log")])
            for name in RESTORED]


def preset_values(preset: str) -> list:
    """The widgets' values for a preset, in `PRESET_FILLED` order (its fixed band, or the
    suggested band of its k; an empty band text is left as the user wrote it: None)."""
    p = PRESETS[preset]
    mode, band, k = band_widgets(preset)
    values = {f.name: getattr(p, f.config) for f in FIELDS if f.preset and f.config}
    values |= {"band_mode": mode, "band_text": band or None, "k": k, "key_positions": key_positions_of(p) or "answer"}
    return [values[name] if not name.endswith("_log") else log10(values[name.removesuffix("_log")])
            for name in PRESET_FILLED]


def run_defaults(preset: str) -> list:
    """The values of `RUN_DEFAULTED` for `preset` (its batch size and key budgets, 0 for
    none; its retain sample, `RETAIN_EXAMPLES_FOR` else `DEFAULT_RETAIN_EXAMPLES`);
    "(custom)" or an unknown name: EditConfig()'s."""
    p = PRESETS.get(preset, EditConfig())
    return [p.batch_size, p.forget_budget or 0, p.retain_budget or 0,
            RETAIN_EXAMPLES_FOR.get(preset, DEFAULT_RETAIN_EXAMPLES)]


def band_widgets(preset: str) -> tuple[str, str, int]:
    """(band mode, band text, k) for a preset: its fixed layers, or the suggested band of k."""
    p = PRESETS[preset]
    if not p.layers:
        return "suggested", "", p.k
    return "manual", band_text(p.layers), len(p.layers)


PRESET_FIELDS = tuple(f.name for f in FIELDS if f.preset)  # the fields a preset sets, no log sliders
_NOT_HIDDEN = {"layers", "prompt_format", "candidates", "keep_keys"}  # set per run, not by a preset


def _band_layers(text) -> tuple[int, ...] | str:
    """A band text's layers ("3-5" and "3,4,5" alike), or the text where it is no band."""
    try:
        return tuple(sorted({n for part in str(text).replace(" ", "").split(",") if part
                             for n in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)
                                       if "-" in part.strip("-") else (int(part),))}))
    except ValueError:
        return str(text).strip()


def _same(name: str, a, b) -> bool:
    if name in ("beta", "w_r", "rho", "c", "k"):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if name in ("beta_relative", "use_alpha"):
        return bool(a) == bool(b)
    if name == "band_text":
        return _band_layers(a) == _band_layers(b)
    return a == b


def _shown(config: dict) -> set[str]:
    """The EditConfig fields a widget holds for `config`: every field's, and the key modes
    where the key positions box names them (not ZsRE's subject_last)."""
    shown = {f.config for f in FIELDS if f.config} | _NOT_HIDDEN
    return shown | ({"key_mode", "retain_key_mode"} if _named_positions(config) else set())


def _hidden(config: EditConfig | dict) -> dict:
    """The settings no widget holds (a preset's `key_mode`, for one)."""
    d = config.to_dict() if isinstance(config, EditConfig) else dict(config)
    shown = _shown(d)
    default = EditConfig().to_dict()
    return {key: d.get(key, default[key]) for key in default if key not in shown}


def preset_matches(name: str, values: dict, hidden: dict | None = None) -> bool:
    """Whether the form's values (by field name) are preset `name`'s: every field it sets
    (beta, w_r, rho, target, ...; c only for the corruption target, whose only setting it
    is; the band text for a fixed band, k for the suggested one) and, with `hidden`, the
    settings no widget holds."""
    if name not in PRESETS:
        return False
    wanted = dict(zip(PRESET_FILLED, preset_values(name)))
    for field in PRESET_FIELDS:
        if field == "c" and wanted["target"] != "corruption":
            continue
        if field == "band_text" and wanted["band_mode"] != "manual":
            continue
        if field == "k" and wanted["band_mode"] == "manual":
            continue
        if field not in values or not _same(field, values[field], wanted[field]):
            return False
    return hidden is None or _hidden(PRESETS[name]) == hidden


def matching_preset(values: dict, current: str | None = None, hidden: dict | None = None) -> str:
    """The Preset box's value for the form's `values`: the preset they are (`current` first
    where it is one), else "(custom)". The same answer whether the values were typed or
    restored: a preset's name exactly when the edit would be the preset's. `hidden`: the
    settings no widget holds, a restored config's; None: those the edit takes, `current`'s
    (`edit_config`: the preset's, or EditConfig()'s for "(custom)")."""
    if hidden is None:
        hidden = _hidden(PRESETS.get(current, EditConfig()) if current else EditConfig())
    for name in ([current] if current in PRESETS else []) + [n for n in PRESETS if n != current]:
        if preset_matches(name, values, hidden):
            return name
    return CUSTOM


def preset_choices() -> list[tuple[str, str]]:
    return [(CUSTOM, CUSTOM)] + [(name, name) for name in PRESETS]


def hidden_differences(config: dict) -> list[str]:
    """The config's settings that no widget holds and that differ from EditConfig()'s (they
    came from a preset): a restore with the "(custom)" preset cannot bring them back."""
    default = EditConfig().to_dict()
    shown = _shown(config)
    return [f"{key}={config[key]!r}" for key in default if key not in shown and config.get(key) != default[key]]

