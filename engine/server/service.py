"""The chat service behind the server's routes: upstream slots and the queue in front of them,
deadlines, SSE formatting, and the mapping of errors to HTTP statuses.

Kept apart from the HTTP routes (``routes.py``) so the pipeline can wrap it (adapt the request
before, record the exchange after) without touching the transport.

Every request has one deadline, set when it arrives: the wait for an upstream slot, the
upstream call and the whole stream all count against it (``request_timeout_s``, default
``DEFAULT_DEADLINE_S``). A stream that sends nothing for ``stream_idle_s`` is cut too, so an
upstream trickling bytes or SSE keep-alive comments cannot hold a slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from whetstone.engine.backends.base import Backend, StreamChunk
from whetstone.engine.backends.openai_wire import (
    ChatCall,
    chunk_to_openai,
    error_to_openai,
    finish_reason_to_openai,
    new_completion_id,
    request_from_openai,
    tool_calls_to_openai,
    usage_to_openai,
)
from whetstone.engine.errors import (
    BackendError,
    BackendRejected,
    BackendTimeout,
    ConfigError,
    NotFound,
    WhetstoneError,
)
from whetstone.engine.server.limits import MAX_REQUEST_ITEMS, check_ranges, check_size
from whetstone.engine.server.metrics import Metrics
from whetstone.engine.types import Completion, Request
from whetstone.library_store.paths import shown

log = logging.getLogger("whetstone.server")
_T = TypeVar("_T")

# How long past a request's deadline we wait for a backend that ignores Request.timeout.
_DEADLINE_GRACE_S = 1.0
# Big enough for a few images as data URLs; bigger bodies are refused before they are read.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_DEADLINE_S = 300.0  # a whole request, queue wait included, unless configured
DEFAULT_STREAM_IDLE_S = 120.0  # the longest silence within a stream


@dataclass(frozen=True)
class ServerSettings:
    """What one server serves and how. ``model_name`` is the id clients send as ``model``."""

    model_name: str
    aliases: tuple[str, ...] = ()
    default_max_tokens: int = 512
    # The whole request, queue wait included; also passed to the backend as its timeout.
    # None: DEFAULT_DEADLINE_S in all, the backend keeping its own per-call timeout.
    request_timeout_s: float | None = None
    stream_idle_s: float | None = DEFAULT_STREAM_IDLE_S  # None: no idle limit
    max_concurrency: int = 1  # backend calls in flight; the rest wait their turn
    max_queue: int | None = None  # requests waiting for a slot; past it: 429 (None: no limit)
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    max_request_items: int = MAX_REQUEST_ITEMS  # limits.check_size

    @property
    def served(self) -> tuple[str, ...]:
        return (self.model_name, *self.aliases)

    @property
    def deadline_s(self) -> float:
        """Seconds a request may take in all."""
        return self.request_timeout_s or DEFAULT_DEADLINE_S


@runtime_checkable
class Relay(Protocol):
    """A backend that can post any OpenAI route to its upstream (``OpenAICompatBackend``):
    the passed-through routes, and chat with ``n`` > 1 (the upstream decodes the choices)."""

    model: str

    async def apost(self, path: str, body: Mapping[str, Any], timeout: float | None = None
                    ) -> Any: ...

    async def apost_stream(self, path: str, body: Mapping[str, Any],
                           timeout: float | None = None) -> AsyncIterator[bytes]: ...


MAX_N = 128  # OpenAI's own bound on n (limits.INTEGER_FIELDS)


class DeadlineExceeded(BackendTimeout):
    """The server's own deadline passed (its message holds nothing from the upstream)."""


def upstream_fault(exc: BaseException) -> bool:
    """Whether an exception that is not a ``WhetstoneError`` came from what the upstream sent
    (a malformed SSE line, a broken HTTP stream) rather than from a bug or a local model: the
    first is a 502, the second a 500."""
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return True
    # The openai SDK's transport is httpx2/httpcore2 in newer releases, httpx before.
    if type(exc).__module__.split(".")[0] in ("httpx", "httpcore", "httpx2", "httpcore2", "h11",
                                              "openai", "aiohttp"):
        return True
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    # Raised while reading an upstream's chunk (StreamAccumulator.feed).
    return last is not None and last.tb_frame.f_globals.get("__name__") == (
        "whetstone.engine.backends.openai_wire")


def _as_upstream_error(exc: Exception) -> Exception:
    if isinstance(exc, WhetstoneError) or not upstream_fault(exc):
        return exc
    return BackendError(f"the upstream sent a reply that could not be read: "
                        f"{type(exc).__name__}: {exc}", hint="check the upstream server")


