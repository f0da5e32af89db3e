"""Write the snapshot of today's behaviour that tests/test_layout_unchanged.py checks (issue 38:
a refactor of the modules' layout must change nothing a user or a client sees).

    python tests/make_layout_snapshot.py                 # every part (SmolLM2's if it is in models/)
    python tests/make_layout_snapshot.py app_api cli     # only those parts
    python tests/make_layout_snapshot.py --no-real       # every part but SmolLM2's

Each part is one JSON file in tests/data/layout_snapshot/ (`PARTS`):

- app_api: every event of the app as `python app.py --model demo` builds it (api_name and
  api_visibility, sorted), and each public endpoint's parameters (name, component, default)
  and returned components, as a Gradio client sees them.
- cli: every option of `python -m grom` and of each subcommand, read from the argparse
  parser (`grom.cli.build_parser`): option strings, dest, action, type, default, choices,
  required, nargs, metavar and help.
- demo_patches: on the bundled demo model and the studio's default data (the demo benchmark's
  default split, the split's preset, the Edit panel's default retain sample), GROM's edit
  saved and loaded back (its files, edit.json's settings and layer records, each patch
  summarised: name, shape, dtype, sum, |sum|, max |x|, norm, first 8 values), and the
  patches of GA and NPO (2 optimizer steps each, lr 1e-3) and ROME (5 value steps, on the studio's band
  for an editor: the demo's layers 1-3).
- demo_comparison: `grom.eval.evaluate` of the demo model with that saved edit on the
  comparison's default size (the studio's Base, Edited and Retain model rows): every metric,
  plus the known-fact and answer-class counts.
- smollm2: the same on SmolLM2-135M-Instruct (models/smollm2-135m-instruct) with the studio's
  defaults for it: the real-knowledge benchmark's default split, the smollm2 preset, the
  128-example retain sample, the comparison's default size; its edit's patches and the
  Base and Edited rows. Minutes on a CPU (the test is marked real_model and slow).

Everything runs on the CPU in float32 with one torch thread (as tests/conftest.py sets), so
a second run gives the same numbers; the test compares with tolerances (`compare`) that
allow float noise between machines, not a changed result.

Where the refactor moves a module imported here, change the import (one place: the
functions below) and nothing else: the snapshot files stay as they are.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages (app, components, grom)
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)  # as tests/conftest.py: the numbers below are computed with one thread

SNAPSHOT_DIR = ROOT / "tests" / "data" / "layout_snapshot"
REAL_MODEL = "smollm2-135m-instruct"  # components.server.allowed_sources.REAL
BASELINE_STEPS, BASELINE_LR = 2, 1e-3  # optimizer steps of each trained baseline, at this lr
EDITOR_STEPS, EDITOR_LR = 5, 0.5  # ROME's value optimisation (the Baselines panel's first values for an editor)

# tolerances of `compare`
PATCH_REL = 1e-3  # a patch's summary numbers: relative to the patch's own scale. Not tighter: two AdamW steps
# carry the float noise between CPUs up to 1e-4 of a GA or NPO patch's scale (an Intel Xeon with AVX-512 against
# the AMD EPYC the snapshot was written on, 2026-11-28); a changed result moves it by the scale itself
METRIC_REL = 1e-4  # metrics and the other floats
EDITED_REL = 5e-3  # the answer probabilities of a model patched by an optimised value (ROME's p_answer_edited,
# p_answer_value): five Adam steps at lr 0.5 carry the CPUs' float noise into the patch (within PATCH_REL) and from
# it into these, 1.2e-3 relative between an AVX2-only AMD EPYC (2026-11-30) and the AVX-512 one of the snapshot
EDITED_KEYS = ("p_answer_edited", "p_answer_value")
METRIC_ABS = 1e-9


# ------------------------------------------------------------------------------ helpers

def sig(x: float, digits: int) -> float:
    """`x` rounded to `digits` significant digits (NaN and inf as they are)."""
    x = float(x)
    return x if not math.isfinite(x) or x == 0 else float(f"{x:.{digits}g}")


def rounded(value, digits: int = 10):
    """`value` (JSON-able: dicts, lists, numbers, strings) with every float rounded."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return sig(value, digits)
    if isinstance(value, dict):
        return {str(k): rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    if hasattr(value, "item"):  # a numpy or torch scalar
        return rounded(value.item(), digits)
    raise TypeError(f"not JSON-able: {type(value).__name__}")


def patch_summary(t: torch.Tensor) -> dict:
    """A patch as a few numbers: shape and dtype exact, the rest float64 sums of its values."""
    flat = t.detach().cpu().reshape(-1).double()
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
            "sum": sig(flat.sum().item(), 10), "abs_sum": sig(flat.abs().sum().item(), 10),
            "max_abs": sig(flat.abs().max().item(), 10) if flat.numel() else 0.0,
            "norm": sig(flat.norm().item(), 10), "first8": [sig(v, 6) for v in flat[:8].tolist()]}


