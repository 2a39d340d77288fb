"""Traces of served exchanges, built and written off the event loop.

``TraceWriter``: an asyncio queue drained by one background task that writes traces in
batches in a worker thread; each trace is built and encoded (cut to the record cap) in a
thread of its own as soon as it is queued, so neither a large request nor a slow disk holds
the loop; a reply waits for its own trace's write (``settle``) before it is sent, so an
acknowledged trace survives the process being killed; ``stop()`` drains it, so a shutdown
loses no trace; ``label``
attaches feedback to a trace once its own write has landed, finding it through the store's
index; on a server with API keys only the key an exchange was recorded for may label it.

In front of a store across the network (``TraceStore.remote``: PostgreSQL) each record also
goes to a spool on this machine's disk as it is encoded (library_store/trace_spool.py), and
a reply waits for that instead of the store's write (``durable``): a trace the client was
told of survives the server being killed, and an outage of the store does not hold the
replies. The writer then keeps retrying the store through an outage (``outage`` says why it
is failing) instead of dropping the batch, and a server starting writes the spools its dead
predecessors left first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ...library_store.trace_records import Record
from ...library_store.trace_spool import Spool, abandoned
from ...library_store.traces import TraceStore
from ..errors import NotFound, StoreUnavailable, WhetstoneError
from ..types import Trace
from .guard import TRACE_HEADER
from .metrics import Metrics

log = logging.getLogger("whetstone.server")

# The trace meta field holding the SHA-256 of the API key an exchange was recorded for.
OWNER_KEY = "api_key_sha256"
# How long feedback waits for the trace it labels to leave the write queue.
LABEL_WAIT_S = 10.0
# How long a reply waits for its trace to be written (a local store) or spooled (a remote
# one) before it goes anyway (a store that hangs must not hold every reply); the trace is
# still written when the store comes back.
SETTLE_WAIT_S = 10.0
# How long the writer lets traces gather after the first one arrives. A reply before a local
# store waits for its trace's write (routes._Exchange._settle), so a linger is added latency:
# none. Traces still go in batches, what queued while the previous batch was being written (a
# group commit), which is also what batches a remote store's writes under load.
LINGER_S = 0.0
# Once the server stops, how long the writer keeps retrying a remote store that does not
# answer: what is unwritten then stays in the spool for the next server to start there.
STOP_RETRY_S = 10.0
RETRY_MAX_S = 2.0
REPLAY_BATCH = 500
# A built record and the spool offset just past it (0: not spooled).
Encoded = tuple[Record, int]
# A queued trace: its id, its record being built (None if building failed), the event set
# once its batch is written.
_Queued = tuple[str, "asyncio.Future[Encoded | None]", asyncio.Event]


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
        self.spool: Spool | None = None
        self.outage: str | None = None  # why the remote store refused the last write
        self._stopping_at: float | None = None

    @property
    def pending(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def durable(self) -> bool:
        """Whether a reply waits for its trace to reach the spool (a remote store)."""
        return self.store.remote

    def start(self) -> None:
        """Start the writer on the running loop (the server's lifespan calls this)."""
        if self._task is None:
            self._stopped = False
            self._stopping_at = None
            if self.store.remote and self.spool is None:
                self.spool = Spool(self.store.root / "spool")
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

    def submit(self, trace_id: str, build: Callable[[], Trace]
               ) -> asyncio.Future[Encoded | None] | None:
        """Queue the trace ``build()`` makes (its id ``trace_id``) for writing; returns at
        once (call it on the server's loop): the building, the encoding and the write all
        happen in threads. The future is done once the record is built (and spooled, for a
        remote store): what a ``durable`` reply waits for."""
        if self._stopped:
            now = self._encode(trace_id, build)
            if now is not None:
                self._write([now])  # shutting down: write now rather than lose it
            return None
        if self._task is None:
            self.start()
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        encoded = loop.run_in_executor(self._encoder, self._encode, trace_id, build)
        written = asyncio.Event()
        self._unwritten[trace_id] = written
        self._queue.put_nowait((trace_id, encoded, written))
        return encoded

    def _encode(self, trace_id: str, build: Callable[[], Trace]) -> Encoded | None:
        try:
            record = self.store.encode(build())
        except Exception:  # a bug in building one trace must not stop the writer
            self.metrics.trace_errors.inc()
            log.exception("could not build trace %s", trace_id)
            return None
        if self.spool is None:
            return record, 0
        try:
            return record, self.spool.add(record)
        except OSError as exc:  # a full disk: the trace still goes to the store from memory
            self.metrics.trace_errors.inc()
            log.error("could not spool trace %s (%s); writing it from memory", trace_id, exc)
            return record, 0

    async def _run(self) -> None:
        assert self._queue is not None
        queue = self._queue
        if self.spool is not None:
            await asyncio.to_thread(self._replay)
        while True:
            batch = [await queue.get()]
            if batch[0] is not None and self.linger_s > 0:
                await asyncio.sleep(self.linger_s)  # one write for the traces of the linger
            while not queue.empty():
                batch.append(queue.get_nowait())
            items = [item for item in batch if item is not None]
            try:
                encoded = [r for r in await asyncio.gather(*(f for _, f, _ in items)) if r]
                if encoded:
                    await asyncio.to_thread(self._write, encoded)
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

    def _write(self, encoded: list[Encoded]) -> None:
        records = [record for record, _ in encoded]
        if self.spool is not None:
            if self._write_remote(records):
                self.spool.done(max(offset for _, offset in encoded))
            return
        try:
            self.store.append_records(records)  # one call per batch
            self.metrics.traces_written.inc(len(records))
            return
        except Exception:  # noqa: BLE001 - find out which ones failed, one at a time
            log.warning("writing a batch of %d traces failed; retrying one by one", len(records))
        self._write_each(records)

    def _write_remote(self, records: list[Record]) -> bool:
        """Write a batch to the remote store, retrying while it cannot be reached (the batch
        waits in the spool meanwhile); False when the server stopped before it could be."""
        delay = 0.1
        while True:
            try:
                self.store.append_records(records)
            except StoreUnavailable as exc:
                if self.outage is None:
                    log.warning("the trace store cannot be reached (%s); traces wait in the "
                                "spool and are retried", exc.message)
                self.outage = exc.message
                self.metrics.trace_errors.inc()
            except Exception:  # noqa: BLE001 - a record the store refuses, not an outage
                log.warning("the trace store refused a batch of %d traces; writing them one by "
                            "one", len(records))
                self._write_each(records)
                return True
            else:
                if self.outage is not None:
                    log.warning("the trace store answers again; the spooled traces are written")
                self.outage = None
                self.metrics.traces_written.inc(len(records))
                return True
            if self._stopping_at is not None and \
                    time.monotonic() - self._stopping_at > STOP_RETRY_S:
                log.error("the trace store is still unreachable: %d trace(s) stay in the spool "
                          "%s and are written when a server starts there again", len(records),
                          self.spool.folder if self.spool else "")
                return False
            time.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)

    def _replay(self) -> None:
        """Write what servers that died left in their spools (before any new trace)."""
        assert self.spool is not None
        for _, records in abandoned(self.spool.folder, own=self.spool.name):
            for i in range(0, len(records), REPLAY_BATCH):
                if not self._write_remote(records[i:i + REPLAY_BATCH]):
                    return  # stopping: the spool stays for the next start

    def _write_each(self, records: list[Record]) -> None:
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
        self._stopping_at = time.monotonic()
        if self._task is not None and self._queue is not None:
            self._queue.put_nowait(None)
            await self._task
        self._task = None
        self._stopped = True
        if self._encoder is not None:
            self._encoder.shutdown(wait=False)
            self._encoder = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None

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

    async def settle(self, trace_id: str,
                     spooled: asyncio.Future[Encoded | None] | None = None) -> bool:
        """What a reply waits for before it goes, at most ``SETTLE_WAIT_S``: before a local
        store, the trace's write; before a remote one (``durable``), its line in this
        machine's spool (``spooled``, the future ``submit`` returned), since that store may be
        down for a while and the writer retries it from the spool. False (logged) when that
        took longer."""
        try:
            if self.durable and spooled is not None:
                # shield: a reply given up on (the client left) must not cancel the future
                # the writer's batch waits on.
                await asyncio.wait_for(asyncio.shield(spooled), SETTLE_WAIT_S)
            else:
                await self.written(trace_id, timeout=SETTLE_WAIT_S)
            return True
        except TimeoutError:
            log.warning("replying before trace %s is spooled: still waiting after %g s",
                        trace_id, SETTLE_WAIT_S)
            return False
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
