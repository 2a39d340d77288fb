"""Around each chat call the server answers: adapt the request with the library before, hand
the finished exchange to the trace writer after.

Retrieval embeds the query, which would stall the event loop, so ``ChatPipeline`` adapts in a
thread pool (a cached question is answered on the loop); when retrieval fails the request is
served without the library (logged and counted): the model answering matters more than the
guidance. A failed endpoint is reported to the client without the paths its error names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from ...library_store.learning import CanaryRecord
from ..chat.adapter import Adapted, ChatAdapter, ChatSwitches, chat_query
from ..errors import ConfigError, WhetstoneError
from ..types import Request, Trace
from .canary import CanaryRouter, Route
from .metrics import Metrics
from .recording import TraceWriter
from .service import error_message, without_paths

log = logging.getLogger("whetstone.server")

class Endpoints(Protocol):
    """The methods' endpoints a server calls on a reply (``MethodEndpoints``)."""

    def names(self) -> list[str]: ...

    def report(self, name: str, question: str, answer: str) -> Mapping[str, Any]: ...


ENDPOINT_WORKERS = 4


def endpoint_error(exc: Exception) -> str:
    """What the client is told of a failed endpoint: the error and its hint without the paths
    it names (an empty corpus's folder), or, for a bug, only where the details are."""
    if isinstance(exc, WhetstoneError):
        return without_paths(error_message(exc))
    return "the endpoint failed (the details are in the server log)"