def patches_summary(patches) -> dict:
    return {name: patch_summary(patches[name]) for name in sorted(patches)}


def _model_name(name: str | None) -> str | None:
    """A model's name without the machine's folders (the demo's is its assets folder)."""
    return Path(name).name if name and ("/" in name and Path(name).is_absolute()) else name


# ------------------------------------------------------------------------------ 1. the app's API

def app_api() -> dict:
    """The events of the app built as `python app.py --model demo` builds it (tests/app_fixtures.py:
    `preload` then `build_app`; not launched)."""
    import app
    from components.server.allowed_sources import DEMO

    assert app.preload(DEMO) == DEMO
    blocks = app.build_app()
    events = sorted([fn.api_name, fn.api_visibility] for fn in blocks.fns.values())
    info = blocks.get_api_info()
    endpoints = {}
    for name, ep in sorted(info["named_endpoints"].items()):
        endpoints[name] = {
            "parameters": [{"name": p.get("parameter_name"), "component": p.get("component"),
                            "has_default": p.get("parameter_has_default"), "default": p.get("parameter_default")}
                           for p in ep["parameters"]],
            "returns": [r.get("component") for r in ep["returns"]],
        }
    return {"events": events, "public_endpoints": endpoints,
            "unnamed_endpoints": sorted(str(k) for k in info.get("unnamed_endpoints", {}))}


# ------------------------------------------------------------------------------ 2. the CLI

def _type_name(t) -> str | None:
    """A builtin type by name (int, float, str); any other converter as "<function>" (its name,
    and the module it lives in, are the layout's, not the behaviour's)."""
    if t is None:
        return None
    return t.__name__ if t in (int, float, str, bool, complex) else "<function>"


