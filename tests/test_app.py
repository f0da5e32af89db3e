"""GROM Studio through its API, as a script would drive it: a locally launched app and
`gradio_client`. The demo pipeline, two sessions at once with different edits (the base
weights bit-identical afterwards), and every bad input answered with an error while the
app keeps serving.

Runs on a CPU with the bundled demo model; the edits use a few hundred retain examples
and the comparisons a few examples per set, to stay quick.
"""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from components import edit_panel  # noqa: E402
from components.server.session import REGISTRY  # noqa: E402
from tests.app_fixtures import url  # noqa: E402,F401  (the fixture)
from tests.conftest import weights_hash  # noqa: E402

QUICK = dict(retain_examples=300)  # a seeded sample of the retain set gives the keys


def new_client(url) -> Client:
    c = Client(url, verbose=False)
    c.predict("demo", "auto", "auto", api_name="/load_model")
    c.predict("demo", "forget10", "", None, None, api_name="/load_benchmark")
    return c


def headers_and_rows(frame: dict) -> tuple[list, list]:
    return frame["headers"], frame["data"]


def test_the_demo_pipeline_through_the_api(url, tmp_path):
    c = Client(url, verbose=False)
    status, summary, _ = c.predict("demo", "auto", "auto", api_name="/load_model")
    assert "6 layers" in status and "LlamaForCausalLM" in summary
    info, forget_df, retain_df, preset = c.predict("demo", "forget10", "", None, None,
                                                   api_name="/load_benchmark")
    assert "400 forget" in info and preset == "demo" and "Where was" in forget_df

    plot, band = c.predict(k=3, band_mode="suggested", api_name="/layer_scores", **QUICK)
    assert plot["type"] == "plotly" and "Band (suggested for k = 3)" in band
    assert len(json.loads(plot["plot"])["data"][0]["y"]) == 6  # S_l for every layer

    summary, table, norms = c.predict(api_name="/run_edit", **QUICK)
    assert "Edited" in summary and "layers 3, 4, 5" in summary
    assert len(table["data"]) == 3 and norms["type"] == "plotly"

    text, metrics, forget_html, retain_html = c.predict(max_examples=8, api_name="/compare")
    heads, rows = headers_and_rows(metrics)
    assert heads[:4] == ["metric", "Base", "Edited", "Retain model"] and rows[0][0] == "Final score"
    forget_prob = next(r for r in rows if r[0] == "Forget prob")
    assert float(forget_prob[2]) < float(forget_prob[1])  # the edit lowered p(forget answer)
    assert "Final score" in text and 'class="w-del"' in forget_html and "gen-table" in retain_html
    # compared again: the layers below the band (0-2) are replayed, the numbers are the same
    from components.server.session import REGISTRY

    prefix = REGISTRY.current.prefix_cache  # the demo, just loaded
    hits = prefix.hits
    _, again, again_forget, _ = c.predict(max_examples=8, api_name="/compare")
    assert prefix.hits > hits and again == metrics and again_forget == forget_html

    asked = c.predict("Where was Sina Cheithnu born?", api_name="/generate")
    assert "before the edit" in asked and "after the edit" in asked

    pca, note = c.predict("", api_name="/pca")
    traces = json.loads(pca["plot"])["data"]
    assert {t["name"] for t in traces} >= {"forget, before", "forget, after", "retain, before", "retain, after"}
    assert "**forget** outputs by" in note and "‖P‖/‖W‖" in note  # each set's share moved, in words
    assert "movement direction 1" in json.loads(pca["plot"])["layout"]["xaxis"]["title"]["text"]

    bars, ranking, example = c.predict("", api_name="/influence")
    assert bars["type"] == "plotly" and ranking["data"][0][0] == 1 and "Rank 1" in example
    example3, _ = c.predict(3, api_name="/influence_example")
    assert "Rank 3" in example3

    sweep, points, _ = c.predict("beta", "75, 150", api_name="/sweep")
    assert [row[0] for row in points["data"]] == ["base (no edit)", "β 75", "β 150"] and sweep["type"] == "plotly"
    p_forget = [row[1] for row in points["data"]]
    assert p_forget[0] > p_forget[-1]  # a stronger edit forgets more than none

    quant, qnote = c.predict(max_examples=5, api_name="/quantization")
    assert quant["headers"] == ["metric", "Base", "Base 4-bit", "Edited", "Edited 4-bit"]
    metrics = [row[0] for row in quant["data"]]
    assert "Forget ROUGE-L" in metrics and "Retain ROUGE-L" in metrics  # forgotten, and kept?
    assert "survives 4-bit quantization" in qnote and "4-bit: round-to-nearest" in qnote

    files, note, code = c.predict(api_name="/export")
    names = sorted(Path(f).name for f in files)
    # after the comparison of this edit, its OpenUnlearning log too (tests/test_openunlearning_format.py)
    assert names[-2:] == ["edit.json", "patch.safetensors"] and "Edit.load" in code
    assert names[:-2] in ([], ["TOFU_EVAL.json", "TOFU_SUMMARY.json"])
    folder = tmp_path / "grom-edit"
    folder.mkdir()
    for f in files:
        shutil.copy(f, folder / Path(f).name)
    from grom import Edit

    loaded = Edit.load(folder)
    assert loaded.band == [3, 4, 5] and loaded.settings.beta == 150.0

    status, table, _ = c.predict(api_name="/reset")
    assert "dropped" in status
    with pytest.raises(Exception, match="no edit yet"):
        c.predict(max_examples=5, api_name="/compare")


