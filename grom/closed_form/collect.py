"""Running the model over key batches: the forward passes GROM needs, each done once.

Two ways to get a layer's keys:

- `collect_keys`: run the model from the start with a hook on the matrix, stopping right
  after it (used for the LM head, and as the reference path);
- `LayerStream`: run the model once up to the first layer of the band, keep the hidden
  states entering it (and the arguments the model passes the band's layers: one call per
  layer kind, since sliding-window and full-attention layers get different masks), then
  advance one decoder layer at a time. Where a matrix's output reaches the residual
  stream linearly (`grom.model.arch.residual_gain`: down_proj in most families), a layer's
  patch moves the next layer's input by exactly ``g P x``, so the stream advances without
  re-running the layer; elsewhere it re-runs the layer as patched. Two more savings: the
  opening every sequence shares (a chat template's system prompt) runs once, as a row of
  its own (`share_prefix`), and a stream resumed many times from its start (a landscape's
  cells, Run edits at other settings) reads its first layer's pass from the first run
  (`remember_first`).

(Was `grom/collect.py`.)
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from grom.data.encoding import Batch
from grom.model.arch import model_device
from grom.model.hooks import StopForward, capture_inputs, drop_frames, hooked, stop_after
from grom.model.shared_prefix import PrefixKV, common_prefix, is_view, recording, suffix_batch
from grom.turns import Between, give

# Above this many bytes of cached matrix inputs, the stream re-runs layers instead.
MAX_INPUT_CACHE_BYTES = 4 << 30
# The hidden states (and call arguments) entering the band kept per batch, at most this
# many bytes by default; batches beyond are replayed from the embeddings at each layer.
HIDDEN_CACHE_BYTES = 8 << 30
# A stream's first layer's keys, outputs and matrix inputs kept with its start, at most this
# many bytes (`LayerStream.key_batches`).
MEMO_BYTES = 256 << 20


@dataclass
class Keys:
    """Keys of one matrix: X (n, s) float32, with each column's gold token and example."""

    X: torch.Tensor
    gold: torch.Tensor
    example: torch.Tensor

    @classmethod
    def concat(cls, parts: list[torch.Tensor], batches: Sequence[Batch], device) -> "Keys":
        X = torch.cat([p.to(device, torch.float32) for p in parts]).T
        gold = torch.cat([b.gold for b in batches])
        example = torch.cat([b.example for b in batches])
        return cls(X, gold, example)


def forward(model: nn.Module, batch: Batch, shared: int = 0, extra: dict | None = None):
    """A forward pass of `batch`; with `shared`, the batch is the rest of sequences whose
    first `shared` tokens a key/value cache view in `extra` holds (`grom.model.shared_prefix`)."""
    dev = model_device(model)
    mask = batch.attention_mask
    if shared:
        mask = torch.cat([torch.ones((mask.shape[0], shared), dtype=mask.dtype), mask], 1)
    return model(input_ids=batch.input_ids.to(dev), attention_mask=mask.to(dev),
                 **(extra or {"use_cache": False}))


def collect_keys(model: nn.Module, batches: Sequence[Batch], module: nn.Module, device,
                 progress: Callable[[float], None] | None = None) -> Keys:
    """Inputs of `module` at every batch's key positions, by full forward passes."""
    parts: list[torch.Tensor] = []
    with torch.no_grad():
        for i, batch in enumerate(batches):
            with capture_inputs(module, batch.select) as got, stop_after(module):
                forward(model, batch)
            parts.extend(got)
            if progress:
                progress((i + 1) / len(batches))
    return Keys.concat(parts, batches, device)


def _call_sources(kinds: Sequence, first: int, last: int) -> dict[int, int]:
    """Layer l in first..last -> the first layer from `first` on with l's kind, whose call
    arguments l reuses."""
    seen: dict = {}
    return {l: seen.setdefault(kinds[l], l) for l in range(first, last + 1)}


def _capture_layer_calls(model: nn.Module, layers: nn.ModuleList, wanted: Sequence[int],
                         batch: Batch, shared: int = 0, extra: dict | None = None) -> dict[int, tuple]:
    """The (args, kwargs) the model passes each layer of `wanted` for this batch (`forward`'s
    `shared` and `extra`); the forward pass stops before the last of them runs."""
    calls: dict[int, tuple] = {}
    stop = max(wanted)

    def hook_for(j: int):
        def hook(_module, args, kwargs):
            calls[j] = (args, dict(kwargs))
            if j == stop:
                raise StopForward
        return hook

    try:
        with ExitStack() as stack:
            for j in wanted:
                stack.enter_context(hooked(layers[j], hook_for(j), pre=True, with_kwargs=True))
            forward(model, batch, shared, extra)
    except StopForward as stopped:
        drop_frames(stopped)
    return calls


