"""`run_edit`: the whole GROM edit, from examples to an `Edit`.

1. tokenize forget and retain examples into key positions; specificity weights alpha;
   seeded subsampling to the key budgets (the refusal target: forget keys after each
   question followed by a refusal, `grom.closed_form.refusal`; its band scored on the answers);
2. pick the band by the layer scores S_l (unless layers are given);
3. edit the band's layers in order, each layer's keys taken on the model as already
   edited by the earlier ones: the hidden states entering the band are computed once,
   then the stream advances one layer at a time;
4. return the patches as data, with the model as it was found (also on failure).

A host sharing the model (`grom.turns`) gets turns between the forward batches of each
step (layer scores, the stream's opening pass, each layer's keys) and between layers,
the layers patched so far reverted for the turn and patched again after.

Progress is reported by stage (tokenizing, scoring layers, collecting keys, each layer's
keys batch by batch and its solve): to the caller's `progress(fraction, message)`, or by
default as a bar on stderr when it is a terminal (tqdm, as transformers draws its own).

(Was `grom/pipeline.py`. `score_prepared` was `compute_scores`, the name the studio's device job keeps.)
"""
from __future__ import annotations

import hashlib
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn
from tqdm import tqdm

from grom.closed_form.collect import HIDDEN_CACHE_BYTES, MAX_INPUT_CACHE_BYTES, LayerStream, iter_keys
from grom.closed_form.config import EditConfig
from grom.closed_form.directions import specificity_weights
from grom.closed_form.keys import gold_tokens, subsample
from grom.closed_form.layer_scores import LayerScores, score_layers
from grom.closed_form.layer_solver import KeySource, LayerSolver, TurnClock, local_batches
from grom.closed_form.refusal import encode_refusals
from grom.data.encoding import encode_examples, make_batches, pad_id
from grom.data.schema import as_examples
from grom.edit import Edit
from grom.model.arch import (
    EditedMatrix,
    arch_spec,
    decoder_layers,
    edited_matrix,
    layer_kinds,
    lm_head_is_tied,
    loaded_from,
    num_layers,
    residual_gain,
    retie_lm_head,
    unembedding,
    untie_lm_head,
)
from grom.model.distributed import world_size
from grom.model.editable import check_edit_inputs
from grom.turns import Between, modes, modes_as, random_kept

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]


def _quiet(fraction: float, message: str) -> None:
    """Progress reported to no one."""


@contextmanager
def reporting(progress: Progress | bool | None) -> Iterator[Progress]:
    """The `progress(fraction, message)` run_edit reports to: the caller's callable; for
    True, a bar on stderr when it is a terminal (none in a log file, a pipe, a test or a
    server's worker, where the bar's redraws would be noise); for False or None, no one."""
    if callable(progress):
        yield progress
        return
    if progress is not True or not sys.stderr.isatty():
        yield _quiet
        return
    with tqdm(total=1.0, file=sys.stderr, desc="GROM edit", bar_format="{desc:<44.44} {percentage:3.0f}%|{bar}| "
              "{elapsed}", dynamic_ncols=True) as bar:
        def show(fraction: float, message: str) -> None:
            bar.set_description_str(message, refresh=False)
            bar.update(max(0.0, min(fraction, 1.0) - bar.n))  # forward only
            bar.refresh()
        yield show


def _reporting_keys(keys: KeySource, editor: LayerSolver, progress: Progress, name: str,
                    start: float, width: float) -> KeySource:
    """`keys`, reporting each batch read ("layer 12 (1/5): keys 3/10 (forget)") within the
    layer's share of the bar (`start`, `width`): a pass over the forget batches alone (a
    beta relative to their outputs' norm) the first fifth, the pass over every batch up to
    90%, then "solving". The batches are the key source's own, unchanged."""
    def source(only: Sequence[int] | None) -> Iterator[tuple[int, torch.Tensor]]:
        total = len(editor.batches) if only is None else len(only)
        lo, span = (0.2, 0.7) if only is None else (0.0, 0.2)
        it = keys(only)
        try:
            for done, (i, x) in enumerate(it, 1):
                what = f"keys {done}/{total} ({'forget' if editor.is_forget[i] else 'retain'})" if only is None \
                    else f"beta from the forget outputs {done}/{total}"
                progress(start + width * (lo + span * done / total), f"{name}: {what}")
                yield i, x
        finally:
            getattr(it, "close", lambda: None)()  # the source's own clean-up, whoever stops early
        if only is None:
            progress(start + 0.9 * width, f"{name}: solving")
    return source


