"""The one device: the lock and the queue every model job runs under, the GPU decorator of
a ZeroGPU Space, and cancellation.


- `DEVICE_LOCK` and the queue id `DEVICE_QUEUE` serialise everything that touches the model.
  A request that needs the edited model applies its session's patch, computes and reverts
  in a `finally`, all while holding the lock, so the base weights are never left edited
  between requests and no request sees another session's patch.
- A job the visitor cancelled, or whose page went away, stops at its next forward pass
  (`JobCancelled`, raised by a hook every resident model carries), so it frees the lock
  in a fraction of a second instead of running to its end.
- `on_device` marks the compute functions: `spaces.GPU` on a ZeroGPU Space, plain
  functions elsewhere. They take plain values and return plain values; sessions are
  only changed outside them (on ZeroGPU they run in another process).
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

from anyio import from_thread
from gradio.context import LocalContext

from components.core.errors import JobCancelled
from grom.arch import decoder_layers

DEVICE_LOCK = threading.RLock()


DEVICE_QUEUE = "device"  # the concurrency_id of every event that touches the model


def _gpu_decorator() -> tuple[Callable, bool]:
    try:
        import spaces  # noqa: F401  (only on Hugging Face Spaces)
    except ImportError:
        return (lambda fn: fn), False
    return spaces.GPU, True


on_device, ON_SPACES = _gpu_decorator()


def on_device_for(seconds: int) -> Callable:
    """`on_device` for long work (training a baseline): on ZeroGPU, a GPU slot of up to
    `seconds` (`spaces.GPU(duration=...)`; the default slot is 60 s); elsewhere a no-op."""
    if not ON_SPACES:
        return lambda fn: fn
    import spaces

    return spaces.GPU(duration=seconds)


def device_progress(callback: Callable | None) -> Callable | None:
    """A progress callback to hand to an `on_device` function (it also stops a cancelled
    job at each stage): on ZeroGPU those run in another process and take only plain,
    picklable values, so none is passed there."""
    if ON_SPACES or callback is None:
        return None

    def report(*args, **kwargs):
        check_cancelled()
        return callback(*args, **kwargs)

    return report


CANCEL_CHECK_S = 0.2  # how often a running job asks whether it was cancelled


def _event_gone() -> bool:
    """In gradio's event loop: whether this thread's job was cancelled or lost its client.
    Gradio cancels by cancelling the asyncio task that waits for the handler's thread (the
    thread itself runs on), and marks a job whose page went away as not alive."""


    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    event = queue.event_ids_to_events.get(event_id) if queue is not None else None
    if event is None or not event.alive:
        return True
    suffix = f"<gradio-sep>{event_id}"
    return any(task.get_name().endswith(suffix) and task.cancelling()
               for task in asyncio.all_tasks())


_checked = threading.local()


def job_cancelled() -> bool:
    """Whether the gradio job this thread runs was cancelled (asked at most every
    CANCEL_CHECK_S; False outside a queued gradio job: a script, a test, the preload)."""
    try:

        event_id = LocalContext.event_id.get(None)
        if event_id is None or LocalContext.blocks.get(None) is None:
            return False
        now = time.monotonic()
        if getattr(_checked, "event", None) == event_id and now - _checked.at < CANCEL_CHECK_S:
            return False
        _checked.event, _checked.at = event_id, now

        return bool(from_thread.run_sync(_event_gone))
    except Exception:  # not in a worker thread of gradio's loop (or gradio changed): run on
        return False


def check_cancelled() -> None:
    if job_cancelled():
        raise JobCancelled("The job was cancelled; nothing was changed.")


def _cancel_hook(module, args):
    check_cancelled()


def add_cancel_hooks(model) -> None:
    """Every forward pass of `model` and of each of its decoder layers first checks that
    its job is still wanted (a batch of keys, a generated token, a training step)."""
    model.register_forward_pre_hook(_cancel_hook)
    try:
        layers = decoder_layers(model)
    except Exception:  # an unsupported family is refused elsewhere
        return
    for layer in layers:
        layer.register_forward_pre_hook(_cancel_hook)
