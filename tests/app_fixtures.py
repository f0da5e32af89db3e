"""The app launched in this process on a free port, for the API and browser tests."""
from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model: str):
    """Preload `model`, build the app and launch it on a free port; (blocks, url)."""
    import app

    assert app.preload(model) == model, f"{model} could not be loaded"
    from components.server.session import REGISTRY

    blocks = app.build_app()
    REGISTRY.unload_visitors()  # as a fresh server: the start model only, not earlier modules' models
    _, local_url, _ = blocks.launch(server_name="127.0.0.1", server_port=free_port(),
                                    prevent_thread_lock=True, quiet=True, **app.launch_kwargs())
    return blocks, local_url


@pytest.fixture(scope="module")
def url():
    """The local URL of a freshly built app on the demo model (closed after the module)."""
    from components.server.allowed_sources import DEMO

    blocks, local_url = launch(DEMO)
    yield local_url
    blocks.close()


@pytest.fixture(scope="module")
def real_url():
    """The app on the real chat model, as `python app.py` opens it (fetched on first use)."""
    from components.server.allowed_sources import REAL

    blocks, local_url = launch(REAL)
    yield local_url
    blocks.close()
