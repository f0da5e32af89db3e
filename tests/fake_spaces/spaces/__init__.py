"""A stand-in for Hugging Face's `spaces` package as it behaves on a ZeroGPU Space, for the
tests (tests/test_zerogpu.py puts this folder first on sys.path, with SPACES_ZERO_GPU set).

What it keeps of the real one (spaces 0.51.3, read in `spaces/zero/decorator.py`,
`wrappers.py`, `client.py`; written here from that reading, not copied):
- `GPU` bare, `GPU(duration=N)` or `GPU(duration=callable)`: the callable is called in the
  parent with the call's arguments; the seconds asked (default 60) are recorded in `CALLS`
  and refused above `MAX_DURATION_S` ("ZeroGPU illegal duration"), as the server does.
- each call runs in a process forked from the caller (multiprocessing "fork"), its
  arguments pickled there and its result (or exception) pickled back; whatever it changes
  stays in that process. A GPU function called inside one runs inline (the real wrapper's
  `forked` flag).
- the parent has no CUDA: the `torch.cuda` functions of `CUDA_CALLS` raise there from the
  moment this module is imported (the real one patches them to fake a device; raising is
  stricter: the app must not ask); the worker gets them back.
- imported after CUDA was initialised, it raises as the real one does; `TORCH_BEFORE` records
  whether torch was imported before it (on a Space the app imports `spaces` first).
Unlike the real one, a worker is never reused (a fresh fork per call: the stricter case
for state that would have to survive between calls) and any exception comes back as it
is (the real one passes a `gr.Error` on and reduces others to their class name).
"""
from __future__ import annotations

import functools
import multiprocessing
import pickle
import sys
import traceback
from typing import Callable

TORCH_BEFORE = "torch" in sys.modules  # whether the importer brought torch in before `spaces`

import torch  # noqa: E402

if torch.cuda.is_initialized():  # what the real package refuses at import, in the same words
    raise RuntimeError("CUDA has been initialized before importing the `spaces` package")

MAX_DURATION_S = 300
DEFAULT_DURATION_S = 60
CALLS: list[tuple[str, int]] = []  # (function name, seconds asked), in call order
CUDA_CALLS = ("is_available", "mem_get_info", "synchronize", "empty_cache", "device_count", "current_device",
              "get_device_name", "get_device_properties", "get_device_capability", "memory_allocated",
              "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats", "init", "set_device")
_REAL = {name: getattr(torch.cuda, name) for name in CUDA_CALLS}
_FORK = multiprocessing.get_context("fork")
in_worker = False


def _forbidden(name: str) -> Callable:
    def call(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
            # torch asking itself (a CUDA build's AdamW.step checks is_available() for graph
            # capture): the real package answers those with its fake device; only the app's
            # own questions are refused
            return _REAL[name](*args, **kwargs)
        raise RuntimeError(f"torch.cuda.{name}() in the main process of a ZeroGPU Space (no GPU there)")
    return call


def forbid_cuda() -> None:
    for name in CUDA_CALLS:
        setattr(torch.cuda, name, _forbidden(name))


def _allow_cuda() -> None:
    for name, fn in _REAL.items():
        setattr(torch.cuda, name, fn)


def _asked(duration, args, kwargs) -> int:
    seconds = duration(*args, **kwargs) if callable(duration) else duration
    seconds = DEFAULT_DURATION_S if seconds is None else seconds
    if not 0 < seconds <= MAX_DURATION_S:
        raise RuntimeError(f"ZeroGPU illegal duration: the requested GPU duration ({seconds}s) is larger "
                           "than the maximum allowed" if seconds > 0 else f"ZeroGPU: duration {seconds}s")
    return seconds


def _work(task: Callable, payload: bytes, send) -> None:
    global in_worker
    in_worker = True
    _allow_cuda()
    torch.set_num_threads(1)  # OpenMP's pool of the parent does not survive the fork
    try:
        args, kwargs = pickle.loads(payload)
        reply = (True, task(*args, **kwargs))
    except BaseException as err:  # noqa: BLE001  (every failure goes back to the parent)
        reply = (False, err)
    try:
        data = pickle.dumps(reply)
    except Exception as err:  # noqa: BLE001
        data = pickle.dumps((False, RuntimeError(f"{task.__name__}: result not picklable: {err!r}\n"
                                                 f"{traceback.format_exc()}")))
    send.send_bytes(data)
    send.close()


def _run_forked(task: Callable, args: tuple, kwargs: dict):
    payload = pickle.dumps((args, kwargs))  # what cannot cross fails here, in the parent
    recv, send = _FORK.Pipe(duplex=False)
    proc = _FORK.Process(target=_work, args=(task, payload, send), daemon=True)
    proc.start()
    send.close()
    try:
        data = recv.recv_bytes()
    except EOFError:
        data = None
    proc.join()
    if data is None:
        raise RuntimeError(f"GPU task aborted: {task.__name__} (worker exit code {proc.exitcode})")
    ok, value = pickle.loads(data)
    if ok:
        return value
    raise value


def GPU(task: Callable | None = None, *, duration=None, size=None):
    """`@GPU`, `@GPU(duration=...)`: see the module's docstring."""
    if task is None:
        return functools.partial(GPU, duration=duration, size=size)

    @functools.wraps(task)
    def call(*args, **kwargs):
        if in_worker:
            return task(*args, **kwargs)
        CALLS.append((task.__name__, _asked(duration, args, kwargs)))
        return _run_forked(task, args, kwargs)

    call.zerogpu = None
    return call


forbid_cuda()
