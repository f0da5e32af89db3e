"""Key positions (issue 47 item 1): where GROM takes its forget keys, the answer tokens (the
paper's), the subject's tokens, the last prompt token or every prompt token, the retain keys
to match; in the library, the CLI and the Edit form."""
from __future__ import annotations

import pytest
import torch

from grom import EditConfig, run_edit
from grom.closed_form.config import PRESETS, key_positions_of, keyed_at
from grom.closed_form.pipeline import prepare
from grom.data.encoding import KEY_POSITIONS, encode_example, fact_start, subject_positions
from grom.data.prompts import encode_qa
from grom.data.schema import QAExample
from tests.conftest import RETAIN, tiny_llama

EX = QAExample("Where was Zorvath Quill born?", "Zorvath Quill was born in Pellmoor.", fact="Pellmoor",
               subject="zorvath-quill")
FORGET = [EX, QAExample("What did Zorvath Quill write?", "He wrote The Glass Orchard.", fact="The Glass Orchard",
                        subject="zorvath-quill")]


def _fact_token(tokenizer) -> int:
    ids, start = encode_qa(tokenizer, EX.question, EX.answer)
    return ids[fact_start(tokenizer, EX.question, EX.answer, EX.fact, None, start)]


def test_each_mode_reads_its_positions_with_the_facts_token_as_gold(tokenizer):
    (qa,) = encode_example(tokenizer, EX, 0, mode="qa")
    last = qa.positions[0]  # the prompt's last token: it predicts the answer's first
    fact = _fact_token(tokenizer)
    assert tokenizer.decode([fact]).strip().startswith("P")  # "Pellmoor"'s first piece, not the answer's first word
    (lp,) = encode_example(tokenizer, EX, 0, mode="last_prompt")
    assert lp.positions == (last,) and lp.gold == (fact,)
    (pr,) = encode_example(tokenizer, EX, 0, mode="prompt")
    assert pr.positions == tuple(range(last + 1)) and set(pr.gold) == {fact}
    (sub,) = encode_example(tokenizer, EX, 0, mode="subject")
    assert tokenizer.decode([sub.input_ids[p] for p in sub.positions]).strip() == "Zorvath Quill"
    assert sub.positions == tuple(subject_positions(tokenizer, EX.question, EX.subject, None))
    (both,) = encode_example(tokenizer, EX, 0, mode="prompt_qa")
    assert both.positions == tuple(range(last)) + qa.positions  # every prompt and every answer position
    assert both.gold == (fact,) * last + qa.gold
    assert qa.input_ids == lp.input_ids == pr.input_ids == sub.input_ids == both.input_ids


def test_a_question_that_does_not_name_its_subject_keys_its_last_token(tokenizer):
    ex = QAExample("Where was he born?", "He was born in Pellmoor.", fact="Pellmoor", subject="zorvath-quill")
    (sub,) = encode_example(tokenizer, ex, 0, mode="subject")
    (lp,) = encode_example(tokenizer, ex, 0, mode="last_prompt")
    assert sub.positions == lp.positions and subject_positions(tokenizer, ex.question, ex.subject, None) == []
    no_fact = QAExample("Where was Zorvath Quill born?", "In Pellmoor.")  # no fact named: the answer's first token
    (enc,) = encode_example(tokenizer, no_fact, 0, mode="last_prompt")
    assert enc.gold[0] == encode_example(tokenizer, no_fact, 0, mode="qa")[0].gold[0]


def test_the_settings_name_each_pair_and_refuse_an_unknown_one():
    assert key_positions_of(EditConfig()) == "answer" and key_positions_of(EditConfig(key_mode="qa")) == "answer"
    for name, (forget, retain) in KEY_POSITIONS.items():
        config = keyed_at(EditConfig(beta=7.0), name)
        assert (config.key_mode, config.retain_key_mode, config.beta) == (forget, retain, 7.0)
        assert key_positions_of(config) == name
    assert key_positions_of(PRESETS["zsre"]) is None  # its subject_last keys are no user's pair
    with pytest.raises(ValueError, match="key positions 'middle' are unknown; use one of answer, subject"):
        keyed_at(EditConfig(), "middle")


