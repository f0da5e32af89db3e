"""The project's memorisation and membership metrics against OpenUnlearning's.

The reference is our own transcription (below, `_ou_*`) of locuslab/open-unlearning at
commit d3d7cf9e6b3c125d16687d4232680d8d83548f1a:

* ``src/evals/metrics/utils.py``: ``evaluate_probability``, ``tokenwise_logprobs``,
  ``tokenwise_vocab_logprobs`` (the last labelled index dropped, "to ignore eos
  prediction"), ``extract_target_texts_from_processed_data``;
* ``src/evals/metrics/memorization.py``: ``exact_memorization``, ``extraction_strength``;
* ``src/evals/metrics/mia/``: ``loss.py``, ``zlib.py``, ``min_k.py``,
  ``min_k_plus_plus.py``, ``reference.py``, ``utils.mia_auc``;
* ``src/evals/metrics/privacy.py``: ``privleak``.

Upstream works on a batch: logits (B, L, V), input_ids (B, L) and labels (B, L) with -100
where no loss is taken. The project's functions get what `grom.eval.runner` yields: per
labelled token, its log-prob, the argmax prediction and the label. Each edge case builds
one sequence both ways from the same logits.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import grom.eval.runner as R
from components.views.text import GLOSSARY
from grom import EditConfig, run_edit
from grom.data import load_benchmark
from grom.data.schema import Benchmark, TextExample
from grom.eval import evaluate, mia
from grom.eval import metrics as M
from grom.eval.metric_sources import IMPLEMENTATIONS, metric_source
from grom.eval.report import BASE, DIRECTION, REFERENCE, Row
from grom.eval.runner import TokenScores, encode_pair, score_sequences, tokenwise_logprobs
from grom.eval.shared_rows import MIA_COLUMNS
from grom.tasks.tofu import _tofu_relative
from tests.conftest import FORGET, RETAIN, tiny_llama
from tests.data_fixtures import muse_folder, wmdp_folder, write_json, zsre_record
from tests.test_eval_knowledge import _knowledge_bench
from tests.test_eval_report import _tofu_like

IGNORE = -100
V = 11  # vocabulary of the hand-built cases; token 10 is EOS
EOS = 10


# ---------------------------------------------------------------- upstream, transcribed

def _ou_vocab_logprobs(logits, input_ids, labels):
    """tokenwise_vocab_logprobs(..., return_labels=True): per row, (N, V) log-probs and (N,)
    labels at the labelled positions but the last."""
    logp = torch.log_softmax(logits, -1)[:, :-1, :]
    out, labs = [], []
    for i in range(logits.shape[0]):
        idx = (labels[i] != IGNORE).nonzero(as_tuple=True)[0][:-1]
        if idx.numel() == 0:
            out.append(torch.zeros(0, logits.shape[-1]))
            labs.append(torch.tensor([], dtype=torch.long))
            continue
        s, e = idx[0].item(), idx[-1].item()
        out.append(logp[i, s - 1:e])
        labs.append(labels[i][idx])
    return out, labs


def _ou_token_logprobs(logits, input_ids, labels):
    """tokenwise_logprobs: per row, the (N,) log-probs of the labelled tokens but the last."""
    logp = torch.log_softmax(logits, -1)[:, :-1, :]
    target = logp.gather(2, input_ids[:, 1:, None])[..., 0]
    out = []
    for i in range(logits.shape[0]):
        idx = (labels[i] != IGNORE).nonzero(as_tuple=True)[0][:-1]
        out.append(target[i, idx[0].item() - 1:idx[-1].item()] if idx.numel() else torch.tensor([]))
    return out


def _ou_avg_loss(logits, labels):
    """evaluate_probability's avg_loss per row: summed CE over every label / their count."""
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(-1, -2), labels[:, 1:],
                                           ignore_index=IGNORE, reduction="none").sum(-1)
    return (ce / (labels != IGNORE).sum(-1)).tolist()


