"""MCP servers for the tests: real ones from the package registries (installed by `make
mcp-servers` under .cache/mcp-servers; skipped with the reason when missing) and the SDK-built
test server of tests/fixtures/mcp_test_server.py (stdio, or streamable HTTP in a subprocess)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from servers import free_port

REPO = Path(__file__).resolve().parent.parent
SERVERS = Path(os.environ.get("WHETSTONE_TEST_MCP_SERVERS", REPO / ".cache" / "mcp-servers"))
SQLITE = SERVERS / "sqlite-venv" / "bin" / "mcp-server-sqlite"
FILESYSTEM = SERVERS / "npm" / "node_modules" / ".bin" / "mcp-server-filesystem"
TEST_SERVER = REPO / "tests" / "fixtures" / "mcp_test_server.py"
SHOP_DB = REPO / "benchmarks" / "fixtures" / "mcp_shop" / "shop.db"


def sqlite_server() -> Path:
    """mcp-server-sqlite from PyPI, or a skip saying how to install it."""
    if not SQLITE.is_file():
        pytest.skip(f"mcp-server-sqlite (PyPI) is not installed at {SQLITE}: run "
                    "`make mcp-servers`")
    return SQLITE


def filesystem_server() -> Path:
    """@modelcontextprotocol/server-filesystem from npm, or a skip with the reason."""
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed: the npm MCP server cannot run")
    if not FILESYSTEM.is_file():
        pytest.skip(f"@modelcontextprotocol/server-filesystem (npm) is not installed at "
                    f"{FILESYSTEM}: run `make mcp-servers`")
    return FILESYSTEM


def sdk_server_command(name: str = "test", log: Path | None = None) -> str:
    """The ``--mcp`` line of the SDK-built test server over stdio, named ``name``."""
    extra = f" --log {log}" if log is not None else ""
    return f"{name}={sys.executable} {TEST_SERVER} stdio --name {name}{extra}"


def starts(log: Path) -> list[int]:
    """The pids of the test servers that logged a start in ``log``."""
    if not log.is_file():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines()
            if line.startswith("start ")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped yet) is gone for our purposes
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@contextmanager
def http_test_server(*, token: str | None = None, name: str = "web",
                     log: Path | None = None) -> Iterator[str]:
    """The SDK-built test server over streamable HTTP in its own process; yields its /mcp
    URL."""
    port = free_port()
    cmd = [sys.executable, str(TEST_SERVER), "http", str(port), "--name", name]
    cmd += ["--token", token] if token else []
    cmd += ["--log", str(log)] if log else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test MCP server did not start: "
                                       f"{proc.stderr.read() if proc.stderr else ''}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def red_png() -> bytes:
    """A small red PNG."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (3, 2), (255, 0, 0)).save(out, format="PNG")
    return out.getvalue()