def _split_hidden(call: tuple) -> tuple[torch.Tensor, tuple]:
    """(args, kwargs) of a layer call -> (hidden states, (other args, other kwargs))."""
    args, kwargs = call
    hidden = args[0] if args else kwargs.pop("hidden_states")
    return hidden, (args[1:], kwargs)


def _with_view(call: tuple, slot: tuple, view) -> tuple:
    """A layer call's (other args, kwargs) with `view` put where the model passes its cache
    (`slot`: ("arg", index) or ("kw", name))."""
    args, kwargs = call
    if slot[0] == "arg":
        args = tuple(view if j == slot[1] else v for j, v in enumerate(args))
        if slot[1] >= len(args):
            raise ValueError("the layer call has no such argument")
        return args, kwargs
    return args, {**kwargs, slot[1]: view}


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def iter_keys(model: nn.Module, batches: Sequence[Batch], module: nn.Module,
              only: Sequence[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """(i, inputs of `module` at batch i's key positions, (k_i, n)) for every batch (or
    those of `only`), one full forward pass each, stopping right after the module."""
    with torch.no_grad():
        for i in (range(len(batches)) if only is None else only):
            with capture_inputs(module, batches[i].select) as got, stop_after(module):
                forward(model, batches[i])
            yield i, got[0]


def _tensor_bytes(x) -> int:
    """Bytes of the tensors in a nest of tuples, lists and dicts."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_tensor_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_tensor_bytes(v) for v in x.values())
    return 0


@dataclass
class _Opening:
    """A stream's shared opening (`grom.model.shared_prefix`): its keys and values as the
    model was, its own row's state entering the current layer and that row's call
    arguments (with a cache view, recording there)."""

    kv: PrefixKV
    hidden: torch.Tensor  # (1, n, d)
    calls: dict  # layer -> (args, kwargs) of the opening's own row


class LayerStream:
    """The residual stream of every batch, entering one decoder layer at a time, from
    layer `first` up to `last`.

    kinds: per decoder layer, a label (`grom.model.arch.layer_kinds`; None: one for all); the
    model's call arguments are captured once per label met in first..last and reused for
    every layer with that label.

    budget: at most this many bytes of hidden states and call arguments are kept (None: no
    bound); the batches beyond it keep nothing and are replayed from the embeddings at
    each layer, by a forward pass of the model as it then is (edited up to the current
    layer), which gives the states the stream would hold: the keys are the same, up to the
    rounding of the shortcut `advance_linear` takes for the kept batches.

    share_prefix: where every sequence of the right-padded batches begins with the same
    tokens (a chat template's opening), run them once as a row of their own and each batch
    from where its rows differ (`grom.model.shared_prefix`): the same keys up to a
    product's rounding, for about half the work on SmolLM2's questions. `self.batches` are
    then the batches' rest, their key positions moved.

    remember_first: keep the first layer's whole pass with the start (`key_batches`), for a
    caller that resumes the stream from there many times.

    between: a step boundary (`grom.turns`) between two batches' forward passes (its
    as_found the caller's; `advance` takes one too). The stream is the caller's own: another
    job using the model there changes none of it.
    """

    def __init__(self, model: nn.Module, layers: nn.ModuleList, first: int,
                 batches: Sequence[Batch], last: int | None = None, kinds: Sequence | None = None,
                 budget: int | None = None, between: Between | None = None, share_prefix: bool = False,
                 remember_first: bool = False):
        kinds = kinds if kinds is not None else [None] * len(layers)
        self.source = _call_sources(kinds, first, first if last is None else last)
        self.model, self.layers, self.batches, self.at = model, layers, list(batches), first
        self.hidden, self.calls = [], []
        wanted, held = sorted(set(self.source.values())), 0
        with torch.no_grad():
            self._opening, self._view, probe = self._open(wanted) if share_prefix else (None, None, None)
            for b, batch in enumerate(self.batches):
                if b:
                    give(between)
                parts = {j: _split_hidden(c)
                         for j, c in (probe if b == 0 and probe else self._capture(wanted, batch)).items()}
                calls = {j: rest for j, (_, rest) in parts.items()}
                held += _tensor_bytes(parts[first][0]) + _tensor_bytes(calls)
                fits = budget is None or held <= budget
                self.hidden.append(parts[first][0] if fits else None)
                self.calls.append(calls if fits else None)
        self._outs: dict = {}
        self._inputs: dict = {}
        self._opening_kept: tuple | None = None
        self.first, self._memo = first, ({} if remember_first else None)

    def _open(self, wanted: Sequence[int]) -> tuple[_Opening | None, object, dict | None]:
        """The shared opening of `self.batches` (then replaced by their rest), its cache view
        and the first batch's captured calls; (None, None, None) where there is none or the
        model's cache cannot share it."""
        n = common_prefix(self.batches)
        kv = PrefixKV.of(self.model, self.batches[0].input_ids[0, :n]) if n else None
        if kv is None:
            return None, None, None
        view, extra = kv.view(), {"use_cache": True}
        rest = [suffix_batch(b, n) for b in self.batches]
        probe = _capture_layer_calls(self.model, self.layers, wanted, rest[0], n, {kv.kwarg: view, **extra})
        _, (args, kwargs) = _split_hidden((tuple(probe[wanted[0]][0]), dict(probe[wanted[0]][1])))
        slot = next((("arg", j) for j, v in enumerate(args) if is_view(v)), None) or \
            next((("kw", k) for k, v in kwargs.items() if is_view(v)), None)
        if slot is None:  # the model does not hand its layers the cache
            return None, None, None
        row = Batch(kv.ids.cpu(), torch.ones_like(kv.ids.cpu()), *(torch.zeros(0, dtype=torch.long),) * 4)
        parts = {j: _split_hidden(c) for j, c in _capture_layer_calls(self.model, self.layers, wanted, row).items()}
        try:
            calls = {j: _with_view(rest_, slot, view) for j, (_, rest_) in parts.items()}
        except ValueError:  # the opening's own call is not shaped like the batches'
            return None, None, None
        self.batches = rest
        return _Opening(kv, parts[wanted[0]][0], calls), view, probe

    def _capture(self, wanted: Sequence[int], batch: Batch) -> dict[int, tuple]:
        if self._opening is None:
            return _capture_layer_calls(self.model, self.layers, wanted, batch)
        return _capture_layer_calls(self.model, self.layers, wanted, batch, len(self._opening.kv),
                                    {self._opening.kv.kwarg: self._view, "use_cache": True})

    @property
    def shared(self) -> int:
        """Tokens of the shared opening (0: none; every row runs whole)."""
        return len(self._opening.kv) if self._opening is not None else 0

    @property
    def replayed(self) -> int:
        """How many batches are replayed rather than kept."""
        return sum(h is None for h in self.hidden)

    def start(self) -> tuple:
        """The stream as it enters its first layer (what the forward pass up to it gave),
        to `resume` later without that pass: valid while the layers before it are unchanged."""
        return (self.at, dict(self.source), list(self.hidden), list(self.calls), list(self.batches), self._opening,
                self._memo)

    @classmethod
    def resume(cls, model: nn.Module, layers: nn.ModuleList, batches: Sequence[Batch],
               start: tuple) -> "LayerStream":
        """A stream from `start()` of one over the same batches (its tensors are shared,
        never written: every step makes new ones; its opening's cache view is its own)."""
        stream = cls.__new__(cls)
        stream.at, source, hidden, calls, own_batches, opening, stream._memo = start
        stream.first = stream.at
        stream.source, stream.hidden, stream.calls = dict(source), list(hidden), list(calls)
        stream.model, stream.layers, stream.batches = model, layers, list(own_batches)
        stream._opening = opening
        stream._view = opening.kv.view() if opening is not None else None
        stream._outs, stream._inputs, stream._opening_kept = {}, {}, None
        return stream

    def _own(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Call arguments with this stream's own cache view in place of the one captured."""
        if self._view is None:
            return args, kwargs
        swap = lambda v: self._view if is_view(v) else v  # noqa: E731
        return tuple(swap(v) for v in args), {k: swap(v) for k, v in kwargs.items()}

    def _call(self, layer: nn.Module, hidden: torch.Tensor, call: tuple):
        args, kwargs = self._own(*call)
        return _first(layer(hidden, *args, **kwargs))

    def _run(self, i: int, layer: nn.Module):
        if self.hidden[i] is None:  # replayed: the states entering this layer, from the start
            call = self._capture([self.at], self.batches[i])[self.at]
            hidden, rest = _split_hidden(call)
            return self._call(layer, hidden, rest)
        return self._call(layer, self.hidden[i], self.calls[i][self.source[self.at]])

    def _run_opening(self, layer: nn.Module, matrix: nn.Module | None = None) -> torch.Tensor | None:
        """The opening's own row through the current layer, its keys and values kept in the
        view for the batches' rows to attend to; with `matrix`, also that matrix's input
        there (for `advance_linear`). Returns the row's output (None: no opening)."""
        op = self._opening
        if op is None:
            return None
        call = op.calls[self.source[self.at]]
        with recording(self._view):
            if matrix is None:
                return self._call(layer, op.hidden, call)
            with capture_inputs(matrix, lambda x: x) as got:
                out = self._call(layer, op.hidden, call)
            self._opening_kept = (out, got[0])
            return out

    def key_batches(self, matrix: nn.Module, keep_inputs: bool = False,
                    only: Sequence[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(i, inputs of `matrix` (inside the current layer) at batch i's key positions,
        (k_i, n)) for every batch, or those of `only`. With keep_inputs, also keep the
        layer outputs and the matrix's full inputs of the kept batches, so that
        `advance_linear` can be used.

        At the stream's first layer, which no edit has changed while the stream is valid,
        a whole pass with keep_inputs is remembered where the stream was made with
        remember_first (in what `start` gives, within `MEMO_BYTES`): a stream resumed from
        there then reads its keys, outputs and inputs from it instead of running the layer
        (every setting of a landscape edits the same band on the same batches)."""
        memo = self._memo.get(id(matrix)) if self._memo is not None and self.at == self.first else None
        if memo is not None and (keep_inputs or only is not None):
            keys, outs, inputs, opening = memo
            if keep_inputs:
                self._outs, self._inputs, self._opening_kept = dict(outs), dict(inputs), opening
            for i in (range(len(self.batches)) if only is None else only):
                yield i, keys[i]
            return
        self._outs, self._inputs, self._opening_kept = {}, {}, None
        layer = self.layers[self.at]
        remember = self._memo is not None and self.at == self.first and keep_inputs and only is None
        got_all: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            self._run_opening(layer, matrix if keep_inputs else None)
            for i in (range(len(self.batches)) if only is None else only):
                keep = keep_inputs and self.hidden[i] is not None

                def select(x, batch=self.batches[i], i=i, keep=keep):
                    if keep:
                        self._inputs[i] = x
                    return batch.select(x)

                with capture_inputs(matrix, select) as got:
                    if keep:
                        self._outs[i] = self._run(i, layer)
                    else:
                        with stop_after(matrix):
                            self._run(i, layer)
                if remember:
                    got_all[i] = got[0]
                yield i, got[0]
        if remember and not self.replayed and self._memo_bytes(got_all) <= MEMO_BYTES:
            self._memo[id(matrix)] = ([got_all[i] for i in range(len(self.batches))], dict(self._outs),
                                      dict(self._inputs), self._opening_kept)

    def remembers(self, matrix: nn.Module) -> bool:
        """Whether `key_batches(matrix, ...)` here reads a remembered first layer."""
        return self._memo is not None and self.at == self.first and id(matrix) in self._memo

    def _memo_bytes(self, keys: dict) -> int:
        return _tensor_bytes(list(keys.values())) + _tensor_bytes(list(self._outs.values())) + \
            _tensor_bytes(list(self._inputs.values())) + _tensor_bytes(self._opening_kept)

    def advance_linear(self, P: torch.Tensor, gain: float = 1.0) -> None:
        """Next layer's input = unpatched output + gain * P x, for a matrix whose output
        reaches the residual stream scaled by `gain` and nothing else
        (`grom.model.arch.residual_gain`); P is (m, n) in the math layout. Replayed batches
        need nothing: their next pass runs the patched model."""
        gP = P * gain
        for i, h in enumerate(self.hidden):  # batch by batch, each batch's old state freed as it goes
            if h is not None:
                out, x = self._outs.pop(i), self._inputs.pop(i)
                self.hidden[i] = out + nn.functional.linear(x, gP.to(h.device, h.dtype))
        if self._opening is not None:
            out, x = self._opening_kept
            h = self._opening.hidden
            self._opening = replace(self._opening, hidden=out + nn.functional.linear(x, gP.to(h.device, h.dtype)))
        self._outs, self._inputs, self._opening_kept = {}, {}, None
        self.at += 1

    def advance(self, between: Between | None = None) -> None:
        """Next layer's input by running the current layer as the model now is (`between`
        between two batches)."""
        layer = self.layers[self.at]
        self._outs, self._inputs, self._opening_kept = {}, {}, None
        with torch.no_grad():
            out = self._run_opening(layer)
            for i, h in enumerate(self.hidden):  # in place, batch by batch: the old states are freed
                if h is not None:               # as the new ones come (a new list held both at once)
                    if i:
                        give(between)
                    self.hidden[i] = self._run(i, layer)
            if out is not None:
                self._opening = replace(self._opening, hidden=out)
        self.at += 1

    def input_cache_bytes(self, n: int) -> int:
        """Bytes that keeping every kept batch's full matrix inputs (width n) would take."""
        return sum(h.shape[0] * h.shape[1] * n * h.element_size() for h in self.hidden if h is not None)
