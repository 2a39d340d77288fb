"""The append-only trace store: latest record wins, bad lines are reported and skipped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from whetstone.engine.errors import NotFound
from whetstone.engine.types import Trace
from whetstone.library_store.traces import TraceQuery, TraceStore


def test_latest_record_wins_and_queries_filter(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
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


def test_corrupt_lines_are_reported_with_their_position_and_skipped(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.append(Trace("ok1", "t"))
    day_file = store.files()[0]
    with open(day_file, "a") as f:
        f.write('{"id": "broken", "task": \n')  # a torn write
        f.write('["not", "a", "trace"]\n')
    store.append(Trace("ok2", "t"))
    assert [t.id for t in store.query()] == ["ok1", "ok2"]
    assert len(store.problems) == 2
    assert f"{day_file}:2: unreadable trace record" in store.problems[0]
    assert f"{day_file}:3:" in store.problems[1]


def test_append_after_a_torn_last_line_starts_a_new_line(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
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


def test_unknown_and_ambiguous_ids(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.append(Trace("abc1", "t"))
    store.append(Trace("abc2", "t"))
    with pytest.raises(NotFound, match="ambiguous"):
        store.get("abc")
    with pytest.raises(NotFound, match="traces ls"):
        store.get("zzz")
    assert store.get("abc2").id == "abc2"


def test_retention_drops_whole_old_day_files(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    now = time.time()
    store.append(Trace("old", "t", started=now - 10 * 86400))
    store.append(Trace("new", "t", started=now))
    removed = store.prune(keep_days=3, now=now)
    assert len(removed) == 1
    assert [t.id for t in store.query()] == ["new"]
