"""Results of an earlier edit said to be so (issue 49, item 4): during and after a re-run at
another β, the Compare tab showed the previous edit's summary and metrics, unmarked. The
moment Run edit starts, and whenever the form's settings are no longer the edit's, every
result on show says which edit it is from; the new results replace the line."""
from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pandas as pd
import pytest

pytest.importorskip("gradio")

from components.server.session import Session  # noqa: E402
from components.studio import staleness as st  # noqa: E402
from components.studio.form import NAMES, RESTORED, restore_values  # noqa: E402
from grom import EditConfig  # noqa: E402

SKIP = {"__type__": "update"}


class Edit(SimpleNamespace):
    """An edit's parts the marks read (held weakly, as a grom Edit is)."""


def an_edit(beta: float = 10.0, band=(3, 4, 5)):
    run = {"band_mode": "manual", "k": len(band), "seed": 0, "retain_examples": 128}
    return Edit(settings=EditConfig(beta=beta, layers=band), band=band, timings={"total": 1.0}, method="grom", run=run)


def values_of(edit, **changed) -> list:
    """The Edit form's values (in `NAMES` order) holding `edit`'s settings, some `changed`."""
    by_name = dict(zip(RESTORED, restore_values(edit.settings.to_dict(), edit.run))) | changed
    return [by_name[n] for n in NAMES]


TEXTS = ['<div class="result-card rc-new">Forgot 2 of 6</div>', "Compared on real-knowledge in 3.0 s.",
         "<div>forget answers</div>", "<div>retain answers</div>", "", "On **8 held-out probes** ...",
         "<div>attack answers</div>", "GROM's edit took 1.0 s", "", "", "4-bit: still forgets."]
BASELINE = pd.DataFrame({"metric": ["Final score"], "Base": [0.1], "GROM": [0.5], "NPO": [0.4]})


def shown_session(edit) -> Session:
    """A session whose card, comparison and attacks are `edit`'s."""
    session = Session()
    session.edit = edit
    session.extra["card"] = (edit, None, True, 10)
    session.report, session.report_for = object(), (None, edit, 20)
    session.extra["attacks"] = (edit, {}, (), ())
    return session


def skipped(output) -> bool:
    """Left as it was (`gr.skip()`; an HTML box's, as served, inside "props")."""
    return isinstance(output, dict) and output.get("__type__") == "update" and output.get("props", SKIP) == SKIP


def after(texts: list, outputs: list) -> list:
    return [t if skipped(o) else o for t, o in zip(texts, outputs)]


def test_a_run_marks_what_is_on_show_and_a_failed_run_takes_the_marks_off():
    edit = an_edit()
    session = shown_session(edit)
    out = st.on_run_started(session, BASELINE, *TEXTS)
    texts = after(TEXTS, out[:len(st.SHOWN)])
    assert skipped(out[4]) and skipped(out[8])  # nothing there: nothing to mark
    for i in (0, 1, 2, 3, 5, 6, 7, 10):
        assert st.tag_of(texts[i]) == "previous:1" and st.unmarked(texts[i]) == TEXTS[i].replace(" rc-new", "")
    assert ("From an earlier edit, the edit at β 10, w_r 100, ρ 0.03, band 3-5: the new edit's comparison "
            "follows.") in texts[1]
    assert "rc-new" not in texts[0]  # a marked card is not scrolled to again
    metrics, attacks = out[len(st.SHOWN):]
    assert metrics.label.startswith("⚠ From an earlier edit") and attacks.label.startswith("⚠ From an earlier")
    # the run failed (refused, stopped): the edit on show is still the session's
    ended = st.on_run_ended(*values_of(edit), session, BASELINE, *texts)
    restored = after(texts, ended[:len(st.SHOWN)])
    assert restored[1:] == TEXTS[1:] and "Forgot 2 of 6" in restored[0] and st.tag_of(restored[0]) is None
    assert ended[len(st.SHOWN)].label == st.TABLE_LABELS["metrics"]
    assert all(skipped(o) for o in ended[-len(st.CLEARED):])  # nothing cleared: they are still the edit's


def test_after_a_new_edit_the_previous_ones_results_stay_marked_until_replaced():
    old = an_edit()
    session = shown_session(old)
    texts = after(TEXTS, st.on_run_started(session, BASELINE, *TEXTS)[:len(st.SHOWN)])
    new = an_edit(beta=150.0)
    session.edit = new  # the run succeeded
    ended = st.on_run_ended(*values_of(new), session, BASELINE, *texts)
    assert all(skipped(o) for o in ended[:len(st.SHOWN)])  # the marks stay; the card is the new edit's to draw
    assert all(not skipped(o) for o in ended[-len(st.CLEARED):])  # plots and tables that cannot say it: cleared
    # settings changed later: an earlier edit's results keep their line, they gain no other
    changed = st.on_settings_changed(*values_of(new, beta=30.0), session, BASELINE, *texts)
    assert all(skipped(o) for o in changed[:len(st.SHOWN)])
    # the new comparison replaces the summary: that text is the new edit's
    session.report_for = (None, new, 20)
    fresh = list(texts)
    fresh[1] = "Compared on real-knowledge in 2.0 s."
    changed = st.on_settings_changed(*values_of(new, beta=30.0), session, BASELINE, *fresh)
    assert st.tag_of(changed[1]) == "settings" and "the form now says β 150 → 30" in changed[1]
    assert all(skipped(o) for i, o in enumerate(changed[:len(st.SHOWN)]) if i != 1)


