"""Result cards kept on disk (issue 49, item 1): a page opens with the card its form would
give, computed ahead by the server's warm-up or by an earlier visitor's run, keyed by the
weights, the data, the settings and the evaluation size."""
from __future__ import annotations

import json
import os

import gradio as gr
import pytest
import torch

from components.studio import cards

KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def card_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GROM_CARD_DIR", str(tmp_path))
    return tmp_path


def test_a_kept_card_is_found_by_its_key_and_marked_as_computed_ahead(card_dir):
    cards.keep(KEY, '<div class="result-card"><div class="rc-head">Forgot <b>3 of the 4</b></div></div>', "cpu")
    found = cards.find(KEY)
    assert found is not None and found.device == "cpu" and found.key == KEY
    shown = cards.shown(found)
    assert shown.startswith('<div class="result-card rc-from-store">')
    assert "computed ahead" in shown and "Forgot <b>3 of the 4</b>" in shown
    assert cards.find("f" * 32) is None


def test_a_card_of_another_version_a_bad_key_or_a_link_is_not_read(card_dir):
    (card_dir / f"{KEY}.json").write_text(json.dumps({"version": cards.CARD_VERSION + 1, "key": KEY, "html": "x"}))
    assert cards.find(KEY) is None
    with pytest.raises(ValueError):
        cards.keep("../../etc/passwd", "x", "cpu")  # never a path
    target = card_dir / "elsewhere.json"
    target.write_text(json.dumps({"version": cards.CARD_VERSION, "key": "a" * 32, "html": "x"}))
    os.symlink(target, card_dir / f"{'a' * 32}.json")
    assert cards.find("a" * 32) is None


def test_the_oldest_cards_go_beyond_the_hosts_bound(card_dir, monkeypatch):
    monkeypatch.setenv("GROM_MAX_CARDS", "3")
    keys = [f"{i:032x}" for i in range(5)]
    for i, key in enumerate(keys):
        cards.keep(key, f"<div>{i}</div>", "cpu")
        os.utime(card_dir / f"{key}.json", (1000 + i, 1000 + i))
    cards.keep("f" * 32, "<div>last</div>", "cpu")
    assert sorted(p.stem for p in card_dir.glob("*.json")) == sorted(keys[3:] + ["f" * 32])


def test_the_key_follows_the_weights_the_data_the_settings_and_the_size():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fp = cards.weights_fingerprint(model)
    assert cards.weights_fingerprint(model) == fp  # cached, and stable

    class Bench:
        name, split, eval_sets = "b", "s", None
        forget, retain = ("q1",), ("r1", "r2")

    bench = Bench()
    run = {"retain_examples": 2, "n_retain": 2, "seed": 0, "band_mode": "suggested", "k": 2}
    config = {"beta": 10.0, "layers": (1, 2)}
    key = cards.card_key(fp, "float32", bench, cards.config_of(config, run), run, 20)
    same = cards.card_key(fp, "float32", bench, cards.config_of({**config, "layers": None}, run), run, 20)
    assert key == same  # a suggested band follows from the rest
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        other.load_state_dict(model.state_dict())
        other[1].bias[0] += 1e-3
    changes = [cards.card_key(cards.weights_fingerprint(other), "float32", bench, config, run, 20),
               cards.card_key(fp, "bfloat16", bench, config, run, 20),
               cards.card_key(fp, "float32", bench, {**config, "beta": 11.0}, run, 20),
               cards.card_key(fp, "float32", bench, config, {**run, "seed": 1}, 20),
               cards.card_key(fp, "float32", bench, config, run, None)]
    manual = {**run, "band_mode": "manual"}
    changes.append(cards.card_key(fp, "float32", bench, cards.config_of({**config, "layers": (0, 1)}, manual),
                                  manual, 20))
    assert len({key, *changes}) == len(changes) + 1


