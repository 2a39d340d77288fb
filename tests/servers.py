"""Run a real ASGI app under uvicorn on 127.0.0.1 in a background thread, for tests.

``with running_server(app) as url: ...`` yields ``http://127.0.0.1:<port>``. The socket is bound
before the server starts (port 0: the OS picks a free one), so there is no race for a port and
the URL accepts connections as soon as it is returned.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    """A port that nothing listens on (bound, then released): connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(app: Any, *, port: int = 0, startup_timeout_s: float = 20.0,
                   graceful_shutdown_s: float = 1.0) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (without ``/v1``). ``port``: a
    given one (an upstream that comes up after being down), or 0 for a free one."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=graceful_shutdown_s)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"test server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=graceful_shutdown_s + 10)
        sock.close()


class Servers(contextlib.ExitStack):
    """Starts any number of apps and stops them all when the ``with`` block ends.

    ``servers.start(app)`` returns the base URL (without ``/v1``).
    """

    def start(self, app: Any) -> str:
        return self.enter_context(running_server(app))


def wait_healthy(base: str, proc: Any, log: Any, timeout_s: float = 240.0,
                 path: str = "/health") -> None:
    """Wait until a server process at ``base`` answers ``path`` with 200; fail the test
    with the end of its ``log`` (a Path) when it exits or ``timeout_s`` passes first."""
    import httpx
    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the server at {base} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
