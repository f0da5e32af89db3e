"""Evaluating an edit without running the layers it left alone.

A GROM edit changes decoder layers from some L on (the band); every layer below L is the
unedited model's. On the same input batch, the hidden states leaving layer L-1 and the
attention keys and values layers 0..L-1 write while they read a prompt are therefore the
unedited model's too. A `PrefixCache` keeps them per exact input batch, so evaluating an
edit runs layers L.. alone on each batch it has seen: teacher-forced answer scores and
the prompt pass of greedy generation (decoding new tokens still runs every layer, since
those tokens differ). The results are the same bit for bit: what is kept is what the
skipped layers would compute again.

Use: ``with cache.reusing(model, first_changed_layer(model, edit))`` around the edited
model's evaluation (it replays where an entry exists and records where none does: the
layers below L are unedited either way), ``with cache.reusing(model, None, capture=(L,))``
around the unedited model's to record ahead for a band starting at L. Only forward passes
of the model's decoder stack on token ids are touched: a prompt pass with an empty
key/value cache object, or a pass with ``use_cache=False``; decoding steps, and passes
the cache cannot replay exactly, run as usual. Valid while the model's weights below
each entry's layer stay as they were (an app drops it with the model).
"""
from __future__ import annotations

import hashlib
import inspect
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn

from grom.model.arch import decoder_layers, num_layers

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_RECALL_BYTES = 96 << 20  # SmolLM2's default card holds about 30 MB of states per edit
JUDGED = 4096  # answers whose judged value a `Recall` keeps


def first_changed_layer(model: nn.Module, edit) -> int:
    """The lowest decoder layer whose output `edit` changes: the first layer holding one of
    its patched weights; the number of layers where it patches only an LM head that is not
    the input embedding; 0 (nothing reusable) where it touches anything else."""
    if edit is None:
        return num_layers(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    layer_of = {id(p): i for i, layer in enumerate(decoder_layers(model)) for p in layer.parameters()}
    unties = bool(getattr(edit, "unties_lm_head", False))  # the head gets its own copy first
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    first = num_layers(model)
    for name in edit.patches:
        p = params.get(name)
        if p is None:
            return 0
        if id(p) in layer_of:
            first = min(first, layer_of[id(p)])
        elif not (head is not None and p is head.weight and (unties or p is not embed.weight)):
            return 0
    return first


def _digest(*tensors) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        if t is None:
            h.update(b"-")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class _Entry:
    """What layers 0..layer-1 gave on one input batch."""

    layer: int
    output: object  # layer-1's output (a tensor, or a tuple whose first item is one)
    updates: list = field(default_factory=list)  # (args, kwargs) of each key/value write
    nbytes: int = 0


def _bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_bytes(v) for v in x.values())
    return 0


