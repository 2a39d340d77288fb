"""The OpenAI-compatible server: ``/v1/chat/completions`` (with SSE streaming), ``/v1/models``,
``/health``, for any backend.

``create_app(backend)`` builds a FastAPI app (no app exists at import time); ``serve(...)`` runs
it under uvicorn, which is what ``whetstone serve`` calls. The backend is called through
``acomplete`` / ``astream`` so generation runs off the event loop and the server stays
responsive; at most ``max_concurrency`` calls are in flight (the backend's own limit by default:
a local model is one process, a remote server can take more). Every error is an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}`` with a fitting status, never a stack trace.

The wire format lives in ``engine.backends.openai_wire``, shared with the ``openai:`` backend.
The middleware (library injection, trace capture, keys, limits) wraps ``ChatService``.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at
# run time, and their types are imported inside create_app.
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.backends.base import Backend, StreamChunk
from engine.backends.openai_wire import (
    ChatCall,
    chunk_to_openai,
    completion_to_openai,
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
from engine.types import Completion

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger("whetstone.server")

# How long past a request's deadline we wait for a backend that ignores Request.timeout.
_DEADLINE_GRACE_S = 1.0


@dataclass(frozen=True)
class ServerSettings:
    """What one server serves and how. ``model_name`` is the id clients send as ``model``."""

    model_name: str
    aliases: tuple[str, ...] = ()
    default_max_tokens: int = 512
    request_timeout_s: float | None = None  # per request; None: the backend's own timeout
    max_concurrency: int = 1  # backend calls in flight; the rest wait their turn

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


def _error_message(exc: WhetstoneError) -> str:
    return exc.message if not exc.hint else f"{exc.message} ({exc.hint})"


class OpenStream:
    """A backend stream in progress: ``first`` chunk already read, ``next()`` under the
    request's deadline, ``close()`` (idempotent) closes the backend stream and frees the slot."""

    def __init__(self, chunks: AsyncIterator[StreamChunk], deadline: float | None,
                 timeout: float | None, slots: asyncio.Semaphore) -> None:
        self.first: StreamChunk | None = None
        self._chunks = chunks
        self._deadline = deadline
        self._timeout = timeout
        self._slots = slots
        self._started = time.monotonic()
        self._closed = False

    async def next(self) -> StreamChunk | None:
        """The next chunk, None at the end; ``BackendTimeout`` past the deadline."""
        left = None if self._deadline is None else max(
            0.0, self._deadline - (time.monotonic() - self._started))
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


