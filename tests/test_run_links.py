"""Links that reopen a run (components/studio/links.py, the Export tab's "Copy link to this
run"): a run stored under an unguessable token, bounded on disk (count, bytes, age; the
oldest dropped first), a token that is a name and never a path, plain messages for a link
that is not one, unknown or expired, and the page's public address behind a proxy.

With the app wiring them (`make_link`, `open_link`, `on_page_link` after the page's load):
through the API, an edit's link opened in a fresh session brings back its model, split,
settings and result, the same patches bit for bit; and in a browser, the link opened in a
fresh page. Those skip until the app wires the links.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
from starlette.requests import Request

from components.server.errors import UserError
from components.server.session import Session
from components.studio import links
from components.studio.links import LINK_PARAM, TOKEN_PATTERN, LinkError
from grom import Edit, EditConfig
from grom.edit import META_FILE, PATCH_FILE

NAME = "model.layers.0.mlp.down_proj.weight"
RUN = {"model": "demo", "benchmark": "demo", "split": "forget10", "source": "", "retain_examples": 300,
       "n_retain": 300, "seed": 3, "preset": "demo", "band_mode": "manual", "k": 1, "band": [0]}


def tiny_edit(rows: int = 8, cols: int = 16, seed: int = 0, method: str = "grom") -> Edit:
    P = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return Edit(settings=EditConfig(), patches={NAME: P}, method=method, run=dict(RUN), timings={"total": 1.5})


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A links folder of the test's own (GROM_LINK_DIR), the default bounds."""
    folder = tmp_path / "links"
    monkeypatch.setenv("GROM_LINK_DIR", str(folder))
    for name in ("GROM_MAX_LINKS", "GROM_LINKS_MAX_MB", "GROM_LINK_DAYS", "GROM_MAX_PATCH_MB"):
        monkeypatch.delenv(name, raising=False)
    return folder


