"""The learner's lease: one learner per library acts, the others wait.

A ``Lease`` is held by one holder at a time, for ``ttl_s`` seconds from its last renewal; the
holder renews it (a heartbeat, every third of the time), and a holder that stops renewing
(killed, hung, paused) loses it once that time has passed, to the next learner that asks.
Every write a learner makes (starting a canary, promoting it, rolling it back) runs
``check()`` under the library's writers' lock first (``learning.LearningState``, the commit's
validator): a holder whose lease has less than a third of its time left is refused
(``LeaseLost``), so a learner paused past its lease never writes after another took over.

``FileLease`` keeps it in ``<library>/learning/lease.json`` behind a short file lock: enough
on one machine or a shared file system with working locks. A store kept in a database gives
its own ``Lease`` (a row with an expiry); the learner sees only this interface.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock

from ..engine.errors import ConfigError, LeaseLost
from .fsutil import atomic_write

DEFAULT_TTL_S = 30.0


class Lease(Protocol):
    """One holder at a time; see the module docstring."""

    holder: str
    ttl_s: float

    def acquire(self) -> bool:
        """Take the lease when it is free, expired or already ours; False when another holds
        it."""
        ...

    def renew(self) -> bool:
        """Extend our lease (the heartbeat); False when it is no longer ours."""
        ...

    def check(self) -> None:
        """``LeaseLost`` unless we hold it with a third of its time left."""
        ...

    def release(self) -> None:
        """Give it up (when ours)."""
        ...

    def current(self) -> dict[str, Any] | None:
        """Who holds it now and until when (None: nobody, or expired)."""
        ...


def new_holder() -> str:
    """A holder name that says where the learner runs: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FileLease:
    """A ``Lease`` in a JSON file under a file lock (see the module docstring)."""

    def __init__(self, folder: Path | str, holder: str | None = None, *,
                 ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time) -> None:
        if not ttl_s > 0:
            raise ConfigError(f"the lease time must be positive, got {ttl_s}",
                              hint="e.g. --lease-ttl 30")
        self.folder = Path(folder)
        self.path = self.folder / "lease.json"
        self.holder = holder or new_holder()
        self.ttl_s = ttl_s
        self.clock = clock

    def _lock(self) -> FileLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.folder / ".lease.lock"), timeout=30)

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("holder"), str) else None

    def _write(self, data: dict[str, Any]) -> None:
        atomic_write(self.path, json.dumps(data).encode("utf-8"), tmp_dir=self.folder / ".tmp",
                     durable=False)

    def _live(self, data: dict[str, Any] | None, now: float) -> bool:
        try:
            return data is not None and now < float(data["renewed"]) + float(data["ttl_s"])
        except (KeyError, TypeError, ValueError):
            return False

    def acquire(self) -> bool:
        with self._lock():
            now = self.clock()
            data = self._read()
            if self._live(data, now) and data is not None and data["holder"] != self.holder:
                return False
            mine = data is not None and data["holder"] == self.holder and self._live(data, now)
            self._write({"holder": self.holder, "pid": os.getpid(),
                         "host": socket.gethostname(),
                         "acquired": data["acquired"] if mine and data else now,
                         "renewed": now, "ttl_s": self.ttl_s})
            return True

    def renew(self) -> bool:
        with self._lock():
            now = self.clock()
            data = self._read()
            if data is None or data["holder"] != self.holder or not self._live(data, now):
                return False
            self._write({**data, "renewed": now})
            return True

    def check(self) -> None:
        with self._lock():
            now = self.clock()
            data = self._read()
            ours = data is not None and data["holder"] == self.holder
            left = float(data["renewed"]) + float(data["ttl_s"]) - now if ours and data \
                else 0.0
            if left > self.ttl_s / 3:
                return
        who = (data or {}).get("holder") if not ours else None
        raise LeaseLost(
            f"learner {self.holder} no longer holds the library's lease"
            + (f" ({who} holds it)" if who else " (its heartbeat is late)"),
            hint="nothing was written; this learner waits for the lease again")

    def release(self) -> None:
        with self._lock():
            data = self._read()
            if data is not None and data["holder"] == self.holder:
                self.path.unlink(missing_ok=True)

    def current(self) -> dict[str, Any] | None:
        data = self._read()
        return data if self._live(data, self.clock()) else None


__all__ = ["DEFAULT_TTL_S", "FileLease", "Lease", "new_holder"]
