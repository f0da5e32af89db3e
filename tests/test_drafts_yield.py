"""The drafted passes a page's warm-up records ahead of the first card (`record_ahead`) are
one long forward each, with no step boundary inside: they stop at the next decoder layer
once a visitor's job waits for the device (`yielding`), and start again once the device has
been quiet. Issue 49: B's question and A's Run edit had waited 10 s behind one."""
from __future__ import annotations

import threading
import time

from components.server.device import DEVICE_LOCK
from components.server.model_choices import ensure_model, model_key
from components.studio import comparison


class FakeCache:
    def __init__(self):
        self.done = False

    def marked(self, *_):
        return self.done


def test_a_drafted_pass_gives_the_device_to_a_visitor_at_once_and_finishes_after(monkeypatch):
    handle = ensure_model(model_key("demo", "cpu", "float32"))  # its decoder layers check for waiting visitors
    cache, started, runs = FakeCache(), threading.Event(), []

    def record_drafts(model, *_args, **_kw):  # a long forward: many passes of the demo model, no step boundary
        import torch

        ids = torch.randint(0, 100, (4, 32))
        runs.append("start")
        started.set()
        deadline = time.monotonic() + (8.0 if len(runs) == 1 else 0.3)
        with torch.no_grad():
            while time.monotonic() < deadline:
                model(input_ids=ids)
        cache.done = True

    monkeypatch.setattr(comparison, "kept_cache", lambda _cache: cache)
    monkeypatch.setattr(comparison, "record_drafts", record_drafts)
    monkeypatch.setattr(comparison, "DRAFT_QUIET_S", 0.2)
    worker = threading.Thread(target=comparison.record_ahead, args=(handle, None, None, 5, 3), daemon=True)
    worker.start()
    assert started.wait(10)
    time.sleep(0.3)
    t0 = time.monotonic()
    with DEVICE_LOCK:  # a visitor's job: it had waited for the whole 8 s forward
        waited = time.monotonic() - t0
    worker.join(30)
    assert waited < 2.0, f"the visitor waited {waited:.1f} s behind the drafted pass"
    assert cache.done and runs == ["start", "start"]  # stopped, then recorded again from the beginning
