"""The append-only trace store: one JSON line per trace record, one file per day.

A trace may be written more than once (``running`` when a run starts, its outcome when it ends,
a new score when feedback arrives); the latest line for an id wins. Reading never fails on a
bad line: it is reported with its file and line number and skipped. Retention deletes whole
day files, so nothing is ever rewritten in place.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from engine.errors import ConfigError, NotFound
from engine.types import Trace
from library_store.images import ImageStore


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
        return self.task_set is None or t.meta.get("task_set") == self.task_set


_FILTER = re.compile(r"^\s*(\w+)\s*(<=|>=|=|<|>)\s*(.+?)\s*$")
_FILTER_HINT = ("filters: outcome=, score<|>|=, version=, task=, task_set=, since=YYYY-MM-DD, "
                "until=YYYY-MM-DD")


def parse_trace_filter(text: str | None) -> dict[str, Any]:
    """``"outcome=answered,score<1,version=v2,since=2026-11-01,task=apples"`` -> ``TraceQuery``
    keyword arguments; ``ConfigError`` naming the part it cannot read."""
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
        return {key: datetime.fromisoformat(value).replace(tzinfo=timezone.utc).timestamp()}
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


@dataclass
class TraceStore:
    """Traces under ``root`` (``<library>/traces``). Safe for threads and processes."""

    root: Path
    problems: list[str] = field(default_factory=list)  # bad lines seen by the last read
    keep_days: float | None = None  # retention used by ``prune()`` when no argument is given

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._thread_lock = threading.Lock()
        # Images in traces are kept once by content hash (see library_store/images.py).
        self.images = ImageStore(self.root / "images")

    def _line(self, trace: Trace) -> str:
        text = trace.to_json()
        if '"image' not in text:  # the common case: nothing to look for
            return text + "\n"
        return json.dumps(self.images.externalize(trace.to_dict()), ensure_ascii=False,
                          default=str) + "\n"

    def resolve_images(self, trace: Trace) -> Trace:
        """``trace`` with its stored image references back as inline data-URL parts."""
        return Trace.from_dict(self.images.inline(trace.to_dict()))

    def _lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"))

    def _day_file(self, when: float) -> Path:
        day = datetime.fromtimestamp(when, tz=timezone.utc).strftime("%Y-%m-%d")
        return self.root / f"{day}.jsonl"

    def append(self, trace: Trace) -> None:
        """Write one record. Lines go to the file of the trace's start day."""
        self.append_many([trace])

    def append_many(self, traces: Iterable[Trace]) -> None:
        """Write records under one lock, one open per day file (the server writes in batches).

        Each record is one ``write`` of a whole line, so a crash leaves at worst a torn last
        line, which readers report and skip; the next append starts a fresh line after it."""
        by_file: dict[Path, list[str]] = {}
        for t in traces:
            by_file.setdefault(self._day_file(t.started), []).append(self._line(t))
        if not by_file:
            return
        with self._thread_lock, self._lock():
            for path, lines in by_file.items():
                with open(path, "a", encoding="utf-8") as f:
                    if _ends_torn(path):
                        # A writer killed mid-line left no newline; without one the first
                        # good record would be glued onto the torn line and lost with it.
                        f.write("\n")
                    f.writelines(lines)
                    f.flush()

    def files(self) -> list[Path]:
        return sorted(self.root.glob("*.jsonl")) if self.root.exists() else []

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
                            AttributeError) as exc:
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

    def get(self, trace_id: str) -> Trace:
        """One trace by id or by a unique id prefix."""
        traces = self.latest()
        if trace_id in traces:
            return traces[trace_id]
        matches = [t for i, t in traces.items() if i.startswith(trace_id)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise NotFound(f"no trace with id {trace_id!r} in {self.root}",
                           hint="`whetstone traces ls` lists the recorded traces")
        raise NotFound(f"trace id prefix {trace_id!r} is ambiguous ({len(matches)} traces)",
                       hint="give more characters of the id")

    def set_score(self, trace_id: str, score: float, comment: str | None = None) -> Trace:
        """Label a trace (feedback or a scorer): appends an updated record."""
        t = self.get(trace_id)
        meta = dict(t.meta)
        if comment is not None:
            meta["feedback"] = comment
        updated = t.with_(score=score, meta=meta)
        self.append(updated)
        return updated

    def prune(self, keep_days: float | None = None, now: float | None = None) -> list[Path]:
        """Retention: delete day files older than ``keep_days`` (default: the store's
        ``keep_days`` setting; None keeps everything). Returns what was deleted."""
        if keep_days is None:
            keep_days = self.keep_days
        if keep_days is None:
            return []
        cutoff = (now if now is not None else time.time()) - keep_days * 86400
        removed: list[Path] = []
        with self._thread_lock, self._lock():
            for path in self.files():
                try:
                    day = datetime.strptime(path.stem, "%Y-%m-%d").replace(tzinfo=timezone.utc)
                except ValueError:
                    continue  # not a day file; leave it alone
                if day.timestamp() + 86400 < cutoff:
                    path.unlink()
                    removed.append(path)
        return removed