def backdate(root: Path, token: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(root / token, (t, t))


# ---------------------------------------------------------------- the store


def test_a_link_stores_the_export_files_and_opens_them_bit_for_bit(root):
    edit = tiny_edit()
    token = links.store(edit)
    assert TOKEN_PATTERN.fullmatch(token) and len(token) == 32
    assert sorted(p.name for p in (root / token).iterdir()) == [META_FILE, links.LINK_FILE, PATCH_FILE]
    assert [p.name for p in root.iterdir()] == [token]  # nothing else left: no partial folder
    for text in (token, f" {token} ", f"https://studio.example.org/app/?{LINK_PARAM}={token}&__sign=x"):
        with links.opened(text) as link:
            assert link.token == token and link.patch_file is not None and link.age_s < 60
            assert root not in link.meta_file.parents  # a private copy: pruning cannot take it mid-read
            loaded = Edit.load(link.meta_file.parent)  # checks the sha256 edit.json records
            assert torch.equal(loaded.patches[NAME], edit.patches[NAME]) and not loaded.stored_ranks
            assert loaded.sha256() == edit.sha256() and loaded.run == RUN
    assert links.exists(token) and not links.exists("A" * 32)
    assert links.store(edit) != token  # a new token each time: the caller reuses a session's own
    typed = links.store(edit, "bfloat16")  # the model's dtype, which edit.json does not record
    with links.opened(typed) as link:
        assert link.dtype == "bfloat16" and link.token == typed
    (root / typed / links.LINK_FILE).write_text('{"dtype": "../../x"}')
    with links.opened(typed) as link:
        assert link.dtype == ""  # only a dtype the model box offers


def test_tokens_are_names_never_paths(root):
    token = links.store(tiny_edit())
    (root / "elsewhere").mkdir()
    shutil.copytree(root / token, root / "elsewhere" / token)
    bad = ["", None, 42, "..", "../etc/passwd", f"../{token}", f"{token}/..", f"elsewhere/{token}",
           f"/{root}/{token}", token[:-1], token + "x", token[:-2] + "..", token[:-1] + "/", token[:-1] + "é",
           token[:-1] + " ", "%2e%2e%2f" * 4, f"https://x.org/?{LINK_PARAM}=../../etc/passwd",
           f"https://x.org/?{LINK_PARAM}={token}&{LINK_PARAM}={token}",  # which one? neither
           f"https://x.org/?other={token}", f"https://x.org/{token}", "x" * 100_000]
    for text in bad:
        with pytest.raises(LinkError, match="is not a link to a run of this server"):
            with links.opened(text):
                pass
        assert not links.exists(text if isinstance(text, str) else "")
    # a folder or link of a token's name that is not a link folder of the store opens nothing
    (root / ("B" * 32)).symlink_to(root / "elsewhere" / token)
    (root / ("C" * 32)).write_text("{}")
    (root / ("D" * 32)).mkdir()
    for fake in ("B" * 32, "C" * 32, "D" * 32):
        with pytest.raises(LinkError, match="unknown here"):
            with links.opened(fake):
                pass


def test_unknown_and_expired_links_say_so_and_what_to_do(root, monkeypatch):
    with pytest.raises(LinkError) as err:
        with links.opened("Z" * 32):
            pass
    message = str(err.value)
    assert "unknown here" in message and "30 days" in message and "Ask whoever shared it" in message
    monkeypatch.setenv("GROM_LINK_DAYS", "2")
    token = links.store(tiny_edit())
    backdate(root, token, 3 * 86400 + 10)
    with pytest.raises(LinkError, match=r"has expired: it was made 3 days ago, and this server keeps links for 2 "
                                        r"days\. Ask whoever shared it for a new link"):
        with links.opened(token):
            pass
    assert not (root / token).exists()  # gone with its first visit
    with pytest.raises(LinkError, match="unknown here"):
        with links.opened(token):
            pass
    old = links.store(tiny_edit())
    backdate(root, old, 3 * 86400)
    links.store(tiny_edit(seed=1))  # every new link drops the expired ones
    assert not (root / old).exists()


def test_links_are_bounded_by_count_the_oldest_dropped_first(root, monkeypatch):
    monkeypatch.setenv("GROM_MAX_LINKS", "3")
    tokens = []
    for i in range(5):
        tokens.append(links.store(tiny_edit(seed=i)))
        backdate(root, tokens[-1], 100 - i)  # made in this order
    assert [links.exists(t) for t in tokens] == [False, False, True, True, True]
    assert len(list(root.iterdir())) == 3


def test_links_are_bounded_in_bytes_the_oldest_dropped_first(root, monkeypatch):
    monkeypatch.setenv("GROM_LINKS_MAX_MB", "1")
    tokens = []
    for i in range(5):
        tokens.append(links.store(tiny_edit(64, 1024, seed=i)))  # a 256 KiB patch each
        backdate(root, tokens[-1], 100 - i)
    kept = [links.exists(t) for t in tokens]
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert kept == [False, False, True, True, True] and size <= 1 << 20
    with pytest.raises(UserError, match=r"more than this server keeps for all its links.*GROM_LINKS_MAX_MB"):
        links.store(tiny_edit(512, 1024))  # 2 MiB alone
    assert sorted(p.name for p in root.iterdir()) == sorted(tokens[2:])  # nothing written, nothing dropped


def test_one_visitors_links_push_out_only_its_own(root, monkeypatch):
    """Issue 45, item 5: past a bound, the oldest link of whoever holds the most goes, so 21
    large links of one visitor (once: every older link of everyone) leave the others'."""
    monkeypatch.setenv("GROM_LINKS_MAX_MB", "2")
    mine = [links.store(tiny_edit(seed=i), visitor="198.51.100.1") for i in range(2)]
    theirs = links.store(tiny_edit(seed=9), visitor="198.51.100.2")
    flood = [links.store(tiny_edit(64, 1024, seed=10 + i), visitor="203.0.113.9") for i in range(21)]
    assert all(links.exists(t) for t in mine + [theirs])
    assert sum(links.exists(t) for t in flood) < 21 and links.exists(flood[-1])
    assert sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) <= 2 << 20
    assert "198.51.100" not in "".join(p.read_text() for p in root.rglob("link.json"))  # no address on disk
    monkeypatch.setenv("GROM_MAX_LINKS", "4")  # the count too: the flood's oldest go, not the others'
    links.store(tiny_edit(seed=99), visitor="203.0.113.9")
    assert all(links.exists(t) for t in mine + [theirs])


