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
import random
import shutil
import socket
import subprocess
import tempfile
import threading
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


class CuttingProxy:
    """A TCP proxy to ``target`` on 127.0.0.1 that can cut its connections: all at once
    (``cut_all``) or, with ``chaos(interval)``, one at random every ``interval`` seconds."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.cuts = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, schema: str) -> str:
        return f"postgresql://whetstone@127.0.0.1:{self.port}/postgres?schema={schema}"

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            if self._paused.is_set():
                client.close()  # the store looks down: refused at once
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):  # no Nagle: each small message goes at once
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _cut(self, pair: tuple[socket.socket, socket.socket]) -> None:
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        self.cuts += 1

    def cut_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._cut(pair)

    def pause(self) -> None:
        """Make the store look down: cut every connection and refuse new ones."""
        self._paused.set()
        self.cut_all()

    def resume(self) -> None:
        self._paused.clear()

    def chaos(self, interval: float, seed: int = 0) -> None:
        """Cut one live connection at random every ``interval`` seconds until ``close``."""
        rng = random.Random(seed)

        def run() -> None:
            while not self._stop.wait(interval):
                with self._lock:
                    self._pairs = [p for p in self._pairs if p[0].fileno() != -1]
                    pair = self._pairs.pop(rng.randrange(len(self._pairs))) \
                        if self._pairs else None
                if pair is not None:
                    self._cut(pair)

        threading.Thread(target=run, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.cut_all()
        self.server.close()
