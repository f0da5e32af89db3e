"""Each method's registry row owns what callers ask of it (issue 46): its settings class
(what its edits record, read back), its two boxes with their bounds and refusal words, the
settings a run gets from them, its cost, its order; and nothing in the app asks a method's
family."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from grom import EditConfig, registry
from grom.methods import ALL, BadSetting, EditorConfig, LunarConfig, Settings

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_reads_back_the_settings_it_records():
    defaults = {"grom": EditConfig(), "lunar": LunarConfig(layer=4), "rome": EditorConfig(layers=(1, 2, 3))}
    for name, row in ALL.items():
        settings = defaults.get(name) or (Settings(method=name) if row.family == "trained" else None)
        if settings is None:
            settings = row.settings()
        assert registry.settings_from(name, settings.to_dict()) == settings, name


def test_rows_are_listed_in_their_explicit_order():
    orders = [row.order for row in ALL.values()]
    assert orders == sorted(orders) and list(ALL)[0] == "grom" and list(ALL)[-1] == "lunar"


@pytest.mark.parametrize("name", [n for n, r in ALL.items() if r.family != "closed-form"])
def test_every_other_method_has_two_boxes_that_refuse_in_words(name):
    row = ALL[name]
    count, rate = row.boxes(None)
    assert row.read_boxes({}) == {count.name: float(count.default), rate.name: float(rate.default)}
    with pytest.raises(BadSetting, match=re.escape(count.label.split(" (")[0] + " = ")):
        row.read_boxes({count.name: count.high * 2})
    with pytest.raises(BadSetting, match=f"{re.escape(rate.label)} must be a number"):
        row.read_boxes({rate.name: "fast"})
    assert row.configure is not None and row.describe is not None and row.kind


def test_the_app_asks_no_method_its_family():
    """The app reads a row's fields; the only family it names is GROM's, to leave it out of the
    baseline box (`comparator_names`)."""
    asks = []
    for path in [ROOT / "app.py", *sorted((ROOT / "components").rglob("*.py"))]:
        for line in path.read_text().splitlines():
            if re.search(r"family_of\(|\.family\s*[!=]=|is_(editor|redirection|trained)\(", line):
                asks.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert asks == ['components/studio/comparators.py: return tuple(name for name, row in ALL.items() '
                    'if row.family != "closed-form")'], asks
