"""The middleware around the server's ``ChatService``: keys, body limits, adaptation, traces.

- ``Guard``: a plain ASGI middleware that checks API keys (Bearer) on ``/v1/*`` and counts every
  response by route and status, with its latency (streams: until the last byte).
- ``read_body``: the request body, refused past ``max_body_bytes`` (413) before it is all read.
- ``ChatMiddleware``: adapts each request with the library in a thread pool (retrieval embeds
  the query, which would stall the event loop) and hands finished exchanges to ``TraceWriter``.
- ``TraceWriter``: an asyncio queue drained by one background task that writes traces in
  batches off the response path; ``stop()`` drains it, so a shutdown loses no trace.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends.openai_wire import error_to_openai
from engine.errors import ConfigError, NotFound, WhetstoneError
from engine.runtime.chat import Adapted, ChatAdapter, ChatSwitches, chat_query
from engine.server_metrics import Metrics
from engine.types import Request, Trace

if TYPE_CHECKING:
    from library_store.traces import TraceStore

log = logging.getLogger("whetstone.server")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TRACE_HEADER = "X-Whetstone-Trace-Id"
VERSION_HEADER = "X-Whetstone-Library-Version"
REQUEST_ID_HEADER = "X-Request-Id"
KNOWN_ROUTES = ("/v1/chat/completions", "/v1/models", "/v1/feedback", "/health", "/metrics")
# How long feedback waits for the trace it labels to leave the write queue.
LABEL_WAIT_S = 10.0


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
    if not authorization:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    given = token.strip().encode()
    # Compare against every key in constant time (no early exit), so timing reveals nothing.
    matches = [hmac.compare_digest(given, k.encode()) for k in keys]
    return any(matches)


def _route_of(path: str) -> str:
    if path.startswith("/v1/models"):
        return "/v1/models"
    return path if path in KNOWN_ROUTES else "other"  # bounded label values


class Guard:
    """ASGI middleware: API keys on ``/v1/*`` (when any are set), and request metrics."""

    def __init__(self, app: ASGIApp, *, keys: frozenset[str], metrics: Metrics) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics

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


# --- traces ----------------------------------------------------------------------------------

class TraceWriter:
    """Stores traces from a queue with one background task, in batches, in a worker thread.

    ``recent`` keeps the last traces in memory so feedback on them does not read the whole
    store. ``stop()`` writes everything still queued.
    """

    def __init__(self, store: TraceStore, metrics: Metrics, *, recent: int = 512) -> None:
        self.store = store
        self.metrics = metrics
        self.recent_size = recent
        self._recent: OrderedDict[str, Trace] = OrderedDict()
        # Each queued trace with the event set once its batch is written; _unwritten maps an id
        # to the event of its latest queued copy, so feedback waits for that trace only.
        self._queue: asyncio.Queue[tuple[Trace, asyncio.Event] | None] | None = None
        self._unwritten: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def pending(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        """Start the writer on the running loop (the server's lifespan calls this)."""
        if self._task is None:
            self._stopped = False
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="whetstone-trace-writer")

    def put(self, trace: Trace) -> None:
        """Queue ``trace`` for writing; returns at once (call it on the server's loop)."""
        self._remember(trace)
        if self._stopped:
            self._write([trace])  # shutting down: write now rather than lose it
            return
        if self._task is None:
            self.start()
        assert self._queue is not None
        written = asyncio.Event()
        self._unwritten[trace.id] = written
        self._queue.put_nowait((trace, written))

    def _remember(self, trace: Trace) -> None:
        self._recent[trace.id] = trace
        self._recent.move_to_end(trace.id)
        while len(self._recent) > self.recent_size:
            self._recent.popitem(last=False)

    async def _run(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            items = [item for item in batch if item is not None]
            try:
                if items:
                    await asyncio.to_thread(self._write, [t for t, _ in items])
            finally:
                for trace, written in items:
                    written.set()
                    if self._unwritten.get(trace.id) is written:
                        del self._unwritten[trace.id]
                for _ in batch:
                    queue.task_done()
            if len(items) < len(batch):
                return  # the stop sentinel: everything before it is written

    def _write(self, traces: list[Trace]) -> None:
        try:
            self.store.append_many(traces)  # one call per batch, however the store batches
            self.metrics.traces_written.inc(len(traces))
            return
        except Exception:  # noqa: BLE001 - find out which ones failed, one at a time
            log.warning("writing a batch of %d traces failed; retrying one by one", len(traces))
        # Rewriting a trace that did get written is harmless: the latest line for an id wins.
        for trace in traces:
            try:
                self.store.append(trace)
                self.metrics.traces_written.inc()
            except Exception:  # a full disk must not take the server down (logged, counted)
                self.metrics.trace_errors.inc()
                log.exception("could not store trace %s", trace.id)

    async def flush(self) -> None:
        """Wait until every queued trace is written."""
        if self._queue is not None and self._task is not None and not self._task.done():
            await self._queue.join()

    async def stop(self) -> None:
        """Write what is queued, then end the background task."""
        if self._task is not None and self._queue is not None:
            self._queue.put_nowait(None)
            await self._task
        self._task = None
        self._stopped = True

    async def written(self, trace_id: str, timeout: float | None = None) -> None:
        """Wait until the trace ``trace_id`` has left the queue (at once when it is not
        queued); ``WhetstoneError`` past ``timeout`` (default ``LABEL_WAIT_S``). Unlike
        ``flush()`` it does not wait for traces queued after it, so steady traffic cannot
        hold it up."""
        event = self._unwritten.get(trace_id)
        if event is None or self._task is None or self._task.done():
            return
        timeout = LABEL_WAIT_S if timeout is None else timeout
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            raise WhetstoneError(
                f"the trace {trace_id!r} is still waiting to be written after {timeout:g} s",
                hint="the trace store is slow or backed up; retry the feedback shortly") from None

    async def label(self, trace_id: str, score: float, comment: str | None) -> Trace:
        """Attach feedback to a trace by its exact id; ``NotFound`` when there is none,
        ``WhetstoneError`` when the trace is still queued after ``LABEL_WAIT_S``."""
        # Wait for the trace's own write: the labelled copy must land after it (the latest
        # line for an id wins).
        await self.written(trace_id)
        trace = self._recent.get(trace_id)
        if trace is None:
            trace = await asyncio.to_thread(self._lookup, trace_id)
        meta = dict(trace.meta)
        if comment is not None:
            meta["feedback"] = comment
        updated = trace.with_(score=score, meta=meta)
        await asyncio.to_thread(self.store.append, updated)
        self._remember(updated)
        self.metrics.feedback.inc()
        return updated

    def _lookup(self, trace_id: str) -> Trace:
        try:
            trace = self.store.get(trace_id)
        except NotFound:
            trace = None
        if trace is None or trace.id != trace_id:  # the store also matches id prefixes
            raise NotFound(f"no trace with id {trace_id!r}",
                           hint=f"use the {TRACE_HEADER} header of the response")
        return trace


# --- adaptation ------------------------------------------------------------------------------

class ChatMiddleware:
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
