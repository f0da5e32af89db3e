"""Issue 38: a refactor of the modules' layout changes nothing a user or a client sees.

Each test computes a part of today's behaviour again and compares it with the snapshot in
tests/data/layout_snapshot/ (written by tests/make_layout_snapshot.py, which holds the code
of each part and the comparison's tolerances):

- the app's events (api_name, api_visibility) and its public endpoints' parameters;
- the CLI's subcommands and options, from its argparse parser;
- on the bundled demo model and the studio's default data: the patches of GROM's edit (saved
  and loaded back), of GA and NPO (2 steps) and of ROME (5 value steps), and the default
  comparison's metrics (Base, Edited and Retain model rows);
- the same edit and comparison on SmolLM2-135M-Instruct (real_model, slow: minutes on a CPU).

Names, shapes, counts and strings compare exactly; a patch's numbers within 1e-3 of its
scale, metrics within 1e-4 (relative): float noise between machines passes, a changed result
does not. A change that is meant (not a refactor's): write the part again,
`python tests/make_layout_snapshot.py PART`, and say why in the commit.
"""
from __future__ import annotations

import pytest

from tests import make_layout_snapshot as snap


def check(part: str, actual, *keys: str) -> None:
    """`actual` equals the snapshot of `part` (its entry at `keys`), as `snap.compare` says."""
    path = snap.snapshot_path(part)
    assert path.exists(), f"no snapshot {path}: write it with python tests/make_layout_snapshot.py {part}"
    expected = snap.read_snapshot(part)
    where = part
    for key in keys:
        assert key in expected, f"the snapshot {path.name} has no {key!r} (of {where}): write it again"
        expected, where = expected[key], f"{where}.{key}"
    actual = snap.json.loads(snap.json.dumps(actual))  # as the file holds it: tuples as lists
    problems = snap.compare(expected, actual, where)
    shown = "\n  ".join(problems[:40]) + (f"\n  ... and {len(problems) - 40} more" if len(problems) > 40 else "")
    assert not problems, (f"{len(problems)} difference(s) from {path.name} (snapshot != now):\n  {shown}\n"
                          f"If the change is meant: python tests/make_layout_snapshot.py {part}")


# ------------------------------------------------------------------------------ cheap: seconds

def test_app_events_and_public_endpoints_are_unchanged():
    check("app_api", snap.app_api())


def test_cli_options_are_unchanged():
    check("cli", snap.cli_options())


# ------------------------------------------------------------------------------ the demo model

@pytest.fixture(scope="module")
def demo():
    """The demo model, its default data and GROM's edit, saved and loaded back (once)."""
    return snap.demo_run()


def test_demo_default_data_is_unchanged(demo):
    check("demo_patches", snap.rounded(snap._setup(demo["data"])), "setup")


def test_demo_grom_edit_saved_is_unchanged(demo):
    check("demo_patches", demo["summary"], "grom")


@pytest.mark.parametrize("method", snap.BASELINES)
def test_demo_trained_baseline_patches_are_unchanged(demo, method):
    check("demo_patches", snap.demo_baseline(method), "baselines", method)


@pytest.mark.parametrize("name", snap.EDITORS)
def test_demo_editor_patches_are_unchanged(demo, name):
    check("demo_patches", snap.demo_editor(name), "baselines", name)


def test_demo_default_comparison_is_unchanged(demo):
    check("demo_comparison", snap.demo_comparison())


# ------------------------------------------------------------------------------ SmolLM2 (minutes)

@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_default_edit_and_comparison_are_unchanged(real):
    check("smollm2", snap.smollm2(real))


# ------------------------------------------------------------------------------ the comparison itself

def test_the_comparison_catches_a_change_and_allows_float_noise():
    patch = {"shape": [2, 3], "dtype": "float32", "sum": 0.5, "abs_sum": 10.0, "max_abs": 2.0, "norm": 4.0,
             "first8": [1.0, -2.0, 0.0, 0.25, 1e-9, 0.5]}
    noisy = dict(patch, sum=0.5 + 5e-5, norm=4.0 * (1 + 5e-6), first8=[1.0, -2.0, 1e-6, 0.25, 2e-9, 0.5])
    assert snap.compare(patch, noisy) == []  # noise below 1e-3 of the patch's scale
    assert snap.compare(patch, dict(patch, shape=[3, 2]))
    assert snap.compare(patch, dict(patch, first8=[1.0, -2.0, 0.0, 0.25, 1e-9, 0.51]))
    assert snap.compare(patch, dict(patch, sum=0.5 + 2e-2))  # beyond 1e-3 of abs_sum
    metrics = {"Forget fact recall": 0.55, "Forget facts known": 4, "name": "x", "nan": float("nan")}
    assert snap.compare(metrics, dict(metrics, **{"Forget fact recall": 0.55 * (1 + 5e-5)})) == []
    assert snap.compare(metrics, dict(metrics, **{"Forget fact recall": 0.56}))
    # the answer probabilities behind an optimised value: another CPU's float noise passes, a change does not
    rome = {"p_answer_edited": {"first8": [0.9796, 0.871], "sum": 372.61, "n": 400}, "p_answer_before": {"sum": 1.0}}
    assert snap.compare(rome, {**rome, "p_answer_edited": {"first8": [0.9796, 0.8720], "sum": 372.61, "n": 400}}) == []
    assert snap.compare(rome, {**rome, "p_answer_edited": {"first8": [0.9796, 0.90], "sum": 372.61, "n": 400}})
    assert snap.compare(rome, {**rome, "p_answer_before": {"sum": 1.001}})  # other keys: METRIC_REL
    assert snap.compare(metrics, dict(metrics, **{"Forget facts known": 5}))
    assert snap.compare(metrics, dict(metrics, name="y"))
    assert snap.compare(metrics, {k: v for k, v in metrics.items() if k != "name"})
    assert snap.compare(metrics, dict(metrics, nan=0.0))
    assert snap.compare([["a", "public"]], [["a", "private"]])
    scores = [2.0, -0.5, 1e-6]  # a vector (layer scores): noise within 1e-4 of its largest |x|
    assert snap.compare(scores, [2.0, -0.5, 1e-5]) == []
    assert snap.compare(scores, [2.0, -0.5, 1e-3])