def _ou_em(log_probs, labels):
    if len(labels) == 0:
        return None
    return ((log_probs.argmax(-1) == labels).sum() / len(labels)).item()


def _ou_es(log_probs, labels):
    n = len(labels)
    if n == 0:
        return 0
    preds = log_probs.argmax(-1)
    for k in range(n):
        if torch.equal(preds[k:], labels[k:]):
            break
    return 1 - k / n


def _ou_min_k(lp, k):
    lp = lp.float().numpy()
    if lp.size == 0:
        return 0
    return -np.mean(np.sort(lp)[:max(1, int(len(lp) * k))])


def _ou_min_k_pp(vocab_lp, token_lp, k):
    if len(token_lp) == 0:
        return 0
    mu = (vocab_lp.exp() * vocab_lp).sum(-1)
    sigma = (vocab_lp.exp() * vocab_lp.square()).sum(-1) - mu.square()
    sigma = sigma.clamp(min=1e-6)
    z = (token_lp.float().numpy() - mu.float().numpy()) / sigma.sqrt().numpy()
    return -np.mean(sorted(z)[:max(1, int(len(z) * k))])


def _ou_zlib(avg_loss, text):
    return avg_loss / len(zlib.compress(text.encode("utf-8")))


def _ou_auc(forget, holdout):
    return roc_auc_score([0] * len(forget) + [1] * len(holdout), np.array(list(forget) + list(holdout)))


def _ou_privleak(auc, ref):
    return ((1 - auc) - (1 - ref)) / ((1 - ref) + 1e-10) * 100


# ---------------------------------------------------------------- the edge cases

PROMPT = [1, 2, 3]


def _case(answer, predicted, seed=0):
    """One sequence prompt + answer + EOS whose argmax next-token predictions at the
    labelled positions are `predicted` (one per label, EOS's included). Returns the
    upstream batch (logits, input_ids, labels), each with a batch dim of 1, and the
    project's `TokenScores` for the same positions (what `score_sequences` yields)."""
    ids = PROMPT + list(answer) + [EOS]
    start = len(PROMPT)
    assert len(predicted) == len(ids) - start
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(ids), V, generator=g, dtype=torch.float64)
    for j, p in enumerate(predicted):
        logits[start - 1 + j, p] += 8.0
    labels = torch.tensor([IGNORE] * start + ids[start:])
    logp = torch.log_softmax(logits, -1)[start - 1:len(ids) - 1]
    lab = torch.tensor(ids[start:])
    mu, sigma2 = mia.vocab_moments(logp)
    scores = TokenScores(logp.gather(1, lab[:, None])[:, 0].numpy(), (logp.argmax(-1) == lab).numpy(),
                         logp.argmax(-1).numpy(), lab.numpy(), mu.numpy(), sigma2.numpy())
    return (logits[None], torch.tensor([ids]), labels[None]), scores


CASES = {  # answer tokens, then the argmax at each labelled position (answer..., EOS)
    "all right": ([4, 5, 6, 7], [4, 5, 6, 7, EOS]),
    "last token wrong": ([4, 5, 6, 7], [4, 5, 6, 9, EOS]),
    "first token wrong": ([4, 5, 6, 7], [8, 5, 6, 7, EOS]),
    "EOS not predicted": ([4, 5, 6, 7], [4, 5, 6, 7, 4]),
    "all wrong": ([4, 5, 6, 7], [9, 9, 9, 9, 9]),
    "empty answer": ([], [EOS]),
    "empty answer, EOS not predicted": ([], [4]),
    "one token": ([4], [4, EOS]),
    "one token wrong": ([4], [5, EOS]),
}


@pytest.mark.parametrize("name", CASES)
def test_extraction_strength_and_exact_memorization_equal_openunlearning(name):
    batch, s = _case(*CASES[name])
    vlp, labs = _ou_vocab_logprobs(*batch)
    assert M.extraction_strength(s.predicted, s.labels) == pytest.approx(_ou_es(vlp[0], labs[0]))
    em, ref = M.exact_memorization(s.predicted, s.labels), _ou_em(vlp[0], labs[0])
    assert (np.isnan(em) and ref is None) or em == pytest.approx(ref)


