"""The append-only trace store: one JSON line per trace record, files per day.

A trace may be written more than once (``running`` when a run starts, its outcome when it ends,
a new score when feedback arrives); the latest line for an id wins. Reading never fails on a
bad line: it is reported with its file and line number and skipped. The store is bounded: each
record is capped in size (``trace_records``), and retention (by age and by total size) deletes
whole files, the first written first (never by the time a record claims), so nothing is ever
rewritten in place. Lookups by id use an index
(``trace_index``).

``TraceStore.append`` is the one writer: every host (an agent run through its
``TraceRecorder``, eval, chat, the server's batches through ``append_records``, MCP,
``Engine.endpoint``) stores a trace through it,
and only ``_write_segment`` opens a trace file for writing. Traces are built by
``trace_build.make_trace``, the one builder.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

from filelock import FileLock

from ..engine.errors import ConfigError, NotFound, WhetstoneError
from ..engine.types import Trace
from .images import ImageStore
from .paths import shown
from .trace_build import TRACE_KINDS, trace_kind
from .trace_index import TraceIndex
from .trace_records import DEFAULT_MAX_RECORD_BYTES, Record, encode_dict

log = logging.getLogger("whetstone.traces")


class TraceSink(Protocol):
    """Something told of every trace the store records (an OpenTelemetry exporter,
    ``otel_export.OtelSink``): ``recorded`` for each record written through ``encode``
    (``running`` ones included: a sink skips what it does not want), ``feedback`` for a
    label. A sink must return quickly (queue, not send) and its failures are only logged."""

    def recorded(self, trace: Trace) -> None: ...

    def feedback(self, trace: Trace, score: float, comment: str | None) -> None: ...


@dataclass
class TraceQuery:
    """Filters for ``TraceStore.query``; ``None`` means any."""

    task: str | None = None  # substring of the task
    outcome: str | None = None
    min_score: float | None = None
    max_score: float | None = None
    library_version: str | None = None
    since: float | None = None  # unix time, on ``started``
    until: float | None = None
    ids: frozenset[str] | None = None
    task_set: str | None = None  # meta["task_set"], set by eval
    source: str | None = None  # the trace kind (``trace_build.trace_kind``): agent, chat, ...
    limit: int | None = None  # newest first when limited

    def matches(self, t: Trace) -> bool:
        if self.ids is not None and t.id not in self.ids:
            return False
        if self.task is not None and self.task.lower() not in t.task.lower():
            return False
        if self.outcome is not None and t.outcome != self.outcome:
            return False
        if self.min_score is not None and (t.score is None or t.score < self.min_score):
            return False
        if self.max_score is not None and (t.score is None or t.score > self.max_score):
            return False
        if self.library_version is not None and t.library_version != self.library_version:
            return False
        if self.since is not None and t.started < self.since:
            return False
        if self.until is not None and t.started > self.until:
            return False
        if self.source is not None and trace_kind(t) != self.source:
            return False
        return self.task_set is None or t.meta.get("task_set") == self.task_set


_FILTER = re.compile(r"^\s*(\w+)\s*(<=|>=|=|<|>)\s*(.+?)\s*$")
_FILTER_HINT = ("filters: outcome=, score<|>|=, version=, task=, task_set=, source=, "
                "since=YYYY-MM-DD, until=YYYY-MM-DD")


def parse_trace_filter(text: str | None) -> dict[str, Any]:
    """``"outcome=answered,score<1,version=v2,since=2026-11-01,task=apples,source=chat"`` ->
    ``TraceQuery`` keyword arguments; ``ConfigError`` naming the part it cannot read."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = _FILTER.match(part)
        if not m:
            raise ConfigError(f"cannot read trace filter {part!r}",
                              hint='use key=value pairs, e.g. "outcome=answered,score<1"')
        key, op, value = m.groups()
        try:
            out.update(_filter_term(key, op, value))
        except ValueError as exc:
            raise ConfigError(f"cannot read trace filter {part!r}: {exc}",
                              hint=_FILTER_HINT) from exc
    return out