# Upstream refusals that are not the client's to fix: the upstream refused Whetstone's own key
# (401, 403, 407), or does not know the model name Whetstone sends it (404). They stay 502s,
# the details in the server log; every other 4xx reaches the client as the upstream sent it.
_OPERATORS_STATUSES = frozenset({401, 403, 404, 407})
_RETRY_AFTER_S = "1"  # a 429 whose upstream named no wait


def forwarded(exc: WhetstoneError) -> BackendRejected | None:
    """``exc`` when it is an upstream refusal the client is answered with as is, else None."""
    if isinstance(exc, BackendRejected) and 400 <= exc.status < 500 \
            and exc.status not in _OPERATORS_STATUSES:
        return exc
    return None


def _default_type(status: int) -> str:
    return {429: "rate_limit_error", 413: "invalid_request_error"}.get(
        status, "invalid_request_error")


def error_status(exc: WhetstoneError) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for an error raised while answering a request.
    An upstream's 4xx keeps its status, type and code (``forwarded``)."""
    refused = forwarded(exc)
    if refused is not None:
        return (refused.status, refused.error_type or _default_type(refused.status),
                refused.code)
    if isinstance(exc, ConfigError):
        return 400, "invalid_request_error", None
    if isinstance(exc, NotFound):
        return 404, "invalid_request_error", "model_not_found"
    if isinstance(exc, BackendTimeout):
        return 504, "server_error", "upstream_timeout"
    if isinstance(exc, BackendError):
        return 502, "server_error", "upstream_error"
    return 500, "server_error", None


def error_headers(exc: WhetstoneError) -> dict[str, str]:
    """Headers an error reply carries: ``Retry-After`` on a 429 (the upstream's, else 1 s),
    and ``x-should-retry: false`` when the backend already retried the upstream (or it said
    not to): the ``openai`` client and a Whetstone in front of this one then do not retry
    again, so a chain of proxies makes one round of retries, not one per hop."""
    headers = {}
    refused = forwarded(exc)
    if refused is not None and refused.status == 429:
        headers["Retry-After"] = refused.retry_after or _RETRY_AFTER_S
    if isinstance(exc, BackendError) and exc.no_retry:
        headers["x-should-retry"] = "false"
    return headers


def metric_code(exc: WhetstoneError) -> str | None:
    """The ``code`` label an error is counted under: ``upstream_<status>`` for a forwarded
    refusal (its own code is the upstream's, unbounded), else None (the reply's code)."""
    refused = forwarded(exc)
    return f"upstream_{refused.status}" if refused is not None else None


def error_param(exc: WhetstoneError) -> str | None:
    refused = forwarded(exc)
    return refused.param if refused is not None else None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_message(exc: WhetstoneError) -> str:
    """``exc``'s message, and the hint in brackets (for errors about the client's request)."""
    return exc.message if not exc.hint else f"{exc.message} ({exc.hint})"


# An absolute path on this host: /..., ~/..., C:\... (not the path of a URL: "//" and
# "host/" come before it there, nor a model id like org/name).
_ABS_PATH = r"""(?<![\w:/.~-])(?:~|[A-Za-z]:)?[/\\][^\s'"()<>\[\]{},;]+"""
_PATH_IN_BRACKETS = re.compile(rf"\s*\(\s*{_ABS_PATH}\s*\)")
_PATH = re.compile(_ABS_PATH)


def without_paths(text: str) -> str:
    """``text`` with every absolute path on this host taken out: a path in brackets goes
    with its brackets, any other becomes ``<path>``. For what a client is told: an error
    about a library or corpus names its folder, which is the operator's to know."""
    return _PATH.sub("<path>", _PATH_IN_BRACKETS.sub("", text))


def client_message(exc: WhetstoneError, request_id: str) -> str:
    """What a client is told about ``exc``. An error of its own request (4xx) says what is
    wrong; an upstream or server failure says only what kind it was and the request id, so
    no upstream text, address or traceback reaches a client (they are in the server log and
    the exchange's trace)."""
    refused = forwarded(exc)
    if refused is not None:  # the upstream's own words, without its address
        return refused.upstream_message
    status, _, _ = error_status(exc)
    if status < 500:
        return without_paths(error_message(exc))
    if isinstance(exc, DeadlineExceeded):
        return f"{error_message(exc)} (request {request_id})"
    what = {504: "the upstream model did not answer in time",
            502: "the upstream model failed"}.get(status, "internal server error")
    return f"{what} (request {request_id}; the details are in the server log)"