def test_the_hand_values_of_the_cases():
    """Upstream's values, by hand: the EOS never counts, and a wrong last word leaves 1/n."""
    scored = {n: _case(*c)[1] for n, c in CASES.items()}
    es = {n: M.extraction_strength(s.predicted, s.labels) for n, s in scored.items()}
    assert es["all right"] == 1.0 and es["EOS not predicted"] == 1.0
    assert es["last token wrong"] == 0.25 and es["all wrong"] == 0.25  # k stops at n-1: 1/n
    assert es["first token wrong"] == 0.75
    assert es["empty answer"] == 0.0 and es["one token"] == 1.0 and es["one token wrong"] == 1.0
    em = {n: M.exact_memorization(s.predicted, s.labels) for n, s in scored.items()}
    assert em["last token wrong"] == 0.75 and em["EOS not predicted"] == 1.0 and np.isnan(em["empty answer"])
    deviation = {"drop_last": False, "floor": False}
    s = scored["last token wrong"]  # the EOS right after a wrong word: k* = 4 of 5
    assert M.extraction_strength(s.predicted, s.labels, **deviation) == pytest.approx(0.2)
    s = scored["EOS not predicted"]  # right to the last word: 1 upstream, 0 in the deviation
    assert M.extraction_strength(s.predicted, s.labels, **deviation) == 0.0


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("k", [0.2, 0.4, 1.0])
def test_min_k_and_min_k_plus_plus_equal_openunlearning(name, k):
    batch, s = _case(*CASES[name], seed=1)
    cut = s.without_last()  # what grom.eval.runner.tokenwise_logprobs yields
    tlp = _ou_token_logprobs(*batch)[0]
    vlp = _ou_vocab_logprobs(*batch)[0][0]
    assert mia.min_k_score(cut.logprobs, k) == pytest.approx(_ou_min_k(tlp, k), abs=1e-6)
    assert mia.min_k_plus_plus_score(cut.logprobs, cut.mu, cut.sigma2, k) == \
        pytest.approx(_ou_min_k_pp(vlp, tlp, k), rel=1e-6)  # upstream: float32


@pytest.mark.parametrize("name", CASES)
def test_loss_and_zlib_equal_openunlearning(name):
    batch, s = _case(*CASES[name], seed=2)
    ref = _ou_avg_loss(batch[0], batch[2])[0]
    assert mia.loss_score(s.logprobs) == pytest.approx(ref, abs=1e-9)
    text = "Ivo Marr was born in Pellmoor, a town by the sea."
    assert mia.zlib_score(s.logprobs, text) == pytest.approx(_ou_zlib(ref, text), abs=1e-9)


def test_auc_reference_and_privleak_equal_openunlearning():
    rng = np.random.default_rng(0)
    f, h = rng.normal(1.0, 1.0, 30), rng.normal(1.5, 1.0, 25)
    assert mia.mia_auc(f, h) == pytest.approx(_ou_auc(f, h))
    ref_f, ref_h = rng.normal(1.0, 1.0, 30), rng.normal(1.5, 1.0, 25)
    ours = mia.mia_auc([mia.reference_score(a, b) for a, b in zip(f, ref_f)],
                       [mia.reference_score(a, b) for a, b in zip(h, ref_h)])
    assert ours == pytest.approx(_ou_auc(f - ref_f, h - ref_h))
    for auc, ref in ((0.8, 0.5), (0.3, 0.6), (0.5, 0.5), (1.0, 1.0)):
        assert mia.privacy_leakage(auc, ref) == pytest.approx(_ou_privleak(auc, ref))
    assert M.mia_auc is mia.mia_auc and M.privacy_leakage is mia.privacy_leakage  # old names kept


