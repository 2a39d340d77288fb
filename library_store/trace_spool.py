"""A server's spool: the trace records it acknowledged and has not yet written to a store
across the network, kept on its own disk.

A server in front of a remote store (PostgreSQL) answers a request only once the request's
record is in the spool (one ``write`` of one line: a process killed with ``-9`` right after
still leaves it in the kernel's page cache, on disk soon after). Its writer then moves records
from the spool to the store in batches, and through an outage of the store keeps trying while
the spool holds them. A spool's files are named for the process (``<pid>-<random>-<n>.jsonl``)
and held by a lock file while it lives; a server starting finds the spools whose lock nobody
holds (a process that died) and writes them to the store first. Records carry their write
key, so a record that did reach the store before its writer died lands once.

Offsets are counted over the whole life of a spool, across its files: the writer reports how
far it got (``done``) and files wholly behind that are deleted; a new file is started past
``ROTATE_BYTES``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .trace_records import Record

log = logging.getLogger("whetstone.traces")

ROTATE_BYTES = 8 * 1024 * 1024


def _line(record: Record) -> bytes:
    """A small JSON head, a tab, the record's own line as it is (no second escaping: a JSON
    line holds no raw tab or newline)."""
    head = json.dumps({"id": record.id, "started": record.started,
                       "truncated": record.truncated, "key": record.key}, ensure_ascii=True)
    return head.encode("ascii") + b"\t" + record.line.encode("utf-8", "surrogatepass") + b"\n"


def _record(line: bytes) -> Record | None:
    head, _, body = line.partition(b"\t")
    try:
        d = json.loads(head)
        text = body.decode("utf-8", "surrogatepass")
        json.loads(text)  # whole, not torn
        return Record(id=d["id"], started=float(d["started"]), line=text,
                      truncated=bool(d.get("truncated")), key=d.get("key"))
    except (ValueError, KeyError, TypeError):
        return None  # a line torn by a crash mid-write: it was never acknowledged


class Spool:
    """This process's spool in ``folder`` (the module). Thread-safe."""

    def __init__(self, folder: Path, *, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.folder = folder
        self.rotate_bytes = rotate_bytes
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._owner: FileLock | None = None
        self._files: list[tuple[Path, int]] = []  # (file, offset where it starts)
        self._fh: Any = None
        self._end = 0
        self._done = 0

    def _open_next(self) -> None:
        if self._owner is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._owner = FileLock(str(self.folder / f"{self.name}.lock"))
            self._owner.acquire()
        if self._fh is not None:
            self._fh.close()
        path = self.folder / f"{self.name}-{len(self._files) + 1:06d}.jsonl"
        self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 - kept open for appends
        self._files.append((path, self._end))

    def add(self, record: Record) -> int:
        """Append ``record`` (one write); returns the offset just past it."""
        data = _line(record)
        with self._lock:
            if self._fh is None or (self._end - self._files[-1][1] >= self.rotate_bytes):
                self._open_next()
            view = memoryview(data)
            while view:
                view = view[self._fh.write(view):]
            self._end += len(data)
            return self._end

    @property
    def pending_bytes(self) -> int:
        return self._end - self._done

    def done(self, upto: int) -> None:
        """Everything before offset ``upto`` is in the store: files wholly behind it go."""
        with self._lock:
            self._done = max(self._done, upto)
            while len(self._files) > 1 and self._files[1][1] <= self._done:
                path, _ = self._files.pop(0)
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the files; those holding records not yet done stay for the next start."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            if self._done == self._end:
                for path, _ in self._files:
                    path.unlink(missing_ok=True)
                self._files = []
            if self._owner is not None:
                self._owner.release()
                with contextlib.suppress(OSError):
                    if not self._files:
                        Path(self._owner.lock_file).unlink(missing_ok=True)
                self._owner = None


def abandoned(folder: Path, own: str | None = None) -> Iterator[tuple[str, list[Record]]]:
    """The records of each spool in ``folder`` whose process is gone (its lock is free), by
    spool; yielded while its lock is held, and its files deleted once the caller resumes
    (so the caller writes them to the store before asking for the next)."""
    if not folder.is_dir():
        return
    for lock_path in sorted(folder.glob("*.lock")):
        name = lock_path.name[:-len(".lock")]
        if name == own:
            continue
        lock = FileLock(str(lock_path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue  # a live server's spool
        try:
            files = sorted(folder.glob(f"{name}-*.jsonl"))
            records: list[Record] = []
            for path in files:
                for line in path.read_bytes().splitlines():
                    found = _record(line)
                    if found is not None:
                        records.append(found)
            if records:
                log.info("writing %d trace(s) left in the spool of a server that stopped "
                         "(%s)", len(records), name)
            yield name, records
            for path in files:
                path.unlink(missing_ok=True)
        finally:
            lock.release()
        lock_path.unlink(missing_ok=True)
