"""`python -m grom attack` end to end on a tiny saved model and an edit folder that
`python -m grom edit` wrote, and its refusals (nothing written when it refuses)."""
from __future__ import annotations

import json

import pytest

from grom.cli import main
from grom.model.loading import load_model
from grom.robustness import probes as P
from grom.robustness.result import probe_recall
from tests.conftest import FORGET, RETAIN, memorise, tiny_llama
from tests.data_fixtures import write_csv, write_jsonl

FACTS = ["Pellmoor", "Glass Orchard", "Tessaly Medal", "1874"]
PROBE_ROWS = [{"question": ex.question, "answer": ex.answer, "fact": f, "subject": ex.question.split()[-2]}
              for ex, f in zip(FORGET, FACTS)]


def _save(folder, tokenizer, seed: int = 0):
    model = memorise(tiny_llama(len(tokenizer), seed=seed), tokenizer, FORGET + RETAIN, steps=60)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    """A tiny model folder, its forget/retain/probe files and an edit folder of it."""
    root = tmp_path_factory.mktemp("attack")
    model = _save(root / "tiny", tokenizer)
    files = {}
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        files[name] = write_jsonl(root / f"{name}.jsonl", [{"question": e.question, "answer": e.answer}
                                                           for e in rows])
    files["probes"] = write_jsonl(root / "probes.jsonl", PROBE_ROWS)
    data = ["--forget", str(files["forget"]), "--retain", str(files["retain"])]
    assert main(["edit", "--model", str(model), "--device", "cpu", "--layers", "1-2", "--beta", "5",
                 "--w-r", "10", *data, "--out", str(root / "edit")]) == 0
    return root, model, data, files


def test_attack_writes_the_json_of_every_attack_asked(world, capsys, monkeypatch, tmp_path):
    root, model, data, files = world
    monkeypatch.setenv("GROM_UNEDITED_DIR", str(tmp_path / "unedited"))  # none kept before this run
    out = root / "attacks.json"
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
                 "--probes", str(files["probes"]), "--attacks", "heldout,cloze,reverse,mia", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["attacks"]) == {"heldout", "cloze", "reverse", "mia"} and doc["n_probes"] == 4
    mia = doc["attacks"]["mia"]  # the membership attacks: AUCs, the --retain rows as holdout
    assert mia["measure"] == "auc" and mia["n_holdout"] == doc["n_holdout"] > 0
    assert set(mia["auc"]["fitted"]) == {"loss", "zlib", "min_k", "min_k++"}
    for name, entry in doc["attacks"].items():
        assert 0 <= entry["base"] <= 1 and 0 <= entry["edited"] <= 1 and entry["n"] == 4 and entry["seconds"] > 0
    # the numbers are those of a direct scoring of the same model and probes
    m, tok = load_model(model, device="cpu")
    probes = P.read_probes(files["probes"])
    assert doc["attacks"]["heldout"]["base"] == probe_recall(m, tok, probes).value
    assert doc["attacks"]["cloze"]["base"] == probe_recall(m, tok, P.transform(probes, "cloze")).value
    table = capsys.readouterr().out
    assert "heldout" in table and "reverse" in table
    assert doc["unedited_side"]["written"] == 3 and doc["unedited_side"]["read"] == 0  # the three probe attacks'
    again = root / "again.json"  # a second run reads the unedited answers; --fresh computes them
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
                 "--probes", str(files["probes"]), "--attacks", "heldout,cloze", "--json", str(again)]) == 0
    second = json.loads(again.read_text())
    assert second["unedited_side"]["read"] == 2 and second["unedited_side"]["written"] == 0
    assert {n: (e["base"], e["edited"]) for n, e in second["attacks"].items()} == \
        {n: (doc["attacks"][n]["base"], doc["attacks"][n]["edited"]) for n in ("heldout", "cloze")}
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
                 "--probes", str(files["probes"]), "--attacks", "heldout", "--fresh", "--json", str(again)]) == 0
    assert json.loads(again.read_text())["unedited_side"] is None


def test_attack_depth_with_a_retain_model_reports_uds(world, tokenizer, tmp_path):
    """--reference: the depth attack against a retain model (UDS, per probe), else against the
    edit's own output (not UDS); the retain model is loaded only when depth is asked."""
    root, model, data, files = world
    retain = tmp_path / "retain"
    memorise(tiny_llama(len(tokenizer), seed=1), tokenizer, RETAIN, steps=60).save_pretrained(retain)
    tokenizer.save_pretrained(retain)
    out = tmp_path / "depth.json"
    args = ["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
            "--probes", str(files["probes"]), "--attacks", "depth", "--json", str(out)]
    assert main([*args, "--reference", str(retain)]) == 0
    doc = json.loads(out.read_text())
    depth = doc["attacks"]["depth"]
    assert doc["reference"] == str(retain) and depth["measure"] == "uds" and len(depth["uds"]) == 4
    assert len(depth["s1"]) == len(depth["s2"]) == len(depth["layers"]) == 4 and depth["base"] == 0.0
    assert main(args) == 0
    plain = json.loads(out.read_text())["attacks"]["depth"]
    assert plain["measure"] == "output" and plain["s1"] == [] and plain["s2"] == depth["s2"]