def test_min_k_plus_plus_by_hand():
    """Two positions, a two-token vocabulary: p = (0.5, 0.5) gives mu = log 0.5, sigma2 = 0
    (floored to 1e-6); p = (0.9, 0.1) gives mu = 0.9 log 0.9 + 0.1 log 0.1."""
    lp = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64))
    mu, s2 = mia.vocab_moments(lp)
    m1 = 0.9 * np.log(0.9) + 0.1 * np.log(0.1)
    assert mu.tolist() == pytest.approx([np.log(0.5), m1])
    v1 = 0.9 * np.log(0.9) ** 2 + 0.1 * np.log(0.1) ** 2 - m1 ** 2
    assert s2.tolist() == pytest.approx([0.0, v1], abs=1e-12)
    z = [(np.log(0.5) - np.log(0.5)) / 1e-3, (np.log(0.1) - m1) / np.sqrt(s2[1].item())]
    assert mia.min_k_plus_plus_score([np.log(0.5), np.log(0.1)], mu, s2, k=0.5) == pytest.approx(-min(z))


# ---------------------------------------------------------------- through the runner

def test_runner_yields_what_openunlearning_reads(tokenizer):
    """On a tiny model, the runner's teacher-forced scores (right-padded batches, the LM
    head at the scored positions only) give every metric as upstream computes it from the
    full logits of each sequence alone."""
    model = tiny_llama(len(tokenizer))
    seqs = [encode_pair(tokenizer, ex.question, ex.answer, None) for ex in FORGET + RETAIN[:2]]
    full = score_sequences(model, tokenizer, seqs, batch_size=4, moments=True)
    cut = tokenwise_logprobs(model, tokenizer, seqs, moments=True, batch_size=4)
    texts = [tokenizer.decode(s.labels.tolist(), skip_special_tokens=True) for s in full]
    ours = mia.attack_scores(full, texts)
    for i, ((ids, start), s, c) in enumerate(zip(seqs, full, cut)):
        labels = torch.tensor([[IGNORE] * start + ids[start:]])
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids).logits.double()
        vlp, labs = _ou_vocab_logprobs(logits, input_ids, labels)
        tlp = _ou_token_logprobs(logits, input_ids, labels)[0]
        avg = _ou_avg_loss(logits, labels)[0]
        assert M.extraction_strength(s.predicted, s.labels) == pytest.approx(_ou_es(vlp[0], labs[0]))
        assert M.exact_memorization(s.predicted, s.labels) == pytest.approx(_ou_em(vlp[0], labs[0]))
        np.testing.assert_allclose(c.logprobs, tlp.numpy(), atol=2e-5)
        assert ours["min_k"][i] == pytest.approx(_ou_min_k(tlp, 0.4), abs=2e-5)
        assert ours["min_k++"][i] == pytest.approx(_ou_min_k_pp(vlp[0], tlp, 0.4), rel=1e-5)  # float32 runner
        assert ours["loss"][i] == pytest.approx(avg, abs=2e-5)
        ref_text = tokenizer.decode(labels[0][labels[0] != IGNORE].tolist(), skip_special_tokens=True)
        assert ours["zlib"][i] == pytest.approx(_ou_zlib(avg, ref_text), abs=1e-6)


# ---------------------------------------------------------------- the report and the sources

def _reports(tmp_path, tokenizer, plain_tokenizer, trained_llama):
    """One report of every task, on tiny models and local files, with an edit and a
    reference model where the task uses them."""

    ref = tiny_llama(len(tokenizer), seed=3)
    tofu = _tofu_like()
    edit = run_edit(trained_llama, tokenizer, tofu.forget, tofu.retain,
                    EditConfig(layers=(1, 2), beta=30.0, w_r=30.0))
    yield evaluate(trained_llama, tokenizer, tofu, edit=edit, reference=ref)
    yield evaluate(trained_llama, tokenizer, _knowledge_bench(), edit=edit, batch_size=8)
    custom = Benchmark("custom", "forget", tofu.forget + (TextExample("Zorvath Quill wrote books."),),
                       tofu.retain + (TextExample("Odo Brask lived in Quenford."),), task="custom")
    yield evaluate(trained_llama, tokenizer, custom, edit=edit)
    muse = load_benchmark("muse-news", "forget", source=muse_folder(tmp_path / "m"))
    yield evaluate(ref, plain_tokenizer, muse, max_new_tokens=4, reference=tiny_llama(len(tokenizer), seed=4))
    wmdp = load_benchmark("wmdp-bio", "test", source=wmdp_folder(tmp_path / "w"))
    yield evaluate(ref, plain_tokenizer, wmdp)
    zsre = load_benchmark("zsre", source=write_json(tmp_path / "zsre_mend_eval.json",
                                                     [zsre_record(k) for k in range(1050)]))
    yield evaluate(ref, plain_tokenizer, zsre)


