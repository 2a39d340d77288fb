"""Build the OpenAI-compatible app for a backend, and run it under uvicorn.

``create_app(backend)`` builds a FastAPI app (no app exists at import time) whose routes
(``routes.py``) read a ``ServerState`` from ``app.state.server``; ``serve(...)`` runs it, which
is what ``whetstone serve`` calls. The backend is called through ``acomplete`` / ``astream``,
so generation runs off the event loop; at most ``max_concurrency`` calls are in flight (the
backend's own limit by default).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from ..backends.base import Backend
from ..chat.adapter import ChatAdapter
from ..errors import AddressInUse, ConfigError, WhetstoneError
from .canary import CanaryRouter
from .connections import ConnectionGuard, ConnectionLimits, guarded_protocol
from .feedback import FeedbackPolicy
from .guard import Guard
from .hosts import WebPolicy
from .metrics import Metrics
from .naming import upstream_model_name
from .passthrough import router as passthrough_router
from .pipeline import ChatPipeline, Endpoints
from .probes import Readiness
from .recording import TraceWriter
from .responses import install_error_handlers
from .routes import ServerState, router
from .service import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_STREAM_IDLE_S,
    ChatService,
    ServerSettings,
)

if TYPE_CHECKING:
    from ...library_store.traces import TraceStore


def _settings(backend: Backend, *, model_name: str | None, aliases: tuple[str, ...],
              default_max_tokens: int, request_timeout_s: float | None,
              stream_idle_s: float | None, max_concurrency: int | None,
              max_queue: int | None, max_body_bytes: int | None) -> ServerSettings:
    if max_queue is not None and max_queue < 0:
        raise ConfigError(f"max_queue must be 0 or more, got {max_queue}",
                          hint="0 answers 429 whenever every upstream slot is busy")
    if max_body_bytes is not None and max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
    for key, value in (("request_timeout_s", request_timeout_s),
                       ("stream_idle_s", stream_idle_s)):
        if value is not None and not value > 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    name = model_name or upstream_model_name(backend.spec or "") or "whetstone"
    return ServerSettings(
        model_name=name,
        aliases=tuple(a for a in aliases if a != name),
        default_max_tokens=default_max_tokens,
        request_timeout_s=request_timeout_s,
        stream_idle_s=stream_idle_s,
        max_concurrency=max_concurrency or backend.capabilities.max_concurrency,
        max_queue=max_queue,
        max_body_bytes=max_body_bytes,
    )


def _lifespan(pipeline: ChatPipeline,
              backend: Backend) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start the pipeline with the app; on the way out write every queued trace, then close
    what of the backend is bound to this event loop."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pipeline.start()
        try:
            yield
        finally:
            await pipeline.stop()  # writes every queued trace before the process ends
            # The caller owns the backend and closes it; what is bound to this event loop (an
            # async HTTP pool) can only be closed here, while the loop still runs.
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                await aclose()

    return lifespan


def create_app(
    backend: Backend,
    *,
    model_name: str | None = None,
    aliases: tuple[str, ...] = (),
    default_max_tokens: int = 512,
    request_timeout_s: float | None = None,
    stream_idle_s: float | None = DEFAULT_STREAM_IDLE_S,
    max_concurrency: int | None = None,
    max_queue: int | None = None,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    api_keys: Iterable[str] = (),
    adapter: ChatAdapter | None = None,
    traces: TraceStore | None = None,
    retrieval_workers: int = 4,
    endpoints: Endpoints | None = None,
    web: WebPolicy | None = None,
    canary: CanaryRouter | None = None,
    feedback_policy: FeedbackPolicy | None = None,
) -> FastAPI:
    """Build the app serving ``backend`` as ``model_name`` (default: the upstream's own model
    name, ``naming.upstream_model_name``: never its address).

    ``request_timeout_s`` bounds each request in all, the wait for a slot included (504 past
    it; default ``DEFAULT_DEADLINE_S``), ``stream_idle_s`` the silence within a stream
    (None: no limit); ``max_concurrency`` caps backend
    calls in flight (default: ``backend.capabilities.max_concurrency``) and ``max_queue`` how
    many more may wait (429 past it; None: no limit); ``max_body_bytes`` refuses bigger bodies
    (413); ``api_keys``, when given, are required as ``Authorization: Bearer`` on ``/v1/*``.
    ``adapter`` applies the library to each request; ``traces`` records every exchange;
    ``endpoints`` answers ``{"whetstone": {"endpoints": [name]}}`` (each endpoint's report on
    the reply; ``Engine.app`` gives the installed methods');
    ``retrieval_workers`` threads embed queries. ``web`` says which Host and Origin headers are
    answered (``hosts.WebPolicy``; default: a server on 127.0.0.1's, the loopback names).
    ``canary`` routes a share of conversations to a learner's canary (``canary.py``);
    ``feedback_policy`` limits and weighs feedback per key (``feedback.py``; default: 600
    labels a minute per key, every key weighing 1).
    """
    settings = _settings(backend, model_name=model_name, aliases=aliases,
                         default_max_tokens=default_max_tokens,
                         request_timeout_s=request_timeout_s, stream_idle_s=stream_idle_s,
                         max_concurrency=max_concurrency, max_queue=max_queue,
                         max_body_bytes=max_body_bytes)
    keys = frozenset(api_keys)
    writer: TraceWriter | None = None
    # The gauges read the service and the writer built just below, when /metrics is scraped.
    metrics = Metrics(in_flight=lambda: service.admitted, queued=lambda: service.queued,
                      traces_pending=lambda: writer.pending if writer is not None else 0)
    service = ChatService(backend, settings, metrics)
    writer = TraceWriter(traces, metrics) if traces is not None else None
    pipeline = ChatPipeline(adapter, writer, metrics, workers=retrieval_workers,
                            endpoints=endpoints, canary=canary if adapter is not None else None)

    # No /openapi.json, /docs or /redoc: the API is OpenAI's (docs/middleware.md), and a
    # schema served without a key would map the server for anyone who can reach it.
    app = FastAPI(title="Whetstone", version="0.1.0", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=_lifespan(pipeline, backend))
    app.state.server = ServerState(backend=backend, settings=settings, service=service,
                                   metrics=metrics, pipeline=pipeline, writer=writer,
                                   adapter=adapter, started_at=int(time.time()),
                                   api_keys=keys, readiness=Readiness(
                                       backend, store=traces.ready if traces is not None and
                                       traces.remote else None),
                                   feedback_policy=feedback_policy or FeedbackPolicy())
    app.add_middleware(Guard, keys=keys, metrics=metrics, web=web or WebPolicy.for_bind())
    install_error_handlers(app, metrics)
    app.include_router(router)
    app.include_router(passthrough_router)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` now, so a port in use is an ``AddressInUse`` (exit
    code 10) before a model loads, not uvicorn's exit 3 after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a server restarted at once may take the port of one that just stopped
    # (a port someone still listens on stays refused).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(f"cannot listen on {host}:{port}: another process is using "
                               "the port", hint=f"stop it (`lsof -i :{port}` names it) or "
                               "pick another port with --port") from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="check --host (an address of this machine) and --port (ports "
                               "below 1024 need root)") from exc
    return sock


def serve(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    sock: socket.socket | None = None,
    limits: ConnectionLimits | None = None,
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
    **app_options: Any,
) -> None:
    """Serve ``backend`` until interrupted (``whetstone serve``) on ``sock`` (default: bound
    to ``host:port`` here, ``bind``). ``limits`` bound each connection's headers and the
    connections open (default: ``ConnectionLimits()``, see ``connections.py``). The Host
    headers answered are ``host``'s and ``allowed_hosts``, the browser origins the server's
    own and ``allowed_origins`` (``hosts.WebPolicy.for_bind``).
    ``app_options`` go to ``create_app`` (``model_name``, ``adapter``, ``traces``,
    ``api_keys``, ``max_queue`` ...). At shutdown uvicorn lets requests in flight finish,
    then the trace queue is drained."""
    import uvicorn  # heavy: uvicorn (with watchfiles and multiprocessing), only to serve

    app_options.setdefault("web", WebPolicy.for_bind(host, allowed_hosts=allowed_hosts,
                                                     allowed_origins=allowed_origins))
    app = create_app(backend, **app_options)
    guard = ConnectionGuard(limits or ConnectionLimits(), app.state.server.metrics)
    sock = sock if sock is not None else bind(host, port)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           http=guarded_protocol(guard)))
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn's exit 3 when start-up fails: not "model missing"
        if server.started:
            raise
        raise WhetstoneError(f"the server on {host}:{port} did not start",
                             hint="the log above says why") from exc
    finally:
        sock.close()