class ChatPipeline:
    """What the server does around each chat call: adapt it, then record it.

    ``adapter`` None: requests pass unchanged (still recorded when ``traces`` is given).
    ``workers``: threads for retrieval (each query embedding is one single-threaded ONNX run;
    on 2 cores 1 thread and 4 served unique prompts alike). An endpoint (a verification)
    calls the model for seconds, so endpoints have threads of their own and never hold up
    retrieval.
    """

    def __init__(self, adapter: ChatAdapter | None, traces: TraceWriter | None,
                 metrics: Metrics, *, workers: int = 4,
                 endpoints: Endpoints | None = None, canary: CanaryRouter | None = None
                 ) -> None:
        self.adapter = adapter
        self.traces = traces
        self.metrics = metrics
        self.endpoints = endpoints
        self.canary = canary
        if canary is not None:
            canary.attach(metrics)  # its routes and the library's learning state on /metrics
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers),
                                            thread_name_prefix="whetstone-retrieval")
        self._endpoint_executor = ThreadPoolExecutor(max_workers=ENDPOINT_WORKERS,
                                                     thread_name_prefix="whetstone-endpoint")

    def library_version(self) -> str | None:
        return self.adapter.library_version() if self.adapter is not None else None

    def library_gate(self) -> Mapping[str, Any] | None:
        """How the served version came to be: a gate accepted it, or it went live ungated."""
        return self.adapter.library_gate() if self.adapter is not None else None

    async def adapt(self, request: Request, switches: ChatSwitches,
                    conversation: str | None = None) -> Adapted:
        """The adapted request. When retrieval fails the request is served without the
        library (logged and counted): the model answering matters more than the guidance.
        While a canary runs, ``conversation`` (``canary.conversation_key``) says which
        version adapts it; the arm goes into ``meta["canary"]``."""
        if self.adapter is None or not switches.library:
            self.metrics.library.inc(applied="false")
            return Adapted(request, query=chat_query(request.messages))
        route = self.canary.route(conversation) if self.canary is not None \
            and conversation is not None else None
        adapter: ChatAdapter = self.adapter
        if route is not None and route.arm == "canary":
            canary = await self._canary_adapter(route.record)
            if canary is None:
                route = Route(route.record, "current")
            adapter = canary or self.adapter
        adapted = await self._adapt(request, switches, adapter)
        if route is None:
            return adapted
        return replace(adapted, meta={**adapted.meta, "canary": route.meta()})

    async def _canary_adapter(self, record: CanaryRecord) -> ChatAdapter | None:
        """The canary's adapter (built the first time in a retrieval thread); None, logged
        and counted, when it cannot be loaded: the request is served by the current version."""
        assert self.canary is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.canary.adapter, record)
        except Exception as exc:  # noqa: BLE001 - the current version still answers
            log.warning("canary %s could not be loaded; the current version serves its "
                        "share: %s", record.id, getattr(exc, "message", None) or repr(exc))
            self.metrics.errors.inc(code="canary_unavailable")
            return None

    async def _adapt(self, request: Request, switches: ChatSwitches,
                     adapter: ChatAdapter) -> Adapted:
        loop = asyncio.get_running_loop()
        try:
            # A repeated question is answered from the adapter's cache right here; only a new
            # one pays the thread hop and the embedding.
            cached = adapter.cached(request, switches)
            adapted = cached if cached is not None else await loop.run_in_executor(
                self._executor, adapter.adapt, request, switches)
        except Exception as exc:  # noqa: BLE001 - degrade to a plain proxy, never fail a call
            log.warning("library retrieval failed; answering without it: %s",
                        getattr(exc, "message", None) or repr(exc))
            self.metrics.errors.inc(code="library_unavailable")
            self.metrics.library.inc(applied="false")
            return Adapted(request, query=chat_query(request.messages),
                           meta={"library_error": getattr(exc, "message", None) or repr(exc)})
        self.metrics.retrieval_latency.observe(adapted.duration_s)
        self.metrics.library.inc(applied="true")
        return adapted

    def check_endpoints(self, switches: ChatSwitches, stream: bool, n: int = 1) -> None:
        """Refuse ``endpoints`` where they cannot be called (a 400 before any work)."""
        if not switches.endpoints:
            return
        if n > 1:
            raise ConfigError(f"'whetstone.endpoints' act on one reply; they cannot be "
                              f"combined with n = {n}", hint="send n: 1")
        known = self.endpoints.names() if self.endpoints is not None else []
        if not known:
            raise ConfigError("this server calls no method endpoints",
                              hint="serve with `whetstone serve` or Engine(...).app(), or "
                                   "pass endpoints= to create_app")
        unknown = [e for e in switches.endpoints if e not in known]
        if unknown:
            raise ConfigError(f"no method here answers the endpoint(s) "
                              f"{', '.join(map(repr, unknown))}",
                              hint=f"endpoints: {', '.join(known)}")
        if stream:
            raise ConfigError("'whetstone.endpoints' need the whole reply: they cannot be "
                              "combined with stream", hint="send stream: false")

    async def call_endpoints(self, names: tuple[str, ...], question: str, answer: str
                             ) -> dict[str, Any]:
        """Each endpoint's report on one reply, computed off the event loop. A failed one (an
        empty corpus, an unreadable proposer reply) is reported, and the reply still sent."""
        assert self.endpoints is not None
        loop = asyncio.get_running_loop()
        out: dict[str, Any] = {}
        for name in names:
            try:
                out[name] = dict(await loop.run_in_executor(
                    self._endpoint_executor, self.endpoints.report, name, question, answer))
            except Exception as exc:  # noqa: BLE001 - the answer matters more than its check
                log.warning("endpoint %s failed: %s", name,
                            getattr(exc, "message", None) or repr(exc))
                self.metrics.errors.inc(code="endpoint_failed")
                out[name] = {"error": endpoint_error(exc)}
        return out

    def record(self, trace_id: str, build: Callable[[], Trace]) -> asyncio.Future[Any] | None:
        """Queue the trace ``build()`` makes, built off the loop (``TraceWriter.submit``);
        the future is done once it is built (and spooled, before a remote store)."""
        if self.traces is not None:
            return self.traces.submit(trace_id, build)
        return None

    async def start(self) -> None:
        if self.traces is not None:
            self.traces.start()

    async def stop(self) -> None:
        """Drain the trace queue and release the retrieval threads."""
        if self.traces is not None:
            await self.traces.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._endpoint_executor.shutdown(wait=False, cancel_futures=True)
        if self.canary is not None:
            self.canary.close()