def test_the_form_changed_marks_the_results_and_changed_back_unmarks_them():
    edit = an_edit()
    session = shown_session(edit)
    assert all(skipped(o) for o in st.on_settings_changed(*values_of(edit), session, BASELINE, *TEXTS)[:11])
    out = st.on_settings_changed(*values_of(edit, beta=150.0, band_text="2-4"), session, BASELINE, *TEXTS)
    texts = after(TEXTS, out[:len(st.SHOWN)])
    assert ("These results are of the edit at β 10, w_r 100, ρ 0.03, band 3-5; the form now says β 10 → 150, "
            "band 3-5 → 2-4: press <b>Run edit</b> for those settings.") in texts[1]
    assert out[len(st.SHOWN)].label.startswith("⚠ These results are of the edit at β 10")
    back = st.on_settings_changed(*values_of(edit), session, BASELINE, *texts)
    assert after(texts, back[:len(st.SHOWN)]) == [TEXTS[0].replace(" rc-new", "")] + TEXTS[1:]
    session.extra["stale_run"] = ("running",)  # a new edit is running: its start marked them already
    assert all(skipped(o) for o in st.on_settings_changed(*values_of(edit, beta=3.0), session, BASELINE, *TEXTS))
    assert all(skipped(o) for o in st.on_run_started(Session(), BASELINE, *TEXTS))  # no edit: nothing on show


def test_the_settings_in_words():
    edit = an_edit()
    assert st.differences(dict(zip(NAMES, values_of(edit))), edit) == []
    assert st.differences(dict(zip(NAMES, values_of(edit, c=3.0, batch_size=2, preset="tofu10"))), edit) == []
    assert st.differences(dict(zip(NAMES, values_of(edit, band_text="3,4,5"))), edit) == []  # the same band
    assert st.differences(dict(zip(NAMES, values_of(edit, band_mode="suggested"))), edit) == [
        "band 3-5 → the suggested one"]
    assert st.differences(dict(zip(NAMES, values_of(edit, target="corruption", use_alpha=False))), edit) == [
        "target suppression → corruption", "α on → off"]
    huge = st.differences(dict(zip(NAMES, values_of(edit, beta="x" * 10**6))), edit)
    assert huge[0].startswith("β 10 → x") and len(huge[0]) < 60


# ------------------------------------------------------------------------------ through the app

@pytest.fixture(scope="module")
def served():
    from components.server.allowed_sources import DEMO
    from tests.app_fixtures import launch

    blocks, url = launch(DEMO)
    yield blocks, url
    blocks.close()


def post(url, blocks, name: str, session: str, data: list) -> list:
    """The page's event whose handler is `name`, for the session `session`, as a browser sends
    it: `data` in its inputs' order, None for an input's value as the page opened."""
    config = blocks.get_config_file()
    dep = next(d for d in config["dependencies"] if getattr(blocks.fns[d["id"]].fn, "__name__", "") == name)
    opened = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
    data = [opened.get(i) if v is None else v for i, v in zip(dep["inputs"], data)]
    r = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", timeout=60,
                   content=json.dumps({"fn_index": dep["id"], "session_hash": session, "data": data}).encode(),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:500]
    return r.json()["data"]


def test_a_rerun_at_another_beta_marks_the_previous_comparison_through_the_app(served):
    """Through the served app, as the page drives it: an edit and its comparison, then Run
    edit pressed at another β (the page's own event, for that session), the run, its end,
    and the new comparison, which replaces the marked one."""
    from gradio_client import Client

    blocks, url = served
    c = Client(url, verbose=False)
    sid = c.session_hash
    c.predict("demo", "forget10", "", None, None, api_name="/load_benchmark")
    c.predict(retain_examples=300, api_name="/run_edit")
    summary, table, forget_html, retain_html = c.predict(max_examples=5, api_name="/compare")
    texts = [""] * len(st.SHOWN)
    texts[1], texts[2], texts[3] = summary, forget_html, retain_html
    out = post(url, blocks, "on_run_started", sid, [None, None, *texts])
    assert st.tag_of(out[1]) == "previous:1" and st.unmarked(out[1]) == summary
    assert "From an earlier edit, the edit at β" in out[1] and st.tag_of(out[2]) == "previous:1"
    assert out[len(st.SHOWN)]["label"].startswith("⚠ From an earlier edit")  # the metrics table's label
    c.predict(retain_examples=300, beta=0.5, preset="(custom)", api_name="/run_edit")  # the new edit
    texts[1:4] = out[1:4]
    ended = post(url, blocks, "on_run_ended", sid, [None] * len(NAMES) + [None, None, *texts])
    assert all(skipped(o) for o in ended[:len(st.SHOWN)])  # marked until the new comparison replaces them
    assert all(o.get("type") == "plotly" or "headers" in o for o in ended[-len(st.CLEARED):])  # cleared
    fresh, *_ = c.predict(max_examples=5, api_name="/compare")
    assert st.tag_of(fresh) is None and fresh.startswith("Compared on")
