"""Traces of served exchanges, written off the response path.

``TraceWriter``: an asyncio queue drained by one background task that writes traces in
batches in a worker thread; ``stop()`` drains it, so a shutdown loses no trace; ``label``
attaches feedback to a trace once its own write has landed, finding it through the store's
index; on a server with API keys only the key an exchange was recorded for may label it.
"""

from __future__ import annotations

import asyncio
import logging

from whetstone.engine.errors import NotFound, WhetstoneError
from whetstone.engine.server.guard import TRACE_HEADER
from whetstone.engine.server.metrics import Metrics
from whetstone.engine.types import Trace
from whetstone.library_store.trace_records import Record
from whetstone.library_store.traces import TraceStore

log = logging.getLogger("whetstone.server")

# The trace meta field holding the SHA-256 of the API key an exchange was recorded for.
OWNER_KEY = "api_key_sha256"
# How long feedback waits for the trace it labels to leave the write queue.
LABEL_WAIT_S = 10.0
# How long the writer lets traces gather after the first one arrives. A write pays a fixed
# cost (the store's file lock, its segment lookup, the index append) whatever the batch holds;
# under load the writer thread spent ~0.5 ms of CPU a request writing batches of one or two.
LINGER_S = 0.05


class TraceWriter:
    """Stores traces from a queue with one background task, in batches, in a worker thread.
    A batch is what arrived within ``linger_s`` of its first trace (50 ms by default).

    Memory stays bounded: a trace is queued as its stored record, already cut to the store's
    record cap (``TraceStore.encode``), and nothing is cached after it is written; feedback
    finds a trace through the store's index. ``stop()`` writes everything still queued.
    """

    def __init__(self, store: TraceStore, metrics: Metrics, linger_s: float = LINGER_S) -> None:
        self.store = store
        self.metrics = metrics
        self.linger_s = linger_s
        # Each queued record with the event set once its batch is written; _unwritten maps an
        # id to the event of its latest queued copy, so feedback waits for that trace only.
        self._queue: asyncio.Queue[tuple[Record, asyncio.Event] | None] | None = None
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
        record = self.store.encode(trace)
        if self._stopped:
            self._write([record])  # shutting down: write now rather than lose it
            return
        if self._task is None:
            self.start()
        assert self._queue is not None
        written = asyncio.Event()
        self._unwritten[record.id] = written
        self._queue.put_nowait((record, written))

    async def _run(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            if batch[0] is not None and self.linger_s > 0:
                await asyncio.sleep(self.linger_s)  # one write for the traces of the next 50 ms
            while not queue.empty():
                batch.append(queue.get_nowait())
            items = [item for item in batch if item is not None]
            try:
                if items:
                    await asyncio.to_thread(self._write, [r for r, _ in items])
            finally:
                for record, written in items:
                    written.set()
                    if self._unwritten.get(record.id) is written:
                        del self._unwritten[record.id]
                for _ in batch:
                    queue.task_done()
            if len(items) < len(batch):
                return  # the stop sentinel: everything before it is written

    def _write(self, records: list[Record]) -> None:
        try:
            self.store.append_records(records)  # one call per batch
            self.metrics.traces_written.inc(len(records))
            return
        except Exception:  # noqa: BLE001 - find out which ones failed, one at a time
            log.warning("writing a batch of %d traces failed; retrying one by one", len(records))
        # Rewriting a trace that did get written is harmless: the latest line for an id wins.
        for record in records:
            try:
                self.store.append_records([record])
                self.metrics.traces_written.inc()
            except Exception:  # a full disk must not take the server down (logged, counted)
                self.metrics.trace_errors.inc()
                log.exception("could not store trace %s", record.id)

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

    async def label(self, trace_id: str, score: float, comment: str | None, *,
                    owner: str | None = None) -> Trace:
        """Attach feedback to a trace by its exact id; ``NotFound`` when there is none,
        ``WhetstoneError`` when the trace is still queued after ``LABEL_WAIT_S``.

        ``owner`` (the ``key_hash`` of the caller's API key; None when the server has no
        keys) must be the key the trace was recorded for: another key's trace is ``NotFound``
        as well, so a client learns nothing about ids that are not its own."""
        # Wait for the trace's own write: the labelled copy must land after it (the latest
        # line for an id wins).
        await self.written(trace_id)
        trace = await asyncio.to_thread(self.store.find, trace_id)  # the index, not a scan
        if trace is None or (owner is not None and trace.meta.get(OWNER_KEY) != owner):
            raise NotFound(f"no trace with id {trace_id!r}",
                           hint=f"use the {TRACE_HEADER} header of the response")
        meta = dict(trace.meta)
        if comment is not None:
            meta["feedback"] = comment
        updated = trace.with_(score=score, meta=meta)
        await asyncio.to_thread(self.store.append, updated)
        self.metrics.feedback.inc()
        return updated
