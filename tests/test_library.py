"""Key modes, dtypes, a model split over devices, diagnostics, loading and the CLI."""
import json

import pytest
import torch

from grom import EditConfig, example_influence_bruteforce, run_edit
from grom.closed_form.diagnostics import example_outputs, influence
from grom.data.encoding import encode_example
from grom.data.schema import FactRecord, TextExample
from grom.model.loading import ModelLoadError, load_model
from tests.conftest import FORGET, RETAIN, tiny_gpt2, tiny_llama


def test_qa_positions_predict_each_answer_token(tokenizer):
    (enc,) = encode_example(tokenizer, FORGET[0], 0)
    answer = tokenizer(FORGET[0].answer, add_special_tokens=False)["input_ids"]
    assert list(enc.gold) == answer
    assert [enc.input_ids[p + 1] for p in enc.positions] == answer
    prompt = tokenizer.decode(enc.input_ids[: enc.positions[0] + 1])
    assert prompt.startswith("<s><|user|>") and prompt.endswith("<|assistant|>")  # chat template


def test_plain_template_without_chat_template(plain_tokenizer):
    (enc,) = encode_example(plain_tokenizer, FORGET[0], 0)
    prompt = plain_tokenizer.decode(enc.input_ids[: enc.positions[0] + 1])
    assert prompt == "Question: Where was Zorvath Quill born?\nAnswer: "


def test_corpus_mode_windows_cover_every_position(tokenizer):
    text = TextExample(" ".join(e.answer for e in FORGET))
    encs = encode_example(tokenizer, text, 3, max_length=16)
    ids = tokenizer(text.text)["input_ids"]
    assert all(e.example == 3 and len(e.input_ids) <= 16 for e in encs)
    assert sum(len(e.positions) for e in encs) == len(ids) - 1  # each next token predicted once
    assert [g for e in encs for g in e.gold] == ids[1:]


def test_subject_last_key_is_the_subjects_last_token(tokenizer):
    rec = FactRecord(subject="Zorvath Quill", prompt="Where was Zorvath Quill born?", answer="Pellmoor")
    (enc,) = encode_example(tokenizer, rec, 0)
    (pos,) = enc.positions
    assert tokenizer.decode(enc.input_ids[: pos + 1]).endswith("Zorvath Quill")
    assert enc.gold[0] == tokenizer(" Pellmoor", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(ValueError, match="does not occur"):
        encode_example(tokenizer, FactRecord("Nobody", "Where was X born?", "Y"), 0)


def test_subject_last_head_edit(tokenizer):
    model = tiny_llama(len(tokenizer))
    facts = [FactRecord(e.question.split(" was ")[-1].rstrip("?").replace(" born", ""), e.question, "Z")
             for e in FORGET[:1]]
    edit = run_edit(model, tokenizer, facts, RETAIN, EditConfig(matrix="lm_head", key_mode="subject_last",
                                                                beta=5.0, w_r=10.0))
    assert edit.layers[0].n_forget_keys == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models(tokenizer, dtype):
    model = tiny_llama(len(tokenizer)).to(dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1, 2), beta=5.0, w_r=10.0))
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in edit.patches.values())
    with edit.applied(model):
        pass
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_model_split_over_two_device_entries(tokenizer):
    """A model dispatched with accelerate's device hooks (layers assigned device by device;
    here all entries are the CPU, the only device at hand) edits as the plain model does."""
    from accelerate import dispatch_model

    model = tiny_llama(len(tokenizer))
    config = EditConfig(layers=(1, 2), beta=5.0, w_r=10.0)
    single = run_edit(model, tokenizer, FORGET, RETAIN, config)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "cpu", "model.layers.2": "cpu", "model.layers.3": "cpu",
                  "model.norm": "cpu", "lm_head": "cpu"}
    split = dispatch_model(tiny_llama(len(tokenizer)), device_map=device_map, main_device="cpu",
                           force_hooks=True)
    assert hasattr(split.model.layers[1], "_hf_hook")  # accelerate moves inputs layer by layer
    edit = run_edit(split, tokenizer, FORGET, RETAIN, config)
    for name, P in single.patches.items():
        torch.testing.assert_close(edit.patches[name], P)


def test_diagnostics_influence_matches_bruteforce_and_outputs(tokenizer):
    model = tiny_gpt2(len(tokenizer))
    edit = run_edit(model, tokenizer, FORGET, RETAIN, EditConfig(layers=(1,), beta=5.0, w_r=10.0, keep_keys=True))
    name = "transformer.h.1.mlp.c_proj.weight"
    k = edit.keys[name]
    fast = influence(edit, name)
    slow = example_influence_bruteforce(k.Xf, k.Xr, k.directions, k.forget_example, w_r=10.0, rho=0.03)
    assert fast.shape == (len(FORGET),)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-9)
    out = example_outputs(edit, model, name)
    assert out.forget_before.shape == (len(FORGET), 32) and out.retain_after.shape == (len(RETAIN), 32)
    f_move = (out.forget_after - out.forget_before).norm(dim=1).mean()
    r_move = (out.retain_after - out.retain_before).norm(dim=1).mean()
    assert f_move > r_move


def save_tiny(tmp_path, tokenizer):
    folder = tmp_path / "tiny"
    tiny_llama(len(tokenizer)).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def test_load_model_from_local_folder_and_errors(tmp_path, tokenizer):
    model, tok = load_model(save_tiny(tmp_path, tokenizer))
    assert model.config.model_type == "llama" and not model.training
    with pytest.raises(ModelLoadError, match="local folder"):
        load_model(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model(tmp_path / "tiny", dtype="int3")


def test_cli_edit_and_scores(tmp_path, tokenizer, capsys):
    from grom.cli import main
    from grom.edit import Edit

    folder = save_tiny(tmp_path, tokenizer)
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"question": e.question, "answer": e.answer}) for e in rows))
    files = ["--forget", str(tmp_path / "forget.jsonl"), "--retain", str(tmp_path / "retain.jsonl")]
    assert main(["scores", "--model", str(folder), "--device", "cpu", "-k", "2", *files]) == 0
    assert "band (k=2)" in capsys.readouterr().out
    out = tmp_path / "edit"
    assert main(["edit", "--model", str(folder), "--device", "cpu", "--layers", "1-2", "--beta", "5",
                 "--w-r", "10", *files, "--out", str(out)]) == 0
    edit = Edit.load(out)
    assert edit.band == [1, 2] and edit.settings.beta == 5.0
