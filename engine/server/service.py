"""The chat service behind the server's routes: upstream slots and the queue in front of them,
deadlines, SSE formatting, and the mapping of errors to HTTP statuses.

Kept apart from the HTTP routes (``routes.py``) so the pipeline can wrap it (adapt the request
before, record the exchange after) without touching the transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from engine.backends.base import Backend, StreamChunk
from engine.backends.openai_wire import (
    ChatCall,
    chunk_to_openai,
    error_to_openai,
    finish_reason_to_openai,
    new_completion_id,
    request_from_openai,
    tool_calls_to_openai,
    usage_to_openai,
)
from engine.errors import (
    BackendError,
    BackendTimeout,
    ConfigError,
    NotFound,
    WhetstoneError,
)
from engine.server.metrics import Metrics
from engine.types import Completion

log = logging.getLogger("whetstone.server")

# How long past a request's deadline we wait for a backend that ignores Request.timeout.
_DEADLINE_GRACE_S = 1.0
# Big enough for a few images as data URLs; bigger bodies are refused before they are read.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    """What one server serves and how. ``model_name`` is the id clients send as ``model``."""

    model_name: str
    aliases: tuple[str, ...] = ()
    default_max_tokens: int = 512
    request_timeout_s: float | None = None  # per request; None: the backend's own timeout
    max_concurrency: int = 1  # backend calls in flight; the rest wait their turn
    max_queue: int | None = None  # requests waiting for a slot; past it: 429 (None: no limit)
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES

    @property
    def served(self) -> tuple[str, ...]:
        return (self.model_name, *self.aliases)


def error_status(exc: WhetstoneError) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for an error raised while answering a request."""
    if isinstance(exc, ConfigError):
        return 400, "invalid_request_error", None
    if isinstance(exc, NotFound):
        return 404, "invalid_request_error", "model_not_found"
    if isinstance(exc, BackendTimeout):
        return 504, "server_error", "upstream_timeout"
    if isinstance(exc, BackendError):
        return 502, "server_error", "upstream_error"
    return 500, "server_error", None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_message(exc: WhetstoneError) -> str:
    """What a client is told about ``exc``: the message, and the hint in brackets."""
    return exc.message if not exc.hint else f"{exc.message} ({exc.hint})"


class OpenStream:
    """A backend stream in progress: ``first`` chunk already read, ``next()`` under the
    request's deadline, ``close()`` (idempotent) closes the backend stream and frees the slot."""

    def __init__(self, chunks: AsyncIterator[StreamChunk], deadline: float | None,
                 timeout: float | None, slots: asyncio.Semaphore,
                 on_close: Callable[[OpenStream], None] | None = None) -> None:
        self.first: StreamChunk | None = None
        self._chunks = chunks
        self._deadline = deadline
        self._timeout = timeout
        self._slots = slots
        self._on_close = on_close
        self.started = time.monotonic()
        self._closed = False

    async def next(self) -> StreamChunk | None:
        """The next chunk, None at the end; ``BackendTimeout`` past the deadline."""
        left = None if self._deadline is None else max(
            0.0, self._deadline - (time.monotonic() - self.started))
        try:
            return await asyncio.wait_for(anext(self._chunks, None), left)
        except asyncio.TimeoutError:
            raise BackendTimeout(f"the model did not finish within {self._timeout:g} s",
                                 hint="retry later, or ask for fewer tokens") from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._slots.release()
            if self._on_close is not None:
                self._on_close(self)


