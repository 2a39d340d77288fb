"""Which version is current, as a process on another machine learns it: LISTEN/NOTIFY, with
polling as the fallback.

A commit to the PostgreSQL store sends ``NOTIFY whetstone_<schema>, 'vN'`` in its own
transaction, so the notification leaves the server exactly when the new pointer is visible.
``VersionFollower`` keeps one connection that LISTENs; every ``current()`` (a served request
asks once or more) checks that connection's socket without blocking, one ``select`` with no
wait, and reads what arrived: a request that starts after the notification reached this
machine serves the new version, with no thread to be scheduled first.

While the listening connection is down (the server restarted, a proxy cut it) ``current()``
answers at once with the version it last knew, and a background thread reads the pointer
every ``poll_s`` and tries to listen again as often; a request never waits on a store that
does not answer.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
from collections.abc import Callable
from typing import Any

from .pg_connect import Pool, lost_errors

log = logging.getLogger("whetstone.library")

POLL_S = 0.5


class VersionFollower:
    """The current version id of one store, kept by notifications (see the module).
    ``read_current`` reads the pointer once, without retrying (it raises when it cannot)."""

    def __init__(self, pool: Pool, read_current: Callable[[], str | None], *,
                 poll_s: float = POLL_S) -> None:
        self.pool = pool
        self.read_current = read_current
        self.poll_s = poll_s
        self.notified = 0  # notifications applied (tests read these counts)
        self.polls = 0  # reads of the pointer made while no connection listened
        self._conn: Any = None
        self._value: str | None = None
        self._known = False
        self._tried = False
        self._lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def current(self) -> str | None:
        """The current version id (None: the store holds no library yet)."""
        with self._lock:
            if self.listening:
                self._drain()
            elif not self._tried:  # the first call listens at once; later tries are the poller's
                self._tried = True
                self._listen()
            if not self._known:  # the first answer is read, not guessed
                self._value = self.read_current()  # raises when the store is down
                self._known = True
            if not self.listening:
                self._start_poller()
            return self._value

    def changed(self, version: str) -> None:
        """This process made ``version`` current (its own commit): no need to wait for the
        notification of it."""
        with self._lock:
            self._value, self._known = version, True

    def _listen(self) -> bool:
        """Open the listening connection, then read the pointer once: what changed while
        nobody listened is not announced again. Called under ``_lock``."""
        try:
            conn = self.pool.connect()
            conn.execute(f"LISTEN {self.pool.url.channel}")
            value = self.read_current()
        except Exception as exc:  # noqa: BLE001 - polling covers for it
            log.debug("cannot listen for new versions (polling instead): %s", exc)
            with contextlib.suppress(Exception):
                conn.close()
            return False
        self._conn, self._value, self._known = conn, value, True
        return True

    def _drain(self) -> None:
        """Apply what the listening socket holds, without waiting for more."""
        conn = self._conn
        broken: tuple[type[BaseException], ...] = (*lost_errors(), OSError, ValueError)
        try:
            ready, _, _ = select.select([conn.fileno()], [], [], 0)
            if not ready:
                return
            for note in conn.notifies(timeout=0):
                if note.channel == self.pool.url.channel and note.payload:
                    self.notified += 1
                    self._value, self._known = note.payload, True
        except broken as exc:
            log.info("lost the connection that listens for new versions (%s); polling every "
                     "%.1f s until it is back", exc, self.poll_s)
            self._drop()

    def _start_poller(self) -> None:
        if self._closed.is_set() or (self._poller is not None and self._poller.is_alive()):
            return
        self._poller = threading.Thread(target=self._poll, name="whetstone-version-poll",
                                        daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        """Until a connection listens again: read the pointer, try to listen, every poll_s."""
        while not self._closed.wait(self.poll_s):
            with self._lock:
                if self.listening or self._listen():
                    return
            try:
                value = self.read_current()
            except Exception as exc:  # noqa: BLE001 - the store is down: keep what we knew
                log.debug("cannot read the current version: %s", exc)
                continue
            with self._lock:
                self.polls += 1
                self._value, self._known = value, True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._drop()
