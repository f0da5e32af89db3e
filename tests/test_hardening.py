"""The studio on a public host (issue 12): a text field cannot make the server build a
huge band or echo a huge input, a chat template cannot hold the device, errors show no
server paths and tell apart no repository files, NaN and infinity get real messages, and
the diagnostics take any edited matrix's name through the API.

Unit tests first, then gradio_client against the app on the bundled demo model.
"""
from __future__ import annotations

import copy
import math
import time

import pytest

from components.diagnostics_panel import _matrix
from components.server.allowed_sources import allowed_source
from components.server.errors import REPO_ROOT, UserError, message_for, scrub_paths, shorten
from components.server.validate import parse_band, retain_subset
from components.studio.form import edit_config
from grom.closed_form.config import EditConfig
from grom.data import prompts
from grom.data.prompts import TemplateError, encode_prompt, format_prompt

NAN, INF = float("nan"), float("inf")
SLOW_TEMPLATE = ("{% for i in range(6000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}"
                 "{{ messages[-1]['content'] }}")


def widgets(**changes) -> dict:
    values = dict(preset="demo", target="suppression", beta=150.0, beta_relative=True, w_r=100.0,
                  rho=0.03, c=45.0, matrix="down_proj", use_alpha=True, band_mode="manual",
                  band_text="3-5", k=3, seed=0, forget_budget=0, retain_budget=0, batch_size=32)
    return values | changes


# ---------------------------------------------------------------- 1: the band, echoes

@pytest.mark.parametrize("band", ["0-10000000", "0-1000000000", "2-" + "9" * 900])
def test_a_huge_band_is_refused_at_once_with_a_short_message(band):
    start = time.perf_counter()
    with pytest.raises(UserError, match="outside the model") as err:
        parse_band(band, 6)
    assert time.perf_counter() - start < 0.1 and len(str(err.value)) < 200


def test_band_parts_are_checked_and_their_echo_is_short():
    assert parse_band("3-5", 6) == (3, 4, 5) and parse_band("1, 3 5 3", 6) == (1, 3, 5)
    for band, message in [("5-3", "lower layer first"), ("-1", "write layers as"), ("7", "Layer 7 is outside"),
                          ("x" * 100_000, "characters long"), ("3-5 " + "y" * 900, "write layers as")]:
        with pytest.raises(UserError, match=message) as err:
            parse_band(band, 6)
        assert len(str(err.value)) < 200


def test_a_huge_model_or_data_name_gets_a_short_message():
    for kind in ("model", "data"):
        for name in ("a" * 100_000, "x/" * 50_000, "bad id!" * 10_000):
            with pytest.raises(UserError) as err:
                allowed_source(name, kind)
            assert len(str(err.value)) < 300
    assert shorten("z" * 1000) == "z" * 79 + "…" and shorten("short") == "short"
    assert len(message_for(ValueError("q" * 100_000))) <= 1000


# ---------------------------------------------------------------- 6: chat templates

def demo_tokenizer():
    from transformers import AutoTokenizer

    from grom.demo import demo_model_dir

    return AutoTokenizer.from_pretrained(demo_model_dir("full"))


def count_renders(monkeypatch, tok) -> list:
    calls = []
    render = type(tok).apply_chat_template
    monkeypatch.setattr(type(tok), "apply_chat_template",
                        lambda self, *a, **kw: calls.append(1) or render(self, *a, **kw))
    return calls


def test_each_prompt_is_rendered_once_per_tokenizer(monkeypatch):
    tok = demo_tokenizer()
    calls = count_renders(monkeypatch, tok)
    first = [encode_prompt(tok, f"question {i}?") for i in range(30)]
    again = [encode_prompt(tok, f"question {i}?") for i in range(30)]
    assert first == again and len(calls) == 30
    tok.chat_template = tok.chat_template + " "  # a changed template is rendered afresh
    assert format_prompt(tok, "question 0?").endswith(" ") and len(calls) == 31


def test_a_slow_chat_template_is_refused_and_never_run_again(monkeypatch):
    tok = demo_tokenizer()
    tok.chat_template = SLOW_TEMPLATE  # ~0.5 s a render (0.25 s allowed)
    calls = count_renders(monkeypatch, tok)
    for i in range(30):  # 30 prompts: before, 30 renders (15 s); now the first prompt's tries, then refused at once
        with pytest.raises(TemplateError, match="CPU time"):
            format_prompt(tok, f"q{i}")
    assert len(calls) == prompts.RENDER_TRIES