def test_an_edit_over_the_patch_bound_is_linked_by_its_settings(root, monkeypatch):
    monkeypatch.setenv("GROM_MAX_PATCH_MB", "1")
    edit = tiny_edit(512, 1024)  # 2 MiB of patches: computed again when the link is opened
    assert links.stored_form(edit) == "settings" and links.stored_form(tiny_edit()) == "patches"
    token = links.store(edit)
    with links.opened(token) as link:
        assert link.patch_file is None
        meta = json.loads(link.meta_file.read_text())
        assert meta["patch_sha256"] == edit.sha256() and meta["run"] == RUN
    with pytest.raises(UserError, match="only a GROM edit can be computed again.*Export the edit"):
        links.store(tiny_edit(512, 1024, method="npo"))


def test_a_stale_partial_link_goes_and_foreign_files_stay(root):
    root.mkdir()
    partial = root / f"{links.PARTIAL_PREFIX}crashed"
    partial.mkdir()
    (partial / META_FILE).write_text("{}")
    t = time.time() - 2 * links.PARTIAL_MAX_AGE_S
    os.utime(partial, (t, t))
    (root / "README").write_text("the host's")
    links.store(tiny_edit())
    assert not partial.exists() and (root / "README").read_text() == "the host's"


def test_age_in_words():
    assert [links.age_text(s) for s in (5, 60, 150, 3600, 7300, 86400, 3 * 86400 + 5)] == \
        ["moments", "1 minute", "2 minutes", "1 hour", "2 hours", "1 day", "3 days"]


# ---------------------------------------------------------------- the page's address


def request(path: str = "/gradio_api/queue/join", query: str = "run=x&__sign=s", headers: dict | None = None,
            host: str = "127.0.0.1:7860", root_path: str = "", scope_root: str = "") -> gr.Request:
    """The gr.Request of a queued event: its fastapi request is the queue's join (the
    page's query string on it), under the app (its root_path)."""
    scope = {"type": "http", "method": "POST", "scheme": "http", "server": ("127.0.0.1", 7860), "path": path,
             "query_string": query.encode(), "root_path": scope_root, "app": SimpleNamespace(root_path=root_path),
             "headers": [(b"host", host.encode())] + [(k.lower().encode(), v.encode())
                                                     for k, v in (headers or {}).items()]}
    return gr.Request(request=Request(scope))


def test_the_link_is_the_pages_public_address():
    t = "T" * 32
    assert links.page_url(request(), t) == f"http://127.0.0.1:7860/?run={t}"  # the page's query dropped
    behind = request(headers={"X-Forwarded-Host": "me-studio.hf.space, 10.0.0.2", "X-Forwarded-Proto": "https"})
    assert links.page_url(behind, t) == f"https://me-studio.hf.space/?run={t}"
    mounted = request(path="/studio/gradio_api/queue/join", headers={"X-Forwarded-Host": "example.org",
                                                                     "X-Forwarded-Proto": "https"},
                      root_path="/studio")
    assert links.page_url(mounted, t) == f"https://example.org/studio/?run={t}"
    assert links.page_url(request(path="/studio/gradio_api/queue/join"), t) == f"http://127.0.0.1:7860/studio/?run={t}"
    named = request(root_path="https://example.org/studio/")  # GRADIO_ROOT_PATH as a full URL
    assert links.page_url(named, t) == f"https://example.org/studio/?run={t}"
    assert links.page_url(request(scope_root="/proxied"), t) == f"http://127.0.0.1:7860/proxied/?run={t}"
    assert links.page_url(None, t) == f"?run={t}"
    assert links.token_of(links.page_url(behind, t)) == t