def _actions(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            continue
        out.append({"options": list(a.option_strings), "dest": a.dest, "action": type(a).__name__,
                    "type": _type_name(a.type), "default": a.default if a.default is not argparse.SUPPRESS
                    else "==SUPPRESS==", "choices": list(a.choices) if a.choices is not None else None,
                    "required": a.required, "nargs": a.nargs, "metavar": a.metavar, "help": a.help,
                    "const": a.const})
    return out


def cli_options() -> dict:
    from grom.cli import build_parser

    parser = build_parser()
    out = {"prog": parser.prog, "description": parser.description, "options": _actions(parser), "subcommands": {}}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            out["subcommands_dest"], out["subcommands_required"] = a.dest, a.required
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                out["subcommands"][name] = {"help": helps.get(name), "prog": sub.prog, "options": _actions(sub)}
    return json.loads(json.dumps(out))  # tuples as lists, as the file holds them


# ------------------------------------------------------------------------------ 3. and 4. the demo

def studio_defaults(model_name: str, name: str, bench) -> dict:
    """What the studio starts on for `model_name` (components.page.start_benchmark, the Edit panel's preset and
    retain sample, the Compare slider's first value)."""
    from components.server.allowed_sources import DEMO
    from components.studio.benchmarks import preset_for
    from components.studio.comparison import default_examples
    from components.studio.form import RUN_DEFAULTED, run_defaults

    preset = preset_for(name, bench.split, model_name)
    run = dict(zip(RUN_DEFAULTED, run_defaults(preset)))  # what the Edit panel's boxes take for the preset
    return {"preset": preset, "retain_examples": run["retain_examples"],
            "seed": 0, "max_examples": default_examples(bench, real=model_name != DEMO)}


def start_data(model_name: str) -> dict:
    """The studio's start benchmark and split for `model_name`, loaded, and its defaults."""
    from components.page import start_benchmark
    from grom.data import load_benchmark

    name, split = start_benchmark(model_name)
    bench = load_benchmark(name, split)
    d = studio_defaults(model_name, name, bench)
    from components.server.validate import retain_subset

    retain = retain_subset(bench.retain, d["retain_examples"], d["seed"])
    return {"benchmark": name, "split": split, **d, "bench": bench, "retain": retain}


def grom_edit(model, tokenizer, data: dict):
    from grom import PRESETS, run_edit

    config = PRESETS[data["preset"]].replace(prompt_format=data["bench"].prompt_format, seed=data["seed"])
    return run_edit(model, tokenizer, data["bench"].forget, data["retain"], config)


def saved_edit_summary(edit) -> tuple[dict, object]:
    """Save `edit`, load it back: (its summary, the loaded Edit)."""
    from grom import Edit

    with tempfile.TemporaryDirectory() as folder:
        edit.save(folder)
        files = sorted(p.name for p in Path(folder).iterdir())
        meta = json.loads((Path(folder) / "edit.json").read_text())
        loaded = Edit.load(folder)
        patches = {name: loaded.patches[name].clone() for name in loaded.patches}
    loaded.patches = patches  # read now: the folder is gone
    layers = [{k: v for k, v in r.items() if k != "solve_seconds"} for r in meta["layers"]]
    summary = {
        "files": files, "metadata_keys": sorted(meta),
        "settings": meta["settings"], "method": meta["method"], "model_name": _model_name(meta["model_name"]),
        "band": loaded.band, "layers": layers, "scores": meta["scores"], "unties_lm_head": meta["unties_lm_head"],
        "world_size": meta["world_size"], "run": meta["run"], "patch_norms": meta["patch_norms"],
        "patches": patches_summary(loaded.patches),
    }
    return rounded(summary), loaded


def _brief(value):
    """A method's info for the snapshot: long lists of numbers (an editor's per-fact
    probabilities) as their length, sum and first 8; timings left out."""
    if isinstance(value, dict):
        return {k: _brief(v) for k, v in value.items() if "seconds" not in k and k != "timings"}
    if isinstance(value, (list, tuple)) and len(value) > 8 and all(isinstance(v, (int, float)) for v in value):
        return {"n": len(value), "sum": sum(float(v) for v in value), "first8": list(value[:8])}
    if isinstance(value, (list, tuple)):
        return [_brief(v) for v in value]
    return value


def baseline_summary(edit) -> dict:
    """A baseline's Edit: its method, band, info (settings, steps, losses) and patches."""
    return rounded({"method": edit.method, "band": edit.band, "info": _brief(edit.info),
                    "patches": patches_summary(edit.patches)})


def report_summary(report) -> dict:
    from grom.eval.results import BASE

    rows = [r for r in report.rows if r != BASE]
    return rounded({"benchmark": report.benchmark, "split": report.split, "task": report.task,
                    "stage": report.stage, "n_examples": report.n_examples,
                    "rows": list(report.rows), "metrics": {k: v.metrics for k, v in report.rows.items()},
                    "known_facts": {r: report.known_facts(r) for r in rows},
                    "answer_classes": {r: report.answer_classes(r) for r in rows}})


def _setup(data: dict) -> dict:
    return {k: data[k] for k in ("benchmark", "split", "preset", "retain_examples", "seed", "max_examples")} | {
        "n_forget": len(data["bench"].forget), "n_retain": len(data["bench"].retain),
        "n_retain_used": len(data["retain"])}


@functools.lru_cache(maxsize=1)
def demo_run() -> dict:
    """The demo model, the studio's start data for it and GROM's edit of it, saved and loaded
    back (computed once per process: both demo parts read it)."""
    from components.server.allowed_sources import DEMO
    from grom.demo import load_demo_model

    t0 = time.perf_counter()
    model, tokenizer = load_demo_model("full")
    data = start_data(DEMO)
    edit = grom_edit(model, tokenizer, data)
    summary, loaded = saved_edit_summary(edit)
    return {"model": model, "tokenizer": tokenizer, "data": data, "edit": loaded, "summary": summary,
            "seconds": time.perf_counter() - t0}


def demo_baseline(method: str) -> dict:
    """A trained baseline's patches on the demo run's data: `BASELINE_STEPS` optimizer steps of
    the TOFU recipe's batches (8 x 4) at lr 1e-3 without warm-up (the recipe's warm-up would
    start at lr 0, its patches then at the weights' float32 rounding: noise, not a result)."""
    from grom.methods import run_baseline

    run = demo_run()
    data = run["data"]
    bench = data["bench"]
    edit = run_baseline(method, run["model"], run["tokenizer"], bench.forget, data["retain"],
                        max_steps=BASELINE_STEPS, lr=BASELINE_LR, warmup_epochs=0,
                        prompt_format=bench.prompt_format, seed=0)
    return baseline_summary(edit)


def demo_editor(name: str = "rome") -> dict:
    """An editor's patches on the demo run's data, on the studio's band for an editor
    (components.studio.comparators.run_comparator: GROM's band, unless it ends at the model's last
    layer, as the demo's 3-5 does, where a value vector cannot move a fact: then layers 1-3)."""
    from grom.methods import EditorConfig, ValueSettings, run_editor
    from grom.methods.editors.locate_then_edit import editor_band
    from grom.model.arch import num_layers

    run = demo_run()
    model, data = run["model"], run["data"]
    bench = data["bench"]
    config = EditorConfig(layers=editor_band(run["edit"].band, num_layers(model)), prompt_format=bench.prompt_format,
                          values=ValueSettings(steps=EDITOR_STEPS, lr=EDITOR_LR))
    return baseline_summary(run_editor(name, model, run["tokenizer"], bench.forget, data["retain"], config))


BASELINES = ("ga", "npo")
EDITORS = ("rome",)


def demo_patches() -> dict:
    run = demo_run()
    baselines = {m: demo_baseline(m) for m in BASELINES} | {e: demo_editor(e) for e in EDITORS}
    return {"setup": rounded(_setup(run["data"])), "grom": run["summary"], "baselines": baselines}


def demo_comparison() -> dict:
    from grom.demo import load_demo_model
    from grom.eval import evaluate

    run = demo_run()
    data = run["data"]
    reference = load_demo_model("retain")  # components.studio.comparison.reference_for: the demo's forget10
    report = evaluate(run["model"], run["tokenizer"], data["bench"], edit=run["edit"], reference=reference,
                      max_examples=data["max_examples"])
    return {"setup": rounded(_setup(data)), "report": report_summary(report)}


# ------------------------------------------------------------------------------ 4. SmolLM2

def load_real():
    """SmolLM2 as tests/conftest.py's `real` fixture loads it (models/, never the Hub)."""
    from grom.model.loading import load_model

    return load_model(REAL_MODEL, local_files_only=True)


def smollm2(real=None) -> dict:
    from grom.eval import evaluate

    model, tok = real if real is not None else load_real()
    data = start_data(REAL_MODEL)
    edit = grom_edit(model, tok, data)
    summary, loaded = saved_edit_summary(edit)
    report = evaluate(model, tok, data["bench"], edit=loaded, max_examples=data["max_examples"])
    return {"setup": rounded(_setup(data)), "grom": summary, "report": report_summary(report)}


PARTS = {"app_api": app_api, "cli": cli_options, "demo_patches": demo_patches,
         "demo_comparison": demo_comparison, "smollm2": smollm2}


def snapshot_path(part: str) -> Path:
    return SNAPSHOT_DIR / f"{part}.json"


def read_snapshot(part: str):
    return json.loads(snapshot_path(part).read_text())


def write_snapshot(part: str, value) -> Path:
    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(part)
    path.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=True) + "\n")
    return path