@dataclass
class Prepared:
    """Tokenized, subsampled and batched key positions of one edit."""

    forget: list
    retain: list
    alpha: torch.Tensor  # (vocab,)
    n_forget_examples: int
    n_retain_examples: int
    scored: tuple[list, torch.Tensor] | None = None
    """(forget batches, alpha) the layer scores read where they differ from the edit's
    (the refusal target: its keys follow a refusal, its band is where the model writes the
    forget answers, scored as for suppression); None: `forget` and `alpha`."""


def prepare(tokenizer, forget: Sequence, retain: Sequence, config: EditConfig, vocab_size: int) -> Prepared:
    """Encode, weight and batch the forget and retain examples."""
    forget, retain = as_examples(forget), as_examples(retain)
    if not forget:
        raise ValueError("the forget set is empty: give at least one example to forget")
    if not retain:
        raise ValueError("the retain set is empty: GROM needs retain examples to keep")
    kw = dict(fmt=config.prompt_format, max_length=config.max_length)
    enc_f = encode_examples(tokenizer, forget, mode=config.key_mode, **kw)
    enc_r = encode_examples(tokenizer, retain, mode=config.retain_key_mode, **kw)
    if config.use_alpha:
        alpha = specificity_weights(gold_tokens(enc_f), gold_tokens(enc_r), vocab_size)
    else:
        alpha = torch.ones(vocab_size)
    pid, size, seed = pad_id(tokenizer), config.batch_size, config.seed
    retain_batches = _batches(enc_r, config.retain_budget, seed + 1, size, pid)
    forget_batches = _batches(enc_f, config.forget_budget, seed, size, pid)
    if config.target != "refusal":
        return Prepared(forget_batches, retain_batches, alpha, len(forget), len(retain))
    enc_refusal = encode_refusals(tokenizer, forget, seed=seed, refusal=config.refusal, mode=config.key_mode, **kw)
    return Prepared(_batches(enc_refusal, config.forget_budget, seed, size, pid), retain_batches,
                    torch.ones(vocab_size), len(forget), len(retain), scored=(forget_batches, alpha))


def _batches(encoded, budget: int | None, seed: int, batch_size: int, pid: int) -> list:
    """The key positions subsampled to `budget` (seeded), batched by length (less padding)."""
    kept = sorted(subsample(encoded, budget, seed), key=lambda e: len(e.input_ids))
    return make_batches(kept, batch_size, pid)


def score_prepared(model, prep: Prepared, config: EditConfig, progress=None,
                   between: Between | None = None) -> LayerScores:
    """The layer scores of `prep`'s keys; `between` between forward batches (`score_layers`)."""
    forget, alpha = prep.scored or (prep.forget, prep.alpha)
    return score_layers(model, forget, prep.retain, alpha, matrix=config.matrix,
                        k=config.k, candidates=config.candidates, progress=progress, between=between)


def _band(model, config: EditConfig, scores: LayerScores | None) -> list[int]:
    if config.matrix == "lm_head":
        return []
    band = sorted(config.layers) if config.layers is not None else list(scores.band)
    n = num_layers(model)
    bad = [l for l in band if not 0 <= l < n]
    if bad:
        raise ValueError(f"layers {bad} are outside the model: it has layers 0..{n - 1}")
    return band


def _layers_it_may_edit(config: EditConfig, scores: LayerScores | None) -> list[int] | None:
    """The layers an edit may patch, known before any forward pass: the given ones, the
    given scores' band, else the automatic band's candidates (None: every layer)."""
    if config.layers is not None:
        return sorted(config.layers)
    if scores is not None:
        return list(scores.band)
    return None if config.candidates is None else sorted(config.candidates)


def _batches_key(batches) -> str:
    """A fingerprint of the key batches (token ids, masks, key positions)."""
    h = hashlib.sha256()
    for b in batches:
        for t in (b.input_ids, b.attention_mask, b.rows, b.cols):
            h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def _open_stream(model, band: list[int], batches, cache: dict | None,
                 budget: int | None = HIDDEN_CACHE_BYTES, between: Between | None = None) -> LayerStream:
    """The stream entering band[0]: one forward pass up to it, or the pass an earlier edit
    of the same (unedited) model made over the same batches, kept in `cache`. `budget`:
    bytes of hidden states kept (`LayerStream`); batches beyond are replayed. `between`
    between the pass's batches."""
    layers = decoder_layers(model)
    key = (band[0], band[-1], _batches_key(batches), budget) if cache is not None else None
    if key is not None and key in cache:
        return LayerStream.resume(model, layers, batches, cache[key])
    stream = LayerStream(model, layers, band[0], batches, last=band[-1], kinds=layer_kinds(model),
                         budget=budget, between=between, share_prefix=True, remember_first=cache is not None)
    if stream.replayed:
        log.info("%d of %d batches replayed from the embeddings (hidden-state budget %s bytes)",
                 stream.replayed, len(batches), budget)
    if key is not None:
        cache[key] = stream.start()
    return stream


