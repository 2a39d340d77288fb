"""Around each chat call the server answers: adapt the request with the library before, hand
the finished exchange to the trace writer after.

Retrieval embeds the query, which would stall the event loop, so ``ChatPipeline`` adapts in a
thread pool (a cached question is answered on the loop); when retrieval fails the request is
served without the library (logged and counted): the model answering matters more than the
guidance.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from engine.server.adapter import Adapted, ChatAdapter, ChatSwitches, chat_query
from engine.server.metrics import Metrics
from engine.server.recording import TraceWriter
from engine.types import Request, Trace

log = logging.getLogger("whetstone.server")


class ChatPipeline:
    """What the server does around each chat call: adapt it, then record it.

    ``adapter`` None: requests pass unchanged (still recorded when ``traces`` is given).
    ``workers``: threads for retrieval (embedding is serialised by the embedder anyway; more
    threads let index reads overlap it).
    """

    def __init__(self, adapter: ChatAdapter | None, traces: TraceWriter | None,
                 metrics: Metrics, *, workers: int = 4) -> None:
        self.adapter = adapter
        self.traces = traces
        self.metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers),
                                            thread_name_prefix="whetstone-retrieval")

    def library_version(self) -> str | None:
        return self.adapter.library_version() if self.adapter is not None else None

    async def adapt(self, request: Request, switches: ChatSwitches) -> Adapted:
        """The adapted request. When retrieval fails the request is served without the
        library (logged and counted): the model answering matters more than the guidance."""
        if self.adapter is None or not switches.library:
            self.metrics.library.inc(applied="false")
            return Adapted(request, query=chat_query(request.messages))
        loop = asyncio.get_running_loop()
        try:
            # A repeated question is answered from the adapter's cache right here; only a new
            # one pays the thread hop and the embedding.
            adapted = self.adapter.cached(request, switches) or await loop.run_in_executor(
                self._executor, self.adapter.adapt, request, switches)
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

    def record(self, trace: Trace) -> None:
        if self.traces is not None:
            self.traces.put(trace)

    async def start(self) -> None:
        if self.traces is not None:
            self.traces.start()

    async def stop(self) -> None:
        """Drain the trace queue and release the retrieval threads."""
        if self.traces is not None:
            await self.traces.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
