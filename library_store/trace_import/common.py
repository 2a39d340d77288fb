"""What every reader of ``trace_import`` shares: the origin of an imported trace, its stable
id, the mapping of scores and labels onto feedback, and the report of an import.

A reader turns one source record (an OTLP trace, a JSONL line, a LangSmith trace) into one
``Trace`` or raises ``BadRecord`` saying why; it never writes. ``write`` stores the traces
whole, through the store's own append path, so the record-size cap and the store-size cap
apply as they do to every other trace.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, get_args

from whetstone.engine.types import Outcome, Step, Trace
from whetstone.library_store.trace_build import SOURCE_KEY, make_trace

KIND = "import"  # the trace kind (trace_build.TRACE_KINDS) of every imported trace
ORIGIN = "origin"  # meta key holding where a trace came from
# How a finished run may end: the Outcome type's values, less the mark of a run in progress.
OUTCOMES: tuple[str, ...] = tuple(o for o in get_args(Outcome) if o != "running")
MAX_COMMENT_CHARS = 4_000  # as /v1/feedback keeps (engine/server/exchange.py)
# A label that is a verdict becomes a score (1 good, 0 bad); any other label is kept as the
# feedback's comment: a word such as "positive" is read the same from every tool that wrote it.
VERDICTS: dict[str, float] = {
    **dict.fromkeys(("correct", "pass", "passed", "good", "yes", "true", "positive", "right",
                     "thumbs_up", "thumbs-up", "up", "1", "accept", "accepted"), 1.0),
    **dict.fromkeys(("incorrect", "fail", "failed", "bad", "no", "false", "negative", "wrong",
                     "thumbs_down", "thumbs-down", "down", "0", "reject", "rejected"), 0.0),
}


class BadRecord(Exception):
    """A source record that cannot become a whole trace; the message says why."""


@dataclass(frozen=True)
class Imported:
    """One trace a reader built, with the key that says it is the same record next time."""

    trace: Trace
    key: str


@dataclass
class ImportReport:
    """What an import did: traces stored, already there, and records skipped with why."""

    imported: list[str] = field(default_factory=list)  # trace ids stored
    duplicates: int = 0  # records already in the store (same origin key or trace id)
    skipped: list[str] = field(default_factory=list)  # "where: why" per malformed record
    truncated: int = 0  # stored records cut to the store's record-size cap
    dropped_files: list[str] = field(default_factory=list)  # pruned past the store-size cap
    evicted: int = 0  # traces the store held before the import that the size cap dropped
    kept: int = 0  # imported traces still stored when the import ended
    sources: dict[str, str] = field(default_factory=dict)  # source -> format read
    notes: list[str] = field(default_factory=list)  # what was read only in part (annotations)

    def to_dict(self) -> dict[str, Any]:
        return {"imported": len(self.imported), "ids": list(self.imported),
                "duplicates": self.duplicates, "skipped": list(self.skipped),
                "truncated": self.truncated, "dropped_files": list(self.dropped_files),
                "evicted": self.evicted, "kept": self.kept,
                "sources": dict(self.sources), "notes": list(self.notes)}


# How far into the future a record may start: a day covers a clock set to the wrong time
# zone (a naive local time read as UTC is at most 14 hours off). A record dated past it is
# skipped as malformed; the store evicts by write time, so none could push real traces out.
MAX_FUTURE_S = 86_400
# The deepest JSON a record may nest. Python's json gives up near 1000 levels with a
# RecursionError, and everything after reading (the trace's own encoding, hashing a record)
# recurses as well: a record nested past this is malformed, listed and skipped like bad JSON.
# Real exports nest a few dozen levels (a LangSmith run tree, OTLP key-value lists).
MAX_JSON_DEPTH = 200


def parse_json(text: str | bytes) -> Any:
    """``json.loads``, where JSON nested deeper than ``MAX_JSON_DEPTH`` is a ``ValueError``
    like any text that is not JSON (never a ``RecursionError`` that ends the import)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # no recursion: the depth is what is checked
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        stack.extend((c, depth + 1) for c in children)
    return value


def origin_key(fmt: str, source_id: str) -> str:
    """The key an imported record is known by: its format and the id its source gave it."""
    return f"{fmt}:{source_id}"


def content_key(fmt: str, record: Any) -> str:
    """A key for a record without an id of its own: the hash of its JSON, so the same record
    read again (from the same file or a copy) is recognised."""
    text = json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)
    return origin_key(fmt, "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass"))
                      .hexdigest()[:32])


