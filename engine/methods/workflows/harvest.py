"""What the evolver reads from runs: the host-tool calls each made, which of them worked, and
what the calls that only looked around showed of the environment."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...types import Trace
from .induce import CallRecord, Wording, question_spans
from .values import holds, leaf_values, structured


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return dict(value) if isinstance(value, dict) else {}
    return {}


def host_calls(trace: Trace, host: Collection[str]) -> list[CallRecord]:
    """The calls ``trace`` made of the ``host`` tools that returned a result, in order."""
    out: list[CallRecord] = []
    for step in trace.steps:
        if step.kind != "act" or step.error or not isinstance(step.input, Mapping):
            continue
        tool = step.input.get("tool")
        output = step.output if isinstance(step.output, Mapping) else {}
        if tool not in host or output.get("error"):
            continue
        obs = output.get("observation")
        if not isinstance(obs, str) or obs.startswith(f"Error in {tool}:"):
            continue
        out.append(CallRecord(str(tool), _arguments(step.input.get("arguments")), obs))
    return out


@dataclass(frozen=True)
class Worked:
    """A run's calls up to the first whose result holds the run's label."""

    trace_id: str
    question: str
    label: Any
    calls: tuple[CallRecord, ...]


def worked_calls(trace: Trace, label: Any, host: Collection[str]) -> Worked | None:
    """The calls of ``trace`` up to the first result that holds ``label`` (the run reached
    the answer through its tools, whatever it then answered), as it is or kept another way
    (``values.kept_forms``: a price in cents); None when no result does."""
    calls = host_calls(trace, host)
    for i, c in enumerate(calls):
        if holds(c.result, label) is not None:  # as it is, or kept another way (in cents)
            return Worked(trace.id, trace.task, label, tuple(calls[:i + 1]))
    return None


def looked_around(traces: Iterable[Trace], host: Collection[str], wording: Wording
                  ) -> list[tuple[CallRecord, int]]:
    """The calls that took nothing from their question (a list of tables, a folder's
    listing, a table's columns): what the environment showed, most often made first."""
    seen: dict[str, CallRecord] = {}
    counts: Counter[str] = Counter()
    for t in traces:
        for c in host_calls(t, host):
            args = [v for v in c.arguments.values() if isinstance(v, str)]
            if question_spans(t.task, args, wording):
                continue
            key = c.tool + json.dumps(c.arguments, sort_keys=True, default=str)
            seen.setdefault(key, c)
            counts[key] += 1
    return [(seen[k], n) for k, n in counts.most_common()]


def compact(result: str, rows: int = 12) -> str:
    """A result as an analyst reads it best: a list of records with the same fields as a
    table (the fields once, then one line of values per record, at most ``rows``); anything
    else as it is."""
    value = structured(result)
    if not (isinstance(value, list) and value and all(isinstance(r, dict) for r in value)):
        return result.strip()
    fields = list(value[0])
    if any(list(r) != fields for r in value):
        return result.strip()
    lines = [" | ".join(str(f) for f in fields)]
    lines += [" | ".join(str(r[f]) for f in fields) for r in value[:rows]]
    if len(value) > rows:
        lines.append(f"... ({len(value) - rows} more rows)")
    return "\n".join(lines)


def names_in(result: str, limit: int = 24) -> list[str]:
    """What a listing names: the short text values of a structured result, or the lines of
    a text result that are one word (a path, a name)."""
    leaves = leaf_values(result)
    if leaves is not None:
        found = [v for v in leaves if isinstance(v, str) and 0 < len(v) <= 64]
    else:
        # A line that is one name, or a marker and a name ("[DIR] services").
        found = [line.split()[-1] for line in result.splitlines()
                 if 1 <= len(line.split()) <= 2 and len(line) <= 200
                 and (len(line.split()) == 1 or line.split()[0].startswith("["))]
    return list(dict.fromkeys(found))[:limit]


def folders_in(result: str, limit: int = 24) -> list[str]:
    """The entries a listing marks as folders (``[DIR] services``, ``services/``)."""
    found = []
    for line in result.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].upper() in ("[DIR]", "DIR", "<DIR>", "D"):
            found.append(words[1].strip("/"))
        elif len(words) == 1 and len(words[0]) > 1 and words[0].endswith("/") \
                and "/" not in words[0][:-1]:
            found.append(words[0][:-1])
    return [f for f in dict.fromkeys(found) if f not in (".", "..")][:limit]


def useful(result: str) -> bool:
    """Whether a result shows something: not empty, not an error, not an empty listing."""
    text = result.strip()
    return bool(text) and text not in ("[]", "{}", "()", "None", "null") and \
        not text.lower().startswith(("error", "database error", "(no output)"))


def digest(calls: Sequence[tuple[CallRecord, int]], budget_chars: int = 6000,
           result_chars: int = 900) -> str:
    """What ``calls`` showed, one call and its result each (``compact``), within
    ``budget_chars``."""
    out: list[str] = []
    used = 0
    for c, _ in calls:
        result = compact(c.result)
        if len(result) > result_chars:
            result = result[:result_chars] + " …"
        line = f"{c.tool}({json.dumps(c.arguments, ensure_ascii=False)}) ->\n{result}"
        if used + len(line) > budget_chars:
            continue
        out.append(line)
        used += len(line)
    return "\n\n".join(out)


__all__ = ["Worked", "compact", "digest", "folders_in", "host_calls", "looked_around", "names_in",
           "useful", "worked_calls"]
