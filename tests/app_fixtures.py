"""The app launched in this process on a free port, for the API and browser tests."""
from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    """The local URL of a freshly built app on the demo model (closed after the module)."""
    import app

    app.preload()
    demo = app.build_app()
    _, local_url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(),
                                  prevent_thread_lock=True, quiet=True, **app.launch_kwargs())
    yield local_url
    demo.close()
