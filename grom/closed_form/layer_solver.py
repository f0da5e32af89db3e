"""`LayerSolver`: one band edit's layers, each summed batch by batch, solved and applied.

Each layer's system is summed from this rank's key batches (`grom.closed_form.solve.SystemSums`:
n^2 + m n float64, whatever the number of keys) and reduced over the ranks under
torch.distributed; the keys themselves are kept (float32, on the CPU) only with
`EditConfig.keep_keys`, for the diagnostics. The model is edited in place layer by layer
(later layers' keys are taken on it) and `restore` puts every weight back bit for bit;
`reverted` does so for a block only (a turn another job takes at a step boundary,
`grom.turns`), then patches them again.

(Was `grom/editor.py`. Its class `Editor` is now `LayerSolver` (`Editor` was also a ROME/MEMIT
row).)
"""
from __future__ import annotations

import itertools
import time
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from grom.closed_form.config import EditConfig
from grom.closed_form.directions import (
    Directions,
    corruption_directions,
    head_promotion_directions,
    head_suppression_directions,
    mean_row,
    promotion_directions,
    suppression_directions,
)
from grom.closed_form.solve import SystemSums
from grom.edit import LayerKeys, LayerRecord
from grom.model.arch import EditedMatrix, unembedding
from grom.model.distributed import gather_by_index, share, world_size
from grom.turns import Between, inside


def _directions(model, gold: torch.Tensor, alpha, config: EditConfig, m: int, beta: float,
                w_bar: torch.Tensor | None = None) -> Directions:
    """The directions D (m, k) of forget key columns with gold tokens `gold` (k,); w_bar (m,) the
    mean LM-head row the refusal target centres on (computed once per edit by the caller)."""
    if config.target == "corruption":
        return corruption_directions(gold.numel(), m, config.c, config.seed)
    if config.target == "refusal":  # gold: the refusal's next tokens (grom.closed_form.refusal)
        if config.matrix == "lm_head":
            return head_promotion_directions(gold, m, beta)
        return promotion_directions(gold, unembedding(model).detach(), beta, w_bar)
    a = alpha[gold]
    if config.matrix == "lm_head":
        return head_suppression_directions(gold, a, m, beta)
    return suppression_directions(gold, a, unembedding(model).detach(), beta)


def _solve_device(W: torch.Tensor) -> torch.device:
    return W.device if W.device.type == "cuda" else torch.device("cpu")


# keys(only): (i, inputs of the matrix at local batch i's key positions, (k_i, n)) for
# every local batch, or for those of `only`
KeySource = Callable[[Sequence[int] | None], Iterator[tuple[int, torch.Tensor]]]


def local_batches(prep) -> tuple[list[int], list]:
    """(global indices, batches) of the forget-then-retain batches this rank handles (all
    of them in one process; `grom.model.distributed.share` under torch.distributed)."""
    batches = prep.forget + prep.retain
    mine = share(batches)
    return mine, [batches[i] for i in mine]


class TurnClock:
    """A job's step boundaries (`grom.turns`) and its own clock: `give(as_found)` calls the
    host's `between` (none: nothing), and `now` stops while it runs, so that the seconds
    other jobs take in their turns stay out of the job's timings."""

    def __init__(self, between: Between | None = None):
        self.between, self.spent = between, 0.0

    def give(self, as_found=nullcontext) -> None:
        if self.between is None:
            return
        t0 = time.perf_counter()
        try:
            self.between(as_found)
        finally:
            self.spent += time.perf_counter() - t0

    def now(self) -> float:
        return time.perf_counter() - self.spent

    @property
    def turn(self) -> Between | None:
        """The timed `between` for steps where the job has changed nothing (None without one)."""
        return self.give if self.between is not None else None

    def inside(self, as_found) -> Between | None:
        """The timed `between` for steps in a state `as_found` undoes (`grom.turns.inside`)."""
        return inside(self.turn, as_found)