def warm_stream(model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, config: EditConfig,
                band: Sequence[int], cache: dict, budget: int | None = HIDDEN_CACHE_BYTES,
                between: Between | None = None) -> None:
    """Put into `cache` (see `run_edit`'s stream_cache) the hidden states entering `band`
    for an edit of these examples with `config`, ahead of the edit itself. `between`
    between the forward batches (the model as found: nothing is changed)."""
    prep = prepare(tokenizer, forget, retain, config, unembedding(model).shape[0])
    with torch.no_grad():
        _open_stream(model, sorted(band), local_batches(prep)[1], cache, budget, between)


def _edit_band(editor: LayerSolver, band: list[int], progress: Progress, cache: dict | None = None,
               budget: int | None = HIDDEN_CACHE_BYTES) -> float:
    """Edit the band's layers in order on one residual stream; returns the seconds spent
    opening and advancing the stream (the keys' own are in editor.timings["keys"]). A step
    boundary (`editor.between`) between two batches of every pass and between layers; the
    stream is the edit's own (another job using the model meanwhile changes none of it)."""
    model, cfg, clock = editor.model, editor.config, editor.clock
    gain = residual_gain(model, cfg.matrix)  # None: a patched layer must be re-run
    t0 = clock()
    progress(0.3, f"collecting keys up to layer {band[0]}")
    stream = _open_stream(model, band, editor.batches, cache, budget, editor.between)
    key_s = clock() - t0
    span = band[-1] - band[0] + 1
    for step, l in enumerate(range(band[0], band[-1] + 1)):
        if step:
            editor.give()
        if l not in band:
            stream.advance(editor.between)
            continue
        t = edited_matrix(model, cfg.matrix, l)
        matrix = model.get_submodule(t.module_name)
        width = t.from_param(matrix.weight).shape[1]
        linear = gain is not None and stream.input_cache_bytes(width) <= MAX_INPUT_CACHE_BYTES
        keep = linear and l != band[-1]
        name = f"layer {l} ({band.index(l) + 1}/{len(band)})"
        keys = _reporting_keys(lambda only: stream.key_batches(matrix, keep and only is None, only), editor,
                               progress, name, 0.3 + 0.65 * step / span, 0.65 / span)
        P = editor.solve_layer(t, keys)
        if l != band[-1]:
            t2 = clock()
            stream.advance_linear(P, gain) if keep else stream.advance(editor.between)
            key_s += clock() - t2
    return key_s


def _edit_by_replay(editor: LayerSolver, matrices: list[EditedMatrix], progress: Progress) -> float:
    """Edit each matrix in order, taking its keys by full forward passes (stopping right
    after the matrix) on the model as already edited; a step boundary between two batches
    (`LayerSolver`) and between two matrices."""
    model = editor.model
    for i, t in enumerate(matrices):
        if i:
            editor.give()
        module = model.get_submodule(t.module_name)
        keys = _reporting_keys(lambda only: iter_keys(model, editor.batches, module, only), editor, progress,
                               f"{t.module_name} ({i + 1}/{len(matrices)})", 0.3 + 0.65 * i / len(matrices),
                               0.65 / len(matrices))
        editor.solve_layer(t, keys)
    return 0.0


@contextmanager
def _as_found(model: nn.Module, editor: LayerSolver, found: dict, head: nn.Parameter | None):
    """The model as `run_edit` found it for the block: the matrices patched so far as
    they were (`LayerSolver.reverted`), the LM head tied again where the edit untied it
    (`head`: the untied one, put back after), the modes as found and the random state
    kept; then as the edit has it, bit for bit."""
    with editor.reverted():
        if head is not None:
            retie_lm_head(model)
        try:
            with modes_as(model, found), random_kept():
                yield
        finally:
            if head is not None:
                model.get_submodule(arch_spec(model).lm_head).weight = head