# ---------------------------------------------------------------- the page's handler, no app


def test_a_page_without_a_link_changes_nothing_and_a_bad_one_says_why(root):
    from components.export_panel import LINK_OUTPUTS, on_page_link

    session = Session()
    out = on_page_link(session, request(query="x=1"), progress=lambda *a, **k: None)
    assert len(out) == LINK_OUTPUTS and all(isinstance(o, type(gr.skip())) for o in out)
    out = on_page_link(session, None, progress=lambda *a, **k: None)
    assert len(out) == LINK_OUTPUTS
    for query, said in (("run=..%2F..%2Fetc%2Fpasswd", "is not a link"), ("run=" + "Q" * 32, "unknown here"),
                        ("run=", "is not a link")):
        out = on_page_link(session, request(query=query), progress=lambda *a, **k: None)
        assert len(out) == LINK_OUTPUTS and said in out[-4] and "The page opened as usual" in out[-4]
        assert out[-4] == out[-3] and str(root) not in out[-4] and isinstance(out[-1], type(gr.skip()))
    assert session.model_key is None and session.edit is None  # untouched


def test_a_shared_run_repeats_no_free_text_of_its_author(root):
    from components.export_panel import _plain_run

    edit = tiny_edit()
    edit.run |= {"preset": "[Log in again here](https://evil.example)", "band_mode": "**urgent**"}
    with links.opened(links.store(edit)) as link:  # a run imported from a hostile file, then shared
        _plain_run(link.meta_file)
        run = json.loads(link.meta_file.read_text())["run"]
        assert (run["preset"], run["band_mode"]) == ("(custom)", "manual") and run["band"] == RUN["band"]
        assert Edit.load(link.meta_file.parent).sha256() == edit.sha256()  # the patches untouched


# ---------------------------------------------------------------- through the app (needs app.py's wiring)


def wired() -> bool:
    """Whether the app wires the links (make_link, open_link, the page's ?run=: components/page.py)."""
    from components import page

    return hasattr(page, "on_page_link")


needs_wiring = pytest.mark.skipif(not wired(), reason="the app does not wire the links yet: make_link, "
                                                       "open_link and on_page_link after the page's load")


@pytest.fixture
def wired_url(root, request):
    """The app on the demo model (tests/app_fixtures.py `url`), links in the test's folder."""
    return request.getfixturevalue("url")


from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)


def outputs(out) -> SimpleNamespace:
    """`on_open_link`'s outputs by name (export_panel LINK_OUTPUTS order)."""
    from components.studio.form import RESTORED

    n = len(RESTORED)
    return SimpleNamespace(model=out[:5], widgets=dict(zip(RESTORED, out[5:5 + n])), bench=out[5 + n:11 + n],
                           summary=out[11 + n], table=out[12 + n], note=out[14 + n], export_note=out[15 + n],
                           card=out[-1])