def test_two_sessions_with_different_edits_at_once(url):
    a, b = new_client(url), new_client(url)
    model = REGISTRY.current.model
    before = weights_hash(model)
    jobs = {"a": dict(band_mode="manual", band_text="3-5", beta=150.0),
            "b": dict(band_mode="manual", band_text="4", beta=40.0, w_r=10.0)}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit((a if name == "a" else b).predict, api_name="/run_edit",
                                     **QUICK, **kw) for name, kw in jobs.items()}
        edits = {name: f.result(timeout=300) for name, f in futures.items()}
    assert "layers 3, 4, 5" in edits["a"][0] and "layers 4 " in edits["b"][0]
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(a.predict, max_examples=6, api_name="/compare")
        fb = pool.submit(b.predict, max_examples=6, api_name="/compare")
        ra, rb = fa.result(timeout=300), fb.result(timeout=300)
    prob = lambda r: next(row for row in r[1]["data"] if row[0] == "Forget prob")  # noqa: E731
    assert prob(ra)[1] == prob(rb)[1]  # the same base model...
    assert prob(ra)[2] != prob(rb)[2]  # ...and each session's own edit
    exported = {}
    for name, client in (("a", a), ("b", b)):
        files, _, _ = client.predict(api_name="/export")
        meta = json.loads(Path(next(f for f in files if f.endswith("edit.json"))).read_text())
        exported[name] = (meta["settings"]["layers"], meta["settings"]["beta"])
    assert exported == {"a": ([3, 4, 5], 150.0), "b": ([4], 40.0)}
    assert weights_hash(model) == before  # never left edited