def _cloned(x):
    """Tensors (alone or in a tuple) copied, so later in-place work cannot change them."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, tuple):
        return tuple(_cloned(v) for v in x)
    return x


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def _like(output, hidden: torch.Tensor):
    """`hidden` in the shape of a layer output like `output`."""
    if isinstance(output, tuple):
        return (hidden,) + tuple(output[1:])
    return hidden


class PrefixCache:
    """The unedited model's lower layers on input batches seen before (module docstring),
    least recently used dropped first beyond `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.hits = self.misses = 0
        self._model_id: int | None = None
        self._marks: dict[str, set[int]] = {}
        self.recall = Recall()  # earlier edited answers' states below their band (`LowerStates`)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()
        self._marks.clear()
        self.recall.clear()

    def mark(self, name: str, layers) -> None:
        """Note that the batches of `name` (a kind of pass, e.g. an evaluation's drafted passes)
        were recorded for a band starting at each of `layers`; an eviction at a layer drops
        its marks (`marked` then says False: a caller may not count on a replay there)."""
        for layer in layers:
            self._marks.setdefault(name, set()).add(int(layer))

    def marked(self, name: str, layer: int) -> bool:
        """Whether `name`'s batches were recorded at `layer` and nothing there was evicted since."""
        return int(layer) in self._marks.get(name, ())

    def _store(self, key: tuple, entry: _Entry) -> None:
        entry.nbytes = _bytes(entry.output) + sum(_bytes(a) + _bytes(k) for a, k in entry.updates)
        if entry.nbytes > self.max_bytes:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while self.nbytes > self.max_bytes:
            (_, layer, _), _ = self._entries.popitem(last=False)
            for layers in self._marks.values():
                layers.discard(layer)

    @contextmanager
    def reusing(self, model: nn.Module, first: int | None, capture: tuple[int, ...] = ()) -> Iterator[None]:
        """Within the block, forward passes of `model`'s decoder stack replay layers
        0..first-1 from an entry of the same input batch, or record one (`first`: the
        lowest layer the applied edit changes, `first_changed_layer`; None for the
        unedited model, which then records entries for the layers in `capture`)."""
        if self._model_id is not None and self._model_id != id(model):
            self.clear()  # another model: nothing kept applies to it
        self._model_id = id(model)
        n = num_layers(model)
        wanted = tuple(sorted({first} if first is not None else set(capture)))
        wanted = tuple(layer for layer in wanted if 1 <= layer <= n)
        if not wanted:
            yield
            return
        base = model.base_model
        signature = inspect.signature(base.forward)
        layers = decoder_layers(model)
        state: dict = {}

        def finish() -> None:
            undo = state.pop("undo", None)
            if undo is not None:
                undo()

        def pre(_module, args, kwargs):
            finish()  # a pass that raised left its layers replaced or hooked: put them back
            state.clear()
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                return None
            extra = bound.get("kwargs", {})
            get = lambda name: bound.get(name, extra.get(name))  # noqa: E731
            # transformers 5.2x names the key/value cache `cache`; earlier 5.x `past_key_values`
            ids, cache = get("input_ids"), get("cache") if get("cache") is not None else get("past_key_values")
            if ids is None or get("inputs_embeds") is not None:
                return None
            if cache is not None:
                if cache.get_seq_length() != 0:
                    return None  # a decoding step: new tokens, every layer runs
                kind = "kv"
            elif get("use_cache") is False:
                kind = "plain"
            else:
                return None  # the model would fill a cache of its own: leave it whole
            digest = _digest(ids, get("attention_mask"), get("position_ids"), get("cache_position"))
            if first is not None and (hit := self._entries.get((kind, first, digest))) is not None:
                self.hits += 1
                self._entries.move_to_end((kind, first, digest))
                state["undo"] = _replay(layers, hit, cache)
                return None
            if first is not None:
                self.misses += 1
            state["undo"] = _record(layers, wanted, cache, kind, digest, state)
            return None

        def post(_module, _args, _output):
            finish()
            for key, entry in state.pop("recorded", {}).items():
                self._store(key, entry)

        h1 = base.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = base.register_forward_hook(post)
        try:
            yield
        finally:
            h1.remove()
            h2.remove()
            finish()


def _replay(layers: nn.ModuleList, entry: _Entry, cache):
    """Layers 0..entry.layer-1 skip their work for this pass: each writes the keys and
    values it wrote before, the last returns its output as recorded. Returns the undo."""
    by_layer: dict[int, list] = {}
    for args, kwargs in entry.updates:
        by_layer.setdefault(args[2], []).append((args, kwargs))

    def make(i: int):
        def forward(hidden_states=None, *args, **kwargs):
            for a, k in by_layer.get(i, ()):  # copies: the cache may keep them
                type(cache).update(cache, *_cloned(a), **k)
            if i == entry.layer - 1:
                out = entry.output
                return _like(out, _hidden(out).clone())
            return _like(entry.output, hidden_states)
        return forward

    for i in range(entry.layer):
        layers[i].forward = make(i)

    def undo():
        for i in range(entry.layer):
            layers[i].__dict__.pop("forward", None)
    return undo


def _record(layers: nn.ModuleList, wanted: tuple[int, ...], cache, kind: str, digest: str, state: dict):
    """Hooks that keep, for each layer L in `wanted`, the output of layer L-1 and every
    key/value write of layers below L in this pass. Returns the undo."""
    top = max(wanted)
    outputs: dict[int, object] = {}
    updates: list = []
    handles = []
    for L in wanted:
        def keep(_module, _args, output, L=L):
            outputs[L] = _cloned(output)
        handles.append(layers[L - 1].register_forward_hook(keep))
    if kind == "kv":
        def update(*args, **kwargs):
            if len(args) >= 3 and isinstance(args[2], int) and args[2] < top:
                updates.append((_cloned(args), kwargs))
            return type(cache).update(cache, *args, **kwargs)
        cache.update = update

    def undo():
        for h in handles:
            h.remove()
        if kind == "kv":
            cache.__dict__.pop("update", None)
        recorded = {}
        for L in wanted:
            if L not in outputs:
                continue
            mine = [u for u in updates if u[0][2] < L]
            if kind == "kv" and sorted(u[0][2] for u in mine) != list(range(L)):
                continue  # not one write per layer below L: this family cannot be replayed
            recorded[(kind, L, digest)] = _Entry(L, outputs[L], mine)
        state["recorded"] = recorded
    return undo


class Recall:
    """States entering a decoder layer, kept across evaluations: what each edited row's
    decodings held (`LowerStates`), per layer and by tokens, least recently used dropped
    first beyond `max_bytes`. A later edit of a band starting at the same layer reads an
    earlier edit's answers from here as guesses (`grom.eval.runner.greedy_answers`: the
    layers below the band are the unedited model's whatever the edit, so their states on
    the same tokens are the same). Valid while the weights below each layer stay as they
    were: a `PrefixCache` holds one and drops it with its entries."""

    def __init__(self, max_bytes: int = DEFAULT_RECALL_BYTES):
        self.max_bytes = max_bytes
        # (layer, tokens) -> (states, the tags of the edits whose answers it holds)
        self._held: OrderedDict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, set[str]]] = OrderedDict()
        self.nbytes = 0
        # what the unedited model made of an answer, by its text (the knowledge task's judge:
        # its perplexity), so the same answer again costs no pass; LRU beyond JUDGED
        self.judged: OrderedDict[tuple, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        self._held.clear()
        self.judged.clear()
        self.nbytes = 0

    def judge(self, key: tuple, value: float | None = None) -> float | None:
        """The value kept for `key` (None: none), or keep `value` for it."""
        if value is None:
            got = self.judged.get(key)
            if got is not None:
                self.judged.move_to_end(key)
            return got
        self.judged[key] = value
        while len(self.judged) > JUDGED:
            self.judged.popitem(last=False)
        return value

    def hold(self, layer: int, ids: Sequence[int], states: torch.Tensor, tag: str | None = None) -> None:
        """Keep `states` (len(ids), d), entering `layer` at each of `ids`: a prompt and a
        whole answer that the edit `tag` gave. One held sequence serves every answer that
        starts it (read along it, such an answer ends where it ends: EOS, its budget or its
        phrase), so a sequence that starts a held one adds only its tag to it, and one that
        extends held ones replaces them, taking their tags."""
        key = tuple(int(t) for t in ids)
        tags = {tag} if tag is not None else set()
        for (at, held) in list(self._held):
            if at != layer:
                continue
            if held[:len(key)] == key:
                self._held[(at, held)][1].update(tags)
                self._held.move_to_end((at, held))
                return
            if key[:len(held)] == held:
                old, theirs = self._held.pop((at, held))
                self.nbytes -= _bytes(old)
                tags |= theirs
        states = states.detach()
        self._held[(layer, key)] = (states, tags)
        self.nbytes += _bytes(states)
        while self.nbytes > self.max_bytes and self._held:
            _, (old, _) = self._held.popitem(last=False)
            self.nbytes -= _bytes(old)

    def extending(self, layer: int, ids: Sequence[int], tag: str | None = None, only: bool = False
                  ) -> tuple[tuple[int, ...], torch.Tensor] | None:
        """A held sequence at `layer` that starts with `ids` and goes on past them, with its
        states: one the edit `tag` gave where there is one, else (unless `only`) the most
        recently held; None where none does."""
        want = tuple(int(t) for t in ids)
        found = None
        for (at, held) in reversed(self._held):
            if at == layer and len(held) > len(want) and held[:len(want)] == want:
                if tag is not None and tag in self._held[(at, held)][1]:
                    found = (at, held)
                    break
                if found is None and not only:
                    found = (at, held)
        if found is None:
            return None
        self._held.move_to_end(found)
        return found[1], self._held[found][0]

    def states_for(self, layer: int, ids: Sequence[int]) -> torch.Tensor | None:
        want = tuple(int(t) for t in ids)
        for (at, held), (states, _) in self._held.items():
            if at == layer and len(held) >= len(want) and held[:len(want)] == want:
                return states[:len(want)]
        return None


class LowerStates:
    """The states entering decoder layer `layer` at every position a greedy decoding fed
    (`grom.eval.runner.greedy_answers`): a prompt's tokens and each answer token read
    back. Below the first layer an edit changes, those states are a function of the tokens
    alone, the same for the edited and the unedited model; so a teacher-forced pass of
    the unedited model over a prompt and an answer the edited model gave (the knowledge
    task's judge: each answer's perplexity under the unedited model) can start at `layer`
    from them (`run`) instead of running every layer again. The same numbers up to the
    float rounding of another batch. Valid while the weights below `layer` stay as they
    were; None `layer`: nothing is kept."""

    def __init__(self, layer: int | None = None, recall: Recall | None = None, tag: str | None = None):
        self.layer = layer
        self.recall = recall  # where whole answers are kept for later decodings (`Recall`)
        self.tag = tag  # the edit decoding (`grom.edit.patch_sha256`): its own earlier answers are read first
        self._held: list[tuple[tuple[int, ...], torch.Tensor]] = []
        self.hits = 0

    def __len__(self) -> int:
        return len(self._held)

    @contextmanager
    def watching(self, model: nn.Module) -> Iterator[list]:
        """Within the block, the hidden states entering `layer` on each forward pass of
        `model`'s decoder stack are appended to the list yielded (nothing where the layer
        below returns a tuple: its other items could not be given back)."""
        seen: list = []
        if not self.layer:
            yield seen
            return
        def keep(_module, _args, output):
            seen.append(output if isinstance(output, torch.Tensor) else None)
        handle = decoder_layers(model)[self.layer - 1].register_forward_hook(keep)
        try:
            yield seen
        finally:
            handle.remove()

    def hold(self, ids: Sequence[int], states: torch.Tensor, whole: bool = True) -> None:
        """Keep `states` (len(ids), d): those entering `layer` at each of `ids`; `whole`: a
        prompt and its whole answer, kept in the recall too."""
        if self.layer and len(ids) == len(states):
            self._held.append((tuple(int(t) for t in ids), states))
            if self.recall is not None and whole:
                self.recall.hold(self.layer, ids, states, self.tag)

    def extending(self, ids: Sequence[int], same: bool = False) -> tuple[tuple[int, ...], torch.Tensor] | None:
        """An earlier decoding's sequence that starts with `ids` and goes on past them, with
        its states entering `layer` (`Recall.extending`: one this edit gave where there is
        one; `same`: only such a one); None without a recall."""
        if not self.layer or self.recall is None or (same and self.tag is None):
            return None
        return self.recall.extending(self.layer, ids, self.tag, only=same)

    def states_for(self, ids: Sequence[int]) -> torch.Tensor | None:
        """The states entering `layer` at each of `ids`, where a decoding fed them (or ids
        and more: a position's states depend on the tokens up to it alone); else None."""
        want = tuple(int(t) for t in ids)
        for held, states in self._held:
            if len(held) >= len(want) and held[:len(want)] == want:
                self.hits += 1
                return states[:len(want)]
        if self.layer and self.recall is not None and (states := self.recall.states_for(self.layer, want)) is not None:
            self.hits += 1
            return states
        return None

    def run(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The decoder stack's last hidden state (after the final norm) on a right-padded
        batch (ids, mask: (B, T)) whose states entering `layer` are `states` (B, T, d):
        the layers below it skip their work."""
        undo = _replay(decoder_layers(model), _Entry(self.layer, states), None)
        # embeddings in place of the ids: the layers that would read them are skipped, and a
        # prefix cache's hooks leave such a pass alone (it has nothing to record)
        embeds = torch.zeros((*ids.shape, states.shape[-1]), dtype=states.dtype, device=states.device)
        try:
            out = model.base_model(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
        finally:
            undo()
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