def test_the_fingerprint_reads_the_exact_bits_whatever_the_order_of_its_sums():
    """The weights' fingerprint is the same on every machine and thread count (a card shipped
    in assets/cards is found on a host with the same weights): each parameter enters by the
    integer sum of its bits, which equals numpy's sum of the same bytes; one bit changed in
    one value changes it."""
    import numpy as np

    from grom.model.fingerprint import _bit_sum, weights_fingerprint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 7).to(torch.bfloat16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weights_fingerprint(model)
        torch.set_num_threads(2)
        two = weights_fingerprint(model)
    finally:
        torch.set_num_threads(threads)
    assert one == two
    for p, ints in ((model[0].weight, np.int32), (model[1].weight, np.int16)):
        raw = np.frombuffer(p.detach().contiguous().view(torch.uint8).numpy().tobytes(), dtype=ints)
        assert _bit_sum(p.detach().reshape(-1)) == int(raw.astype(np.int64).sum())
    with torch.no_grad():
        w = model[0].weight.view(-1)
        w[12345 % w.numel()] = torch.nextafter(w[12345 % w.numel()], torch.tensor(1.0))
    assert weights_fingerprint(model) != one


def test_a_page_opens_with_the_card_the_warm_up_kept_and_not_for_other_settings(card_dir):
    """The server's warm-up computes the start page's card (demo model and benchmark) as Run
    edit would; a new page with the same form shows it at once, marked; a page with another
    beta, or opened with a link to a run, does not."""
    import app
    from components.page import card_widgets, on_form_for_stored, on_stored_card, start_session, warm_card
    from components.server.allowed_sources import DEMO
    from components.server.session import REGISTRY
    from components.studio import form

    app.preload(DEMO, "cpu")
    key = REGISTRY.current.key
    with gr.Blocks():
        ui = app.build_layout(DEMO, start_session(key))
    values = [c.value for c in card_widgets(ui)]
    warm = start_session(key)
    warm_card(values[:-2], *values[-2:], warm)
    kept = list(card_dir.glob("*.json"))
    assert len(kept) == 1
    html = on_stored_card(*values, start_session(key))
    assert isinstance(html, str) and "rc-from-store" in html and "computed ahead" in html
    stored = json.loads(kept[0].read_text())["html"]
    assert stored.split("</div>")[0].split(">", 1)[1] in html and "to the first card" not in stored  # no wait
    beta = form.NAMES.index("beta")
    other = list(values)
    other[beta] = float(other[beta]) * 2
    assert isinstance(on_stored_card(*other, start_session(key)), type(gr.skip()))
    # before the page's first run, a setting changed: the kept card of the new settings, else a line saying
    # there is none; back to the settings it opened with, its card again; nothing once the page has an edit
    page = start_session(key)
    assert isinstance(on_form_for_stored(*values, html, page), type(gr.skip()))
    assert on_form_for_stored(*other, html, page) == cards.STALE
    assert cards.shown_key(on_form_for_stored(*values, cards.STALE, page)) == cards.shown_key(html)
    page.edit = object()
    assert isinstance(on_form_for_stored(*other, html, page), type(gr.skip()))

    class Linked:
        query_params = {"run": "x" * 32}

    assert isinstance(on_stored_card(*values, start_session(key), request=Linked()), type(gr.skip()))
    before = kept[0].read_bytes()
    warm_card(values[:-2], *values[-2:], start_session(key))  # kept already: nothing computed again
    assert len(list(card_dir.glob("*.json"))) == 1 and kept[0].read_bytes() == before


def test_the_unedited_rows_and_the_layer_scores_outlive_the_process(card_dir):
    """What a card rests on is kept on disk by the weights and the data: after a restart
    (the process's caches emptied) the Base rows and the layer scores are read back, the
    same values, and nothing is computed again."""
    import app
    from components.page import start_session
    from components.server.allowed_sources import DEMO
    from components.server.session import REGISTRY
    from components.studio import comparison, scores
    from grom import EditConfig

    app.preload(DEMO, "cpu")
    handle = REGISTRY.current
    bench = start_session(handle.key).benchmark
    comparison._BASE_CACHE.clear()  # an earlier test of this worker may have made them in memory (not on
    handle.scores_cache.clear()     # this test's disk): this process computes, then keeps, them first
    report = comparison.comparison_report(handle, bench, None, 5, None)
    config = EditConfig(prompt_format=bench.prompt_format)
    first = scores.cached_scores(handle, bench.forget[:4], bench.retain[:8], config, lambda *a, **k: None)
    comparison._BASE_CACHE.clear()
    handle.scores_cache.clear()
    again = comparison.base_report(handle.key, bench, 5)
    assert again is not None and again is not report and "Edited" not in again.rows
    assert again.rows["Base"].metrics == report.rows["Base"].metrics
    calls = []
    original = scores.compute_scores
    scores.compute_scores = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        read = scores.cached_scores(handle, bench.forget[:4], bench.retain[:8], config, lambda *a, **k: None)
    finally:
        scores.compute_scores = original
    assert calls == [] and torch.equal(torch.as_tensor(read.S), torch.as_tensor(first.S))
    assert len(list((card_dir / "base-report").glob("*.pkl"))) == 1
    assert len(list((card_dir / "layer-scores").glob("*.pkl"))) == 1


def test_the_fingerprint_cache_and_the_kept_attack_side_do_not_keep_an_unloaded_model_alive(tokenizer):
    """The weights' fingerprint is cached per model and the attack tab's kept unedited side
    per model (components.attack_panel.unedited_side): both by weak reference, so a model the
    registry unloads is freed (a 1B model is 4 GB the host would otherwise never get back)."""
    import gc
    import weakref
    from types import SimpleNamespace

    from components import attack_panel
    from tests.conftest import tiny_llama

    model = tiny_llama(len(tokenizer), layers=2)
    fp = cards.weights_fingerprint(model)
    assert cards.known_fingerprint(model) == fp
    side = attack_panel.unedited_side(SimpleNamespace(model=model, tokenizer=tokenizer))
    assert side is not None and side.stamp["weights"] == fp
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
