"""A server's trace spool (issue 49): records wait on local disk for a remote store; files
behind what was written go, a spool whose server died is found and handed over once, a live
one is left alone, and a line torn by a crash is skipped; a reply waits for the spool, not the
remote store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import pytest

from whetstone.engine.errors import StoreUnavailable
from whetstone.engine.server import recording
from whetstone.engine.server.metrics import Metrics
from whetstone.engine.server.recording import TraceWriter
from whetstone.engine.types import Trace
from whetstone.library_store.trace_records import Record
from whetstone.library_store.trace_spool import Spool, abandoned
from whetstone.library_store.traces import TraceStore


def record(i: int) -> Record:
    return Record(id=f"t{i}", started=1_700_000_000.0 + i, line=f'{{"id": "t{i}"}}',
                  key=f"k{i}")


def test_files_wholly_written_on_are_deleted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, rotate_bytes=200)
    offsets = [spool.add(record(i)) for i in range(10)]
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) > 2
    spool.done(offsets[4])
    left = sorted(tmp_path.glob("*.jsonl"))
    assert len(left) < len(files) and left[-1] == files[-1]
    spool.done(offsets[-1])
    assert spool.pending_bytes == 0
    spool.close()
    assert list(tmp_path.glob("*.jsonl")) == [] and list(tmp_path.glob("*.lock")) == []


def test_a_dead_servers_spool_is_handed_over_once(tmp_path: Path) -> None:
    dead = Spool(tmp_path)
    for i in range(3):
        dead.add(record(i))
    dead._owner.release()  # type: ignore[union-attr]  # its process died: the lock is free
    with open(next(tmp_path.glob("*.jsonl")), "ab") as f:
        f.write(b'{"id": "torn", "sta')  # killed mid-write: never acknowledged
    live = Spool(tmp_path)
    live.add(record(9))
    found = list(abandoned(tmp_path, own=live.name))
    assert [[r.key for r in records] for _, records in found] == [["k0", "k1", "k2"]]
    assert list(abandoned(tmp_path, own=live.name)) == []  # handed over once
    assert [p.name.startswith(live.name) for p in tmp_path.glob("*.jsonl")] == [True]


def test_a_live_spool_is_not_taken_and_a_stopped_one_keeps_what_was_not_written(
        tmp_path: Path) -> None:
    other = Spool(tmp_path)
    other.add(record(1))
    assert list(abandoned(tmp_path)) == []  # its lock is held: a live server's
    other.close()  # stopped before its writer got to t1 (the store was down)
    assert [[r.id for r in rs] for _, rs in abandoned(tmp_path)] == [["t1"]]
    assert list(tmp_path.iterdir()) == []


def test_a_record_comes_back_as_it_was_spooled(tmp_path: Path) -> None:
    odd = Record(id="odd", started=1.5, line='{"id": "odd", "task": "tab\\t ✓ \udc80"}',
                 truncated=True, key="k")
    spool = Spool(tmp_path)
    spool.add(odd)
    spool.close()
    assert [records for _, records in abandoned(tmp_path)] == [[odd]]


class DownStore(TraceStore):
    """A store across the network that does not answer."""

    remote: ClassVar[bool] = True

    def append_records(self, records: Iterable[Record]) -> None:
        raise StoreUnavailable("the store does not answer")


def test_a_reply_before_a_remote_store_waits_for_the_spool_not_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a store across the network a reply waits for its trace's line in the spool
    (``TraceWriter.settle``), not for the store's write as before the folder store: with the
    store down it goes at once (not after ``SETTLE_WAIT_S``), and the trace waits in the
    spool for the next server."""
    monkeypatch.setattr(recording, "STOP_RETRY_S", 0.2)  # stopping: give up on the store soon

    async def reply() -> tuple[bool, float, int]:
        writer = TraceWriter(DownStore(tmp_path / "traces"), Metrics())
        writer.start()
        spooled = writer.submit("t1", lambda: Trace("t1", "q", outcome="answered", answer="a"))
        start = time.monotonic()
        settled = await writer.settle("t1", spooled)
        waited = time.monotonic() - start
        assert writer.spool is not None
        pending = writer.spool.pending_bytes
        await writer.stop()
        return settled, waited, pending

    settled, waited, pending = asyncio.run(reply())
    assert settled and waited < 2 and pending > 0
    assert [[r.id for r in rs] for _, rs in abandoned(tmp_path / "traces" / "spool")] == [["t1"]]