# ------------------------------------------------------------------------------ comparing

def _is_patch(d: dict) -> bool:
    return isinstance(d, dict) and {"shape", "sum", "abs_sum", "max_abs", "first8"} <= set(d)


def _close(a: float, b: float, rel: float, abs_tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _compare_patch(expected: dict, actual: dict, where: str, problems: list) -> list[str]:
    """A patch's summary: shape and dtype exactly, its numbers within PATCH_REL of its scale."""
    for key in ("shape", "dtype"):
        if expected.get(key) != actual.get(key):
            problems.append(f"{where}.{key}: {expected.get(key)!r} != {actual.get(key)!r}")
    scale = abs(expected["max_abs"])
    checks = [("sum", expected["sum"], actual["sum"], PATCH_REL * abs(expected["abs_sum"]))]
    checks += [(k, expected[k], actual[k], 0.0) for k in ("abs_sum", "max_abs", "norm") if k in expected]
    if len(expected["first8"]) != len(actual["first8"]):
        problems.append(f"{where}.first8: {len(expected['first8'])} values != {len(actual['first8'])}")
    checks += [(f"first8[{i}]", a, b, PATCH_REL * scale)
               for i, (a, b) in enumerate(zip(expected["first8"], actual["first8"]))]
    for key, a, b, abs_tol in checks:
        if not _close(float(a), float(b), PATCH_REL, abs_tol):
            problems.append(f"{where}.{key}: {a!r} != {b!r}")
    return problems


def compare(expected, actual, where: str = "", problems: list | None = None, abs_tol: float = METRIC_ABS,
            rel: float = METRIC_REL) -> list[str]:
    """Where `actual` differs from `expected` (JSON values): dict keys, list lengths, strings,
    booleans, integers and None exactly; floats within METRIC_REL (a list of numbers, such as
    the layer scores: within METRIC_REL of its largest |x|), under EDITED_KEYS within EDITED_REL;
    a patch's summary within PATCH_REL of the patch's scale (its |sum| for the sum, its max |x|
    for the values)."""
    problems = [] if problems is None else problems
    if _is_patch(expected) and _is_patch(actual):
        return _compare_patch(expected, actual, where, problems)
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(expected) != set(actual):
            problems.append(f"{where}: keys missing {sorted(set(expected) - set(actual))}, "
                            f"new {sorted(set(actual) - set(expected))}")
        for k in expected:
            if k in actual:
                compare(expected[k], actual[k], f"{where}.{k}", problems,
                        rel=EDITED_REL if k in EDITED_KEYS else rel)
        return problems
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            problems.append(f"{where}: {len(expected)} items != {len(actual)}: {expected!r} != {actual!r}"[:2000])
        else:
            floats = [abs(x) for x in expected if _number(x) and math.isfinite(x)]
            scale = rel * max(floats) if floats and all(_number(x) for x in expected) else 0.0
            for i, (a, b) in enumerate(zip(expected, actual)):
                compare(a, b, f"{where}[{i}]", problems, max(abs_tol, scale), rel)
        return problems
    numbers = (int, float)
    if (isinstance(expected, float) or isinstance(actual, float)) and isinstance(expected, numbers) \
            and isinstance(actual, numbers) and not isinstance(expected, bool) and not isinstance(actual, bool):
        if type(expected) is not type(actual) or not _close(expected, actual, rel, abs_tol):
            problems.append(f"{where}: {expected!r} != {actual!r}")
        return problems
    if type(expected) is not type(actual) or expected != actual:
        problems.append(f"{where}: {expected!r} != {actual!r}")
    return problems


# ------------------------------------------------------------------------------ the script

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parts", nargs="*", metavar="PART",
                   help=f"parts to write (default: all): {', '.join(PARTS)}")
    p.add_argument("--no-real", action="store_true", help="leave SmolLM2's part as it is")
    args = p.parse_args(argv)
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"unknown part {bad[0]!r}; parts: {', '.join(PARTS)}")
    parts = args.parts or [x for x in PARTS if not (args.no_real and x == "smollm2")]
    for part in parts:
        t0 = time.perf_counter()
        path = write_snapshot(part, json.loads(json.dumps(PARTS[part]())))
        print(f"{part}: {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.1f} KiB) "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
