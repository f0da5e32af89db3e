"""The UI's edge: every exception becomes a `gr.Error` that says what to do.

`ui_errors` wraps a handler. Errors the user can act on (bad input, no network, an
unsupported model, a malformed file) keep their message; running out of memory frees the
cache and says how to need less; anything else is logged with its traceback and reported
briefly. The session is never touched here, so it keeps its state.
"""
from __future__ import annotations

import functools
import logging

import gradio as gr
import torch

log = logging.getLogger(__name__)

OOM_HINT = ("Out of memory on the device. Try fewer examples (Advanced settings: retain "
            "examples, key budgets), a smaller batch, a narrower band, bfloat16, or a smaller model.")


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, (RuntimeError, MemoryError)) and (
        isinstance(err, MemoryError) or "out of memory" in str(err).lower())


def _free_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def message_for(err: BaseException) -> str:
    """The text a user sees for `err`."""
    if _is_oom(err):
        _free_memory()
        return OOM_HINT
    if isinstance(err, (ValueError, FileNotFoundError, TypeError, KeyError, FloatingPointError,
                        LookupError, OSError)):
        return str(err).strip().strip("'\"") or type(err).__name__
    return f"Something went wrong ({type(err).__name__}: {err}). The details are in the server log."


def ui_errors(fn):
    """Turn every exception of handler `fn` into a `gr.Error` with an actionable message."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as err:  # the UI edge: report, log, keep serving
            log.warning("%s failed", fn.__name__, exc_info=True)
            raise gr.Error(message_for(err), print_exception=False) from err

    return wrapper
