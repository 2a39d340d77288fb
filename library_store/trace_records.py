"""One trace as one bounded JSON line: the trace store's record format and its size cap.

A record is the trace's JSON on one line. Past ``max_bytes`` the longest strings (a 15 MB
message, an image as a data URL) are cut to a head plus a marker holding the original length
and sha256, shorter and shorter until the line fits; what stays is still a valid trace with the
same id, task head, answer head, outcome and score. The marker says the record was cut, so
nobody mistakes a head for the whole text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..engine.types import Trace

DEFAULT_MAX_RECORD_BYTES = 256 * 1024
MIN_MAX_RECORD_BYTES = 4 * 1024
TRUNCATED = "…[truncated by whetstone: {n} characters, sha256 {digest}]"
_SMALLEST_CUT = 64  # characters of a string's head kept at the tightest cut


@dataclass(frozen=True)
class Record:
    """A trace ready to append: its id, start time (which day file) and JSON line (no
    newline), and whether it had to be cut to fit. ``key`` names this one write: a store
    that may see a write twice (PostgreSQL, after a lost answer) keeps it once."""

    id: str
    started: float
    line: str
    truncated: bool = False
    key: str | None = None


def truncated_text(text: str, keep: int) -> str:
    """``text`` cut to ``keep`` characters plus the marker (its length and sha256)."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text[:keep] + TRUNCATED.format(n=len(text), digest=digest)


def _cap(value: Any, limit: int) -> tuple[Any, bool]:
    """``value`` with every string longer than ``limit`` characters cut; (value, cut?)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value, False
        return truncated_text(value, limit), True
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        cut = False
        for k, v in value.items():
            out[k], c = _cap(v, limit)
            cut |= c
        return out, cut
    if isinstance(value, (list, tuple)):
        items = [_cap(v, limit) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    return value, False


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)


def _cap_record(data: dict[str, Any], limit: int) -> tuple[dict[str, Any], bool]:
    """``_cap`` for a whole record: the id is never cut, and stays the first key (the index
    reads it from the start of a line)."""
    body, cut = _cap({k: v for k, v in data.items() if k != "id"}, limit)
    return {"id": data["id"], **body}, cut


def _size(line: str) -> int:
    return len(line.encode("utf-8", "surrogatepass"))


def _skeleton(data: dict[str, Any], limit: int) -> dict[str, Any]:
    """The last resort for a trace of very many small parts: its steps keep their kind,
    module and timing, not their input and output."""
    steps = [{k: v for k, v in s.items() if k not in ("input", "output", "meta")}
             for s in data.get("steps") or ()]
    meta = {"record_truncated": "steps' input and output dropped to fit the record cap"}
    small = {**data, "steps": steps, "meta": meta}
    return _cap_record(small, limit)[0]


def encode_trace(trace: Trace, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Record:
    """``trace`` as one JSON line of at most ``max_bytes`` bytes of UTF-8."""
    return encode_dict(trace.to_dict(), max_bytes)


def encode_dict(data: dict[str, Any], max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Record:
    """A trace already as its dict (``Trace.to_dict``, perhaps with its images swapped for
    references) as one JSON line of at most ``max_bytes`` bytes of UTF-8; ``data`` is not
    changed.

    Strings are cut before anything is serialised, so a 15 MB message costs one hash and a
    slice, not a 15 MB dump."""
    max_bytes = max(MIN_MAX_RECORD_BYTES, int(max_bytes))
    trace_id, started = data["id"], data["started"]
    limit = max_bytes // 2  # characters; JSON escapes and UTF-8 may make each several bytes
    while True:
        capped, cut = _cap_record(data, limit)
        line = _dumps(capped)
        if _size(line) <= max_bytes:
            return Record(trace_id, started, line, cut)
        if limit <= _SMALLEST_CUT:
            break
        limit = max(_SMALLEST_CUT, limit // 4)
    line = _dumps(_skeleton(data, _SMALLEST_CUT))
    if _size(line) > max_bytes:  # thousands of steps: keep only what identifies the trace
        keep = ("id", "task", "answer", "label", "outcome", "score", "library_version",
                "model", "started", "ended", "total_tokens")
        line = _dumps(_cap_record({**{k: data.get(k) for k in keep}, "steps": [],
                                   "meta": {"record_truncated": "steps dropped to fit the "
                                                                "record cap"}},
                                  _SMALLEST_CUT)[0])
    return Record(trace_id, started, line, True)
