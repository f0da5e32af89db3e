"""The UI's edge: every exception becomes a `gr.Error` that says what to do.

`ui_errors` wraps a handler. Errors the user can act on (bad input, no network, an
unsupported model, a malformed file) keep their message; running out of memory frees the
cache and says how to need less; anything else is logged with its traceback and reported
briefly. Messages never show the server's absolute paths (`scrub_paths`) and never
repeat more than a little of what the user typed (`shorten`). The session is never
touched here, so it keeps its state.

`ui_errors` also starts the job's clock (`JOB_STARTED`): a handler's wall time counts
from the moment gradio runs it (not from when it joined the queue), and a job past
GROM_MAX_JOB_SECONDS stops at its next forward pass (`components.server.device`). A
stopped or cancelled job's traceback is cleared and its memory given back at once.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import gradio as gr
import torch

log = logging.getLogger(__name__)

ECHO_CHARS = 80  # the most of a user's input a message repeats
MESSAGE_CHARS = 1000  # the longest message shown
REPO_ROOT = Path(__file__).resolve().parents[2]

JOB_STARTED: ContextVar[float | None] = ContextVar("grom_job_started", default=None)
"""When the handler running in this context started (`time.monotonic()`), set by
`ui_errors` (the outermost one); None outside a handler (a script, a test, the preload)."""
JOB_NAME: ContextVar[str | None] = ContextVar("grom_job_name", default=None)
"""The name of the handler running in this context (what kind of job it is: the device's
line names the jobs ahead of a waiting one by it), set by the outermost `ui_errors`."""

OOM_HINT = ("Out of memory on the device. Try fewer examples (Advanced settings: retain "
            "examples, key budgets), a smaller batch, a narrower band, bfloat16, or a smaller model.")


def shorten(value, limit: int = ECHO_CHARS) -> str:
    """`value` as text of at most `limit` characters: what a message may repeat of an input."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _path_roots() -> list[tuple[str, str]]:
    """(absolute folder of the server, what a message shows instead), the longest first."""
    roots = {REPO_ROOT: "", Path(sys.prefix): "<python>", Path(sys.base_prefix): "<python>",
             Path(tempfile.gettempdir()): "<tmp>", Path.home(): "~"}
    for env in ("GROM_MODELS_DIR", "GROM_DATA_DIR"):
        if os.environ.get(env):
            roots[Path(os.environ[env])] = Path(os.environ[env]).name
    pairs = {(str(p), shown) for folder, shown in roots.items()
             for p in (folder.absolute(), folder.resolve()) if len(p.parts) > 1}
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def scrub_paths(message: str) -> str:
    """`message` with the server's absolute folders written relative: /srv/app/models/x ->
    models/x, a temporary upload -> <tmp>/..., the home folder -> ~."""
    for root, shown in _path_roots():
        message = re.sub(re.escape(root) + r"(/|(?![\w.-]))",
                         lambda m: (shown + m.group(1)) if shown else ("" if m.group(1) else "."),
                         message)
    return message


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, (RuntimeError, MemoryError)) and (
        isinstance(err, MemoryError) or "out of memory" in str(err).lower())


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_initialized():  # asks no device (a ZeroGPU main process has none)
        torch.cuda.empty_cache()


def message_for(err: BaseException) -> str:
    """The text a user sees for `err`."""
    if _is_oom(err):
        _free_memory()
        return OOM_HINT

    if isinstance(err, JobCancelled):
        return str(err)
    if isinstance(err, (ValueError, FileNotFoundError, TypeError, KeyError, FloatingPointError,
                        LookupError, OSError)):
        text = str(err).strip().strip("'\"") or _empty_message(err)
    else:
        text = f"Something went wrong ({type(err).__name__}: {err}). The details are in the server log."
    return shorten(scrub_paths(text), MESSAGE_CHARS)


def _empty_message(err: BaseException) -> str:
    """A message for an exception raised without one (float('nan') to int, say)."""
    return (f"An input could not be used ({type(err).__name__}); check that every number is "
            "finite and in range.")


def ui_errors(fn):
    """Turn every exception of handler `fn` into a `gr.Error` with an actionable message.
    A generator handler (one that streams its results) is wrapped step by step: gradio may
    run each step in another thread, so nothing set for the job outlives a step, but the
    job's clock (GROM_MAX_JOB_SECONDS) runs from its first step."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            started = time.monotonic()
            yield from each_step(lambda: fn(*args, **kwargs), lambda: _as_job(fn.__name__, started))

        return steps

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _as_job(fn.__name__, time.monotonic()):
            return fn(*args, **kwargs)

    return wrapper


def each_step(make: Callable[[], Iterator], around: Callable[[], ContextManager]) -> Iterator:
    """The values of the generator `make()`, each of its steps (its creation with the first)
    run inside a fresh `around()`, nothing held between them: how a wrapper of a streaming
    handler does per step what it does around a plain one (gradio may run each step in
    another thread). The generator is closed with this one."""
    gen = None
    try:
        while True:
            with around():
                if gen is None:
                    gen = make()
                try:
                    value = next(gen)
                except StopIteration:
                    return
            yield value
    finally:
        if gen is not None:
            gen.close()


@contextlib.contextmanager
def _as_job(name: str, started: float):
    """The job's clock and name for the code inside (unless an outer handler set them), and
    its exceptions made `gr.Error`s: a cancelled one frees its work first."""
    clock = JOB_STARTED.set(started) if JOB_STARTED.get() is None else None
    named = JOB_NAME.set(name) if clock is not None else None
    try:
        yield
    except gr.Error:
        raise
    except JobCancelled as err:  # stopped (cancelled, or past GROM_MAX_JOB_SECONDS): free its work now
        log.info("%s stopped: %s", name, err)
        message = message_for(err)
        traceback.clear_frames(err.__traceback__)  # the frames hold the job's activations
        del err
        _release()
        raise gr.Error(message, print_exception=False) from None
    except UserError as err:  # a bad input or a state the user can fix: said to them, no traceback kept
        log.info("%s refused: %s", name, shorten(err, 300))
        message = message_for(err)
        traceback.clear_frames(err.__traceback__)  # the frames hold the request's inputs
        raise gr.Error(message, print_exception=False) from None
    except Exception as err:  # the UI edge: report, log, keep serving
        log.warning("%s failed", name, exc_info=True)
        raise gr.Error(message_for(err), print_exception=False) from err
    finally:
        if clock is not None:
            JOB_STARTED.reset(clock)
            JOB_NAME.reset(named)


def _release() -> None:
    from grom.model.process_memory import release_memory  # collect, empty the device cache, trim the C heap

    release_memory()


class UserError(ValueError):
    """A bad input or a state the user can fix; its message says what to do."""


class JobCancelled(Exception):
    """The visitor cancelled the job or left the page: stop and free the device."""


class JobTimedOut(JobCancelled):
    """The job ran past GROM_MAX_JOB_SECONDS: stopped like a cancelled one (the model is
    given back unedited), with a message that says the limit and how to ask for less."""
