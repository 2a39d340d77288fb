"""The trace store in PostgreSQL: ``TraceStore``'s contract over the ``trace_records`` table.

One row per record, as the file store keeps one line per record: a trace written more than
once (running, then its outcome, then feedback) has several rows, and the one with the highest
``seq`` wins. Writers take a transaction-scoped advisory lock, so rows become visible in
``seq`` order and a reader following the store (``read_since``) never skips one committed
late. Each row carries its record's write key (``Record.key``, made when it is encoded): a
write retried after a lost answer, or replayed from a server's spool, lands once.

The index is the table's own (``(id, seq)``, ids compared bytewise for prefixes); the size cap
reads a running total kept by every write and, past it, deletes the oldest rows down to 7/8 of
the cap (whole files in the file store); retention by age deletes whole days, as the file store
does. Images go to ``trace_images`` by hash.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..engine.errors import NotFound
from ..engine.types import Trace
from .fsutil import sha256_bytes
from .images import REF_TYPE, ImageStore
from .trace_records import Record, encode_dict
from .traces import TraceStore, trace_bounds

if TYPE_CHECKING:
    from .pg_library import PgBacking

_PAGE = 2000  # rows a read fetches at a time
_INSERT = """
INSERT INTO trace_records(id, started, line, write_key, nbytes)
SELECT id, started, line, key, nbytes
FROM unnest(%s::text[], %s::float8[], %s::text[], %s::text[], %s::int[])
     WITH ORDINALITY AS r(id, started, line, key, nbytes, ord)
ORDER BY ord
ON CONFLICT (write_key) DO NOTHING
RETURNING nbytes
"""


def new_key() -> str:
    return uuid.uuid4().hex


def _storable(line: str) -> str:
    """``line`` as PostgreSQL text holds it: a lone surrogate (bytes that were not UTF-8)
    written as its JSON escape, which reads back as the same string."""
    try:
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return json.dumps(json.loads(line), ensure_ascii=True)


class PgImageStore(ImageStore):
    """Images of traces in ``trace_images``, by sha256."""

    def __init__(self, backing: PgBacking, local: Path) -> None:
        super().__init__(local / "images", durable=False)  # never written
        self.backing = backing

    def put(self, data: bytes, media_type: str = "image/png") -> dict[str, Any]:
        digest = sha256_bytes(data)
        self.backing.run(lambda c: c.execute(
            "INSERT INTO trace_images VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (digest, media_type, data)), "storing an image")
        return {"type": REF_TYPE, "sha256": digest, "media_type": media_type}

    def get(self, digest: str) -> bytes:
        row = self.backing.run(lambda c: c.execute(
            "SELECT data FROM trace_images WHERE digest = %s", (digest,)).fetchone(),
            "reading an image")
        if row is None:
            raise NotFound(f"image {str(digest)[:12]} is not in the store {self.backing.where}",
                           hint="it was pruned, or the traces were imported without it")
        return bytes(row[0])


class PgIndex:
    """What ``TraceStore.get`` asks of its index, answered by the table's own."""

    def __init__(self, backing: PgBacking) -> None:
        self.backing = backing

    def with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        rows = self.backing.run(lambda c: c.execute(
            'SELECT DISTINCT id COLLATE "C" FROM trace_records WHERE id COLLATE "C" >= %s '
            'AND id COLLATE "C" < %s ORDER BY 1 LIMIT %s',
            (prefix, prefix + "\U0010ffff", limit)).fetchall(), "reading the trace index")
        return [str(r[0]) for r in rows]