class ChatService:
    """Answers parsed chat calls with the backend: concurrency limit, deadlines, formatting.

    Kept apart from the HTTP routes so the pipeline can wrap it (adapt the request before,
    record the exchange after) without touching the transport.
    """

    def __init__(self, backend: Backend, settings: ServerSettings,
                 metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._slots = asyncio.Semaphore(max(1, settings.max_concurrency))
        self.admitted = 0  # requests past admission and not yet answered
        self.upstream_active = 0  # of those, the ones holding an upstream slot

    @property
    def queued(self) -> int:
        """Admitted requests waiting (for retrieval or an upstream slot)."""
        return self.admitted - self.upstream_active

    def admit(self) -> bool:
        """Take a place in the queue, or False when it is full (the caller answers 429).
        Every True must be paired with ``release()``."""
        limit = self.settings.max_queue
        if limit is not None and self.admitted >= max(1, self.settings.max_concurrency) + limit:
            return False
        self.admitted += 1
        return True

    def release(self) -> None:
        self.admitted -= 1

    def parse(self, body: Any) -> ChatCall:
        """Validate a request body; raises ``ConfigError`` (400) or ``NotFound`` (404)."""
        call = request_from_openai(body, default_max_tokens=self.settings.default_max_tokens,
                                   timeout=self.settings.request_timeout_s)
        if call.model is not None and call.model not in self.settings.served:
            raise NotFound(f"the model {call.model!r} is not served here",
                           hint="available: " + ", ".join(self.settings.served))
        return call

    def _deadline(self, call: ChatCall) -> float | None:
        t = call.request.timeout
        return None if t is None else t + _DEADLINE_GRACE_S

    async def complete(self, call: ChatCall) -> Completion:
        """One completion, or ``BackendTimeout`` when the deadline passes."""
        async with self._slots:
            self.upstream_active += 1
            start = time.perf_counter()
            try:
                completion = await asyncio.wait_for(self.backend.acomplete(call.request),
                                                    self._deadline(call))
            except asyncio.TimeoutError:
                raise BackendTimeout(
                    f"the model did not answer within {call.request.timeout:g} s",
                    hint="retry later, or ask for fewer tokens") from None
            finally:
                self.upstream_active -= 1
                self.metrics.upstream_latency.observe(time.perf_counter() - start,
                                                      stream="false")
        self._count_tokens(completion)
        return completion

    def _count_tokens(self, completion: Completion) -> None:
        self.metrics.tokens.inc(completion.prompt_tokens, kind="prompt")
        self.metrics.tokens.inc(completion.completion_tokens, kind="completion")

    async def open_stream(self, call: ChatCall) -> OpenStream:
        """Start streaming and wait for the first chunk, so a backend that fails at once is
        answered with a proper HTTP error instead of a broken event stream.

        The returned stream holds a concurrency slot until it is closed.
        """
        await self._slots.acquire()
        self.upstream_active += 1
        stream = OpenStream(self.backend.astream(call.request), self._deadline(call),
                            call.request.timeout, self._slots, on_close=self._stream_closed)
        try:
            stream.first = await stream.next()
        except BaseException:
            await stream.close()
            raise
        return stream

    def _stream_closed(self, stream: OpenStream) -> None:
        self.upstream_active -= 1
        self.metrics.upstream_latency.observe(time.monotonic() - stream.started, stream="true")

    async def sse_events(self, call: ChatCall, model: str, stream: OpenStream,
                         on_end: Callable[[Completion | None, str | None, str], None]
                         | None = None) -> AsyncIterator[str]:
        """``chat.completion.chunk`` events ending in ``data: [DONE]``; a failure mid-stream
        becomes an ``{"error": ...}`` event, which OpenAI clients raise as an error.

        ``on_end(completion, error, text_so_far)`` is called once however the stream ends
        (completion None: it failed, or the client went away), after the last event has been
        handed to the server, so recording the exchange never delays the reply.
        """
        cid, created = new_completion_id(), int(time.time())
        sent: list[str] = []
        final: Completion | None = None
        failure: str | None = None

        def event(**kw: Any) -> str:
            return _sse(chunk_to_openai(id=cid, created=created, model=model, **kw))

        interrupted = True  # stays True when the client goes away (GeneratorExit) mid-stream
        try:
            try:
                yield event(delta={"role": "assistant", "content": ""})
                chunk: StreamChunk | None = stream.first
                last: Completion | None = None
                while chunk is not None:
                    if chunk.text:
                        sent.append(chunk.text)
                        yield event(delta={"content": chunk.text})
                    if chunk.completion is not None:
                        last = chunk.completion
                        break
                    chunk = await stream.next()
                if last is None:
                    raise BackendError("the backend's stream ended without a completion",
                                       hint="a backend's stream() must end with the Completion")
                self._count_tokens(last)
                if last.tool_calls:
                    calls = [{"index": i, **c}
                             for i, c in enumerate(tool_calls_to_openai(last.tool_calls))]
                    yield event(delta={"tool_calls": calls})
                yield event(delta={}, finish_reason=finish_reason_to_openai(last))
                if call.include_usage:
                    yield event(usage=usage_to_openai(last))
                final = last
            except WhetstoneError as exc:
                status, kind, code = error_status(exc)
                log.warning("stream failed (%d): %s", status, exc.message)
                failure = exc.message
                self.metrics.errors.inc(code=code or "server_error")
                yield _sse(error_to_openai(error_message(exc), kind, code=code))
            except Exception as exc:
                log.exception("stream failed")
                failure = f"{type(exc).__name__}: {exc}"  # for the trace, not the client
                self.metrics.errors.inc(code="internal_error")
                yield _sse(error_to_openai("internal server error (see the server log)",
                                           "server_error"))
            interrupted = False
        finally:
            await stream.close()
            if interrupted and on_end is not None:
                on_end(None, None, "".join(sent))
        try:
            yield "data: [DONE]\n\n"
        finally:
            if on_end is not None:
                on_end(final, failure, "".join(sent))