def run_edit(model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, config: EditConfig,
             progress: Progress | bool | None = True, scores: LayerScores | None = None,
             stream_cache: dict | None = None, hidden_budget: int | None = HIDDEN_CACHE_BYTES,
             between: Between | None = None) -> Edit:
    """Compute a GROM edit of `model`; the model is returned as it was found.

    forget / retain: sequences of benchmark examples (grom.data.schema). `scores`, if
    given, are reused instead of being computed again for the automatic band.
    `stream_cache`, a dict the caller keeps for this model while its weights stay as they
    are, holds the hidden states entering the band from the first edit's forward pass, so
    later edits of the same data and band (a hyperparameter search) skip that pass.
    `hidden_budget`: bytes of hidden states entering the band kept between layers (None:
    no bound); the batches beyond it are replayed from the embeddings at each layer.
    `progress(fraction, message)` is called as the stages go (tokenizing, scoring layers,
    collecting keys, each layer's keys batch by batch and its solve); True, the default,
    draws them as a bar on stderr when it is a terminal; False or None: not reported. The
    edit is the same whatever reports. `between` (`grom.turns`) is
    called at every step boundary: between two forward batches of the layer scores, of the
    stream's first pass and of each layer's keys, and between two layers; inside its
    as_found the model is as found (the layers patched so far reverted, modes as found),
    and the edit is the same bit for bit whatever ran there. A matrix it may patch that
    cannot take a float patch in place (quantized, offloaded: `grom.model.editable`) is a
    `NotEditable` error before any forward pass.

    Memory grows with the model, not the data: each layer's system is summed batch by
    batch (n^2 + m n float64), and keys are kept only with config.keep_keys. Under
    torch.distributed every rank takes its share of the batches and the sums are reduced,
    so every rank computes the same patches.
    """
    with reporting(progress) as report:
        return _run_edit(model, tokenizer, forget, retain, config, report, scores, stream_cache, hidden_budget,
                         between)


def _run_edit(model: nn.Module, tokenizer, forget: Sequence, retain: Sequence, config: EditConfig,
              progress: Progress, scores: LayerScores | None, stream_cache: dict | None, hidden_budget: int | None,
              between: Between | None) -> Edit:
    """`run_edit`, reporting to `progress`."""
    t_start = time.perf_counter()
    check_edit_inputs(model, config.matrix, _layers_it_may_edit(config, scores),
                      reads_head=config.target == "suppression")
    progress(0.0, "tokenizing")
    vocab = unembedding(model).shape[0]
    prep = prepare(tokenizer, forget, retain, config, vocab)
    timings: dict[str, float] = {}
    turns = TurnClock(between)  # its clock leaves the turns out of the timings
    if config.matrix != "lm_head" and config.layers is None and scores is None:
        t0 = turns.now()
        scores = score_prepared(model, prep, config, lambda p: progress(
            0.05 + 0.25 * p, f"scoring layers: {'forget' if p <= 0.5 else 'retain'} batches"), turns.turn)
        timings["scores"] = turns.now() - t0
        turns.give()  # between the scores' last batch and the edit's first (nothing changed yet)
    band = _band(model, config, scores)
    found = modes(model) if between is not None else {}
    editor = LayerSolver(model, prep, config, clock=turns.now)
    untied = config.matrix == "lm_head" and lm_head_is_tied(model) and untie_lm_head(model)
    head = unembedding(model) if untied and between is not None else None
    editor.between = turns.inside(lambda: _as_found(model, editor, found, head))
    was_training = model.training
    model.eval()
    try:
        if config.matrix == "lm_head" or not config.stream:
            matrices = [edited_matrix(model, config.matrix, l) for l in (band or [None])]
            key_s = _edit_by_replay(editor, matrices, progress)
        else:
            key_s = _edit_band(editor, band, progress, stream_cache, hidden_budget)
    finally:
        editor.restore()
        if untied:
            retie_lm_head(model)
        model.train(was_training)
    timings.update(keys=key_s + editor.timings["keys"], solve=editor.timings["solve"], apply=editor.timings["apply"],
                   total=time.perf_counter() - t_start)
    progress(1.0, "done")
    log.info("GROM edit of %s: %s", [r.param_name for r in editor.records], timings)
    return Edit(settings=config, patches=editor.patches, layers=editor.records, scores=scores,
                timings=timings, unties_lm_head=bool(untied), keys=editor.keys, world_size=world_size(),
                model_name=loaded_from(model))