class ChatService:
    """Answers parsed chat calls with the backend: concurrency limit, deadlines, formatting.

    Kept apart from the HTTP routes so the middleware can wrap it (adapt the request before,
    record the exchange after) without touching the transport.
    """

    def __init__(self, backend: Backend, settings: ServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self._slots = asyncio.Semaphore(max(1, settings.max_concurrency))

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
            try:
                return await asyncio.wait_for(self.backend.acomplete(call.request),
                                              self._deadline(call))
            except asyncio.TimeoutError:
                raise BackendTimeout(
                    f"the model did not answer within {call.request.timeout:g} s",
                    hint="retry later, or ask for fewer tokens") from None

    async def open_stream(self, call: ChatCall) -> OpenStream:
        """Start streaming and wait for the first chunk, so a backend that fails at once is
        answered with a proper HTTP error instead of a broken event stream.

        The returned stream holds a concurrency slot until it is closed.
        """
        await self._slots.acquire()
        stream = OpenStream(self.backend.astream(call.request), self._deadline(call),
                            call.request.timeout, self._slots)
        try:
            stream.first = await stream.next()
        except BaseException:
            await stream.close()
            raise
        return stream

    async def sse_events(self, call: ChatCall, model: str, stream: OpenStream
                         ) -> AsyncIterator[str]:
        """``chat.completion.chunk`` events ending in ``data: [DONE]``; a failure mid-stream
        becomes an ``{"error": ...}`` event, which OpenAI clients raise as an error."""
        cid, created = new_completion_id(), int(time.time())

        def event(**kw: Any) -> str:
            return _sse(chunk_to_openai(id=cid, created=created, model=model, **kw))

        try:
            yield event(delta={"role": "assistant", "content": ""})
            chunk: StreamChunk | None = stream.first
            final: Completion | None = None
            while chunk is not None:
                if chunk.text:
                    yield event(delta={"content": chunk.text})
                if chunk.completion is not None:
                    final = chunk.completion
                    break
                chunk = await stream.next()
            if final is None:
                raise BackendError("the backend's stream ended without a completion",
                                   hint="a backend's stream() must end with the Completion")
            if final.tool_calls:
                calls = [{"index": i, **c}
                         for i, c in enumerate(tool_calls_to_openai(final.tool_calls))]
                yield event(delta={"tool_calls": calls})
            yield event(delta={}, finish_reason=finish_reason_to_openai(final))
            if call.include_usage:
                yield event(usage=usage_to_openai(final))
        except WhetstoneError as exc:
            status, kind, code = error_status(exc)
            log.warning("stream failed (%d): %s", status, exc.message)
            yield _sse(error_to_openai(_error_message(exc), kind, code=code))
        except Exception:
            log.exception("stream failed")
            yield _sse(error_to_openai("internal server error (see the server log)",
                                       "server_error"))
        finally:
            await stream.close()
        yield "data: [DONE]\n\n"


def create_app(
    backend: Backend,
    *,
    model_name: str | None = None,
    aliases: tuple[str, ...] = (),
    default_max_tokens: int = 512,
    request_timeout_s: float | None = None,
    max_concurrency: int | None = None,
) -> "FastAPI":
    """Build the app serving ``backend`` as ``model_name`` (default: the backend's spec).

    ``request_timeout_s`` bounds each request (504 past it); ``max_concurrency`` caps backend
    calls in flight (default: ``backend.capabilities.max_concurrency``).
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    settings = ServerSettings(
        model_name=model_name or backend.spec or "whetstone",
        aliases=tuple(a for a in aliases if a != model_name),
        default_max_tokens=default_max_tokens,
        request_timeout_s=request_timeout_s,
        max_concurrency=max_concurrency or backend.capabilities.max_concurrency,
    )
    service = ChatService(backend, settings)

    class _EventStream(StreamingResponse):
        """Closes the backend stream however the response ends: done, failed, or the client
        went away before the first event (then the event generator never starts)."""

        def __init__(self, stream: OpenStream, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._stream = stream

        async def __call__(self, *args: Any) -> None:
            try:
                await super().__call__(*args)
            finally:
                await self._stream.close()
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # The caller owns the backend and closes it; what is bound to this event loop (an
        # async HTTP pool) can only be closed here, while the loop still runs.
        aclose = getattr(backend, "aclose", None)
        if aclose is not None:
            await aclose()

    app = FastAPI(title="Whetstone", version="0.1.0", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.service = service

    def error(status: int, message: str, kind: str, code: str | None = None,
              param: str | None = None) -> JSONResponse:
        return JSONResponse(error_to_openai(message, kind, code=code, param=param),
                            status_code=status)

    def whetstone_error(exc: WhetstoneError) -> JSONResponse:
        status, kind, code = error_status(exc)
        if status >= 500:
            log.warning("request failed (%d): %s", status, exc.message)
        return error(status, _error_message(exc), kind, code)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return error(exc.status_code, str(exc.detail), kind, code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()}", "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error(500, "internal server error (see the server log)", "server_error")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"the request body is not valid JSON: {exc}",
                         "invalid_request_error", "invalid_json")
        try:
            call = service.parse(body)
            model = call.model or settings.model_name
            if not call.stream:
                completion = await service.complete(call)
                return JSONResponse(completion_to_openai(completion, model=model))
            stream = await service.open_stream(call)
        except WhetstoneError as exc:
            return whetstone_error(exc)
        return _EventStream(
            stream, service.sse_events(call, model, stream), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": started, "owned_by": "whetstone"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(n) for n in settings.served]}

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def get_model(model_id: str) -> Response | dict[str, Any]:
        if model_id not in settings.served:
            return error(404, f"the model {model_id!r} is not served here; available: "
                         + ", ".join(settings.served), "invalid_request_error",
                         "model_not_found", "model")
        return model_card(model_id)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_name, "backend": backend.spec}

    return app


def serve(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    **app_options: Any,
) -> None:
    """Serve ``backend`` until interrupted (``whetstone serve``). ``app_options`` go to
    ``create_app`` (``model_name``, ``request_timeout_s``, ``max_concurrency`` ...)."""
    import uvicorn

    app = create_app(backend, **app_options)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
