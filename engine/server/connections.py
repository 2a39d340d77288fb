"""Connection-level limits under uvicorn: a header deadline, and caps on open connections.

uvicorn bounds the idle time between two requests on a keep-alive connection, but nothing
else: a socket that connects and sends nothing, or sends one header line every few seconds
(slow-loris), is held forever, and enough of them use up the process's file descriptors
while ``/health`` and keyed requests fail. ``guarded_protocol(limits)`` is uvicorn's own HTTP
protocol class (httptools, else h11) with three checks added:

- a request's head (request line and headers) must arrive in full within
  ``header_timeout_s`` of the connection opening, or of the first byte after the previous
  response; past it the client gets ``408`` and the connection is closed;
- at most ``max_connections`` are open at once, and at most ``max_per_ip`` from one client
  address, shared fairly: at a cap, a new connection takes the place of the oldest idle one
  (waiting for a request's head, or kept alive between requests) of the address holding the
  most (its own address, at the per-address cap), which is closed (with a ``503`` when its
  client waits for an answer). Only when no such connection is idle is the new one answered
  ``503`` and closed as soon as it is accepted, so it holds a descriptor for no time at all.

So a client that drips headers on hundreds of sockets, and reconnects after each 408, holds
only the places nobody else asks for: a probe from another address (``/health``), or another
client behind the same address, gets in by taking one of its idle sockets. A request being
answered is never cut for another.

Request bodies are not timed here (the per-address cap bounds what a slow body can hold).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter as Tally
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError
from .metrics import Metrics

log = logging.getLogger("whetstone.server")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONNECTIONS_PER_IP = 256
_WARN_EVERY_S = 10.0  # a flood of refusals logs one line per this many seconds, not one each

_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
            b"connection: close\r\ncontent-length: 21\r\n\r\ntoo many connections\n")
_EVICTED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
            b"connection: close\r\ncontent-length: 40\r\n\r\n"
            b"closed for another client; retry slowly\n")
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
              b"connection: close\r\ncontent-length: 33\r\n\r\nthe request headers came too slow\n")


def default_max_connections() -> int:
    """``DEFAULT_MAX_CONNECTIONS``, or half the open-file limit when that is lower, so clients
    can never take the descriptors the server needs for its upstream and its traces."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


