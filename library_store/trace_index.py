"""Where each trace's latest record is: trace id -> (file, offset, length), in SQLite.

Derived data beside the JSON lines (``<traces>/index.sqlite``): the files are the truth and
the index catches up with whatever they hold that it has not seen (lines appended by a writer
without the index, a file deleted by hand), so it can be deleted at any time and is rebuilt
on the next lookup. Finding a trace costs one indexed query and one read of its line, however
large the store; a missing id costs the query alone.

Records of one trace all go to the files of its start day, in order, and file names sort in
the order they were written (``YYYY-MM-DD.jsonl``, then ``YYYY-MM-DD_001.jsonl`` ...), so
"latest" is the greatest (file, offset): an upsert never lets an older record replace a newer.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

INDEX_FILE = "index.sqlite"
_ID_AT_START = re.compile(rb'^\{"id": "([A-Za-z0-9._:-]{1,200})"')
_READ_CHUNK = 1 << 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records(
    id TEXT PRIMARY KEY, file TEXT NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS records_by_file ON records(file);
CREATE TABLE IF NOT EXISTS files(name TEXT PRIMARY KEY, indexed INTEGER NOT NULL);
"""
_UPSERT = """
INSERT INTO records(id, file, offset, length) VALUES(?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET file=excluded.file, offset=excluded.offset,
    length=excluded.length
WHERE excluded.file > records.file
   OR (excluded.file = records.file AND excluded.offset >= records.offset)
"""

Row = tuple[str, int, int]  # (trace id, offset, length) within one file


def record_id(line: bytes) -> str | None:
    """The trace id of one record line, read from its start when it is there (the store
    writes ``{"id": ...`` first), else from the parsed line; None when unreadable."""
    m = _ID_AT_START.match(line)
    if m is not None:
        return m.group(1).decode("ascii")
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    tid = data.get("id") if isinstance(data, dict) else None
    return tid if isinstance(tid, str) else None


def complete_lines(path: Path, start: int) -> tuple[list[Row], int]:
    """(id, offset, length) of each complete line of ``path`` from byte ``start``, and the
    offset just past the last complete line (a torn last line is left for later)."""
    rows: list[Row] = []
    pos = start
    with open(path, "rb") as f:
        f.seek(start)
        pending = b""
        while chunk := f.read(_READ_CHUNK):
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                tid = record_id(line) if line.strip() else None
                if tid is not None:
                    rows.append((tid, pos, len(line)))
                pos += len(line) + 1
    return rows, pos


class TraceIndex:
    """The index of one trace folder. Thread-safe (a connection per thread); several
    processes may share it (SQLite locks; every write is idempotent)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / INDEX_FILE
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            self.root.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=30)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")  # derived data: rebuilt if lost
                # Keep the write-ahead log small: checkpoint often, truncate it after.
                conn.execute("PRAGMA wal_autocheckpoint=64")
                conn.execute("PRAGMA journal_size_limit=262144")
                conn.executescript(_SCHEMA)
            except sqlite3.Error:
                conn.close()
                raise
            self._local.conn = conn
        return conn

    def reset(self) -> None:
        """Forget everything (a damaged index): the next ``catch_up`` rebuilds it."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    def indexed(self, name: str) -> int:
        """Bytes of file ``name`` the index has read (0 when none)."""
        row = self._conn().execute("SELECT indexed FROM files WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def add(self, name: str, rows: Sequence[Row], indexed_to: int) -> None:
        """Record ``rows`` of file ``name``, which is now read up to ``indexed_to``."""
        conn = self._conn()
        with conn:
            conn.executemany(_UPSERT, [(tid, name, off, n) for tid, off, n in rows])
            conn.execute("INSERT INTO files(name, indexed) VALUES(?, ?) ON CONFLICT(name) "
                         "DO UPDATE SET indexed=MAX(indexed, excluded.indexed)",
                         (name, indexed_to))

    def forget(self, names: Iterable[str]) -> None:
        """Drop the records of deleted files."""
        conn = self._conn()
        with conn:
            for name in names:
                conn.execute("DELETE FROM records WHERE file=?", (name,))
                conn.execute("DELETE FROM files WHERE name=?", (name,))

    def catch_up_file(self, path: Path) -> None:
        """Index what ``path`` holds past what was read (from the start if it shrank)."""
        name = path.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            self.forget([name])
            return
        done = self.indexed(name)
        if done == size:
            return
        if done > size:  # rewritten or truncated by hand: read it again
            self.forget([name])
            done = 0
        rows, end = complete_lines(path, done)
        self.add(name, rows, end)

    def catch_up(self, files: Sequence[Path]) -> None:
        """Bring the index up to ``files`` (the data files, oldest first): tails are read,
        files that are gone are forgotten. Costs one stat per file when nothing changed."""
        known = dict(self._conn().execute("SELECT name, indexed FROM files").fetchall())
        present = {p.name for p in files}
        gone = [n for n in known if n not in present]
        if gone:
            self.forget(gone)
        for path in files:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if known.get(path.name) != size:
                self.catch_up_file(path)

    def lookup(self, trace_id: str) -> tuple[str, int, int] | None:
        """(file name, offset, length) of the latest record of ``trace_id``, or None."""
        row = self._conn().execute("SELECT file, offset, length FROM records WHERE id=?",
                                   (trace_id,)).fetchone()
        return (str(row[0]), int(row[1]), int(row[2])) if row else None

    def with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """Up to ``limit`` ids starting with ``prefix`` (a range scan of the primary key)."""
        rows = self._conn().execute(
            "SELECT id FROM records WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            (prefix, prefix + "\U0010ffff", limit)).fetchall()
        return [str(r[0]) for r in rows]
