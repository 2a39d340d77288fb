"""Traces of served exchanges, built and written off the event loop.

``TraceWriter``: an asyncio queue drained by one background task that writes traces in
batches in a worker thread; each trace is built and encoded (cut to the record cap) in a
thread of its own as soon as it is queued, so neither a large request nor a slow disk holds
the loop; a reply waits for its own trace's write (``written``) before it is sent, so an
acknowledged trace survives the process being killed; ``stop()`` drains it, so a shutdown
loses no trace; ``label``
attaches feedback to a trace once its own write has landed, finding it through the store's
index; on a server with API keys only the key an exchange was recorded for may label it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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
# How long a reply waits for its trace to be written before it goes anyway (a store that
# hangs must not hold every reply); the trace is still written when the store comes back.
SETTLE_WAIT_S = 10.0
# How long the writer lets traces gather after the first one arrives. A reply now waits for
# its trace (routes._Exchange._settle), so a linger is added latency: none. Traces still go
# in batches, what queued while the previous batch was being written (a group commit).
LINGER_S = 0.0
# A queued trace: its id, its record being built (None if building failed), the event set
# once its batch is written.
_Queued = tuple[str, "asyncio.Future[Record | None]", asyncio.Event]


class TraceWriter:
    """Stores traces from a queue with one background task, in batches, in a worker thread.
    A batch is what queued while the previous one was written (and within ``linger_s`` of
    its first trace: none by default).

    ``submit(trace_id, build)`` queues a trace still to be built: one encoder thread builds
    it and cuts it to the store's record cap (``TraceStore.encode``) at once, in the order
    submitted, and the queue waits on that. Memory stays bounded: what waits for the disk is
    the cut record, and nothing is cached after it is written; feedback finds a trace
    through the store's index. ``stop()`` writes everything still queued.
    """

    def __init__(self, store: TraceStore, metrics: Metrics, linger_s: float = LINGER_S) -> None:
        self.store = store
        self.metrics = metrics
        self.linger_s = linger_s
        # Each queued record with the event set once its batch is written; _unwritten maps an
        # id to the event of its latest queued copy, so feedback waits for that trace only.
        self._queue: asyncio.Queue[_Queued | None] | None = None
        self._unwritten: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._encoder: ThreadPoolExecutor | None = None

    @property
    def pending(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        """Start the writer on the running loop (the server's lifespan calls this)."""
        if self._task is None:
            self._stopped = False
            self._queue = asyncio.Queue()
            # One thread: records are built in the order they were submitted, and a burst of
            # big requests costs one core, not all of them.
            self._encoder = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="whetstone-trace")
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="whetstone-trace-writer")

    def put(self, trace: Trace) -> None:
        """Queue ``trace`` for writing; returns at once (call it on the server's loop)."""
        self.submit(trace.id, lambda: trace)

    def submit(self, trace_id: str, build: Callable[[], Trace]) -> None:
        """Queue the trace ``build()`` makes (its id ``trace_id``) for writing; returns at
        once (call it on the server's loop): the building, the encoding and the write all
        happen in threads."""
        if self._stopped:
            record = self._encode(trace_id, build)
            if record is not None:
                self._write([record])  # shutting down: write now rather than lose it
            return
        if self._task is None:
            self.start()
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        encoded = loop.run_in_executor(self._encoder, self._encode, trace_id, build)
        written = asyncio.Event()
        self._unwritten[trace_id] = written
        self._queue.put_nowait((trace_id, encoded, written))

    def _encode(self, trace_id: str, build: Callable[[], Trace]) -> Record | None:
        try:
            return self.store.encode(build())
        except Exception:  # a bug in building one trace must not stop the writer
            self.metrics.trace_errors.inc()
            log.exception("could not build trace %s", trace_id)
            return None

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
            records: list[Record] = []
            try:
                records = [r for r in await asyncio.gather(*(f for _, f, _ in items)) if r]
                if records:
                    await asyncio.to_thread(self._write, records)
            finally:
                self._done(items)
                for _ in batch:
                    queue.task_done()
            if len(items) < len(batch):
                return  # the stop sentinel: everything before it is written

    def _done(self, items: list[_Queued]) -> None:
        """Wake whoever waits for these traces (``written``), written or not."""
        for trace_id, _, written in items:
            written.set()
            if self._unwritten.get(trace_id) is written:
                del self._unwritten[trace_id]

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
        if self._encoder is not None:
            self._encoder.shutdown(wait=False)
            self._encoder = None

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
        except TimeoutError:
            raise WhetstoneError(
                f"the trace {trace_id!r} is still waiting to be written after {timeout:g} s",
                hint="the trace store is slow or backed up; retry the feedback shortly") from None

    async def settle(self, trace_id: str) -> bool:
        """Wait until the trace ``trace_id`` is written, at most ``SETTLE_WAIT_S``: what a
        reply waits for before it goes. False (logged) when the store took longer."""
        try:
            await self.written(trace_id, timeout=SETTLE_WAIT_S)
            return True
        except WhetstoneError as exc:
            log.warning("replying before trace %s is written: %s", trace_id, exc.message)
            return False

    async def label(self, trace_id: str, score: float, comment: str | None, *,
                    owner: str | None = None, key: str | None = None, weight: float = 1.0,
                    label: str | None = None) -> Trace:
        """Attach feedback to a trace by its exact id; ``NotFound`` when there is none,
        ``WhetstoneError`` when the trace is still queued after ``LABEL_WAIT_S``.

        ``owner`` (the ``key_hash`` of the caller's API key; None when the server has no
        keys) must be the key the trace was recorded for: another key's trace is ``NotFound``
        as well, so a client learns nothing about ids that are not its own. ``key`` and
        ``weight`` (who sent it, how much it counts: ``feedback.FeedbackPolicy``) are kept on
        the trace with the time, and ``label`` (the right answer, when the client knows it)
        as its label."""
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
        if key is not None:
            meta.update(feedback_key=key, feedback_weight=weight)
        meta["feedback_at"] = time.time()
        updated = trace.with_(score=score, meta=meta,
                              label=label if label is not None else trace.label)
        # append_feedback: an exporter hears of the label, not of a second whole trace
        await asyncio.to_thread(self.store.append_feedback, updated, score, comment)
        self.metrics.feedback.inc()
        return updated