@dataclass(frozen=True)
class ConnectionLimits:
    """``header_timeout_s``: seconds a request's head may take (None: no limit);
    ``max_connections`` / ``max_per_ip``: open connections in all / from one address (None:
    no cap; ``max_connections`` None means ``default_max_connections()``, 0 no cap)."""

    header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S
    max_connections: int | None = None
    max_per_ip: int | None = DEFAULT_MAX_CONNECTIONS_PER_IP

    def __post_init__(self) -> None:
        if self.header_timeout_s is not None and not self.header_timeout_s > 0:
            raise ConfigError(f"header_timeout_s must be positive, got {self.header_timeout_s}",
                              hint="None turns the header deadline off")
        for key in ("max_connections", "max_per_ip"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ConfigError(f"{key} must be 0 (no cap) or more, got {value}")

    def total_cap(self) -> int | None:
        if self.max_connections is None:
            return default_max_connections()
        return self.max_connections or None


class Connection(Protocol):
    """What the guard asks of an open connection to take its place for another."""

    def idle(self) -> bool:
        """Waiting for a request's head, or kept alive between requests."""

    def evict(self) -> None:
        """Close it now (the guard has already counted it out)."""


class ConnectionGuard:
    """Counts open connections, in all and per client address, for one server, and picks
    the idle connection that makes way for a new one at a cap (the module's docstring)."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics | None = None) -> None:
        self.limits = limits
        self.metrics = metrics
        self.total_cap = limits.total_cap()
        self.open = 0
        self.per_ip: Tally[str] = Tally()
        # Each address's connections, oldest first (a dict keeps insertion order).
        self._conns: dict[str, dict[Connection, None]] = {}
        self._refused_since_warning = 0
        self._last_warning = -_WARN_EVERY_S

    def admit(self, ip: str, conn: Connection | None = None) -> str | None:
        """Count a new connection from ``ip`` in (making way for it at a cap), or say why it
        is refused."""
        cap = self.limits.max_per_ip
        if cap and self.per_ip[ip] >= cap and not self._make_way(ip, "max_per_ip"):
            return self._refuse(f"{ip} has {self.per_ip[ip]} connections open, none idle "
                                f"(--max-connections-per-ip {cap})", "max_per_ip")
        if self.total_cap is not None and self.open >= self.total_cap \
                and not self._make_way_for(ip):
            return self._refuse(f"{self.open} connections are open, none idle that another "
                                f"address could take (--max-connections {self.total_cap})",
                                "max_connections")
        self.open += 1
        self.per_ip[ip] += 1
        if conn is not None:
            self._conns.setdefault(ip, {})[conn] = None
        self._gauge()
        return None

    def release(self, ip: str, conn: Connection | None = None) -> None:
        self.open -= 1
        self.per_ip[ip] -= 1
        mine = self._conns.get(ip)
        if mine is not None and conn is not None:
            mine.pop(conn, None)
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]  # the tally must not grow with every address ever seen
            self._conns.pop(ip, None)
        self._gauge()

    def _make_way_for(self, ip: str) -> bool:
        """At the total cap: close an idle connection of the address holding the most, for a
        newcomer from ``ip``, as long as that address holds more than ``ip`` does (or is
        ``ip``): the heaviest address with an idle connection pays."""
        for other in sorted(self._conns, key=self.per_ip.__getitem__, reverse=True):
            if other != ip and self.per_ip[other] <= self.per_ip[ip]:
                return False
            if self._make_way(other, "max_connections"):
                return True
        return False

    def _make_way(self, ip: str, reason: str) -> bool:
        """Close the oldest idle connection of ``ip``, counted under ``reason``; False when
        none of its connections is idle."""
        victim = next((c for c in self._conns.get(ip, {}) if c.idle()), None)
        if victim is None:
            return False
        self.release(ip, victim)
        self.closed(reason)
        victim.evict()
        return True

    def closed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.inc(reason=reason)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.connections_open.set(self.open)

    def _refuse(self, why: str, reason: str) -> str:
        self.closed(reason)
        self._refused_since_warning += 1
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_S:
            log.warning("refused %d connection(s): %s", self._refused_since_warning, why)
            self._refused_since_warning, self._last_warning = 0, now
        return why


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, (tuple, list)) and peer:
        return str(peer[0])
    return "unix"  # a Unix socket: all its clients are one


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (``auto``: httptools when installed, else h11) with
    ``guard``'s limits, for ``uvicorn.Config(http=...)``."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # heavy: uvicorn, httptools

    header_timeout = guard.limits.header_timeout_s

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _ip: str | None = None
        _counted = False  # in the guard's tally (until closed, or made way for another)
        _head_started = False  # bytes of a request's head came, and the head is not done
        _head_timer: asyncio.TimerHandle | None = None
        _head_cycle: Any = None  # the request cycle current when the head phase began

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            ip = _peer_ip(transport)
            if guard.admit(ip, self) is not None:
                # Before uvicorn sees it: not in its connection set, and no request is read.
                transport.write(_REFUSED)
                transport.close()
                return
            self._ip, self._counted = ip, True
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._ip is None:
                return  # refused in connection_made: uvicorn never knew it
            self._disarm()
            if self._counted:
                guard.release(self._ip, self)
                self._counted = False
            self._ip = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._between_requests() and not self._head_started:
                self._head_started = True
                if self._head_timer is None:
                    self._arm()  # the first byte of the next request on a kept-alive one
            super().data_received(data)
            if self._head_started and self._head_done():
                self._head_started = False
                self._disarm()

        def idle(self) -> bool:  # waiting for a head, or between requests (uvicorn's test)
            return self._counted and self._between_requests() and not self.transport.is_closing()

        def evict(self) -> None:  # make way for another client (the guard counted it out)
            self._counted = False
            self._disarm()
            if self.cycle is None or self._head_started:
                self.transport.write(_EVICTED)  # a client waiting for an answer gets one
            self.transport.close()

        def _between_requests(self) -> bool:
            return self.cycle is None or bool(self.cycle.response_complete)

        def _head_done(self) -> bool:
            return self.cycle is not None and self.cycle is not self._head_cycle

        def _arm(self) -> None:
            self._head_cycle = self.cycle
            if header_timeout is not None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                timer, self._head_timer = self._head_timer, None
                timer.cancel()

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._head_done() or self.transport.is_closing():
                return  # the head completed in a callback data_received did not see
            guard.closed("header_timeout")
            self.transport.write(_TIMED_OUT)
            self.transport.close()

    return GuardedHTTPProtocol


__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_IP",
    "ConnectionGuard",
    "ConnectionLimits",
    "default_max_connections",
    "guarded_protocol",
]
