"""The OpenAI-compatible server: ``/v1/chat/completions`` (with SSE streaming), ``/v1/models``,
``/health``, for any backend.

``create_app(backend)`` builds a FastAPI app (no app exists at import time); ``serve(...)`` runs
it under uvicorn, which is what ``whetstone serve`` calls. The backend is called through
``acomplete`` / ``astream`` so generation runs off the event loop and the server stays
responsive; at most ``max_concurrency`` calls are in flight (the backend's own limit by default:
a local model is one process, a remote server can take more). Every error is an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}`` with a fitting status, never a stack trace.

The wire format lives in ``engine.backends.openai_wire``, shared with the ``openai:`` backend.
The middleware (``engine.server_middleware``) wraps ``ChatService``: each request is adapted with
the library (``adapter``), answered by the upstream backend, and recorded as a trace off the
response path (``traces``); API keys, a body size limit, a bounded queue in front of the
upstream slots (429 past it) and Prometheus metrics (``/metrics``) guard it. Per-request
switches ride in the body (``extra_body={"whetstone": {"library": false, "record": false}}``);
responses name the library version and the trace in ``X-Whetstone-Library-Version`` and
``X-Whetstone-Trace-Id``, and ``POST /v1/feedback`` labels a trace.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at
# run time, and their types are imported inside create_app.
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.backends.base import Backend
from engine.backends.openai_wire import (
    ChatCall,
    completion_to_openai,
    error_to_openai,
)
from engine.errors import ConfigError, NotFound, WhetstoneError
from engine.runtime.chat import Adapted, ChatAdapter, ChatSwitches, chat_trace, check_feedback
from engine.server_metrics import CONTENT_TYPE, Metrics
from engine.server_middleware import (
    REQUEST_ID_HEADER,
    TRACE_HEADER,
    VERSION_HEADER,
    BodyTooLarge,
    ChatMiddleware,
    Guard,
    TraceWriter,
    read_body,
)
from engine.server_service import (
    DEFAULT_MAX_BODY_BYTES,
    ChatService,
    OpenStream,
    ServerSettings,
    _error_message,
    error_status,
)
from engine.types import Completion, Trace

if TYPE_CHECKING:
    from fastapi import FastAPI

    from library_store.traces import TraceStore

log = logging.getLogger("whetstone.server")

# A JSON escape in the surrogate range (\ud800-\udfff). Only bodies holding one can decode to
# a lone surrogate, so only those pay for the full check in _valid_text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _valid_text(raw: bytes, body: Any) -> bool:
    """Whether every string in the parsed ``body`` encodes as UTF-8. A JSON escape can decode
    to a lone surrogate, which no backend, SSE writer or trace file can encode."""
    if not _SURROGATE_ESCAPE.search(raw):
        return True
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a new one."""
    if given and len(given) <= 128 and all(c.isalnum() or c in "._:-" for c in given):
        return given
    return "req_" + uuid.uuid4().hex[:24]


def _failure_text(exc: BaseException) -> str:
    """What a trace says about an exception that is not a ``WhetstoneError``."""
    return f"{type(exc).__name__}: {exc}"