class LayerSolver:
    """Solves and applies one layer at a time; reverts everything in `restore`. prep: a
    `grom.closed_form.pipeline.Prepared` (batches, alpha, example counts).

    between: a step boundary (`grom.turns`) between two key batches of a layer (`give`;
    its as_found the caller's: `reverted` and whatever else the caller changed); clock: the
    seconds of its timings (`TurnClock.now`, which leaves the turns out)."""

    def __init__(self, model: nn.Module, prep, config: EditConfig, between: Between | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if config.keep_keys and world_size() > 1:
            raise ValueError("keep_keys (the keys for the diagnostics) needs one process: run the "
                             "diagnostics without torch.distributed")
        self.model, self.prep, self.config = model, prep, config
        self.mine, self.batches = local_batches(prep)
        self.is_forget = [i < len(prep.forget) for i in self.mine]
        self.s = sum(b.gold.numel() for b in prep.forget)
        self.r = sum(b.gold.numel() for b in prep.retain)
        self.saved: dict[str, torch.Tensor] = {}
        self.patches: dict[str, torch.Tensor] = {}
        self.records: list[LayerRecord] = []
        self.keys: dict[str, LayerKeys] = {}
        self.timings = {"keys": 0.0, "solve": 0.0, "apply": 0.0}
        self.between, self.clock = between, clock
        refusal = config.target == "refusal" and config.matrix != "lm_head"
        self.w_bar = mean_row(unembedding(model).detach()) if refusal else None

    def _timed(self, pairs: Iterator) -> Iterator:
        """`pairs`, with the seconds spent making them added to timings["keys"], and a step
        boundary (`give`) between two of them."""
        it = iter(pairs)
        for n in itertools.count():
            if n:  # between two batches: no hook held, the key source waits at its yield
                self.give()
            t0 = self.clock()
            try:
                item = next(it)
            except StopIteration:
                self.timings["keys"] += self.clock() - t0
                return
            self.timings["keys"] += self.clock() - t0
            yield item

    def give(self) -> None:
        """A step boundary (`between`; none: nothing)."""
        if self.between is not None:
            self.between(nullcontext)

    def _beta(self, W: torch.Tensor, keys: KeySource, dev) -> float:
        """The absolute beta: config.beta, or with beta_relative that times the mean norm of
        W x over every forget key (per-column float32 norms, in the keys' global order, so
        one process and N ranks average the same vector)."""
        cfg = self.config
        if cfg.target == "corruption":
            return cfg.c
        if not cfg.beta_relative:
            return cfg.beta
        W32 = W.to(dev, torch.float32)
        only = [i for i, f in enumerate(self.is_forget) if f]
        norms = {self.mine[i]: (W32 @ x.to(dev, torch.float32).T).norm(dim=0)
                 for i, x in self._timed(keys(only))}
        return cfg.beta * float(torch.cat(gather_by_index(norms)).mean())

    def sum_keys(self, W: torch.Tensor, keys: KeySource, beta: float, dev) -> tuple[SystemSums, dict]:
        """The layer's system summed over this rank's batches; the keys kept if asked."""
        cfg, m = self.config, W.shape[0]
        sums = SystemSums(m, W.shape[1], self.s, self.r, w_r=cfg.w_r, w_f=cfg.w_f, device=dev)
        kept: dict = {True: [], False: []}
        for i, x in self._timed(keys(None)):
            X, b = x.to(dev, torch.float32).T, self.batches[i]  # (n, k)
            if self.is_forget[i]:
                sums.add_forget(X, _directions(self.model, b.gold, self.prep.alpha, cfg, m, beta, self.w_bar))
            else:
                sums.add_retain(X)
            if cfg.keep_keys:
                kept[self.is_forget[i]].append((X.cpu(), b))
        return sums, kept

    def _keep(self, name: str, W: torch.Tensor, kept: dict, beta: float) -> None:
        def cat(parts):
            X = torch.cat([X for X, _ in parts], 1) if parts else torch.zeros(W.shape[1], 0)
            ex = torch.cat([b.example for _, b in parts]) if parts else torch.zeros(0, dtype=torch.long)
            return X, ex

        (Xf, f_ex), (Xr, r_ex) = cat(kept[True]), cat(kept[False])
        gold = torch.cat([b.gold for _, b in kept[True]])
        directions = _directions(self.model, gold, self.prep.alpha, self.config, W.shape[0], beta, self.w_bar).to("cpu")
        self.keys[name] = LayerKeys(Xf, f_ex, Xr, r_ex, directions, self.prep.n_forget_examples,
                                    self.prep.n_retain_examples)

    def solve_layer(self, t: EditedMatrix, keys: KeySource) -> torch.Tensor:
        """P for one matrix (math layout, weight dtype), applied to the model in place."""
        t0, keys_before = self.clock(), self.timings["keys"]
        param = self.model.get_parameter(t.param_name)
        W = t.from_param(param.detach())
        dev, cfg = _solve_device(param), self.config
        beta = self._beta(W, keys, dev)
        sums, kept = self.sum_keys(W, keys, beta, dev)
        sums.reduce()
        DXt, system = sums.DXt, sums.system(cfg.rho)
        P = system.update(DXt).to(param.dtype)
        del DXt, sums
        solve_s = self.clock() - t0 - (self.timings["keys"] - keys_before)
        self.timings["solve"] += solve_s
        t1 = self.clock()
        patch = t.to_param(P).to(param.device)
        if not torch.isfinite(patch).all():
            raise FloatingPointError(f"the update for {t.param_name} is not finite; lower beta or raise rho")
        with torch.no_grad():
            self.saved[t.param_name] = param.detach().clone()
            param.add_(patch)
        self.patches[t.param_name] = patch.cpu()
        self.timings["apply"] += self.clock() - t1
        self.records.append(LayerRecord(t.param_name, t.layer, beta, system.mu, self.s, self.r,
                                        float(P.double().norm()), float(W.double().norm()), solve_s,
                                        t.transposed))
        if cfg.keep_keys:
            self._keep(t.param_name, W, kept, beta)
        return P

    @contextmanager
    def reverted(self) -> Iterator[None]:
        """The matrices patched so far back to their originals for the block, then patched
        again: W0 + patch once more, the same sum in the same dtype, so the same bits (no
        copy of the patched weights is kept meanwhile)."""
        with torch.no_grad():
            for name, W0 in self.saved.items():
                self.model.get_parameter(name).copy_(W0)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, W0 in self.saved.items():
                    param = self.model.get_parameter(name)
                    param.copy_(W0).add_(self.patches[name].to(param.device))

    def restore(self) -> None:
        with torch.no_grad():
            for name, W0 in self.saved.items():
                self.model.get_parameter(name).copy_(W0)
        self.saved.clear()
