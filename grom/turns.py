"""Step boundaries of a long job on a model that a host shares: where it may lend the model
to other jobs for a while, the model as the job found it.

A long library function (an evaluation, a method's run, the attack suite, the model
writing a forget set) takes `between`, a `Between`: at each step boundary it calls
``between(as_found)``, where `as_found` is a zero-argument callable returning a context
manager; ``with as_found(): ...`` runs its block on the model exactly as the job found it
(no patch of the job's applied, no weight it trained changed, its modes, grad flags, hooks
and the random state as they were), and puts the job's own state back after, bit for bit.
Where the job has changed nothing at that point, `as_found` is `contextlib.nullcontext`.
A host serialising model jobs (the studio's device lock) passes a `between` that lets the
jobs waiting run inside ``as_found()``; a script passes none. The numbers a job computes
never depend on whether, or how often, turns were given (tests check it).

`inside` nests the boundaries of a part of a job (a generation batch) in the state the job
holds around that part (a row's edit applied); `Held` is that state, left and entered again;
`random_kept` and `modes_as` are the usual pieces of an `as_found`.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

AsFound = Callable[[], ContextManager]
Between = Callable[[AsFound], None]
"""`between(as_found)`, called at a step boundary (see the module docstring)."""


def give(between: Between | None, as_found: AsFound = nullcontext) -> None:
    """A step boundary: `between(as_found)` where there is a `between`."""
    if between is not None:
        between(as_found)


def inside(between: Between | None, as_found: AsFound) -> Between | None:
    """The `between` for the steps of a part of a job that runs in the state `as_found`
    undoes (an edit applied, a mode set): each step's own as_found is undone first (it was
    made last), then `as_found`'s; on the way back, the reverse."""
    if between is None:
        return None

    def nested(inner: AsFound = nullcontext) -> None:
        @contextmanager
        def both() -> Iterator[None]:
            with inner(), as_found():
                yield
        between(both)
    return nested


class Held:
    """The contexts a part of a job holds the model in (factories of context managers,
    entered in order: an edit applied, a prefix cache's hooks, quantized weights), which
    `left` exits for a block and enters again after: ``between(held.left)``. Each is a
    context that puts the model back exactly on exit (`grom.edit.Edit.applied`,
    `grom.eval.quant.quantized`), so entering it again gives the same state bit for bit."""

    def __init__(self, *factories: AsFound | None):
        self.factories = [f for f in factories if f is not None]
        self._stack: ExitStack | None = None
        self.entered: list = []  # what each context gave when last entered (`quantized`'s QuantInfo)

    def __enter__(self) -> "Held":
        stack = ExitStack()
        try:
            self.entered = [stack.enter_context(factory()) for factory in self.factories]
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc) -> bool:
        stack, self._stack = self._stack, None
        return bool(stack is not None and stack.__exit__(*exc))

    @contextmanager
    def left(self) -> Iterator[None]:
        """The model as it was before `__enter__` for the block; then held again."""
        stack, self._stack = self._stack, None
        if stack is None:  # not held: nothing to leave
            yield
            return
        stack.close()
        try:
            yield
        finally:
            self.__enter__()


def _rng_devices() -> list[int]:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


@contextmanager
def random_kept() -> Iterator[None]:
    """The random state (torch's CPU generator and every CUDA one) put back after the
    block: a job drawing random numbers (sampling, dropout) draws the same ones whatever
    other jobs drew while it lent the model."""
    devices = _rng_devices()
    cpu, cuda = torch.random.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        for d, state in zip(devices, cuda):
            torch.cuda.set_rng_state(state, d)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for the block, then every module in the mode it had."""
    found = modes(model)
    model.eval()
    try:
        yield
    finally:
        for m, training in found.items():
            m.training = training


def modes(model: nn.Module) -> dict[nn.Module, bool]:
    """Every module's train/eval mode, to put back (`modes_as`)."""
    return {m: m.training for m in model.modules()}


@contextmanager
def modes_as(model: nn.Module, found: dict[nn.Module, bool]) -> Iterator[None]:
    """Modules in the modes `found` for the block (the model as a job found it), then in
    the modes they had."""
    now = modes(model)
    for m, training in found.items():
        m.training = training
    try:
        yield
    finally:
        for m, training in now.items():
            m.training = training


@contextmanager
def flags_as(model: nn.Module, found: list[bool]) -> Iterator[None]:
    """Parameters' requires_grad flags as `found` (one per `model.parameters()`) for the
    block, then as they were."""
    params = list(model.parameters())
    now = [p.requires_grad for p in params]
    for p, flag in zip(params, found):
        p.requires_grad_(flag)
    try:
        yield
    finally:
        for p, flag in zip(params, now):
            p.requires_grad_(flag)