def test_sessions_on_different_models_keep_working_and_an_unloaded_one_is_told(url, monkeypatch):
    """Issue 12, item 3: another session's model no longer breaks this one (two stay
    loaded); beyond GROM_RESIDENT_MODELS the least recently used visitor's model goes (the
    start model never: issue 36, tests/test_space_models.py), and its session is told to
    load it again, its edit kept."""
    from components.server.errors import REPO_ROOT

    a, b = new_client(url), new_client(url)
    a.predict("demo-retain", "cpu", "float32", api_name="/load_model")  # a visitor's model, not the start one
    a.predict(api_name="/run_edit", **QUICK)
    status, _, _ = b.predict("demo-retain", "cpu", "bfloat16", api_name="/load_model")
    assert "`assets/demo-retain`" in status and str(REPO_ROOT) not in status  # no server path
    text, *_ = a.predict(max_examples=5, api_name="/compare")  # a's model is still loaded
    assert "Final score" in text
    monkeypatch.setenv("GROM_RESIDENT_MODELS", "1")
    b.predict("demo", "cpu", "bfloat16", api_name="/load_model")  # one kept beside the start model: both demo-retain go
    try:
        with pytest.raises(Exception, match="was unloaded to make room"):
            a.predict(max_examples=5, api_name="/compare")
    finally:
        monkeypatch.delenv("GROM_RESIDENT_MODELS")
        a.predict("demo-retain", "cpu", "float32", api_name="/load_model")
    text, *_ = a.predict(max_examples=5, api_name="/compare")  # the session kept its edit
    assert "Final score" in text


def demo_upload(path, n_forget: int, n_retain: int):
    """(the demo benchmark, `path`): a user's JSONL file with a split column, holding the
    first `n_forget` forget and `n_retain` retain examples of demo/forget01."""
    from grom.data import load_benchmark

    demo = load_benchmark("demo", "forget01")
    rows = [{"question": ex.question, "answer": ex.answer, "split": "forget"} for ex in demo.forget[:n_forget]]
    rows += [{"question": ex.question, "answer": ex.answer, "split": "retain"} for ex in demo.retain[:n_retain]]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return demo, path


def test_an_uploaded_benchmark(url, tmp_path):
    """A user's own file with a split column: load it, edit, compare."""
    demo, upload = demo_upload(tmp_path / "mine.jsonl", 8, 24)
    c = new_client(url)
    info, forget_html, _, preset = c.predict("custom", "forget", "", handle_file(str(upload)), None,
                                             api_name="/load_benchmark")
    # the demo model's own preset for data of its kind (a preset tuned on another model is not offered)
    assert "8 forget and 24 retain" in info and preset == "demo" and demo.forget[0].question in forget_html
    summary, _, _ = c.predict(preset="(custom)", beta=150.0, beta_relative=True, api_name="/run_edit")
    assert "Edited" in summary
    text, metrics, _, _ = c.predict(max_examples=8, api_name="/compare")
    rows = {r[0]: r for r in metrics["data"]}
    assert float(rows["Forget ROUGE-L"][2]) < float(rows["Forget ROUGE-L"][1])


def test_too_small_an_uploaded_retain_set_is_warned_with_the_number_that_is_enough(url, tmp_path):
    """3 retain examples for 8 forget ones: the edit runs, and the benchmark line says to
    upload at least 20 (as many as the forget set, and at least 20)."""
    _, upload = demo_upload(tmp_path / "small.jsonl", 8, 3)
    c = new_client(url)
    info, *_ = c.predict("custom", "forget", "", handle_file(str(upload)), None, api_name="/load_benchmark")
    assert "Only 3 retain examples" in info and "Upload at least 20" in info
    summary, _, _ = c.predict(preset="(custom)", beta=150.0, beta_relative=True, api_name="/run_edit")
    assert "Data: **custom/forget**, 8 forget and 3 retain" in summary  # what the edit used