@pytest.mark.parametrize("target", ["suppression", "refusal"])
@pytest.mark.parametrize("where", ["subject", "last_prompt", "prompt"])
def test_an_edit_keyed_in_the_prompt_moves_those_outputs(tokenizer, where, target):
    """Both targets take keys in the prompt: the forget side's count is the mode's, the retain
    side's every prompt and answer position; the model is returned as found."""
    model = tiny_llama(len(tokenizer))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = keyed_at(EditConfig(layers=(1,), beta=5.0, w_r=10.0, target=target), where)
    prep = prepare(tokenizer, FORGET, RETAIN, config, len(tokenizer))
    forget_keys = sum(len(b.rows) for b in prep.forget)
    expected = sum(len(encode_example(tokenizer, ex, i, mode=config.key_mode)[0].positions)
                   for i, ex in enumerate(FORGET))
    assert forget_keys == expected
    retain_keys = sum(len(b.rows) for b in prep.retain)
    assert retain_keys == sum(len(encode_example(tokenizer, ex, 0, mode="prompt_qa")[0].positions) for ex in RETAIN)
    edit = run_edit(model, tokenizer, FORGET, RETAIN, config)
    assert edit.layers[0].n_forget_keys == forget_keys and float(next(iter(edit.patches.values())).norm()) > 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_refusal_target_keeps_its_eos_key_only_after_the_answer(tokenizer):
    from grom.closed_form.refusal import encode_refusals

    qa = encode_refusals(tokenizer, FORGET, seed=0, mode="qa")
    prompt = encode_refusals(tokenizer, FORGET, seed=0, mode="prompt")
    eos = tokenizer.eos_token_id
    assert all(e.gold[-1] == eos for e in qa) and not any(eos in e.gold for e in prompt)
    assert all(len(set(e.gold)) == 1 for e in prompt)  # every prompt key toward the refusal's first token


def test_the_cli_sets_both_key_modes(tmp_path):
    from grom.cli import build_parser, config_from_args

    args = build_parser().parse_args(["edit", "--model", "m", "--out", "o", "--key-positions", "prompt"])
    config = config_from_args(args)
    assert (config.key_mode, config.retain_key_mode) == KEY_POSITIONS["prompt"]
    plain = config_from_args(build_parser().parse_args(["edit", "--model", "m", "--out", "o", "--preset", "zsre"]))
    assert plain.key_mode == "subject_last"  # no --key-positions: the preset's own


def test_the_form_box_sets_them_and_a_restore_reads_them_back():
    pytest.importorskip("gradio")
    from components.studio import form

    values = dict(zip(form.RESTORED, form.restore_values(EditConfig().to_dict(), {"band": [1]})))
    values = {name: values[name] for name in form.NAMES}
    assert values["key_positions"] == "answer"
    config = form.edit_config({**values, "key_positions": "last_prompt"}, n_layers=4)
    assert key_positions_of(config) == "last_prompt"
    again = dict(zip(form.RESTORED, form.restore_values(config.to_dict(), {"band": [1]})))
    assert again["key_positions"] == "last_prompt" and again["preset"] == form.CUSTOM
    zsre = dict(zip(form.PRESET_FILLED, form.preset_values("zsre")))
    assert zsre["key_positions"] == "answer"
    kept = form.edit_config({**values, **{k: zsre[k] for k in form.PRESET_FIELDS if zsre[k] is not None},
                             "preset": "zsre"}, n_layers=8)
    assert kept.key_mode == "subject_last"  # the box at "answer" leaves ZsRE's keys as they are
    with pytest.raises(Exception, match="key positions must be one of"):
        form.edit_config({**values, "key_positions": "everywhere"}, n_layers=4)


def test_the_prompt_keys_preset_fills_the_box_and_runs_as_stated():
    """smollm2-prompt (BENCHMARKS.md: fewer held-out facts left than smollm2 at its retain cost,
    more answers broken) is offered beside the default: choosing it puts "prompt" in the key
    positions box and the refusal target in its radio, and the form's config is the preset's."""
    pytest.importorskip("gradio")
    from components.studio import form

    preset = PRESETS["smollm2-prompt"]
    assert key_positions_of(preset) == "prompt" and preset.target == "refusal"
    assert key_positions_of(PRESETS["smollm2"]) == "answer"  # the default stays the paper's keys
    filled = dict(zip(form.PRESET_FILLED, form.preset_values("smollm2-prompt")))
    assert filled["key_positions"] == "prompt" and filled["target"] == "refusal"
    values = {name: filled.get(name) for name in form.NAMES}
    values.update(preset="smollm2-prompt", band_text="", seed=0, forget_budget=0, retain_budget=0, batch_size=32,
                  retain_examples=128)
    config = form.edit_config(values, n_layers=30)
    assert (config.key_mode, config.retain_key_mode, config.beta, config.target) == (
        preset.key_mode, preset.retain_key_mode, preset.beta, preset.target)
    assert form.matching_preset(values, hidden=form._hidden(config)) == "smollm2-prompt"


def test_a_prompt_cut_by_max_length_reads_its_gold_in_the_kept_ids(tokenizer):
    """A prompt longer than max_length loses its start and keeps one answer token (as the
    answer keys always did): the prompt keys are read in the kept ids, and the fact, cut off
    there, gives way to the answer's first token."""
    (full,) = encode_example(tokenizer, EX, 0, mode="prompt")
    answer_start = len(full.positions)  # every prompt token is a key
    (cut,) = encode_example(tokenizer, EX, 0, mode="prompt", max_length=answer_start - 1)
    assert cut.input_ids == full.input_ids[2:answer_start + 1]  # the prompt's first two tokens gone, one answer token
    assert cut.positions == tuple(range(answer_start - 2)) and set(cut.gold) == {full.input_ids[answer_start]}
    assert _fact_token(tokenizer) != full.input_ids[answer_start]  # the fact was not the answer's first token
