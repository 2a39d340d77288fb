"""The tool maker's VERIFY phase, in words and numbers: why a candidate was not admitted, where
it crashed, and how close its answers came to the labels (the search's signal)."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ....tools.learned import answer_text
from .parts import (
    ToolTest,
)

if TYPE_CHECKING:
    from ...evaluation.tasks import TaskRecord





def spread(items: Sequence[Any], n: int) -> list[Any]:
    """``n`` items evenly spaced over ``items`` (all of them when there are fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[math.floor(i * len(items) / n)] for i in range(n)]


def expected_text(task: TaskRecord) -> str:
    e = task.expected
    return e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)


def why_not_admitted(tests: Sequence[ToolTest], misses: Sequence[ToolTest],
         tasks: Mapping[str, TaskRecord]) -> str:
    first = misses[0] if misses else None
    head = (f"{sum(t.matched for t in tests)} of {len(tests)} checked training tasks "
            f"answered correctly")
    if first is None:
        return head
    if not first.ok:
        kind = "timed out" if "time" in (first.error or "").lower() else "crashed"
        return f"{head}; {kind} on {first.task_id}: {last_line(first.error)[:160]}"
    return (f"{head}; on {first.task_id} it returned {answer_text(first.output)[:80]!r}, expected "
            f"{expected_text(tasks[first.task_id])[:80]!r}")


def last_line(error: str | None) -> str:
    """The line of a traceback that says what went wrong (its last non-empty one)."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def crash_lines(t: ToolTest) -> list[str]:
    """Where a tool crashed and why: the traceback's last frame (its line and the code on it)
    and the exception, so a repair can find the line; the error alone without a traceback."""
    lines = [ln.rstrip() for ln in t.output.splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("File ")]
    if not frames:
        return [last_line(t.error)[:200]]
    frame = lines[frames[-1]]
    where = frame[frame.find("line "):].replace(", in ", " of ") if "line " in frame else frame
    return [f"{where.strip()[:80]}: {ln.strip()[:160]}" for ln in lines[frames[-1] + 1:
                                                                       frames[-1] + 2]] + [
        last_line(t.error)[:200]]


def closeness(tests: Sequence[ToolTest], tasks: Mapping[str, TaskRecord]) -> float:
    """Mean similarity (difflib's ratio, 0..1) of each answer to its label; a crash is 0.
    Ranks candidates that answer nothing right yet: one that returns ``'] ('`` for
    ``'] > )'`` is a better base for a repair than one that returns a sentence."""
    def one(t: ToolTest) -> float:
        if not t.ok:
            return 0.0
        if t.matched:
            return 1.0
        got, want = answer_text(t.output).strip().lower(), expected_text(tasks[t.task_id]).lower()
        return difflib.SequenceMatcher(None, got[:500], want[:500]).ratio()
    return sum(one(t) for t in tests) / len(tests) if tests else 0.0