def _filter_term(key: str, op: str, value: str) -> dict[str, Any]:
    if key == "score":
        x = float(value)
        if op in ("<", "<="):
            return {"max_score": x - (1e-9 if op == "<" else 0)}
        if op in (">", ">="):
            return {"min_score": x + (1e-9 if op == ">" else 0)}
        return {"min_score": x, "max_score": x}
    if key in ("since", "until"):
        return {key: datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()}
    if key == "source" and op == "=":
        if value not in TRACE_KINDS:
            raise ValueError(f"no trace kind {value!r}; kinds: {', '.join(TRACE_KINDS)}")
        return {key: value}
    if key in ("outcome", "task", "task_set") and op == "=":
        return {key: value}
    if key == "version" and op == "=":
        return {"library_version": value}
    raise ConfigError(f"unknown trace filter {key}{op}", hint=_FILTER_HINT)


def _ends_torn(path: Path) -> bool:
    """Whether ``path`` is non-empty and its last byte is not a newline (a torn last line)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


_DATA_FILE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:_(\d{3,}))?\.jsonl")
DEFAULT_MAX_BYTES = 1024 ** 3  # 1 GiB of records per store unless configured
MIN_SEGMENT_BYTES = 64 * 1024
MAX_SEGMENT_BYTES = 64 * 1024 * 1024


def _day_of(path: Path) -> str | None:
    m = _DATA_FILE.fullmatch(path.name)
    return m.group(1) if m else None


@dataclass
class TraceStore:
    """Traces under ``root`` (``<library>/traces``). Safe for threads and processes.

    Records go to day files (``YYYY-MM-DD.jsonl``), split into numbered segments
    (``YYYY-MM-DD_001.jsonl`` ...) so old records can be dropped a piece at a time. Bounds:
    each record at most ``max_record_bytes`` (long strings cut with a marker and their hash,
    see ``trace_records``); the data files at most ``max_bytes`` in all (0: no cap), the
    segments written first deleted past it after each write; ``keep_days`` for ``prune()``.
    Lookups by id go through an index (``trace_index``), not a scan.
    """

    root: Path
    problems: list[str] = field(default_factory=list)  # bad lines seen by the last read
    keep_days: float | None = None  # retention used by ``prune()`` when no argument is given
    max_bytes: int = DEFAULT_MAX_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    # Told of every record (issue 39's export); the Library shares its list with each store.
    sinks: list[TraceSink] = field(default_factory=list)
    # A store across the network (PostgreSQL): a server spools what it records on its own disk
    # first and writes it on from there (trace_spool.py).
    remote: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._thread_lock = threading.Lock()
        self.index = TraceIndex(self.root)
        self._total: int | None = None  # bytes of data files, as this process last saw them
        self.pruned = 0  # data files this object deleted (an import reports what it cost)
        # Images in traces are kept once by content hash (see library_store/images.py).
        self.images = ImageStore(self.root / "images")

    def ready(self) -> str | None:
        """None when records can be written now, else why not (a server's ``/readyz``)."""
        return None

    def resolve_images(self, trace: Trace) -> Trace:
        """``trace`` with its stored image references back as inline data-URL parts."""
        return Trace.from_dict(self.images.inline(trace.to_dict()))

    def _lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"))

    @property
    def segment_bytes(self) -> int:
        """Size at which a day file is continued in a new segment."""
        if not self.max_bytes:
            return MAX_SEGMENT_BYTES
        return min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, self.max_bytes // 8))

    def _day(self, when: float) -> str:
        return datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d")

    def _segment(self, day: str) -> Path:
        """The file the next record of ``day`` goes to: its last segment, or a new one when
        that is full."""
        last = max((p for p in self.root.glob(f"{day}*.jsonl") if _day_of(p) == day),
                   default=None)
        if last is None:
            return self.root / f"{day}.jsonl"
        try:
            full = last.stat().st_size >= self.segment_bytes
        except FileNotFoundError:
            full = False
        if not full:
            return last
        m = _DATA_FILE.fullmatch(last.name)
        seq = int(m.group(2) or 0) + 1 if m else 1
        return self.root / f"{day}_{seq:03d}.jsonl"

    def encode(self, trace: Trace) -> Record:
        """``trace`` as the bounded line it is stored as (cheap to keep in a queue); inline
        images go to the image store first and the line keeps their references. The trace
        becomes a dict once: the images are swapped on that dict, which is what is written.
        Every writer encodes here (the server in its encoder thread), so here the sinks
        hear of each record."""
        record = encode_dict(self.images.externalize(trace.to_dict()), self._record_cap())
        self._notify("recorded", trace)
        return record

    def _notify(self, what: str, trace: Trace, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, what)(trace, *args)
            except Exception:  # an exporter's bug must never lose the trace itself
                log.exception("trace sink %s failed on trace %s", type(sink).__name__,
                              trace.id)

    def _record_cap(self) -> int:
        cap = self.max_record_bytes
        return min(cap, self.max_bytes // 4) if self.max_bytes else cap

    def append(self, trace: Trace) -> None:
        """Write one record. Lines go to the file of the trace's start day."""
        self.append_records([self.encode(trace)])

    def record(self, trace: Trace) -> bool:
        """``append`` for a host that has already got its reply (a chat exchange, a wrapped
        client, a LangChain call): a store that cannot be written (a full disk, a read-only
        folder) is logged as an error and returns False; the caller keeps its reply and
        drops the trace id it would have handed out."""
        try:
            self.append(trace)
            return True
        except (OSError, WhetstoneError) as exc:
            log.error("trace %s was not stored in %s: %s (the reply is returned without a "
                      "trace id; free space or fix the folder's permissions)",
                      trace.id, self.root, exc)
            return False

    def append_many(self, traces: Iterable[Trace]) -> None:
        """Write records under one lock (the server writes in batches)."""
        self.append_records([self.encode(t) for t in traces])

    def append_records(self, records: Iterable[Record]) -> None:
        """Write encoded records (``encode``) under one lock, then keep the store under
        ``max_bytes``.

        Each record is one ``write`` of a whole line, so a crash leaves at worst a torn last
        line, which readers report and skip; the next append starts a fresh line after it."""
        by_day: dict[str, list[Record]] = {}
        for r in records:
            by_day.setdefault(self._day(r.started), []).append(r)
        if not by_day:
            return
        with self._thread_lock, self._lock():
            for day, recs in by_day.items():
                self._write_day(day, recs)
            if self.max_bytes and self._total is not None and self._total > self.max_bytes:
                self._prune_locked(None, self.max_bytes, time.time())

    def _write_day(self, day: str, records: list[Record]) -> None:
        i = 0
        while i < len(records):
            path = self._segment(day)
            written = self._write_segment(path, records[i:])
            i += written

    def _write_segment(self, path: Path, records: list[Record]) -> int:
        """Append to one segment until it is full; returns how many records it took."""
        if self._total is None:
            self._total = sum(self._sizes().values())
        if path.exists() and self.index.indexed(path.name) != path.stat().st_size:
            self.index.catch_up_file(path)  # lines another writer added without the index
        rows: list[tuple[str, int, int]] = []
        with open(path, "ab") as f:
            pos = f.seek(0, 2)
            start = pos
            if _ends_torn(path):
                # A writer killed mid-line left no newline; without one the first good
                # record would be glued onto the torn line and lost with it.
                f.write(b"\n")
                pos += 1
            for r in records:
                data = r.line.encode("utf-8", "surrogatepass") + b"\n"
                f.write(data)
                rows.append((r.id, pos, len(data) - 1))
                pos += len(data)
                if pos >= self.segment_bytes:
                    break
            f.flush()
        self._total += pos - start
        self.index.add(path.name, rows, pos)
        return len(rows)

    def files(self) -> list[Path]:
        """The data files, oldest first (their names sort in the order they were written)."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.glob("*.jsonl") if _day_of(p) is not None)

    def _sizes(self) -> dict[Path, int]:
        out: dict[Path, int] = {}
        for p in self.files():
            try:
                out[p] = p.stat().st_size
            except FileNotFoundError:
                continue
        return out

    def size(self) -> int:
        """Bytes of the data files (the index adds about 100 bytes per trace)."""
        return sum(self._sizes().values())

    def _records(self) -> Iterator[Trace]:
        self.problems = []
        for path in self.files():
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield Trace.from_dict(json.loads(line))
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError,
                            AttributeError, RecursionError) as exc:
                        self.problems.append(
                            f"{path}:{lineno}: unreadable trace record ({exc}); skipped"
                        )

    def latest(self) -> dict[str, Trace]:
        """Every trace by id, latest record wins."""
        out: dict[str, Trace] = {}
        for t in self._records():
            out.pop(t.id, None)  # re-insert so dict order follows the latest write
            out[t.id] = t
        return out

    def query(self, q: TraceQuery | None = None) -> list[Trace]:
        """Traces matching ``q``, oldest first (newest ``limit`` when limited)."""
        q = q or TraceQuery()
        found = sorted((t for t in self.latest().values() if q.matches(t)),
                       key=lambda t: t.started)
        if q.limit is not None:
            found = found[-q.limit:]
        return found

    def read_since(self, cursor: Mapping[str, int] | None = None
                   ) -> tuple[list[Trace], dict[str, int]]:
        """The records written after ``cursor`` (what the previous call returned; None: from
        the start), in the order they were written, and the cursor for the next call: a
        reader that follows the store (a method reading new traces before each run) reads each
        line once, however large the store grows. A line still being written waits for the next
        call; an unreadable one is reported in ``problems`` and skipped; a file that shrank
        is read again from its start, and a deleted one leaves the cursor."""
        done = dict(cursor or {})
        out: list[Trace] = []
        after: dict[str, int] = {}
        self.problems = []
        for path in self.files():
            start = done.get(path.name, 0)
            try:
                size = path.stat().st_size
                start = start if start <= size else 0  # rewritten by hand: read it again
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read(size - start)
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # a torn last line: a writer is still on it
            after[path.name] = start + end
            pos = start
            for line in chunk[:end].split(b"\n")[:-1]:
                try:
                    if line.strip():
                        out.append(Trace.from_dict(json.loads(line)))
                except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                        ValueError, AttributeError, RecursionError) as exc:
                    self.problems.append(f"{path} at byte {pos}: unreadable trace record "
                                         f"({exc}); skipped")
                pos += len(line) + 1
        return out, after

    def find(self, trace_id: str) -> Trace | None:
        """The trace with exactly this id, through the index (None when there is none)."""
        try:
            self.index.catch_up(self.files())
            for _ in range(2):
                where = self.index.lookup(trace_id)
                if where is None:
                    return None
                trace = self._read_at(*where)
                if trace is not None and trace.id == trace_id:
                    return trace
                self.index.forget([where[0]])  # the file changed under the index
                self.index.catch_up(self.files())
        except sqlite3.Error as exc:
            log.warning("the trace index at %s failed (%s); rebuilding it", self.index.path, exc)
            self.index.reset()
        return self.latest().get(trace_id)  # the index could not say: read the files

    def _read_at(self, name: str, offset: int, length: int) -> Trace | None:
        try:
            with open(self.root / name, "rb") as f:
                f.seek(offset)
                return Trace.from_dict(json.loads(f.read(length)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None

    def get(self, trace_id: str) -> Trace:
        """One trace by id or by a unique id prefix."""
        found = self.find(trace_id)
        if found is not None:
            return found
        try:
            matches = self.index.with_prefix(trace_id, limit=2)
        except sqlite3.Error:
            matches = [i for i in self.latest() if i.startswith(trace_id)][:2]
        if len(matches) == 1:
            found = self.find(matches[0])
            if found is not None:
                return found
        if not matches:
            raise NotFound(f"no trace with id {shown(trace_id, 80)!r} in {self.root}",
                           hint="`whetstone traces ls` lists the recorded traces")
        raise NotFound(f"trace id prefix {shown(trace_id, 80)!r} is ambiguous",
                       hint="give more characters of the id")

    def set_score(self, trace_id: str, score: float, comment: str | None = None) -> Trace:
        """Label a trace (feedback or a scorer): appends an updated record."""
        t = self.get(trace_id)
        meta = dict(t.meta)
        if comment is not None:
            meta["feedback"] = comment
        updated = t.with_(score=score, meta=meta)
        self.append_feedback(updated, score, comment)
        return updated

    def append_feedback(self, updated: Trace, score: float, comment: str | None) -> None:
        """Write ``updated`` (a trace with its new score) and tell the sinks of the label
        alone, not of a second whole trace."""
        record = encode_dict(self.images.externalize(updated.to_dict()), self._record_cap())
        self.append_records([record])
        self._notify("feedback", updated, score, comment)

    def prune(self, keep_days: float | None = None, now: float | None = None, *,
              max_bytes: int | None = None) -> list[Path]:
        """Retention: delete data files older than ``keep_days`` (default: the store's
        ``keep_days``; None keeps every day: a file goes when its day, or its last write, is
        older), then the files written first while the store holds more than ``max_bytes``
        (default: the store's ``max_bytes``; 0 means no cap). The file written last is always
        kept. Returns what was deleted."""
        if keep_days is None:
            keep_days = self.keep_days
        cap = self.max_bytes if max_bytes is None else max_bytes
        with self._thread_lock, self._lock():
            return self._prune_locked(keep_days, cap or None,
                                      now if now is not None else time.time())

    def _written(self) -> dict[Path, tuple[int, float]]:
        """Each data file's size and when it was last written, in the order they were
        written (their modification time, then their name)."""
        out: list[tuple[int, str, Path, int]] = []
        for p in self.files():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime_ns, p.name, p, st.st_size))
        return {p: (size, ns / 1e9) for ns, _, p, size in sorted(out)}

    def _prune_locked(self, keep_days: float | None, max_bytes: int | None,
                      now: float) -> list[Path]:
        # By when a file was written, not by the day its records claim (its name): a record
        # may claim any start time (an import, the Python API), and traces dated 2100 would
        # otherwise outlive every real one, and push today's out first.
        written = self._written()
        sizes = {p: size for p, (size, _) in written.items()}
        removed: list[Path] = []
        if keep_days is not None:
            cutoff = now - keep_days * 86400
            for path in list(sizes):
                day = datetime.strptime(_day_of(path) or "", "%Y-%m-%d").replace(
                    tzinfo=UTC)
                if min(day.timestamp() + 86400, written[path][1]) < cutoff:
                    removed.append(path)
                    del sizes[path]
        total = sum(sizes.values())
        if max_bytes is not None:
            for path in list(sizes)[:-1]:  # first written first; never the last written
                if total <= max_bytes:
                    break
                total -= sizes.pop(path)
                removed.append(path)
        for path in removed:
            path.unlink(missing_ok=True)
        self.pruned += len(removed)
        if removed:
            self.index.forget(p.name for p in removed)
        self._total = total
        return removed


def trace_store(root: Path, settings: Mapping[str, Any] | None = None) -> TraceStore:
    """The store at ``root`` with the bounds a library's settings give (``trace_keep_days``,
    ``trace_max_bytes`` (0: no cap), ``trace_max_record_bytes``); a bad value is a
    ``ConfigError``."""
    return TraceStore(Path(root), **trace_bounds(settings))


def trace_bounds(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """``TraceStore``'s bounds from a library's settings (see ``trace_store``)."""
    settings = settings or {}
    kw: dict[str, Any] = {}
    for key, name, kind in (("trace_keep_days", "keep_days", float),
                            ("trace_max_bytes", "max_bytes", int),
                            ("trace_max_record_bytes", "max_record_bytes", int)):
        value = settings.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"library.json: {key} must be a number >= 0, got {value!r}",
                              hint="fix the value or remove the key")
        kw[name] = kind(value)
    return kw
