"""Readiness: whether the upstream answers, asked at most once per ``cache_s``.

``/health`` and ``/livez`` say the process serves HTTP (liveness: cheap, no upstream call, so
a slow upstream never gets a healthy server restarted). ``/readyz`` says whether a request
would reach a model now (readiness: Kubernetes takes the pod out of its Service until it
is), through ``Backend.aready``: a model in this process is ready once loaded, an ``openai:``
upstream when its ``GET /models`` answers. The answer is kept ``cache_s`` seconds (2) and one
check runs at a time, so a storm of probes costs the upstream one request per two seconds.

A server in front of a store across the network (PostgreSQL) also asks it (``store``): when it
does not answer, ``/readyz`` says so (``degraded``, with the reason) but stays 200, since the
server still answers and spools its traces until the store is back; taking every replica out
of the balancer at once for a database restart would turn a trace-store outage into a full one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import Backend

log = logging.getLogger("whetstone.server")

READY_CACHE_S = 2.0
READY_TIMEOUT_S = 2.0
# What /readyz says of a trace store that does not answer (never its address: the log has it).
STORE_DOWN = "the trace store does not answer; traces wait in this server's spool"


class Readiness:
    """The cached readiness of one backend (the module's docstring)."""

    def __init__(self, backend: Backend, *, cache_s: float = READY_CACHE_S,
                 timeout_s: float = READY_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic,
                 store: Callable[[], str | None] | None = None) -> None:
        self.backend = backend
        self.store = store
        self.store_reason: str | None = None  # why the trace store does not answer (None: it does)
        self.cache_s = cache_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.checks = 0  # upstream checks made (the cache's effect is visible in tests)
        self._reason: str | None = None
        self._checked: float | None = None
        self._lock: asyncio.Lock | None = None

    def _fresh(self) -> bool:
        return self._checked is not None and self.clock() - self._checked < self.cache_s

    async def reason(self) -> str | None:
        """None when the model can answer, else why not (no address, no path)."""
        if self._fresh():
            return self._reason
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._fresh():  # another probe checked while this one waited
                return self._reason
            self.checks += 1
            try:
                reason = await asyncio.wait_for(self.backend.aready(self.timeout_s),
                                                self.timeout_s + 0.5)
            except TimeoutError:
                reason = "the upstream did not answer in time"
            except Exception as exc:  # noqa: BLE001 - a probe reports, it never fails
                log.warning("the readiness check failed: %r", exc)
                reason = "the readiness check failed (see the server log)"
            self.store_reason = await self._store() if self.store is not None else None
            self._reason, self._checked = reason, self.clock()
        return reason

    async def _store(self) -> str | None:
        assert self.store is not None
        try:
            reason = await asyncio.wait_for(asyncio.to_thread(self.store), self.timeout_s + 2.5)
        except TimeoutError:
            reason = "it did not answer in time"
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never fails
            reason = f"the check failed: {getattr(exc, 'message', None) or exc!r}"
        if reason is not None:
            log.info("readiness: the trace store does not answer: %s", reason)
        return reason

    def report(self, writer: Any) -> dict[str, Any]:
        """What ``/readyz`` adds about the trace store: its outage and the traces waiting."""
        if self.store_reason is None and (writer is None or writer.outage is None):
            return {}
        return {"status": "degraded", "store": STORE_DOWN,
                "traces_waiting": writer.pending if writer is not None else 0}
