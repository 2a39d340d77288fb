"""A throwaway PostgreSQL cluster for the tests of the PostgreSQL store (issue 49).

One cluster per test session (``pg_cluster``), made with ``initdb`` and ``pg_ctl`` in a temp
folder and removed at the end; each test gets a schema of its own in it (``pg_url``), so tests
share nothing but the server. PostgreSQL refuses to run as root, and CI runs as root: there
the cluster runs as ``nobody`` through ``runuser``. Without PostgreSQL's programs, psycopg, or
(as root) ``runuser``, the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

UNPRIVILEGED = "nobody"


def pg_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (``initdb``, ``pg_ctl``), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True):
        return Path(candidate).parent
    return None


def unavailable() -> str | None:
    """Why no cluster can be started here (None: one can)."""
    try:
        import psycopg  # noqa: F401  optional: the scale extra
    except ImportError:
        return "psycopg is not installed (pip install 'whetstone-engine[scale]')"
    if pg_bin() is None:
        return "PostgreSQL's initdb is not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """A PostgreSQL server in ``base`` on 127.0.0.1:``port`` (trust auth, no fsync)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = free_port()
        self.bin = pg_bin()
        assert self.bin is not None

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", UNPRIVILEGED, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                              cwd=self.base)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.base, UNPRIVILEGED)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "whetstone",
                  "-E", "UTF8", "--no-sync", "--no-instructions")
        self.start()

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=400")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l",
                  str(self.base / "server.log"), "-w", "-t", "60", "start", timeout=90)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                  timeout=90)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (connections are cut), wait ``down_s``, start it again."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def url(self, schema: str) -> str:
        return f"postgresql://whetstone@127.0.0.1:{self.port}/postgres?schema={schema}"

    def remove(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    # Not under pytest's own temp folder: that one is private to root, and the server runs
    # as an unprivileged user.
    cluster = PgCluster(Path(tempfile.mkdtemp(prefix="whetstone-pg-")))
    try:
        cluster.init()
    except subprocess.CalledProcessError as exc:
        cluster.remove()
        pytest.skip(f"cannot start a PostgreSQL cluster: {exc.stderr.strip()[-500:]}")
    yield cluster
    cluster.remove()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A store URL whose schema no other test uses; its connections close after the test."""
    url = pg_cluster.url(f"t_{uuid.uuid4().hex[:16]}")
    yield url
    from whetstone.library_store.pg_library import close_store  # lazy: psycopg

    close_store(url)