def test_bad_inputs_give_errors_and_the_app_keeps_serving(url, tmp_path, monkeypatch):
    c = new_client(url)
    model = REGISTRY.current.model
    before = weights_hash(model)
    c.predict(api_name="/run_edit", **QUICK)

    def fails(match, **kw):
        with pytest.raises(Exception, match=match):
            c.predict(**kw)

    # models: no network / unknown id, a path outside the allowed folders, an unsupported family
    fails("(?i)cannot be reached|could not load", choice="no-such-org/no-such-model", device="cpu",
          dtype="float32", api_name="/load_model")
    fails("outside the folders", choice="/etc", device="cpu", dtype="float32", api_name="/load_model")
    monkeypatch.setenv("GROM_MODELS_DIR", str(tmp_path))
    make_unsupported_model(tmp_path / "tiny-opt")
    fails("(?i)supported", choice="tiny-opt", device="cpu", dtype="float32", api_name="/load_model")
    fails("(?i)float8|dtype", choice="demo", device="cpu", dtype="float8", api_name="/load_model")
    # uploads: empty, malformed, no retain set
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    fails("empty", name="custom", split="forget", source="", forget_file=handle_file(str(empty)),
          retain_file=None, api_name="/load_benchmark")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"\n')
    fails("^bad.jsonl line 1", name="custom", split="forget", source="", forget_file=handle_file(str(bad)),
          retain_file=None, api_name="/load_benchmark")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("title,body\na,b\n")
    fails("expected 'question' and 'answer'", name="custom", split="forget", source="",
          forget_file=handle_file(str(wrong)), retain_file=handle_file(str(wrong)),
          api_name="/load_benchmark")
    fails("no 'split' column", name="custom", split="forget", source="",
          forget_file=handle_file(str(wrong)), retain_file=None, api_name="/load_benchmark")
    fails("(?i)local folder|cannot be reached|could not reach", name="tofu", split="forget10",
          source="", forget_file=None, retain_file=None, api_name="/load_benchmark")
    # edit settings: a band outside the model, values out of range, a malformed band
    fails("outside the model", band_mode="manual", band_text="11-15", api_name="/run_edit", **QUICK)
    fails("out of range", beta=-5.0, api_name="/run_edit", **QUICK)
    fails("out of range", rho=0.0, api_name="/run_edit", **QUICK)
    fails("write layers as", band_mode="manual", band_text="three", api_name="/run_edit", **QUICK)
    fails("(?i)band width|maximum value", k=40, band_mode="suggested", api_name="/run_edit", **QUICK)
    # running out of memory
    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(edit_panel, "compute_edit", oom)
    fails("Out of memory", api_name="/run_edit", **QUICK)
    monkeypatch.undo()
    # the session kept its model, benchmark and edit, and the app still serves
    text, metrics, _, _ = c.predict(max_examples=5, api_name="/compare")
    assert "Final score" in text
    summary, _, _ = c.predict(api_name="/run_edit", **QUICK)
    assert "Edited" in summary
    assert weights_hash(model) == before


def make_unsupported_model(folder: Path) -> None:
    """A tiny OPT (a causal LM family GROM does not support), with the demo's tokenizer."""
    from transformers import OPTConfig, OPTForCausalLM

    from grom.demo import demo_model_dir

    cfg = OPTConfig(vocab_size=1024, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=16)
    OPTForCausalLM(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir("full") / name, folder / name)


def test_the_demo_preset_keeps_its_retain_set_on_the_page_s_boxes(url):
    """Issue 49, item 6: the demo model, the demo benchmark's default split (forget10) and Run
    edit with every box as the page sets it (the demo preset's values and its 1600 retain
    examples: a page opened on SmolLM2 gets the same once the demo is loaded,
    tests/test_app_form_follows.py), compared on 50 examples a set as the SmolLM2 page's
    Compare box has it: the retain set holds (retain cost 0.04: one retain metric lost 4%).
    With SmolLM2's 128 retain examples left in the box the same edit lost 34% ("The retain set
    broke"), as the library's path never did."""
    c = new_client(url)
    summary, _, _ = c.predict(api_name="/run_edit")  # every field at the page's value
    assert "Data: **demo/forget10**, 400 forget and 1600 retain examples" in summary, summary
    _, metrics, _, _ = c.predict(max_examples=50, api_name="/compare")
    rows = {r[0]: r for r in metrics["data"]}
    cost = float(rows["Retain cost"][2])
    assert 0.02 <= cost <= 0.06 and float(rows["Retain broken"][2]) == 0, (cost, rows["Retain broken"])
