"""Auth and limits in front of the routes: API keys, request metrics, the body size limit.

- ``Guard``: ASGI middleware (the only thing the server calls middleware) that refuses what a
  web page may not ask (``hosts.WebPolicy``: Host, Origin, Content-Type; on every route,
  ``/health`` included), then checks API keys (``Authorization: Bearer``) on ``/v1/*``, and
  counts every response by route and status, with its latency (streams: until the last byte).
- ``key_owner``: the SHA-256 of the key a request carries, which an exchange's trace keeps so
  that only that key may label it (never the key itself).
- ``read_body``: the request body, refused past ``max_body_bytes`` (413) before it is all read.
- The queue and upstream concurrency limits live with the upstream calls, in ``service.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any

from ..backends.openai_wire import error_to_openai
from ..errors import ConfigError
from .hosts import Refusal, WebPolicy, send_refusal
from .metrics import Metrics

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TRACE_HEADER = "X-Whetstone-Trace-Id"
VERSION_HEADER = "X-Whetstone-Library-Version"
REQUEST_ID_HEADER = "X-Request-Id"
KNOWN_ROUTES = ("/v1/chat/completions", "/v1/models", "/v1/feedback", "/v1/embeddings",
                "/v1/completions", "/health", "/livez", "/readyz", "/metrics")


# --- API keys --------------------------------------------------------------------------------

def load_api_keys(keys: Iterable[str] = (), keys_file: str | Path | None = None
                  ) -> frozenset[str]:
    """The accepted keys: ``keys`` plus one per line of ``keys_file`` (``#`` starts a comment).

    A named file that is missing or holds no key is a ``ConfigError``: a server meant to be
    protected must not start open.
    """
    out = {k.strip() for k in keys if k and k.strip()}
    if keys_file is not None:
        path = Path(keys_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read the API keys file {path}: {exc.strerror or exc}",
                              hint="pass an existing file with one key per line") from exc
        found = {ln.split("#", 1)[0].strip() for ln in lines} - {""}
        if not found:
            raise ConfigError(f"the API keys file {path} holds no key",
                              hint="write one key per line ('#' starts a comment)")
        out |= found
    bad = sorted(k[:4] + "…" for k in out if any(c.isspace() for c in k))
    if bad:
        raise ConfigError(f"API keys cannot contain spaces ({', '.join(bad)})",
                          hint="one key per line, nothing else on the line")
    return frozenset(out)


def key_matches(authorization: str | None, keys: frozenset[str]) -> bool:
    """Whether an ``Authorization: Bearer <key>`` header carries one of ``keys``."""
    return key_owner(authorization, keys) is not None


def key_hash(key: str) -> str:
    """What a trace keeps of the key it was recorded for: its SHA-256 (hex), never the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_owner(authorization: str | None, keys: frozenset[str]) -> str | None:
    """``key_hash`` of the server key an ``Authorization: Bearer`` header carries, or None
    (no header, or not one of ``keys``). Every key is compared, in constant time."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    given = token.strip().encode()
    # Compare against every key in constant time (no early exit), so timing reveals nothing.
    found = [k for k in keys if hmac.compare_digest(given, k.encode())]
    return key_hash(found[0]) if found else None


def _route_of(path: str) -> str:
    if path.startswith("/v1/models"):
        return "/v1/models"
    return path if path in KNOWN_ROUTES else "other"  # bounded label values


def openai_refusal(refusal: Refusal) -> bytes:
    """A ``hosts.Refusal`` as an OpenAI-style error body."""
    return json.dumps(error_to_openai(f"{refusal.message} ({refusal.hint})",
                                      "invalid_request_error", code=refusal.code)).encode()


class Guard:
    """ASGI middleware: the web checks (``web``), API keys on ``/v1/*`` (when any are set),
    and request metrics."""

    def __init__(self, app: ASGIApp, *, keys: frozenset[str], metrics: Metrics,
                 web: WebPolicy | None = None) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.web = web or WebPolicy.for_bind()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = _route_of(scope.get("path", ""))
        status = [500]

        async def counting_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            refusal = self.web.check(scope)
            if refusal is not None:
                self.metrics.errors.inc(code=refusal.code)
                await send_refusal(counting_send, refusal, openai_refusal(refusal))
                return
            if self.keys and scope.get("path", "").startswith("/v1/") and not self._allowed(
                    scope):
                await self._unauthorized(scope, counting_send)
                return
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.inc(route=route, status=status[0])
            self.metrics.latency.observe(time.perf_counter() - started, route=route)

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                return key_matches(value.decode("latin-1"), self.keys)
        return False

    async def _unauthorized(self, scope: Scope, send: Send) -> None:
        has_header = any(n == b"authorization" for n, _ in scope.get("headers") or ())
        message = ("incorrect API key provided" if has_header else
                   "no API key provided; send it as 'Authorization: Bearer <key>'")
        body = json.dumps(error_to_openai(
            message + " (ask the server's operator for a key)", "invalid_request_error",
            code="invalid_api_key")).encode()
        self.metrics.errors.inc(code="invalid_api_key")
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="whetstone"')]})
        await send({"type": "http.response.body", "body": body})


# --- request bodies --------------------------------------------------------------------------

class BodyTooLarge(Exception):
    """The request body is over the limit (answered with 413, not a ``WhetstoneError``: it is
    the transport's limit, not a bad request field)."""

    def __init__(self, limit: int, seen: int | None) -> None:
        self.limit = limit
        self.seen = seen
        size = f"{seen} bytes" if seen is not None else "more"
        super().__init__(f"the request body is {size}; this server takes at most {limit} bytes")


async def read_body(request: Any, limit: int | None) -> bytes:
    """The whole body of a Starlette request, or ``BodyTooLarge`` as soon as it is over
    ``limit`` (from ``Content-Length`` when sent, else while reading a chunked body)."""
    if limit is None:
        return bytes(await request.body())
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)