def test_one_slow_render_of_a_fast_template_is_not_a_refusal(monkeypatch):
    """CI (2026-11-29): the demo model's one-line template was refused mid-suite, one render
    timed at 0.07 s of CPU time (a garbage collection, or a recompiled template, under load).
    A render over the limit is timed again; only a template slow each time is refused."""
    tok = demo_tokenizer()
    format_prompt(tok, "warm")  # the first render (its own limit)
    render, slow = type(tok).apply_chat_template, [True]

    def once_slow(self, *a, **kw):
        if slow.pop() if slow else False:
            end = time.thread_time() + 2 * prompts.MAX_RENDER_SECONDS
            while time.thread_time() < end:
                pass
        return render(self, *a, **kw)

    monkeypatch.setattr(type(tok), "apply_chat_template", once_slow)
    assert format_prompt(tok, "q") == "<|bos|><|user|>q<|assistant|>" and not slow
    assert format_prompt(tok, "q2") == "<|bos|><|user|>q2<|assistant|>"


def test_a_chat_template_that_writes_too_much_is_refused():
    tok = demo_tokenizer()
    tok.chat_template = "{{ messages[-1]['content'] }}{{ 'x' * 70000 }}"
    with pytest.raises(TemplateError, match="characters"):
        format_prompt(tok, "q")
    tok.chat_template = "{{ messages[-1]['content'] }}"  # a long question is not the template's doing
    assert format_prompt(tok, "q" * 100_000) == "q" * 100_000


def test_an_edit_on_a_model_with_a_slow_template_fails_fast(monkeypatch):
    from grom import run_edit
    from grom.data import load_benchmark
    from grom.demo import load_demo_model

    model, tok = load_demo_model("full")
    tok = copy.deepcopy(tok)
    tok.chat_template = SLOW_TEMPLATE
    bench = load_benchmark("demo", "forget10")
    calls = count_renders(monkeypatch, tok)
    with pytest.raises(TemplateError):
        run_edit(model, tok, bench.forget[:30], bench.retain[:100], EditConfig(layers=(3, 4), batch_size=32))
    assert len(calls) == prompts.RENDER_TRIES  # not its 130 prompts: the first one's tries, then refused


def test_the_limits_leave_real_templates_alone(monkeypatch):
    tok = demo_tokenizer()
    monkeypatch.setattr(prompts, "FIRST_RENDER_SECONDS", 0.25)
    assert [format_prompt(tok, f"q{i}") for i in range(200)][-1] == "<|bos|><|user|>q199<|assistant|>"


# ---------------------------------------------------------------- 7: paths, NaN, infinity

def test_names_in_the_repository_answer_as_names_that_do_not_exist():
    for kind in ("model", "data"):
        for exists, missing in [("tests/conftest.py", "tests/nothere.py"), ("app.py", "nothere.py"),
                                ("tests", "nothere"), ("../tests/conftest.py", "../tests/nothere.py"),
                                (str(REPO_ROOT / "app.py"), str(REPO_ROOT / "nothere.py"))]:
            answers = []
            for name in (exists, missing):
                try:
                    answers.append(("ok", allowed_source(name, kind)))
                except UserError as err:
                    answers.append(("error", str(err).replace(name, "NAME")))
            assert answers[0][0] == answers[1][0]
            if answers[0][0] == "error":
                assert answers[0][1] == answers[1][1]
                assert str(REPO_ROOT) not in answers[0][1]


def test_messages_show_no_absolute_server_paths():
    for bad in ("", "/etc", "./nothere", "bad id!"):
        with pytest.raises(UserError) as err:
            allowed_source(bad, "model")
        assert str(REPO_ROOT) not in str(err.value) and "models/" in str(err.value)
    err = OSError(2, "No such file", str(REPO_ROOT / "models" / "x" / "config.json"))
    assert message_for(err).startswith("[Errno 2] No such file: 'models/x/config.json")
    assert scrub_paths(f"{REPO_ROOT}/.venv/lib/site.py and {REPO_ROOT}") == "<python>/lib/site.py and ."


