"""LangGraph's SQLite checkpointer, keyed by trace id, with a retention policy.

A finished run's checkpoints are deleted (its trace is the record). Unfinished runs (killed or
interrupted) stay resumable until they are older than ``keep_days`` or more than ``keep_runs``
newer unfinished runs exist; pruning happens whenever a run starts.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import NotFound

_RUNS_TABLE = """CREATE TABLE IF NOT EXISTS whetstone_runs (
    thread_id TEXT PRIMARY KEY, started REAL NOT NULL, finished REAL)"""


class Checkpoints:
    """Owns the SQLite file, the LangGraph saver over it, and the run bookkeeping."""

    def __init__(self, path: Path, keep_days: float = 7.0, keep_runs: int = 50) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver  # heavy: langgraph

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keep_days = keep_days
        self.keep_runs = keep_runs
        # One connection shared by the graph's threads; SqliteSaver serialises with its own lock.
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._lock = threading.Lock()
        self.saver = SqliteSaver(self._conn)
        self.saver.setup()
        with self._lock, self._conn:
            self._conn.execute(_RUNS_TABLE)

    def started(self, thread_id: str, when: float | None = None) -> None:
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT OR IGNORE INTO whetstone_runs (thread_id, started) VALUES (?, ?)",
                (thread_id, when or time.time()),
            )

    def finished(self, thread_id: str) -> None:
        """The run ended: its checkpoints are no longer needed."""
        self.saver.delete_thread(thread_id)
        with self._lock, self._conn:
            self._conn.execute("UPDATE whetstone_runs SET finished=? WHERE thread_id=?",
                               (time.time(), thread_id))

    def resumable(self, thread_id: str) -> bool:
        config: Any = {"configurable": {"thread_id": thread_id}}
        return self.saver.get_tuple(config) is not None

    def require_resumable(self, thread_id: str) -> None:
        if not self.resumable(thread_id):
            raise NotFound(
                f"run {thread_id!r} has no checkpoint to resume",
                hint="only unfinished runs (interrupted or killed) can be resumed, for "
                     f"{self.keep_days:g} days; `whetstone traces ls` shows each run's outcome",
            )

    def unfinished(self) -> list[tuple[str, float]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT thread_id, started FROM whetstone_runs WHERE finished IS NULL "
                "ORDER BY started DESC").fetchall()
        return [(r[0], r[1]) for r in rows]

    def prune(self, now: float | None = None) -> list[str]:
        """Apply the retention policy; returns the thread ids whose checkpoints were dropped."""
        now = now or time.time()
        dropped = []
        for i, (thread_id, started) in enumerate(self.unfinished()):
            if i >= self.keep_runs or now - started > self.keep_days * 86400:
                self.saver.delete_thread(thread_id)
                dropped.append(thread_id)
        with self._lock, self._conn:
            self._conn.executemany("DELETE FROM whetstone_runs WHERE thread_id=?",
                                   [(t,) for t in dropped])
            self._conn.execute("DELETE FROM whetstone_runs WHERE finished IS NOT NULL AND "
                               "finished < ?", (now - self.keep_days * 86400,))
        return dropped

    def close(self) -> None:
        self._conn.close()
