"""Forward hooks as context managers that always remove themselves.

`capture_inputs` records a module's input (the "keys" of a matrix) at chosen positions;
`capture_outputs` records its output; `stop_after` ends the forward pass once a module
has run, so layers past the last one needed cost nothing; `capture_call` records the
arguments a module was called with (used to re-run a decoder layer on cached states).

(Was `grom/hooks.py`.)
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn


class StopForward(Exception):
    """Raised by `stop_after` to end a forward pass early; caught by `stop_after`."""


def _first_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@contextmanager
def hooked(module: nn.Module, hook: Callable, *, pre: bool = False, with_kwargs: bool = False):
    """Register a (pre-)forward hook for the duration of the block, removed in `finally`."""
    if pre:
        handle = module.register_forward_pre_hook(hook, with_kwargs=with_kwargs)
    else:
        handle = module.register_forward_hook(hook, with_kwargs=with_kwargs)
    try:
        yield handle
    finally:
        handle.remove()


@contextmanager
def capture_inputs(module: nn.Module, select: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[list]:
    """Collect ``select(input)`` on every call of `module` into the yielded list.

    `select` maps the module's first input, (B, T, n), to what should be kept, e.g. the
    rows at the key positions, (k, n). It runs inside the forward pass, so only what it
    returns is kept.
    """
    out: list = []

    def hook(_module, args):
        out.append(select(_first_tensor(args)))

    with hooked(module, hook, pre=True):
        yield out


@contextmanager
def capture_outputs(module: nn.Module, select: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[list]:
    """Collect ``select(output)`` on every call of `module` into the yielded list."""
    out: list = []

    def hook(_module, _args, output):
        out.append(select(_first_tensor(output)))

    with hooked(module, hook):
        yield out


@contextmanager
def capture_call(module: nn.Module) -> Iterator[list]:
    """Collect the ``(args, kwargs)`` of every call of `module`."""
    calls: list = []

    def hook(_module, args, kwargs):
        calls.append((args, dict(kwargs)))

    with hooked(module, hook, pre=True, with_kwargs=True):
        yield calls


@contextmanager
def stop_after(module: nn.Module | None):
    """End any forward pass inside the block as soon as `module` has run.

    The StopForward it raises is swallowed here, so ``with stop_after(m): model(x)``
    simply returns early. None disables stopping.
    """
    if module is None:
        yield
        return

    def hook(_module, _args, _output):
        raise StopForward

    try:
        with hooked(module, hook):
            yield
    except StopForward as stop:
        drop_frames(stop)


def drop_frames(stop: BaseException) -> None:
    """Free now the frames of the forward pass that `stop` ended, and their activations.

    Its traceback holds them; where an exit handler on the way kept the exception in a
    local (ExitStack does), they form a reference cycle that only Python's cyclic
    collector frees, which runs on object counts, not bytes: on a GPU, passes ended this
    way piled up 2-4 GiB a band layer (bench_gpu.py, muse-8b on an H100)."""
    traceback.clear_frames(stop.__traceback__)  # skips the frames still running
    stop.__traceback__ = None