@pytest.mark.parametrize("field", ["seed", "forget_budget", "retain_budget", "batch_size", "k"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_nan_and_infinity_in_the_widgets_get_a_message(field, value):
    with pytest.raises(UserError, match="whole number") as err:
        edit_config(widgets(**{field: value}), n_layers=6)
    assert message_for(err.value).strip()


@pytest.mark.parametrize("value", [NAN, INF, -1])
def test_nan_and_infinity_in_retain_examples_get_a_message(value):
    with pytest.raises(UserError, match="retain examples"):
        retain_subset(range(10), value, 0)


@pytest.mark.parametrize("field", ["beta", "w_r", "rho", "c"])
def test_nan_and_infinity_in_the_edit_values_are_out_of_range(field):
    for value in (NAN, INF, 1e38):
        with pytest.raises(UserError, match="out of range"):
            edit_config(widgets(**{field: value}), n_layers=6)


def test_the_edit_config_refuses_what_the_solve_cannot_use():
    for changes, message in [(dict(beta=INF), "finite"), (dict(beta=NAN), "finite"), (dict(rho=INF), "finite"),
                             (dict(w_r=NAN), "finite"), (dict(c=-INF), "finite"),
                             (dict(beta=1e38), "beta = 1e\\+38 is out of range: use 0 to 1e\\+06"),
                             (dict(w_r=1e300), "out of range"), (dict(c=1e300), "out of range"),
                             (dict(seed=2**64), "seed .* out of range"), (dict(seed=1.5), "whole number"),
                             (dict(layers=(100, 200, 10**9)), "layer numbers"), (dict(k=True), "a number")]:
        with pytest.raises(ValueError, match=message):
            EditConfig(**changes)
    assert EditConfig(beta=1e6).beta == 1e6 and math.isfinite(EditConfig().beta)


# ---------------------------------------------------------------- 8: the diagnostics' matrix

def test_the_diagnostics_take_any_kept_matrix_by_name():
    from types import SimpleNamespace

    names = ["model.layers.3.mlp.down_proj.weight", "model.layers.4.mlp.down_proj.weight"]
    edit = SimpleNamespace(keys=dict.fromkeys(names))
    assert _matrix(edit, "") == names[0] and _matrix(edit, names[1]) == names[1]
    assert _matrix(edit, "model.layers.4.mlp.down_proj") == names[1]
    with pytest.raises(UserError, match="use one of: model.layers.3.mlp.down_proj, model.layers.4"):
        _matrix(edit, "model.layers.9.mlp.down_proj")


# ---------------------------------------------------------------- through the API

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)

QUICK = dict(retain_examples=300)


@pytest.fixture(scope="module")
def client(url):  # noqa: F811
    c = Client(url, verbose=False)
    c.predict("demo", "auto", "auto", api_name="/load_model")
    c.predict("demo", "forget10", "", None, None, api_name="/load_benchmark")
    return c


def error_of(c, **kw) -> tuple[str, float]:
    start = time.perf_counter()
    with pytest.raises(Exception) as err:
        c.predict(**kw)
    return str(err.value), time.perf_counter() - start


@pytest.mark.parametrize("api", ["/run_edit", "/layer_scores"])
def test_a_huge_band_through_the_api_answers_at_once(client, api):
    message, seconds = error_of(client, band_mode="manual", band_text="0-10000000", api_name=api, **QUICK)
    assert "outside the model" in message and len(message) < 300 and seconds < 5


def test_a_huge_model_name_through_the_api_gets_a_short_message(client):
    message, _ = error_of(client, choice="a" * 100_000, device="cpu", dtype="float32", api_name="/load_model")
    assert "characters long" in message and len(message) < 300 and str(REPO_ROOT) not in message


def test_repository_files_are_not_told_apart_through_the_api(client):
    answers = [error_of(client, choice=name, device="cpu", dtype="float32", api_name="/load_model")[0]
               .replace(name, "NAME") for name in ("tests/conftest.py", "tests/nothere.py")]
    assert answers[0] == answers[1] and str(REPO_ROOT) not in answers[0]


def raw_error(c, url, api: str, **kw) -> str:  # noqa: F811
    """The error message of `api` called over plain HTTP in `c`'s session, with JSON's NaN
    and Infinity (which gradio_client cannot send, and a hostile script can)."""
    import json

    import httpx

    params = c.view_api(print_info=False, return_format="dict")["named_endpoints"][api]["parameters"]
    data = [kw.get(p["parameter_name"], p["parameter_default"]) for p in params]
    body = json.dumps({"data": data, "session_hash": c.session_hash}, allow_nan=True)
    base = url.rstrip("/") + "/gradio_api/call" + api
    event = httpx.post(base, content=body, headers={"Content-Type": "application/json"}).json()["event_id"]
    stream = httpx.get(f"{base}/{event}", timeout=60).text
    assert "event: error" in stream, stream[:500]
    return stream.split("event: error", 1)[1].split("data:", 1)[1].strip()


@pytest.mark.parametrize("field", ["seed", "forget_budget", "batch_size", "retain_examples"])
def test_nan_through_the_api_gets_a_message(client, url, field):  # noqa: F811
    message = raw_error(client, url, "/run_edit", **(QUICK | {field: NAN}))
    assert "whole number" in message and len(message) < 300


def test_beta_infinity_through_the_api_is_out_of_range(client, url):  # noqa: F811
    message = raw_error(client, url, "/run_edit", beta=INF, **QUICK)
    assert "out of range" in message


def test_pca_and_influence_take_an_edited_matrix_by_name(client, url):  # noqa: F811
    client.predict(band_mode="manual", band_text="3-4", api_name="/run_edit", **QUICK)
    for name in ("model.layers.4.mlp.down_proj.weight", "model.layers.4.mlp.down_proj"):
        _, note = client.predict(name, api_name="/pca")
        assert note.startswith("`model.layers.4.mlp.down_proj`")
        _, ranking, example = client.predict(name, api_name="/influence")
        assert "Rank 1" in example
    message, _ = error_of(client, param="model.layers.1.mlp.down_proj", api_name="/pca")
    assert "use one of: model.layers.3.mlp.down_proj, model.layers.4.mlp.down_proj" in message
    message, _ = error_of(client, param="nonsense", api_name="/influence")
    assert "use one of" in message
    assert "whole number" in raw_error(client, url, "/influence_example", rank=NAN)
