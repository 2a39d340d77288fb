"""The append-only trace store: latest record wins, bad lines are reported and skipped.

The ``store`` fixture runs each test against both stores: day files in the library's folder
and PostgreSQL's ``trace_records`` (issue 49; skipped with the reason where PostgreSQL is
missing). Tests of the files themselves (torn lines) run on the folder alone."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from whetstone.engine.errors import NotFound
from whetstone.engine.types import Message, Step, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.trace_records import DEFAULT_MAX_RECORD_BYTES
from whetstone.library_store.traces import TraceQuery, TraceStore


@pytest.fixture(params=["file", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TraceStore:
    if request.param == "file":
        return TraceStore(tmp_path)
    return Library.init(tmp_path / "lib", store=request.getfixturevalue("pg_url")).traces


def write_bad_record(store: TraceStore, text: str) -> str:
    """Put an unreadable record into the store behind its back; where it is reported."""
    if not store.remote:
        day_file = store.files()[0]
        with open(day_file, "a") as f:
            f.write(text + "\n")
        return str(day_file)
    backing: Any = store.backing
    backing.run(lambda c: c.execute(
        "INSERT INTO trace_records(id, started, line, nbytes) VALUES ('bad', 0, %s, 1)",
        (text,)), "test")
    return backing.where


def test_latest_record_wins_and_queries_filter(store: TraceStore) -> None:
    store.append(Trace("a1", "add numbers", outcome="running"))
    store.append(Trace("a1", "add numbers", outcome="answered", answer="3"))
    store.append(Trace("b2", "name a city", outcome="horizon", library_version="v2"))
    assert store.get("a1").answer == "3"
    assert [t.id for t in store.query(TraceQuery(outcome="answered"))] == ["a1"]
    assert [t.id for t in store.query(TraceQuery(library_version="v2"))] == ["b2"]
    assert [t.id for t in store.query(TraceQuery(task="CITY"))] == ["b2"]
    scored = store.set_score("a1", 1.0, "good")
    assert scored.score == 1.0 and store.get("a1").meta["feedback"] == "good"
    assert [t.id for t in store.query(TraceQuery(min_score=0.5))] == ["a1"]
    # A label set back to an earlier value wins too: each write is its own record.
    store.set_score("a1", 0.0, "bad")
    store.set_score("a1", 1.0, "good")
    assert store.get("a1").score == 1.0


def test_corrupt_lines_are_reported_with_their_position_and_skipped(store: TraceStore) -> None:
    store.append(Trace("ok1", "t"))
    where = write_bad_record(store, '{"id": "broken", "task": ')  # a torn write
    store.append(Trace("ok2", "t"))
    assert [t.id for t in store.query()] == ["ok1", "ok2"]
    assert len(store.problems) == 1
    assert where in store.problems[0] and "unreadable trace record" in store.problems[0]


def test_append_after_a_torn_last_line_starts_a_new_line(store: TraceStore) -> None:
    if store.remote:
        pytest.skip("the day files' own layout (PostgreSQL keeps rows)")
    store.append(Trace("ok1", "t"))
    day_file = store.files()[0]
    with open(day_file, "a") as f:
        f.write('{"id": "torn", "task": "t')  # a writer killed mid-line: no newline
    store.append(Trace("ok2", "t"))
    assert [t.id for t in store.query()] == ["ok1", "ok2"]
    assert len(store.problems) == 1 and f"{day_file}:2: unreadable" in store.problems[0]
    store.append(Trace("ok3", "t"))  # a healthy file gets no blank line inserted
    assert day_file.read_text().count("\n\n") == 0
    assert [t.id for t in store.query()] == ["ok1", "ok2", "ok3"]


def test_unknown_and_ambiguous_ids(store: TraceStore) -> None:
    store.append(Trace("abc1", "t"))
    store.append(Trace("abc2", "t"))
    store.append(Trace("abd%_", "t"))  # LIKE's wildcards are plain characters in an id
    with pytest.raises(NotFound, match="ambiguous"):
        store.get("abc")
    with pytest.raises(NotFound, match="traces ls"):
        store.get("zzz")
    assert store.get("abc2").id == "abc2" and store.get("abd").id == "abd%_"
    with pytest.raises(NotFound):
        store.get("ab_")


def test_retention_drops_whole_old_days(store: TraceStore) -> None:
    now = time.time()
    store.append(Trace("old", "t", started=now - 10 * 86400))
    store.append(Trace("new", "t", started=now))
    removed = store.prune(keep_days=3, now=now)
    assert len(removed) == 1
    assert [t.id for t in store.query()] == ["new"]


def test_the_store_stays_under_its_total_cap_dropping_the_oldest(store: TraceStore) -> None:
    store.max_bytes = 256 * 1024
    for i in range(300):
        store.append(Trace(f"t{i:05d}", "y" * 4000, started=1_700_000_000.0 + i))
    assert store.size() <= 256 * 1024
    kept = store.latest()
    assert "t00299" in kept and "t00000" not in kept and len(kept) > 30


def test_a_huge_message_is_stored_as_a_head_a_marker_and_its_hash(store: TraceStore) -> None:
    body = "x" * (3 * 1024 * 1024)
    store.append(Trace("big", body, answer="a"))
    assert store.size() <= DEFAULT_MAX_RECORD_BYTES + 1
    got = store.get("big")
    digest = hashlib.sha256(body.encode()).hexdigest()
    assert got.task.startswith("xxx") and f"{len(body)} characters, sha256 {digest}" in got.task
    assert got.answer == "a"


def test_a_reader_following_the_store_reads_each_record_once(store: TraceStore) -> None:
    store.append(Trace("r1", "t", outcome="running"))
    first, cursor = store.read_since(None)
    assert [t.id for t in first] == ["r1"]
    assert store.read_since(cursor)[0] == []
    store.append(Trace("r1", "t", outcome="answered"))
    store.append(Trace("r2", "t"))
    more, cursor = store.read_since(cursor)
    assert [(t.id, t.outcome) for t in more] == [("r1", "answered"), ("r2", "running")]
    assert store.read_since(cursor)[0] == []


def test_odd_text_round_trips(store: TraceStore) -> None:
    odd = "nul \x00 surrogate \udc80 emoji \U0001f600 rtl \u202e"
    store.append(Trace("odd", odd, answer=odd))
    assert store.get("odd").task == odd and store.get("odd").answer == odd


def test_an_image_is_stored_once_and_the_trace_round_trips(store: TraceStore) -> None:
    ask = Message("user", ({"type": "image", "image": Image.new("RGB", (16, 16), "red")},
                           {"type": "text", "text": "What colour is it?"})).to_dict()
    steps = tuple(Step("think", "think", input={"messages": [ask] * (i + 1)}) for i in range(3))
    trace = Trace(id="img", task="What colour is it?", steps=steps, answer="red")
    store.append(trace)
    got = store.get("img")
    part = got.steps[0].input["messages"][0]["content"][0]
    assert part["type"] == "image_ref"
    assert store.resolve_images(got).to_dict() == trace.to_dict()
    with pytest.raises(NotFound, match="is not in"):
        store.images.get("0" * 64)
