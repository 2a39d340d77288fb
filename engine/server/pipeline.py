"""Around each chat call the server answers: adapt the request with the library before, hand
the finished exchange to the trace writer after.

Retrieval embeds the query, which would stall the event loop, so ``ChatPipeline`` adapts in a
thread pool (a cached question is answered on the loop); when retrieval fails the request is
served without the library (logged and counted): the model answering matters more than the
guidance. A failed ``verify`` is reported to the client without the paths its error names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from whetstone.engine.errors import ConfigError, WhetstoneError
from whetstone.engine.server.adapter import Adapted, ChatAdapter, ChatSwitches, chat_query
from whetstone.engine.server.canary import CanaryRouter, Route
from whetstone.engine.server.metrics import Metrics
from whetstone.engine.server.recording import TraceWriter
from whetstone.engine.server.service import error_message, without_paths
from whetstone.engine.types import Request, Trace
from whetstone.library_store.learning import CanaryRecord

log = logging.getLogger("whetstone.server")

# (question, answer) -> a hallucination report (``Engine.verify_report``).
Verifier = Callable[[str, str], Mapping[str, Any]]


VERIFY_WORKERS = 4


def verify_error(exc: Exception) -> str:
    """What the client is told of a failed check: the error and its hint without the paths
    it names (an empty corpus's folder), or, for a bug, only where the details are."""
    if isinstance(exc, WhetstoneError):
        return without_paths(error_message(exc))
    return "the verification failed (the details are in the server log)"


class ChatPipeline:
    """What the server does around each chat call: adapt it, then record it.

    ``adapter`` None: requests pass unchanged (still recorded when ``traces`` is given).
    ``workers``: threads for retrieval (each query embedding is one single-threaded ONNX run;
    on 2 cores 1 thread and 4 served unique prompts alike). Verification calls the model for
    seconds, so it has threads of its own and never holds up retrieval.
    """

    def __init__(self, adapter: ChatAdapter | None, traces: TraceWriter | None,
                 metrics: Metrics, *, workers: int = 4,
                 verifier: Verifier | None = None, canary: CanaryRouter | None = None) -> None:
        self.adapter = adapter
        self.traces = traces
        self.metrics = metrics
        self.verifier = verifier
        self.canary = canary
        if canary is not None:
            canary.attach(metrics)  # its routes and the library's learning state on /metrics
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers),
                                            thread_name_prefix="whetstone-retrieval")
        self._verify_executor = ThreadPoolExecutor(max_workers=VERIFY_WORKERS,
                                                   thread_name_prefix="whetstone-verify")

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
            adapted = adapter.cached(request, switches) or await loop.run_in_executor(
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

    def check_verify(self, switches: ChatSwitches, stream: bool, n: int = 1) -> None:
        """Refuse ``verify`` where it cannot be done (a 400 before any work)."""
        if not switches.verify:
            return
        if n > 1:
            raise ConfigError(f"'whetstone.verify' checks one reply; it cannot be combined "
                              f"with n = {n}", hint="send n: 1 to verify the reply")
        if self.verifier is None:
            raise ConfigError("this server does not verify answers",
                              hint="serve with `whetstone serve` or Engine(...).app(), or "
                                   "pass verifier= to create_app")
        if stream:
            raise ConfigError("'whetstone.verify' needs the whole reply: it cannot be "
                              "combined with stream", hint="send stream: false to verify")

    async def verify(self, question: str, answer: str) -> dict[str, Any]:
        """The verifier's report on one reply, computed off the event loop. A failed check (an
        empty corpus, an unreadable proposer reply) is reported, and the reply still sent."""
        assert self.verifier is not None
        loop = asyncio.get_running_loop()
        try:
            return dict(await loop.run_in_executor(self._verify_executor, self.verifier,
                                                   question, answer))
        except Exception as exc:  # noqa: BLE001 - the answer matters more than its check
            log.warning("verification failed: %s", getattr(exc, "message", None) or repr(exc))
            self.metrics.errors.inc(code="verify_failed")
            return {"error": verify_error(exc)}

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
        self._verify_executor.shutdown(wait=False, cancel_futures=True)
        if self.canary is not None:
            self.canary.close()