def export_patches(client, folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    files, _, _ = client.predict(api_name="/export")
    folder.mkdir(parents=True)
    for f in files:
        shutil.copy(f, folder / Path(f).name)
    return json.loads((folder / META_FILE).read_text()), load_file(str(folder / PATCH_FILE))


def same_patches(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


RUN_EDIT = ("preset", "target", "beta", "beta_relative", "w_r", "rho", "c", "matrix", "use_alpha",
            "band_mode", "band_text", "k", "seed", "forget_budget", "retain_budget", "batch_size",
            "retain_examples")


@needs_wiring
def test_a_link_brings_the_run_back_into_a_fresh_session(wired_url, tmp_path):
    from gradio_client import Client

    from tests.test_app import QUICK, new_client

    url = wired_url
    a = new_client(url)
    settings = QUICK | dict(band_mode="manual", band_text="3-5", beta=120.0, w_r=150.0, seed=3)
    summary, table, _ = a.predict(api_name="/run_edit", **settings)
    link, note = a.predict(api_name="/make_link")
    assert re.fullmatch(re.escape(url.rstrip("/")) + r"/\?run=[A-Za-z0-9_-]{32}", link), link
    assert "opens this run in a fresh page" in note and "demo/forget10" in note and "bit for bit" in note
    assert a.predict(api_name="/make_link")[0] == link  # the same edit: the same link
    meta, patches = export_patches(a, tmp_path / "a")
    _, first, _, _ = a.predict(max_examples=6, api_name="/compare")

    b = Client(url, verbose=False)  # a fresh session, on another split first
    b.predict("demo", "forget01", "", None, None, api_name="/load_benchmark")
    got = outputs(b.predict(link, api_name="/open_link"))
    assert (got.bench[0], got.bench[1]["value"]) == ("demo", "forget10")
    w = got.widgets
    assert (w["beta"], w["w_r"], w["band_mode"], w["band_text"], w["seed"], w["retain_examples"]) == \
        (120.0, 150.0, "manual", "3-5", 3, 300)
    assert got.summary == summary and got.table == table  # the result as the maker saw it
    assert "Opened a shared run" in got.note and "bit for bit" in got.note and got.note == got.export_note
    again, linked = export_patches(b, tmp_path / "b")
    assert same_patches(patches, linked) and again["patch_sha256"] == meta["patch_sha256"]
    assert again["run"] == meta["run"] and again["settings"] == meta["settings"]
    _, second, _, _ = b.predict(max_examples=6, api_name="/compare")
    assert second["data"] == first["data"]  # the same edit, the same metrics
    k = w["k"]["value"] if isinstance(w["k"], dict) else w["k"]
    b.predict(api_name="/run_edit", **({name: w[name] for name in RUN_EDIT} | {"k": k}))  # the settings, run again
    assert same_patches(patches, export_patches(b, tmp_path / "c")[1])

    for bad, said in (("Q" * 32, "unknown here"), ("../../etc/passwd", "is not a link"),
                      (link.replace("run=", "run=x"), "is not a link")):
        with pytest.raises(Exception, match=said):
            b.predict(bad, api_name="/open_link")
    assert same_patches(patches, export_patches(b, tmp_path / "d")[1])  # nothing changed


@needs_wiring
def test_a_link_loads_its_model_where_the_host_allows_it(wired_url, tmp_path, monkeypatch):
    from gradio_client import Client

    url = wired_url
    a = Client(url, verbose=False)
    a.predict("demo-retain", "cpu", "bfloat16", api_name="/load_model")  # not the page's start model, nor its dtype
    a.predict("demo", "forget10", "", None, None, api_name="/load_benchmark")
    summary, _, _ = a.predict(api_name="/run_edit", retain_examples=200, band_mode="manual", band_text="2-3")
    link, _ = a.predict(api_name="/make_link")
    _, patches = export_patches(a, tmp_path / "a")

    monkeypatch.setenv("GROM_MODELS", "demo")  # a host that offers the demo only
    b = Client(url, verbose=False)
    with pytest.raises(Exception, match="offers only these models: demo"):
        b.predict(link, api_name="/open_link")
    monkeypatch.delenv("GROM_MODELS")
    got = outputs(b.predict(link, api_name="/open_link"))
    assert "`assets/demo-retain`" in got.model[0] and "in bfloat16" in got.model[0]
    assert list(got.model[2:]) == ["assets/demo-retain", "auto", "bfloat16"]
    assert got.summary == summary
    assert same_patches(patches, export_patches(b, tmp_path / "b")[1])


# ---------------------------------------------------------------- in a browser (needs app.py's wiring)


@needs_wiring
def test_a_link_opened_in_a_fresh_page(wired_url, tmp_path):
    """Run the demo edit in one page, copy its link, open the link in a fresh page (a new
    browser context: nothing shared but the address): the model, the split, β and the band,
    and the result come back, and the Edit panel says so. An unknown link: the page opens
    as usual and says why."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    url = wired_url
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        errors: list[str] = []
        maker = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
        maker.on("pageerror", lambda e: errors.append(str(e)))
        maker.goto(url)
        maker.wait_for_function("document.body.innerText.includes('Band (')", timeout=300_000)
        beta = maker.get_by_label("β (relative)")
        beta.fill("60")  # not the preset's: the preset box says "(custom)"
        beta.press("Tab")
        maker.click("#run-edit")
        maker.wait_for_selector("#result-card .result-card:not(.rc-from-store):not(:has(.rc-pending))",
                                timeout=300_000)  # the whole card (the link keeps it), not the first verdict
        maker.get_by_role("tab", name="Edit details").click()
        summary = maker.locator("#result-summary").inner_text()
        maker.get_by_role("tab", name="Export", exact=True).click()
        maker.click("#link-button")
        maker.wait_for_function("(document.querySelector('#run-link textarea, #run-link input')?.value || '')"
                                ".includes('?run=')", timeout=60_000)
        link = maker.locator("#run-link textarea, #run-link input").first.input_value()
        assert re.fullmatch(re.escape(url.rstrip("/")) + r"/\?run=[A-Za-z0-9_-]{32}", link), link

        page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()  # a fresh browser
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(link)
        page.wait_for_function("document.querySelector('#edit-status')?.innerText.includes('Opened a shared run')",
                               timeout=300_000)
        status = page.locator("#edit-status").inner_text()
        assert "demo/forget10" in status and "bit for bit" in status, status
        assert page.get_by_label("β (relative)").input_value() == "60"
        page.wait_for_function(f"document.querySelector('#result-summary')?.innerText === {json.dumps(summary)}",
                               timeout=60_000)  # the result as the maker saw it (Edit details, shown)
        page.screenshot(path=str(tmp_path / "link_opened.png"))
        page.get_by_role("tab", name="Layers", exact=True).click()  # the page goes on: the run data's layer scores
        page.wait_for_function("document.body.innerText.includes('Band (')", timeout=300_000)

        gone = browser.new_context().new_page()
        gone.on("pageerror", lambda e: errors.append(str(e)))
        gone.goto(url.rstrip("/") + "/?run=" + "Q" * 32)
        gone.wait_for_function("document.querySelector('#edit-status')?.innerText.includes('unknown here')",
                               timeout=300_000)
        assert "The page opened as usual" in gone.locator("#edit-status").inner_text()
        gone.wait_for_function("document.body.innerText.includes('Band (')", timeout=300_000)
        browser.close()
    assert not errors, errors


def test_a_link_keeps_the_runs_card_and_opens_with_it(root):
    """The card of the run when its link was made travels with the link (issue 49: a
    stakeholder opening it sees the result, not a button to press); one larger than any the
    app writes is not kept."""
    card = '<div class="result-card"><div class="rc-head">Forgot <b>12 of the 15</b></div></div>'
    with links.opened(links.store(tiny_edit(), card=card)) as link:
        assert link.card == card and abs(link.made - time.time()) < 60
    with links.opened(links.store(tiny_edit(), card="x" * (links.MAX_CARD_BYTES + 1))) as link:
        assert link.card == ""
    from components.studio import cards

    shown = cards.shown(cards.StoredCard(card, time.time(), "", ""), "kept with the link when it was made")
    assert "rc-from-store" in shown and "kept with the link" in shown and "12 of the 15" in shown
