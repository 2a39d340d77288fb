"""Issue 12, item 4: the trace store is bounded (per record, in total) and feedback finds a
trace through an index, not a scan; the server's writer keeps bounded memory."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.engine.chat.adapter import Adapted
from whetstone.engine.chat.exchange import chat_trace
from whetstone.engine.commands.traces import traces_group
from whetstone.engine.errors import ConfigError, NotFound
from whetstone.engine.server.metrics import Metrics
from whetstone.engine.server.recording import TraceWriter
from whetstone.engine.types import Completion, Message, Request, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.trace_records import DEFAULT_MAX_RECORD_BYTES
from whetstone.library_store.traces import TraceStore

MB = 1024 * 1024


def chat(i: int, body: str = "", started: float = 1_700_000_000.0) -> Trace:
    """A served exchange whose user message is ``body`` (as the server records it)."""
    adapted = Adapted(Request(messages=(Message("user", f"q{i} {body}"),)))
    return chat_trace(f"t{i:05d}", adapted, model="m", started=started + i,
                      completion=Completion(text=f"a{i}"))


def test_a_huge_message_is_stored_as_a_head_a_marker_and_its_hash(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    body = "x" * (15 * MB)  # the bodies: ~29 MB on disk each
    store.append(chat(1, body))
    (day,) = store.files()
    assert day.stat().st_size <= DEFAULT_MAX_RECORD_BYTES + 1
    got = store.get("t00001")
    text = got.steps[0].input["messages"][0]["content"]
    digest = hashlib.sha256(f"q1 {body}".encode()).hexdigest()
    assert text.startswith("q1 xxx") and f"{len(body) + 3} characters, sha256 {digest}" in text
    assert got.answer == "a1" and got.outcome == "answered"  # still a whole trace


def test_the_store_stays_under_its_total_cap_dropping_the_oldest(tmp_path: Path) -> None:
    store = TraceStore(tmp_path, max_bytes=256 * 1024)
    for i in range(300):
        store.append(chat(i, "y" * 4000))
    assert store.size() <= 256 * 1024
    kept = store.latest()
    assert "t00299" in kept and "t00000" not in kept
    assert len(store.files()) > 1  # old segments went, not the whole day


def test_feedback_lookups_use_the_index_not_a_scan(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path)
    store.append_many([chat(i) for i in range(500)])
    store.append(chat(7).with_(score=0.5))
    store.append(Trace("zz-unique-1", "t"))

    def no_scan(self: TraceStore) -> None:
        raise AssertionError("a lookup read the whole store")

    monkeypatch.setattr(TraceStore, "_records", no_scan)
    assert store.find("t00007").score == 0.5  # the latest record wins
    assert store.find("t99999") is None
    assert store.get("zz-u").id == "zz-unique-1"  # a unique prefix
    with pytest.raises(NotFound, match="ambiguous"):
        store.get("t000")


def test_the_index_catches_up_with_lines_it_did_not_write_and_rebuilds_when_lost(
        tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.append(chat(1))
    (day,) = store.files()
    with open(day, "a") as f:  # an older Whetstone, or a hand edit, appending a record
        f.write(json.dumps(chat(2).to_dict()) + "\n")
    assert store.find("t00002").answer == "a2"
    store.index.reset()  # index deleted: rebuilt from the files
    (tmp_path / "index.sqlite").write_bytes(b"not a database")
    assert TraceStore(tmp_path).find("t00001").answer == "a1"


async def test_the_writer_keeps_bounded_memory_and_labels_through_the_index(
        tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    writer = TraceWriter(store, Metrics())
    writer.start()
    tracemalloc.start()
    try:
        for i in range(40):
            writer.put(chat(i, "z" * MB))  # a 1 MB request each
            await asyncio.sleep(0)
        await writer.flush()
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # It used to keep the last 512 traces in memory: 40 MB here, 7 GB at 15 MB a request.
    assert held < 8 * MB
    labelled = await writer.label("t00003", 1.0, "ok")
    assert labelled.score == 1.0 and store.get("t00003").meta["feedback"] == "ok"
    with pytest.raises(NotFound):
        await writer.label("t-unknown", 1.0, None)
    await writer.stop()


def test_traces_prune_applies_the_cap_and_the_library_setting(tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.update_settings(trace_max_bytes=2_000_000, trace_max_record_bytes=8192)
    store = lib.traces
    assert store.max_bytes == 2_000_000 and store.max_record_bytes == 8192
    for i in range(200):
        store.append(chat(i, "w" * 3000))
    assert 1_000_000 < store.size() <= 2_000_000  # under the cap: nothing dropped yet
    res = CliRunner().invoke(traces_group, ["prune", "--max-bytes", "500000", "--library",
                                            str(lib.root), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["bytes_after"] <= 500_000 < out["bytes_before"] and out["removed"]
    assert lib.traces.find("t00199") is not None and lib.traces.find("t00000") is None
    lib.update_settings(trace_max_bytes=-1)
    with pytest.raises(ConfigError, match="trace_max_bytes"):
        _ = lib.traces