def create_app(
    backend: Backend,
    *,
    model_name: str | None = None,
    aliases: tuple[str, ...] = (),
    default_max_tokens: int = 512,
    request_timeout_s: float | None = None,
    max_concurrency: int | None = None,
    max_queue: int | None = None,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    api_keys: Iterable[str] = (),
    adapter: ChatAdapter | None = None,
    traces: "TraceStore | None" = None,
    retrieval_workers: int = 4,
) -> "FastAPI":
    """Build the app serving ``backend`` as ``model_name`` (default: the backend's spec).

    ``request_timeout_s`` bounds each request (504 past it); ``max_concurrency`` caps backend
    calls in flight (default: ``backend.capabilities.max_concurrency``) and ``max_queue`` how
    many more may wait (429 past it; None: no limit); ``max_body_bytes`` refuses bigger bodies
    (413); ``api_keys``, when given, are required as ``Authorization: Bearer`` on ``/v1/*``.
    ``adapter`` applies the library to each request; ``traces`` records every exchange.
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    from engine.runtime.agent import new_trace_id

    if max_queue is not None and max_queue < 0:
        raise ConfigError(f"max_queue must be 0 or more, got {max_queue}",
                          hint="0 answers 429 whenever every upstream slot is busy")
    if max_body_bytes is not None and max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
    settings = ServerSettings(
        model_name=model_name or backend.spec or "whetstone",
        aliases=tuple(a for a in aliases if a != model_name),
        default_max_tokens=default_max_tokens,
        request_timeout_s=request_timeout_s,
        max_concurrency=max_concurrency or backend.capabilities.max_concurrency,
        max_queue=max_queue,
        max_body_bytes=max_body_bytes,
    )
    writer: TraceWriter | None = None
    metrics = Metrics(in_flight=lambda: service.admitted, queued=lambda: service.queued,
                      traces_pending=lambda: writer.pending if writer is not None else 0)
    service = ChatService(backend, settings, metrics)
    writer = TraceWriter(traces, metrics) if traces is not None else None
    middleware = ChatMiddleware(adapter, writer, metrics, workers=retrieval_workers)

    class _EventStream(StreamingResponse):
        """Closes the backend stream and frees the queue place however the response ends:
        done, failed, or the client went away before the first event (then the event
        generator never starts)."""

        def __init__(self, stream: OpenStream, *args: Any,
                     on_close: Callable[[], None], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._stream = stream
            self._on_close = on_close

        async def __call__(self, *args: Any) -> None:
            try:
                await super().__call__(*args)
            finally:
                try:
                    await self._stream.close()
                finally:
                    self._on_close()
    started_at = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await middleware.start()
        try:
            yield
        finally:
            await middleware.stop()  # writes every queued trace before the process ends
            # The caller owns the backend and closes it; what is bound to this event loop (an
            # async HTTP pool) can only be closed here, while the loop still runs.
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                await aclose()

    app = FastAPI(title="Whetstone", version="0.1.0", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.service = service
    app.state.metrics = metrics
    app.state.middleware = middleware
    app.add_middleware(Guard, keys=frozenset(api_keys), metrics=metrics)

    def error(status: int, message: str, kind: str, code: str | None = None,
              param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
        metrics.errors.inc(code=code or kind)
        return JSONResponse(error_to_openai(message, kind, code=code, param=param),
                            status_code=status, headers=headers)

    def whetstone_error(exc: WhetstoneError, headers: dict[str, str] | None = None
                        ) -> JSONResponse:
        status, kind, code = error_status(exc)
        if status >= 500:
            log.warning("request failed (%d): %s", status, exc.message)
        return error(status, _error_message(exc), kind, code, headers=headers)

    def internal_error(exc: Exception, headers: dict[str, str]) -> JSONResponse:
        """A bug or a backend failure that is not a ``WhetstoneError`` (CUDA out of memory):
        logged once with its traceback, answered as a plain 500 without the details."""
        log.error("request failed (500): %s", _failure_text(exc), exc_info=exc)
        return error(500, "internal server error (see the server log)", "server_error",
                     "internal_error", headers=headers)

    async def json_body(request: Request, headers: dict[str, str]) -> Any:
        """The parsed body, or the error response to send instead."""
        try:
            raw = await read_body(request, settings.max_body_bytes)
        except BodyTooLarge as exc:
            return error(413, str(exc), "invalid_request_error", "request_too_large",
                         headers=headers)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            # ValueError covers bad JSON, bad UTF-8 and integers too long to convert;
            # RecursionError, nesting too deep to parse.
            return error(400, f"the request body is not valid JSON: {exc}",
                         "invalid_request_error", "invalid_json", headers=headers)
        if not _valid_text(raw, body):
            return error(400, "the request body holds a lone UTF-16 surrogate escape "
                         "(\\ud800-\\udfff without its pair); send text as valid Unicode",
                         "invalid_request_error", "invalid_json", headers=headers)
        return body

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        # exc.headers carries what the status needs, such as Allow on a 405.
        return error(exc.status_code, str(exc.detail), kind, code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()}", "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error(500, "internal server error (see the server log)", "server_error")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        started = time.time()
        request_id = _request_id(request.headers.get(REQUEST_ID_HEADER))
        headers = {REQUEST_ID_HEADER: request_id}
        body = await json_body(request, headers)
        if isinstance(body, Response):
            return body
        try:
            call = service.parse(body)
            switches = ChatSwitches.from_body(body.get("whetstone"))
        except WhetstoneError as exc:
            return whetstone_error(exc, headers)
        except Exception as exc:  # noqa: BLE001 - a validation bug: still a proper 500
            return internal_error(exc, headers)
        if not service.admit():
            return error(429, f"the server is busy: {service.admitted} requests are being "
                         f"answered or are waiting, the most it takes; retry shortly",
                         "requests", "rate_limit_exceeded",
                         headers={**headers, "Retry-After": "1"})
        handed_off = [False]  # a stream frees its queue place itself, when it ends
        try:
            adapted = await middleware.adapt(call.request, switches)
            call = replace(call, request=adapted.request)
            return await answer(call, adapted, switches, started, request_id, headers,
                                handed_off)
        finally:
            if not handed_off[0]:
                service.release()

    async def answer(call: ChatCall, adapted: Adapted, switches: ChatSwitches, started: float,
                     request_id: str, headers: dict[str, str], handed_off: list[bool]
                     ) -> Response:
        model = call.model or settings.model_name
        trace_id = new_trace_id() if switches.record and writer is not None else None
        if adapted.applied and adapted.library_version:
            headers[VERSION_HEADER] = adapted.library_version
        if trace_id is not None:
            headers[TRACE_HEADER] = trace_id

        def record(completion: Completion | None, failure: str | None,
                   outcome: Any = None, **meta: Any) -> None:
            if trace_id is not None:
                middleware.record(chat_trace(
                    trace_id, adapted, model=backend.spec, started=started,
                    completion=completion, error=failure, outcome=outcome,
                    request_id=request_id, meta={"served_as": model, "stream": call.stream,
                                                 **meta}))

        async def record_after(completion: Completion | None, failure: str | None) -> None:
            # A coroutine, so Starlette runs it on the loop once the reply is sent (a plain
            # function would go to a worker thread, and the trace queue is the loop's).
            record(completion, failure)

        def failed(exc: Exception) -> JSONResponse:
            """The error reply, recording the exchange once it is sent."""
            if isinstance(exc, WhetstoneError):
                out, reason = whetstone_error(exc, headers), exc.message
            else:
                out, reason = internal_error(exc, headers), _failure_text(exc)
            out.background = BackgroundTask(record_after, None, reason)
            return out

        if not call.stream:
            try:
                completion = await service.complete(call)
            except Exception as exc:  # noqa: BLE001 - any failure gets a reply and a trace
                return failed(exc)
            return JSONResponse(completion_to_openai(completion, model=model), headers=headers,
                                background=BackgroundTask(record_after, completion, None))
        try:
            stream = await service.open_stream(call)
        except Exception as exc:  # noqa: BLE001 - any failure gets a reply and a trace
            return failed(exc)
        ended = [False]

        def on_end(completion: Completion | None, failure: str | None, text: str) -> None:
            if ended[0]:
                return
            ended[0] = True
            if completion is None and failure is None:
                record(None, "the client closed the stream", outcome="interrupted",
                       partial=text)
            else:
                record(completion, failure)

        def on_close() -> None:
            on_end(None, None, "")  # when the event generator never ran
            service.release()

        handed_off[0] = True
        return _EventStream(
            stream, service.sse_events(call, model, stream, on_end), on_close=on_close,
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/feedback", response_model=None)
    async def feedback(request: Request) -> Response | dict[str, Any]:
        body = await json_body(request, {})
        if isinstance(body, Response):
            return body
        if writer is None:
            return error(404, "this server does not record traces, so there is nothing to "
                         "label", "invalid_request_error", "not_found")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object {trace_id, score, comment}",
                         "invalid_request_error")
        trace_id = body.get("trace_id")
        if not isinstance(trace_id, str) or not trace_id.strip():
            return error(400, "'trace_id' is required: the X-Whetstone-Trace-Id header of the "
                         "response being labelled", "invalid_request_error", param="trace_id")
        try:
            score, comment = check_feedback(body.get("score"), body.get("comment"))
        except ConfigError as exc:
            param = "comment" if "comment" in exc.message else "score"
            return error(400, _error_message(exc), "invalid_request_error", param=param)
        try:
            trace: Trace = await writer.label(trace_id.strip(), score, comment)
        except NotFound as exc:
            return error(404, _error_message(exc), "invalid_request_error", "trace_not_found",
                         param="trace_id")
        except WhetstoneError as exc:  # the trace is still queued: the store is backed up
            return error(503, _error_message(exc), "server_error", "trace_pending",
                         headers={"Retry-After": "1"})
        return {"object": "feedback", "trace_id": trace.id, "score": trace.score,
                "comment": comment}

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": started_at, "owned_by": "whetstone"}

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
        out: dict[str, Any] = {"status": "ok", "model": settings.model_name,
                               "backend": backend.spec}
        if adapter is not None or writer is not None:
            out["upstream"] = backend.spec
            out["recording"] = writer is not None
            try:
                out["library_version"] = middleware.library_version()
            except WhetstoneError as exc:
                out["library_version"] = None
                out["library_error"] = exc.message
        return out

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

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
    ``create_app`` (``model_name``, ``adapter``, ``traces``, ``api_keys``, ``max_queue`` ...).
    At shutdown uvicorn lets requests in flight finish, then the trace queue is drained."""
    import uvicorn

    app = create_app(backend, **app_options)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