@dataclass
class PgTraceStore(TraceStore):
    """Traces in PostgreSQL (the module). ``root`` is the library's local ``traces`` folder:
    nothing is stored there but a server's spool."""

    backing: Any = field(default=None, repr=False)
    remote: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.images = PgImageStore(self.backing, self.root)
        # What ``TraceStore.get`` asks its index, answered by the table's own (no SQLite file).
        self.index = PgIndex(self.backing)  # type: ignore[assignment]

    def ready(self) -> str | None:
        return self.backing.ready()

    def encode(self, trace: Trace) -> Record:
        return replace(super().encode(trace), key=new_key())

    def append_records(self, records: Iterable[Record]) -> None:
        """Write records in one transaction; a record whose key is stored already is
        skipped (a retried write). Then keep the store under ``max_bytes``."""
        rows = [r if r.key else replace(r, key=new_key()) for r in records]
        if not rows:
            return
        lines = [_storable(r.line) for r in rows]
        params = ([r.id for r in rows], [float(r.started) for r in rows], lines,
                  [r.key for r in rows], [len(line.encode("utf-8")) for line in lines])
        schema = self.backing.url.schema

        def write(conn: Any) -> int:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('whetstone-traces:' || %s))",
                             (schema,))
                added = sum(int(r[0]) for r in conn.execute(_INSERT, params).fetchall())
                row = conn.execute("UPDATE trace_totals SET bytes = bytes + %s WHERE id = 1 "
                                   "RETURNING bytes", (added,)).fetchone()
                return int(row[0]) if row else 0

        total = self.backing.run(write, "writing traces")
        if self.max_bytes and total > self.max_bytes:
            self._prune_to(self.max_bytes - self.max_bytes // 8)

    def append_feedback(self, updated: Trace, score: float, comment: str | None) -> None:
        record = encode_dict(self.images.externalize(updated.to_dict()), self._record_cap())
        self.append_records([replace(record, key=new_key())])
        self._notify("feedback", updated, score, comment)

    def files(self) -> list[Path]:
        return []  # no files: the rows are the store

    def size(self) -> int:
        row = self.backing.run(lambda c: c.execute(
            "SELECT bytes FROM trace_totals WHERE id = 1").fetchone(), "reading trace sizes")
        return int(row[0]) if row else 0

    def _rows(self, after: int = 0) -> Iterator[tuple[int, str]]:
        """(seq, line) of every row past ``after``, in write order, a page at a time."""
        while True:
            page = self.backing.run(lambda c, after=after: c.execute(
                "SELECT seq, line FROM trace_records WHERE seq > %s ORDER BY seq LIMIT %s",
                (after, _PAGE)).fetchall(), "reading traces")
            for seq, line in page:
                yield int(seq), str(line)
            if len(page) < _PAGE:
                return
            after = int(page[-1][0])

    def _parse(self, seq: int, line: str) -> Trace | None:
        try:
            return Trace.from_dict(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
                RecursionError) as exc:
            self.problems.append(f"{self.backing.where} record {seq}: unreadable trace record "
                                 f"({exc}); skipped")
            return None

    def _records(self) -> Iterator[Trace]:
        self.problems = []
        for seq, line in self._rows():
            trace = self._parse(seq, line)
            if trace is not None:
                yield trace

    def read_since(self, cursor: Mapping[str, int] | None = None
                   ) -> tuple[list[Trace], dict[str, int]]:
        """The records written after ``cursor`` (``{"seq": N}``; None: from the start)."""
        after = int((cursor or {}).get("seq", 0))
        self.problems = []
        out: list[Trace] = []
        for seq, line in self._rows(after):
            after = seq
            trace = self._parse(seq, line)
            if trace is not None:
                out.append(trace)
        return out, {"seq": after}

    def find(self, trace_id: str) -> Trace | None:
        row = self.backing.run(lambda c: c.execute(
            'SELECT seq, line FROM trace_records WHERE id COLLATE "C" = %s '
            "ORDER BY seq DESC LIMIT 1", (trace_id,)).fetchone(), "reading a trace")
        return None if row is None else self._parse(int(row[0]), str(row[1]))

    def prune(self, keep_days: float | None = None, now: float | None = None, *,
              max_bytes: int | None = None) -> list[Path]:
        """Retention as the file store's: the days started more than ``keep_days`` ago,
        then the oldest rows while over ``max_bytes`` (the newest is always kept). Returns
        one name per day whose rows were deleted (``YYYY-MM-DD``)."""
        keep_days = self.keep_days if keep_days is None else keep_days
        cap = self.max_bytes if max_bytes is None else max_bytes
        now = time.time() if now is None else now
        days: set[str] = set()
        if keep_days is not None:
            cutoff = now - keep_days * 86400
            # A whole day goes once it ended before the cutoff (the file store's day files).
            days |= self._delete("floor(started / 86400.0) * 86400.0 + 86400.0 < %s",
                                 (cutoff,))
        if cap:
            days |= self._prune_to(cap)
        return [Path(d) for d in sorted(days)]

    def _prune_to(self, cap: int) -> set[str]:
        """Delete the oldest rows until the newest ones left hold at most ``cap`` bytes."""
        return self._delete(
            "seq IN (SELECT seq FROM (SELECT seq, sum(nbytes) OVER (ORDER BY seq DESC) AS "
            "newer FROM trace_records) t WHERE newer > %s AND seq < (SELECT max(seq) FROM "
            "trace_records))", (cap,))

    def _delete(self, where: str, params: tuple[Any, ...]) -> set[str]:
        schema = self.backing.url.schema

        def delete(conn: Any) -> set[str]:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('whetstone-traces:' || %s))",
                             (schema,))
                rows = conn.execute(
                    f"DELETE FROM trace_records WHERE {where} RETURNING nbytes, "
                    "to_char(to_timestamp(started) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
                    params).fetchall()
                conn.execute("UPDATE trace_totals SET bytes = bytes - %s WHERE id = 1",
                             (sum(int(r[0]) for r in rows),))
                return {str(r[1]) for r in rows}

        return self.backing.run(delete, "pruning traces")


def pg_trace_store(backing: PgBacking, settings: Mapping[str, Any]) -> PgTraceStore:
    """The store of ``backing``'s library with the bounds its settings give."""
    return PgTraceStore(backing.local / "traces", backing=backing, **trace_bounds(settings))