def stable_id(started: float, key: str) -> str:
    """A trace id in the store's scheme (``20261130-101500-3f9a1c2b``, ``new_trace_id``) whose
    random part is the hash of ``key``: the same record imported twice gets the same id."""
    when = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
    return f"{when}-{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def text_of(value: Any) -> str:
    """Message content as text: a string, OpenAI content parts (their text parts), a GenAI
    ``parts`` list, or any other JSON value as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(p, Mapping) for p in value):
        texts = [p.get("text", p.get("content")) for p in value
                 if p.get("type") in ("text", "input_text", "output_text", None)]
        if all(isinstance(t, str) for t in texts) and texts:
            return "".join(t for t in texts if isinstance(t, str))
    return json.dumps(value, ensure_ascii=False, default=str)


def number(value: Any, what: str) -> float | None:
    """``value`` as a finite float (None stays None); ``BadRecord`` naming ``what``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise BadRecord(f"{what} {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise BadRecord(f"{what} {value!r} is not a number")
    return float(value)


def feedback(score: Any, label: Any, comment: Any = None) -> tuple[float | None,
                                                                    dict[str, Any]]:
    """A record's score and label as the store keeps feedback (``set_score``, /v1/feedback):
    the score (0 bad to 1 good) and ``meta["feedback"]`` for the comment. A boolean or a
    verdict word as the label (``correct``, ``fail``, ...) gives the score when none is
    given; any other label is kept as the comment. ``BadRecord`` for a score outside [0, 1]."""
    meta: dict[str, Any] = {}
    if isinstance(score, bool):
        score = float(score)
    value = number(score, "score")
    if value is not None and not 0.0 <= value <= 1.0:
        raise BadRecord(f"score {value:g} is outside 0..1 (1 good, 0 bad)")
    if label is not None:
        if isinstance(label, bool):
            verdict: float | None = float(label)
        elif isinstance(label, (str, int, float)):
            verdict = VERDICTS.get(str(label).strip().lower())
        else:
            raise BadRecord(f"label must be text or a boolean, got {type(label).__name__}")
        meta["feedback_label"] = label
        if verdict is not None and value is None:
            value = verdict
        elif verdict is None:
            comment = comment if comment is not None else str(label)
    if comment is not None:
        meta["feedback"] = text_of(comment)[:MAX_COMMENT_CHARS]
    return value, meta


def _utc(seconds: float) -> str:
    """Epoch seconds as a UTC time, or as the number when no calendar holds it."""
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return f"{seconds:g} seconds after 1970"


def finish_step(outcome: str, started: float, error: str | None = None) -> Step:
    """The ``finish`` step the runtime ends a run with, saying the run was imported."""
    return Step(kind="finish", module="finish", started=started, route="end",
                output={"outcome": outcome, "reason": "imported"}, error=error)


def build(fmt: str, source: str, record: str, key: str, *, task: str, steps: Sequence[Step],
          answer: str | None, outcome: str = "answered", model: str = "", started: float,
          ended: float | None = None, label: str | None = None, score: float | None = None,
          meta: Mapping[str, Any] | None = None, trace_id: str | None = None,
          error: str | None = None) -> Imported:
    """One imported trace (``make_trace`` of kind ``import``) with its origin in
    ``meta["origin"]``: the format, the source (a path or a URL), where in it (a line, a record
    id) and the key; ``BadRecord`` when it has no task, or no answer and did not fail."""
    if not task.strip():
        raise BadRecord("no task: the record holds no user message or input")
    if started < 0:
        raise BadRecord(f"it starts at {_utc(started)}, before 1970: not a time a run took")
    if started > time.time() + MAX_FUTURE_S:
        raise BadRecord(f"it starts at {_utc(started)}, in the future (more than a day from "
                        "now): check the clock or the time zone of its source")
    if outcome not in OUTCOMES:
        raise BadRecord(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    if error is None and outcome == "answered" and (answer is None or not answer.strip()):
        raise BadRecord("no answer: the record holds no final output")
    info: dict[str, Any] = {k: v for k, v in (meta or {}).items() if k != SOURCE_KEY}
    info[ORIGIN] = {"format": fmt, "source": source, "record": record, "key": key,
                    **dict(info.get(ORIGIN) or {})}
    if error is not None:
        info["error"] = error
    steps = (*steps, finish_step(outcome, ended or started, error))
    trace = make_trace(KIND, task=task, steps=steps, answer=answer,
                       outcome=outcome,  # type: ignore[arg-type]  # checked against OUTCOMES
                       model=model, started=started, ended=ended, label=label, score=score,
                       meta=info, trace_id=trace_id or stable_id(started, key))
    return Imported(trace, key)


def outcome_of(value: Any) -> Outcome | None:
    """A recorded outcome when it is one the store knows (``running`` is not: an imported run
    has ended)."""
    return value if isinstance(value, str) and value in OUTCOMES else None  # type: ignore


def known_keys(traces: Iterable[Trace]) -> tuple[set[str], set[str]]:
    """The origin keys and the ids of ``traces``: what an import must not store again."""
    keys: set[str] = set()
    ids: set[str] = set()
    for t in traces:
        ids.add(t.id)
        origin = t.meta.get(ORIGIN)
        if isinstance(origin, Mapping) and isinstance(origin.get("key"), str):
            keys.add(origin["key"])
    return keys, ids


__all__ = ["KIND", "ORIGIN", "BadRecord", "ImportReport", "Imported", "build", "content_key",
           "feedback", "known_keys", "number", "origin_key", "outcome_of", "parse_json",
           "stable_id", "text_of"]


def iso_seconds(value: Any, what: str, *, numbers: bool = False) -> float:
    """An ISO 8601 time (naive: UTC) as epoch seconds (``numbers``: epoch seconds pass as
    they are); ``BadRecord`` naming ``what`` otherwise."""
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise BadRecord(f"{what} is missing")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise BadRecord(f"{what} {value!r} is not an ISO 8601 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
