"""What a web page may make the server do: the Host, Origin and Content-Type checks.

A server on 127.0.0.1 is reachable from every page its user's browser opens. Two attacks
follow. CSRF: a page posts a "simple" request (``Content-Type: text/plain``, no preflight) to
``http://127.0.0.1:8000/v1/...``; the browser sends it and only hides the reply from the page.
DNS rebinding: a page at ``evil.example`` makes that name resolve to 127.0.0.1, and its script
then reads every reply (``/health`` included) as same-origin. ``WebPolicy.check`` refuses both,
as the MCP SDK's transport security does and with its statuses, for ``whetstone serve`` and
``whetstone mcp`` alike:

- ``Host`` must name this server (421 otherwise): the loopback names and addresses, the bound
  address, on a wildcard bind (``0.0.0.0``, ``::``) any IP address and this machine's name,
  plus each ``--allowed-host`` (``NAME`` for any port, ``NAME:PORT`` for one, ``*`` for any);
  a rebinding page's requests carry its own name;
- ``Origin``, when a browser sends one, must be the server's own (the same host and port as
  ``Host``) or one of ``--allowed-origin`` (403 otherwise; ``null`` is refused);
- a body (``POST``, ``PUT``, ``PATCH``) must be ``Content-Type: application/json`` (415), the
  one type a page cannot send without the preflight this server never answers.

``WebCheck`` is the check as ASGI middleware with a face's own error body (MCP's); ``serve``'s
``Guard`` calls ``check`` itself, before the API keys.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
JSON_TYPE = "application/json"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SHOWN = 80  # characters of a refused header shown back


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: its HTTP status, message, hint and error code."""

    status: int
    message: str
    hint: str
    code: str


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``127.0.0.1``, ``::1``,
    ``localhost``)."""
    name = host.strip().strip("[]").lower()
    address = _ip(name)
    return name in LOOPBACK_NAMES or (address is not None and address.is_loopback)


def split_authority(value: str) -> tuple[str, str | None]:
    """``"Example.com:8000"`` -> ``("example.com", "8000")``; ``"[::1]:80"`` -> ``("::1",
    "80")``; a name without a port -> ``(name, None)``. Lowercased, a final dot dropped."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
        port = port_text
    else:  # a bare IPv6 address, or a name
        name, port = value, None
    return name.rstrip("."), port or None


def _shown(value: str) -> str:
    value = "".join(c if c.isprintable() else "?" for c in value)
    return value if len(value) <= _SHOWN else value[:_SHOWN] + "…"


@dataclass(frozen=True)
class WebPolicy:
    """The Host and Origin headers one server answers (see the module's docstring)."""

    hosts: frozenset[str] = frozenset()  # names (any port) and name:port pairs
    origins: frozenset[str] = frozenset()  # scheme://host[:port], lowercased
    any_ip: bool = False  # a wildcard bind: an IP address in Host is this server's
    any_host: bool = False
    any_origin: bool = False

    @classmethod
    def for_bind(cls, host: str = "127.0.0.1", *, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()) -> WebPolicy:
        """The policy of a server bound to ``host``, plus the names and origins given."""
        bound = host.strip().strip("[]").lower()
        names = {"localhost", "127.0.0.1", "::1"}
        wildcard = bound in WILDCARD_BINDS
        if wildcard:
            names.add(socket.gethostname().lower())
        else:
            names.add(bound)
        extra = [h.strip().lower() for h in allowed_hosts if h.strip()]
        origins = [o.strip().lower().rstrip("/") for o in allowed_origins if o.strip()]
        hosts = {f"{n}:{p}" if p else n for n, p in map(split_authority, extra) if n != "*"}
        return cls(hosts=frozenset(names | hosts), origins=frozenset(origins) - {"*"},
                   any_ip=wildcard, any_host="*" in extra, any_origin="*" in origins)

    def host_allowed(self, host: str | None) -> bool:
        if self.any_host:
            return True
        if not host:
            return False
        name, port = split_authority(host)
        address = _ip(name)
        if name in self.hosts or (port and f"{name}:{port}" in self.hosts):
            return True
        return address is not None and (address.is_loopback or self.any_ip)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if self.any_origin or origin in self.origins:
            return True
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme not in ("http", "https") or not host:
            return False  # "null" (a sandboxed frame, a file), or no Host to compare with
        return split_authority(authority)[0] == split_authority(host)[0] and \
            _port(authority, scheme) == _port(host, scheme)

    def check(self, scope: Scope) -> Refusal | None:
        """Why this HTTP request is refused, or None (the module's docstring)."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers") or ():
            headers.setdefault(name, value)  # the first of a repeated header counts
        host = headers.get(b"host", b"").decode("latin-1") or None
        if not self.host_allowed(host):
            return Refusal(421, f"this server does not answer to the Host "
                           f"{_shown(host or '(none)')!r}: a page on another site may be "
                           "trying to reach it through DNS rebinding",
                           "connect through localhost or 127.0.0.1, or start the server with "
                           "--allowed-host NAME for the name clients use", "host_not_allowed")
        origin = headers.get(b"origin")
        if origin is not None and not self.origin_allowed(origin.decode("latin-1"), host):
            return Refusal(403, f"requests from the web page at "
                           f"{_shown(origin.decode('latin-1'))!r} are refused (a cross-site "
                           "request)", "a browser page may call this server only from its own "
                           "origin or one given with --allowed-origin", "origin_not_allowed")
        if scope.get("method", "GET").upper() in _BODY_METHODS:
            given = headers.get(b"content-type", b"").decode("latin-1")
            if given.split(";", 1)[0].strip().lower() != JSON_TYPE:
                return Refusal(415, f"the request body must be JSON sent with 'Content-Type: "
                               f"{JSON_TYPE}' (got {_shown(given or 'none')!r})",
                               f"send the header 'Content-Type: {JSON_TYPE}' (curl: -H "
                               f"'Content-Type: {JSON_TYPE}')", "unsupported_media_type")
        return None


def _port(authority: str, scheme: str) -> str:
    port = split_authority(authority)[1]
    return port or ("443" if scheme == "https" else "80")


Render = Callable[[Refusal], bytes]


async def send_refusal(send: Send, refusal: Refusal, body: bytes) -> None:
    """A refusal as a complete JSON response, the connection left as the client asked."""
    await send({"type": "http.response.start", "status": refusal.status, "headers": [
        (b"content-type", JSON_TYPE.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def jsonrpc_refusal(refusal: Refusal) -> bytes:
    """A refusal as a JSON-RPC error body (what an MCP client reads)."""
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": f"{refusal.message} ({refusal.hint})"}}).encode()


class WebCheck:
    """ASGI middleware: ``policy.check`` on every HTTP request, refusals rendered by
    ``render`` (a face's own error body)."""

    def __init__(self, app: ASGIApp, policy: WebPolicy, render: Render = jsonrpc_refusal
                 ) -> None:
        self.app = app
        self.policy = policy
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.policy.check(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await send_refusal(send, refusal, self.render(refusal))


__all__ = ["Refusal", "WebCheck", "WebPolicy", "is_loopback", "jsonrpc_refusal",
           "send_refusal", "split_authority"]
