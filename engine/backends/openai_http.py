"""The proxy's hot path to an OpenAI-compatible server: one JSON POST over aiohttp.

Every non-streamed request ``whetstone serve`` proxies is one ``acomplete``. Through the
``openai`` SDK that call costs ~1.4 ms of CPU in the client alone (its request building, the
auth-retry wrapper and httpx's connection pool) against ~0.25 ms for the same POST over aiohttp,
and that difference was most of what the proxy spent per request besides the library
(``benchmarks/bench_middleware.py``). ``OpenAICompatBackend.acomplete`` posts through
``JsonPoster``, and ``astream`` reads its event stream from ``open_stream`` through
``SseParser`` (bounded per event and in all); the blocking calls keep the SDK. Failures come
back as ``HttpFailure`` (a timeout, a connection error, or the server's status and message), which the
backend maps to the same errors and retries as the SDK's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# uvicorn (and so vLLM and whetstone serve) drops an idle connection after 5 s; reusing one it
# is closing at that moment fails, so idle ones are let go first.
_KEEPALIVE_S = 4.0
# The most bytes a reply may hold once decoded (gzip, deflate): a chat completion is a few KB,
# a large embeddings batch tens of MB; a compressed reply that inflates past it is a bomb.
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024
# The most bytes one server-sent event may hold: a chat chunk is a few KB (top-20 logprobs
# included); a "line" that never ends would otherwise be buffered for good.
DEFAULT_MAX_EVENT_BYTES = 4 * 1024 * 1024
_READ_CHUNK = 64 * 1024


@dataclass
class HttpFailure(Exception):
    """A POST that did not give a 2xx: ``kind`` is ``timeout``, ``connection`` or ``status``
    (then ``status``, the server's ``message``, its ``Retry-After`` header and its
    ``x-should-retry``, the header the ``openai`` client obeys: False when it said "false")."""

    kind: str
    message: str = ""
    status: int = 0
    retry_after: str | None = None
    should_retry: bool | None = None
    cause: BaseException | None = None
    error: dict[str, Any] | None = None  # the server's OpenAI error object, when it sent one

    def __str__(self) -> str:
        return self.message


def should_retry(headers: Any) -> bool | None:
    """A reply's ``x-should-retry`` header: True, False, or None when absent or unclear."""
    value = (headers.get("x-should-retry") or "").strip().lower()
    return {"true": True, "false": False}.get(value)