def test_every_metric_of_every_report_has_a_source_and_the_attacks_their_auc(
        tmp_path, tokenizer, plain_tokenizer, trained_llama):

    seen = set()
    for report in _reports(tmp_path, tokenizer, plain_tokenizer, trained_llama):
        for metric in report.table().columns:
            assert metric_source(metric).implementation in IMPLEMENTATIONS, metric
            seen.add(metric)
        if report.task in ("tofu", "muse"):
            for label in ("Base", "Retain model"):
                m, raw = report.rows[label].metrics, report.rows[label].raw
                for attack in ("min_k", "min_k++", "loss", "zlib"):
                    assert m[MIA_COLUMNS[attack]] == pytest.approx(
                        _ou_auc(raw[f"forget/{attack}"], raw[f"holdout/{attack}"])), attack
            base, ref = report.rows["Base"].raw, report.rows["Retain model"].raw
            assert report.rows["Base"].metrics["MIA AUC (Reference)"] == pytest.approx(
                _ou_auc(base["forget/loss"] - ref["forget/loss"], base["holdout/loss"] - ref["holdout/loss"]))
            assert "MIA AUC (Reference)" not in report.rows["Retain model"].metrics
    assert {"Forget ES", "Forget EM", "Privacy leakage", *MIA_COLUMNS.values()} <= seen
    assert all(DIRECTION[c] == "half" for c in MIA_COLUMNS.values()) and DIRECTION["Forget EM"] == "down"
    for name in IMPLEMENTATIONS:
        assert f"[{name}" in GLOSSARY or f", {name}" in GLOSSARY, name
    with pytest.raises(KeyError, match="METRIC_SOURCES"):
        metric_source("Forget mystery")


def test_tofu_privacy_leakage_without_a_retain_model_reads_against_half():
    """OpenUnlearning's tofu privleak uses ref_value 0.5 when no retain-model logs exist."""

    rows = {BASE: Row({"MIA AUC": 0.8})}
    _tofu_relative(rows)
    assert rows[BASE].metrics["Privacy leakage"] == pytest.approx(_ou_privleak(0.8, 0.5))
    assert rows[BASE].metrics["Privacy leakage"] == pytest.approx(-60.0)
    rows = {BASE: Row({"MIA AUC": 0.8}), REFERENCE: Row({"MIA AUC": 0.4})}
    _tofu_relative(rows)
    assert rows[BASE].metrics["Privacy leakage"] == pytest.approx(_ou_privleak(0.8, 0.4))
    assert rows[REFERENCE].metrics["Privacy leakage"] == pytest.approx(0.0)


def test_moments_in_chunks_equal_moments_at_once(tokenizer, monkeypatch):

    model = tiny_llama(len(tokenizer))
    seqs = [encode_pair(tokenizer, ex.question, ex.answer, None) for ex in FORGET]
    whole = score_sequences(model, tokenizer, seqs, moments=True)
    monkeypatch.setattr(R, "_MOMENT_ROWS", 5)
    chunked = score_sequences(model, tokenizer, seqs, moments=True)
    for a, b in zip(whole, chunked):
        np.testing.assert_array_equal(a.mu, b.mu)
        np.testing.assert_array_equal(a.sigma2, b.sigma2)
    assert sum(len(s.mu) for s in whole) > 5  # several chunks were used