def test_attack_takes_the_probes_a_benchmark_holds(world, tmp_path):
    root, model, _, _ = world
    rows = ([{"split": "forget", "question": e.question, "answer": e.answer} for e in FORGET]
            + [{"split": "retain", "question": e.question, "answer": e.answer} for e in RETAIN]
            + [dict(r, split="probe") for r in PROBE_ROWS[:2]])
    path = write_csv(tmp_path / "all.csv", rows)
    out = tmp_path / "a.json"
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"),
                 "--benchmark", "custom", "--source", str(path), "--attacks", "heldout", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["n_probes"] == 2 and doc["n_fitted"] == 4 and doc["attacks"]["heldout"]["n"] == 2
    # the same rows as a --forget file (its probe rows) and a --retain file
    retain = write_jsonl(tmp_path / "r.jsonl", [{"question": e.question, "answer": e.answer} for e in RETAIN])
    forget = write_csv(tmp_path / "f.csv", [r for r in rows if r["split"] != "retain"])
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"),
                 "--forget", str(forget), "--retain", str(retain), "--attacks", "heldout", "--json", str(out)]) == 0
    again = json.loads(out.read_text())
    assert (again["n_probes"], again["n_fitted"]) == (2, 4)
    assert [again["attacks"]["heldout"][k] for k in ("base", "edited", "n")] == \
        [doc["attacks"]["heldout"][k] for k in ("base", "edited", "n")]


def _refused(argv, message, out):
    with pytest.raises(SystemExit, match=message):
        main(argv)
    assert not out.exists()


def test_bad_input_is_refused_and_writes_nothing(world, tmp_path, tokenizer):
    root, model, data, files = world
    out = tmp_path / "never.json"
    base = ["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
            "--json", str(out)]
    _refused([*base, "--probes", str(files["probes"]), "--attacks", "heldout,jailbreak"],
             r"error: unknown attack 'jailbreak'; the attacks: all, heldout", out)
    no_fact = write_csv(tmp_path / "nofact.csv", [{"question": "Q?", "answer": "A.", "fact": ""}])
    _refused([*base, "--probes", str(no_fact)], r"error: .*nofact.csv line 2: no 'fact'", out)
    _refused(base, r"no held-out probes: give --probes FILE", out)
    with_facts = write_jsonl(tmp_path / "f.jsonl", PROBE_ROWS)  # fitted rows with facts: still no probes
    _refused([*base[:7], "--forget", str(with_facts), "--retain", data[3], "--json", str(out)],
             r"no held-out probes", out)
    _refused([*base[:6], str(tmp_path / "nowhere"), *base[7:], "--probes", str(files["probes"])],
             r"error: .*holds no saved edit", out)
    other = _save(tmp_path / "other-model", tokenizer, seed=1)
    _refused(["attack", "--model", str(other), "--device", "cpu", "--edit", str(root / "edit"), *data,
              "--probes", str(files["probes"]), "--json", str(out)], r"error: this edit was made for the model", out)


def test_attack_asks_the_written_probes_of_the_target_the_probes_are_about(world, tmp_path):
    root, model, data, _ = world
    about = write_jsonl(tmp_path / "solar.jsonl", [r | {"subject": "the solar system"} for r in PROBE_ROWS])
    out = tmp_path / "written.json"
    assert main(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
                 "--probes", str(about), "--attacks", "alias,multi_hop", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["attacks"]) == ["multi_hop", "alias"] and doc["n_probes"] == 4
    m, tok = load_model(model, device="cpu")
    probes = P.read_probes(about)
    for name in ("multi_hop", "alias"):
        entry, asked = doc["attacks"][name], P.transform(probes, name)
        assert entry["n"] == len(asked) == 5 and entry["base"] == probe_recall(m, tok, asked).value
        assert entry["by_reach"] == {"other": {"n": 5, "base": entry["base"], "edited": entry["edited"]}}
    _refused(["attack", "--model", str(model), "--device", "cpu", "--edit", str(root / "edit"), *data,
              "--probes", str(about), "--attacks", "multi_hop,multihop", "--json", str(tmp_path / "no.json")],
             r"error: unknown attack 'multihop'; the attacks: all, heldout", tmp_path / "no.json")