def server_message(body: Any, default: str) -> str:
    """The error text of an OpenAI-style error body (``{"error": {"message": ...}}``,
    ``{"error": "..."}`` or FastAPI's ``{"detail": ...}``), else ``default``."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):
            return str(body["detail"])
    return default


def error_object(body: Any) -> dict[str, Any] | None:
    """``type``, ``param`` and ``code`` of an OpenAI-style error body (each a string or None),
    or None when the body is not one."""
    if not isinstance(body, dict):
        return None
    err = body.get("error", body)
    if not isinstance(err, dict):
        return None

    def text(key: str) -> str | None:
        value = err.get(key)
        return None if value is None else str(value)

    return {"type": text("type"), "param": text("param"), "code": text("code")}


async def _close_with_loop(session: Any) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await session.close()


async def _relay(response: Any, max_bytes: int) -> AsyncIterator[bytes]:
    """The bytes of an aiohttp response as they arrive (decoded), at most ``max_bytes`` in
    all: past it an ``HttpFailure`` of kind ``too_large`` (a compressed bomb relayed as is
    would otherwise reach the client whole). The connection is let go however the reading
    ends (done, failed, or closed by the caller)."""
    size = 0
    try:
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > max_bytes:
                raise HttpFailure("too_large", f"the reply passed {max_bytes:,} bytes once "
                                  "decoded (Content-Encoding: "
                                  f"{response.headers.get('content-encoding', 'none')}); it "
                                  "was cut there")
            yield chunk
    finally:
        response.release()


class SseParser:
    """Cuts an event stream's bytes (as decoded) into ``(event, data)`` pairs, one per event.

    Bounded: an event over ``max_event_bytes`` (a line that never ends included) or a stream
    over ``max_total_bytes`` in all is an ``HttpFailure`` of kind ``too_large``, so neither an
    endless line nor a compressed bomb is buffered past the caps.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
                 max_total_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.max_total_bytes = max_total_bytes
        self.total = 0
        self._partial = bytearray()  # the line not ended yet
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0  # the bytes of the event so far, its ended lines

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events that ``chunk`` completes."""
        self.total += len(chunk)
        if self.total > self.max_total_bytes:
            raise HttpFailure("too_large", f"the event stream passed {self.max_total_bytes:,} "
                              "bytes once decoded; it was cut there")
        self._partial += chunk
        out: list[tuple[str, str]] = []
        start = 0
        while (end := self._partial.find(b"\n", start)) >= 0:
            line = bytes(self._partial[start:end]).rstrip(b"\r")
            start = end + 1
            self._size += len(line)
            if not line:
                if self._data:
                    out.append((self._event, b"\n".join(self._data).decode(
                        "utf-8", errors="replace")))
                self._event, self._data, self._size = "", [], 0
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line.startswith(b"event:"):
                self._event = line[6:].strip().decode("utf-8", errors="replace")
        del self._partial[:start]
        if self._size + len(self._partial) > self.max_event_bytes:
            raise HttpFailure("too_large", f"an event of the stream passed "
                              f"{self.max_event_bytes:,} bytes without ending; it was cut "
                              "there")
        return out


async def sse_events(chunks: AsyncIterator[bytes], parser: SseParser
                     ) -> AsyncIterator[tuple[str, str]]:
    """The ``(event, data)`` pairs of a stream's bytes (``open_stream``'s); a read that fails
    is an ``HttpFailure`` (``timeout`` or ``connection``)."""
    import aiohttp  # heavy: aiohttp (~0.1 s)

    try:
        async for chunk in chunks:
            for event in parser.feed(chunk):
                yield event
    except TimeoutError as exc:  # before OSError: TimeoutError is one
        raise HttpFailure("timeout", "the stream passed its deadline", cause=exc) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise HttpFailure("connection", str(exc) or type(exc).__name__, cause=exc) from exc


def close_on_loop(loop: asyncio.AbstractEventLoop, close: Any) -> None:
    """Run ``close()`` (a coroutine function) on ``loop``: scheduled when it is the running
    loop, else submitted to the loop's own thread with a short wait; nothing when the loop has
    stopped (what it held goes with it)."""
    if not loop.is_running() or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(close())
    else:  # a loop in another thread (a server's)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=5)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@`` and the ``Authorization`` header they make
    (HTTP Basic, as httpx and the ``openai`` SDK send them), or ``(url, None)``."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    netloc = parts.netloc.rpartition("@")[2]
    return (urlunsplit(parts._replace(netloc=netloc)),
            "Basic " + base64.b64encode(pair.encode()).decode("ascii"))


class JsonPoster:
    """POST JSON to ``base_url`` + path with one aiohttp session per event loop (a session's
    connection pool belongs to the loop that made it). Credentials in the URL
    (``http://user:password@host/v1``) are sent as HTTP Basic in place of the bearer key,
    as the ``openai`` SDK sends them (aiohttp refuses a URL with both)."""

    def __init__(self, base_url: str, api_key: str, *, user_agent: str = "whetstone",
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        base_url, basic = split_userinfo(base_url)
        self.base_url = base_url.rstrip("/")
        self.max_reply_bytes = max_reply_bytes
        self._headers = {"Authorization": basic or f"Bearer {api_key}",
                         "User-Agent": user_agent, "Content-Type": "application/json",
                         "Accept": "application/json"}
        # loop -> (its session, the async generator that closes it with the loop)
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                  tuple[Any, AsyncIterator[None]]] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()
        # Proxies from the environment, as httpx does; looked up per request only when one is
        # set (aiohttp reads the environment and ~/.netrc on every request when asked to).
        self._trust_env = any(os.environ.get(k) for k in (
            "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"))

    async def _session(self) -> Any:
        import aiohttp  # lazily: only an event loop that posts needs it

        loop = asyncio.get_running_loop()
        with self._lock:
            held = self._sessions.get(loop)
            if held is not None and not held[0].closed:
                return held[0]
            connector = aiohttp.TCPConnector(limit=1000, keepalive_timeout=_KEEPALIVE_S)
            session = aiohttp.ClientSession(connector=connector, headers=self._headers,
                                            trust_env=self._trust_env)
        # Closed with its loop: asyncio.run (and uvicorn) finalise a loop's open async
        # generators before closing it, so a caller who never closes the backend (one
        # asyncio.run(engine.achat(...)) after another) leaves no session open behind.
        keeper = _close_with_loop(session)
        await keeper.__anext__()
        with self._lock:
            self._sessions[loop] = (session, keeper)
        return session

    async def _read_capped(self, response: Any) -> bytes:
        """The reply's body as decoded, read a chunk at a time: past ``max_reply_bytes`` an
        ``HttpFailure`` (kind ``too_large``, not retried) before the rest is inflated. aiohttp
        inflates only as the body is read, so a gzip bomb costs at most the cap."""
        parts: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > self.max_reply_bytes:
                raise HttpFailure(
                    "too_large", f"the reply passed {self.max_reply_bytes:,} bytes once decoded "
                    f"(Content-Encoding: {response.headers.get('content-encoding', 'none')}); "
                    "it was cut there")
            parts.append(chunk)
        return b"".join(parts)

    async def post(self, path: str, body: Any, timeout: float) -> Any:
        """The decoded JSON reply of a 2xx (or its text when it is not JSON: the caller says
        what came back); ``HttpFailure`` otherwise. ``timeout`` bounds the whole call, the
        reading and decoding of the reply included."""
        import aiohttp  # heavy: aiohttp (~0.1 s)

        data = json.dumps(body, ensure_ascii=False).encode()
        url = self.base_url + path
        try:
            # aiohttp's own total timeout is checked between reads; the outer one is the
            # deadline whatever the reply does (inflating included).
            async with asyncio.timeout(timeout):
                session = await self._session()
                async with session.post(
                        url, data=data, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    raw = await self._read_capped(r)
                    status, retry_after = r.status, r.headers.get("retry-after")
                    retry_hint = should_retry(r.headers)
        except TimeoutError as exc:
            raise HttpFailure("timeout", f"no answer within {timeout:g} s", cause=exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise HttpFailure("connection", str(exc) or type(exc).__name__, cause=exc) from exc
        text = raw.decode("utf-8", errors="replace")
        try:
            decoded: Any = json.loads(text)
        except ValueError:
            decoded = text
        if status >= 400:
            raise HttpFailure("status", server_message(decoded, text[:500] or f"HTTP {status}"),
                              status=status, retry_after=retry_after,
                              should_retry=retry_hint, error=error_object(decoded))
        return decoded

    async def status(self, path: str, timeout: float) -> int:
        """The status of a GET of ``path`` (its body is not read: a readiness probe);
        ``HttpFailure`` (``timeout`` or ``connection``) when no reply came."""
        import aiohttp  # heavy: aiohttp (~0.1 s)

        try:
            async with asyncio.timeout(timeout):
                session = await self._session()
                async with session.get(self.base_url + path,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    return int(r.status)
        except TimeoutError as exc:
            raise HttpFailure("timeout", f"no answer within {timeout:g} s", cause=exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise HttpFailure("connection", str(exc) or type(exc).__name__, cause=exc) from exc

    async def open_stream(self, path: str, body: Any, timeout: float) -> AsyncIterator[bytes]:
        """POST and relay the reply's bytes as they come (an SSE stream, as sent). A status
        of 400 or more is an ``HttpFailure`` raised here, before any byte is handed out, so
        the caller can still answer with a status of its own."""
        import aiohttp  # heavy: aiohttp (~0.1 s)

        data = json.dumps(body, ensure_ascii=False).encode()
        try:
            session = await self._session()
            response = await session.post(self.base_url + path, data=data,
                                          timeout=aiohttp.ClientTimeout(total=timeout))
            if response.status >= 400:
                try:
                    raw = await self._read_capped(response)
                finally:
                    response.release()
                text = raw.decode("utf-8", errors="replace")
                try:
                    decoded: Any = json.loads(text)
                except ValueError:
                    decoded = text
                raise HttpFailure("status", server_message(decoded, text[:500] or
                                                           f"HTTP {response.status}"),
                                  status=response.status,
                                  retry_after=response.headers.get("retry-after"),
                                  should_retry=should_retry(response.headers),
                                  error=error_object(decoded))
        except TimeoutError as exc:
            raise HttpFailure("timeout", f"no answer within {timeout:g} s", cause=exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise HttpFailure("connection", str(exc) or type(exc).__name__, cause=exc) from exc
        return _relay(response, self.max_reply_bytes)

    async def aclose(self) -> None:
        """Close the running loop's session."""
        with self._lock:
            held = self._sessions.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held[0].close()

    def close(self) -> None:
        """Close every session whose loop still runs (in its own thread); the rest go with
        their loops."""
        with self._lock:
            sessions = list(self._sessions.items())
            self._sessions.clear()
        for loop, (session, _) in sessions:
            close_on_loop(loop, session.close)

__all__ = ["HttpFailure", "JsonPoster", "SseParser", "close_on_loop", "error_object",
           "server_message", "sse_events"]