def _check_not_empty(first: StreamChunk | None) -> None:
    """An upstream that answered a stream with something else (an HTML error page) gives a
    stream that ends at once with no text and no model name: that is a 502, not a 200 with
    empty content."""
    c = first.completion if first is not None else None
    if first is None or (c is not None and not first.text and not c.text and not c.tool_calls
                         and not c.model and not c.completion_tokens):
        raise BackendError("the upstream's stream held no chat completion chunk",
                           hint="check that the upstream speaks the OpenAI chat API")


class OpenStream:
    """A backend stream in progress: ``first`` chunk already read, ``next()`` under the
    request's deadline (``deadline``, on the monotonic clock) and the idle limit, ``close()``
    (idempotent) closes the backend stream and frees the slot."""

    def __init__(self, chunks: AsyncIterator[StreamChunk], deadline: float, total_s: float,
                 slots: asyncio.Semaphore, *, idle_s: float | None = None,
                 idle_before_first: bool = True,
                 on_close: Callable[[OpenStream], None] | None = None) -> None:
        self.first: StreamChunk | None = None
        self._chunks = chunks
        self._deadline = deadline
        self._total_s = total_s
        self._idle_s = idle_s
        # A backend that cannot stream answers all at once: no chunk comes before it is done.
        self._idle_now = idle_before_first
        self._slots = slots
        self._on_close = on_close
        self.started = time.monotonic()
        self._closed = False

    async def next(self) -> StreamChunk | None:
        """The next chunk, None at the end; ``BackendTimeout`` past the deadline or after
        ``idle_s`` without a chunk; a reply the upstream garbled is a ``BackendError``."""
        left = max(0.0, self._deadline - time.monotonic())
        idle = self._idle_s if self._idle_now and self._idle_s is not None else None
        wait = left if idle is None else min(left, idle)
        try:
            chunk = await asyncio.wait_for(anext(self._chunks, None), wait)
        except TimeoutError:
            if idle is not None and idle < left:
                raise DeadlineExceeded(f"the model sent nothing for {idle:g} s",
                                       hint="retry later; the upstream may be stuck") from None
            raise DeadlineExceeded(f"the model did not finish within {self._total_s:g} s",
                                   hint="retry later, or ask for fewer tokens") from None
        except Exception as exc:  # re-raised: a 502 when it is the upstream's doing
            raise _as_upstream_error(exc) from exc
        self._idle_now = True
        return chunk

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
        """Validate a request body; raises ``ConfigError`` (400) or ``NotFound`` (404). ``n``
        above 1 only where the upstream decodes it (a ``Relay``), never in a stream (the
        events here carry one choice)."""
        check_size(body, self.settings.max_request_items)
        check_ranges(body)
        relays = isinstance(self.backend, Relay)
        call = request_from_openai(body, default_max_tokens=self.settings.default_max_tokens,
                                   timeout=self.settings.request_timeout_s,
                                   max_n=MAX_N if relays else 1)
        if call.stream and call.request.n > 1:
            raise ConfigError(f"'n' = {call.request.n} needs stream: false here (a stream "
                              "from this server carries one choice)",
                              hint="send stream: false to get the n choices in one reply")
        if call.model is not None and call.model not in self.settings.served:
            raise NotFound(f"the model {shown(call.model, 80)!r} is not served here",
                           hint="available: " + ", ".join(self.settings.served))
        return call

    def deadline(self) -> float:
        """The deadline of a request arriving now, on the monotonic clock."""
        return time.monotonic() + self.settings.deadline_s

    def _expired(self, message: str | None = None) -> DeadlineExceeded:
        return DeadlineExceeded(message or f"the model did not answer within "
                                f"{self.settings.deadline_s:g} s",
                                hint="retry later, or ask for fewer tokens")

    async def _take_slot(self, deadline: float) -> None:
        """Wait for an upstream slot, no longer than the request's deadline."""
        try:
            await asyncio.wait_for(self._slots.acquire(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise self._expired(f"the request waited for a free slot for all of its "
                                f"{self.settings.deadline_s:g} s") from None

    def _timed(self, request: Request, deadline: float) -> Request:
        """``request`` with the time left as its timeout, when a timeout is configured."""
        if self.settings.request_timeout_s is None:
            return request
        return replace(request, timeout=max(0.001, deadline - time.monotonic()))

    async def complete(self, call: ChatCall, deadline: float | None = None) -> Completion:
        """One completion, or ``DeadlineExceeded`` when the deadline passes (the wait for a
        slot included)."""
        deadline = self.deadline() if deadline is None else deadline
        completion = await self.relay(
            lambda _left: self.backend.acomplete(self._timed(call.request, deadline)), deadline)
        self.count_tokens(completion)
        return completion

    def count_tokens(self, completion: Completion) -> None:
        self.metrics.tokens.inc(completion.prompt_tokens, kind="prompt")
        self.metrics.tokens.inc(completion.completion_tokens, kind="completion")

    async def open_stream(self, call: ChatCall, deadline: float | None = None) -> OpenStream:
        """Start streaming and wait for the first chunk, so a backend that fails at once is
        answered with a proper HTTP error instead of a broken event stream.

        The returned stream holds a concurrency slot until it is closed.
        """
        deadline = self.deadline() if deadline is None else deadline
        await self._take_slot(deadline)
        self.upstream_active += 1
        stream = OpenStream(self.backend.astream(self._timed(call.request, deadline)),
                            deadline, self.settings.deadline_s, self._slots,
                            idle_s=self.settings.stream_idle_s,
                            idle_before_first=self.backend.capabilities.streaming,
                            on_close=self._stream_closed)
        try:
            stream.first = await stream.next()
            _check_not_empty(stream.first)
        except BaseException:
            await stream.close()
            raise
        return stream

    async def relay(self, call: Callable[[float], Awaitable[_T]], deadline: float) -> _T:
        """``call(seconds_left)`` (a passed-through route's upstream call) holding an upstream
        slot, within the request's deadline."""
        await self._take_slot(deadline)
        self.upstream_active += 1
        start = time.perf_counter()
        try:
            left = max(0.001, deadline - time.monotonic())
            return await asyncio.wait_for(call(left), left + _DEADLINE_GRACE_S)
        except TimeoutError:
            raise self._expired() from None
        except Exception as exc:  # re-raised: a 502 when it is the upstream's doing
            raise _as_upstream_error(exc) from exc
        finally:
            self._slots.release()
            self.upstream_active -= 1
            self.metrics.upstream_latency.observe(time.perf_counter() - start, stream="false")

    async def open_relay(self, opener: Callable[[float], Awaitable[AsyncIterator[bytes]]],
                         deadline: float) -> OpenStream:
        """Open a passed-through stream (``opener(seconds_left)``): an upstream refusal is
        raised here, before any byte, so it can still be the reply's status. The stream holds
        an upstream slot until it is closed."""
        await self._take_slot(deadline)
        self.upstream_active += 1
        try:
            left = max(0.001, deadline - time.monotonic())
            chunks = await asyncio.wait_for(opener(left), left + _DEADLINE_GRACE_S)
        except BaseException as exc:
            self._slots.release()
            self.upstream_active -= 1
            if isinstance(exc, asyncio.TimeoutError):
                raise self._expired() from None
            if isinstance(exc, Exception):
                raise _as_upstream_error(exc) from exc
            raise
        return OpenStream(chunks, deadline, self.settings.deadline_s, self._slots,  # type: ignore[arg-type]
                          idle_s=self.settings.stream_idle_s, on_close=self._stream_closed)

    def _stream_closed(self, stream: OpenStream) -> None:
        self.upstream_active -= 1
        self.metrics.upstream_latency.observe(time.monotonic() - stream.started, stream="true")

    async def sse_events(self, call: ChatCall, model: str, stream: OpenStream,
                         on_end: Callable[[Completion | None, str | None, str], None]
                         | None = None, request_id: str = "",
                         settle: Callable[[], Awaitable[None]] | None = None
                         ) -> AsyncIterator[str]:
        """``chat.completion.chunk`` events ending in ``data: [DONE]``; a failure mid-stream
        becomes an ``{"error": ...}`` event, which OpenAI clients raise as an error.

        ``on_end(completion, error, text_so_far)`` is called once however the stream ends
        (completion None: it failed, or the client went away): before ``[DONE]``, then
        ``settle()`` is awaited (the trace written), so a stream the client saw end has its
        trace stored; a client gone mid-stream is recorded as it leaves.
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
                self.count_tokens(last)
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
                log.warning("request %s: stream failed (%d): %s", request_id, status,
                            exc.message)
                failure = exc.message
                self.metrics.errors.inc(code=metric_code(exc) or code or "server_error")
                yield _sse(error_to_openai(client_message(exc, request_id), kind, code=code))
            except Exception as exc:
                log.exception("request %s: stream failed", request_id)
                failure = f"{type(exc).__name__}: {exc}"  # for the trace, not the client
                self.metrics.errors.inc(code="internal_error")
                yield _sse(error_to_openai(f"internal server error (request {request_id}; "
                                           "see the server log)", "server_error"))
            interrupted = False
        finally:
            await stream.close()
            if interrupted and on_end is not None:
                on_end(None, None, "".join(sent))
        if on_end is not None:  # recorded, and written, before the client hears the end
            on_end(final, failure, "".join(sent))
            if settle is not None:
                await settle()
        yield "data: [DONE]\n\n"
