"""Which version is current, as a process on another machine learns it: LISTEN/NOTIFY, with
polling as the fallback.

A commit to the PostgreSQL store sends ``NOTIFY whetstone_<schema>, 'vN'`` in its own
transaction, so the notification leaves the server exactly when the new pointer is visible.
``VersionFollower`` keeps one connection that LISTENs; every ``current()`` (a served request
asks once or more) checks that connection's socket without blocking, one ``select`` with no
wait, and reads what arrived: a request that starts after the notification reached this
machine serves the new version, with no thread to be scheduled first. While the listening
connection is down (the server restarted, a proxy cut it) ``current()`` reads the pointer
itself at most every ``poll_s`` and tries to listen again as often.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from whetstone.library_store.pg_connect import Pool, lost_errors

log = logging.getLogger("whetstone.library")

POLL_S = 0.5


class VersionFollower:
    """The current version id of one store, kept by notifications (see the module)."""

    def __init__(self, pool: Pool, read_current: Callable[[], str | None], *,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.read_current = read_current
        self.poll_s = poll_s
        self.clock = clock
        self.notified = 0  # notifications applied (tests read it)
        self.polls = 0  # reads of the pointer made because no listener was up
        self._conn: Any = None
        self._value: str | None = None
        self._read_at = float("-inf")
        self._listen_tried = float("-inf")
        self._lock = threading.Lock()

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def current(self) -> str | None:
        """The current version id (None: the store holds no library yet)."""
        with self._lock:
            if not self.listening:
                self._listen()
            if self.listening:
                self._drain()
            if not self.listening and self.clock() - self._read_at >= self.poll_s:
                self.polls += 1
                self._set(self.read_current())
            return self._value

    def changed(self, version: str) -> None:
        """This process made ``version`` current (its own commit): no need to wait for the
        notification of it."""
        with self._lock:
            self._value = version

    def _set(self, value: str | None) -> None:
        self._value = value
        self._read_at = self.clock()

    def _listen(self) -> None:
        """Open the listening connection (at most every ``poll_s`` while it fails), then read
        the pointer once: what changed while nobody listened is not announced again."""
        now = self.clock()
        if now - self._listen_tried < self.poll_s:
            return
        self._listen_tried = now
        try:
            conn = self.pool.connect()
            conn.execute(f"LISTEN {self.pool.url.channel}")
        except Exception as exc:  # noqa: BLE001 - polling covers for it; logged once a try
            log.debug("cannot listen for new versions (polling instead): %s", exc)
            return
        self._conn = conn
        try:
            self._set(self.read_current())
        except Exception as exc:  # noqa: BLE001 - the next call polls again
            log.debug("cannot read the current version: %s", exc)
            self._drop()

    def _drain(self) -> None:
        """Apply what the listening socket holds, without waiting for more."""
        conn = self._conn
        try:
            ready, _, _ = select.select([conn.fileno()], [], [], 0)
            if not ready:
                return
            for note in conn.notifies(timeout=0):
                if note.channel == self.pool.url.channel and note.payload:
                    self.notified += 1
                    self._set(note.payload)
        except (*lost_errors(), OSError, ValueError) as exc:
            log.info("lost the connection that listens for new versions (%s); polling every "
                     "%.1f s until it is back", exc, self.poll_s)
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self._read_at = float("-inf")  # poll at once

    def close(self) -> None:
        with self._lock:
            self._drop()
