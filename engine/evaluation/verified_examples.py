"""Worked examples from the model's own runs: taken only from runs the scorer verifies.

Shared by the methods that keep examples (a skill's ``references/examples.md``, a library's
memory of demonstrations); it sits with the scorers because the scorer's verdict is what makes
a run an example. An example is a run's task and the model's own output, step by step as it
wrote it (its reply, a program's output as the runtime gave it back, a tool call and its
result; the wording is ``engine/prompts/examples.yaml``), keyed by the trace id it came from.
A run becomes an example only when it answered (not ``length``: an answer cut at the length
limit teaches a reply that does not end), its stored score passes, and, where the scorer
can be rebuilt from the trace (its name and label), scoring the trace again passes too; a run
with an unparseable reply or a failed tool call, or one too long to teach from, is not taken.

Two forms of solution (``form``): ``all`` keeps the run's output as the model wrote it;
``program`` keeps only the part the scorer's verdict vouches for, the program whose printed
output was the answer and that output, and takes no run answered otherwise. The prose around a
small model's program often carries arithmetic that is wrong even when the answer is right
("3/4 x 120 = 180" before a program that prints 30), and a demonstration teaches its errors too.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...skills.format import MAX_EXAMPLE_LINES, Example
from ..errors import WhetstoneError
from ..prompts import render_prompt
from ..types import Trace
from .scorers import get_scorer
from .tasks import TaskRecord, is_user_scorer


@dataclass
class ExampleStats:
    """Why runs were or were not taken as examples (for the evolve's report)."""

    taken: int = 0
    not_success: int = 0
    rescored_failed: int = 0
    unusable: int = 0
    too_long: int = 0
    ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"taken": self.taken, "not_success": self.not_success,
                "rescored_failed": self.rescored_failed, "unusable": self.unusable,
                "too_long": self.too_long}


def _expected(label: str) -> Any:
    """A label as the scorer wants it: JSON structures (BFCL's ground truth) decoded, plain
    answers kept as text."""
    try:
        value = json.loads(label)
    except ValueError:
        return label
    return value if isinstance(value, (list, dict)) else label


def rescore(trace: Trace) -> float | None:
    """The trace scored again by the scorer its eval named (``meta["scorer"]``) against its
    label; None when that cannot be done (no scorer or label recorded, the scorer needs more
    of the task than the trace keeps, or it names code: a stored trace never chooses code to
    run, so the stored score stands)."""
    name = trace.meta.get("scorer")
    if not isinstance(name, str) or not name or trace.label is None or is_user_scorer(name):
        return None
    try:
        task = TaskRecord(id=str(trace.meta.get("task_id") or trace.id), question=trace.task,
                          expected=_expected(trace.label), scorer=name)
        return get_scorer(name)(trace, task)
    except WhetstoneError:
        return None


def verified(trace: Trace, threshold: float = 1.0, stats: ExampleStats | None = None) -> bool:
    """Whether ``trace`` is a run the scorer passes (see the module docstring)."""
    stats = stats if stats is not None else ExampleStats()
    if trace.outcome != "answered" or trace.score is None or trace.score < threshold:
        stats.not_success += 1
        return False
    again = rescore(trace)
    if again is not None and again < threshold:
        stats.rescored_failed += 1
        return False
    return True


def _line(kind: str, **values: Any) -> str:
    return render_prompt(f"examples.yaml#{kind}", **values)


def _call_text(name: Any, arguments: Any) -> str:
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def solution_of(trace: Trace) -> str | None:
    """The model's output over the run, as it wrote it; None when a step failed (an
    unparseable reply, a tool error) or the run has no model output."""
    parts: list[str] = []
    native_calls = False
    for step in trace.steps:
        if step.error or step.kind == "observe":
            return None
        if step.kind == "think":
            out = step.output
            completion = out.get("completion") if isinstance(out, Mapping) else None
            text = (completion or {}).get("text", "") if completion is not None else \
                (out if isinstance(out, str) else "")
            calls = (completion or {}).get("tool_calls") or []
            native_calls = bool(calls)
            if text.strip():
                parts.append(text.strip())
            for c in calls:
                fn = c.get("function", c)
                parts.append(_line("tool_call", call=_call_text(fn.get("name"),
                                                                fn.get("arguments"))))
        elif step.kind == "act" and isinstance(step.input, Mapping):
            out = step.output if isinstance(step.output, Mapping) else {}
            if out.get("form") == "code":
                parts.append(_line("code_output", output=str(out.get("observation", "")).strip()))
            elif "observation" in out:
                parts.append(_line("tool_response",
                                   output=str(out.get("observation", "")).strip()))
            elif not native_calls:  # the direct solver's calls: the reply held no call text
                parts.append(_line("tool_call", call=_call_text(step.input.get("tool"),
                                                                step.input.get("arguments"))))
    text = "\n".join(parts).strip()
    return text or None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
FORMS = ("all", "program")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def program_of(trace: Trace) -> str | None:
    """The program that answered ``trace`` and the output it printed, in the model's own
    format; None when the run's answer is not that output (it answered in prose, or a later
    step changed it) or any step failed."""
    last: tuple[str, str] | None = None
    for step in trace.steps:
        if step.error or step.kind == "observe":
            return None
        if step.kind != "act" or not isinstance(step.input, Mapping):
            continue
        out = step.output if isinstance(step.output, Mapping) else {}
        args = step.input.get("arguments")
        code = args.get("code") if isinstance(args, Mapping) else None
        if out.get("form") == "code" and isinstance(code, str) and code.strip() \
                and not out.get("timed_out"):
            last = (code.strip(), str(out.get("observation", "")).strip())
        else:
            last = None  # a later tool call: the program was not the last word
    if last is None or not last[1]:
        return None
    code, output = last
    answer = trace.answer if isinstance(trace.answer, str) else json.dumps(trace.answer)
    shown, given = _last_number(output), _last_number(answer or "")
    if shown is None or given is None or abs(shown - given) > 1e-6 * max(1.0, abs(given)):
        return None
    return "\n".join([_line("program", code=code), _line("code_output", output=output)])


def example_from_trace(trace: Trace, threshold: float = 1.0,
                       stats: ExampleStats | None = None, form: str = "all") -> Example | None:
    """The worked example ``trace`` gives in ``form`` (see the module docstring), or None
    (counted in ``stats``) when it gives none."""
    if form not in FORMS:
        raise ValueError(f"example form {form!r} is not one of {FORMS}")
    stats = stats if stats is not None else ExampleStats()
    if not verified(trace, threshold, stats):
        return None
    solution = solution_of(trace) if form == "all" else program_of(trace)
    if solution is None or not trace.task.strip():
        stats.unusable += 1
        return None
    if solution.count("\n") + 1 > MAX_EXAMPLE_LINES:
        stats.too_long += 1
        return None
    stats.taken += 1
    stats.ids.append(trace.id)
    return Example(trace.id, " ".join(trace.task.split()), solution)


def examples_from_traces(traces: Iterable[Trace], threshold: float = 1.0,
                         stats: ExampleStats | None = None, form: str = "all"
                         ) -> list[Example]:
    """Every verified example of ``traces``, one per task (the shortest solution wins: the
    cheaper demonstration of the same task), in the order their tasks first appear."""
    stats = stats if stats is not None else ExampleStats()
    by_task: dict[str, Example] = {}
    for t in traces:
        ex = example_from_trace(t, threshold, stats, form)
        if ex is None:
            continue
        kept = by_task.get(ex.task)
        if kept is None or len(ex.solution) < len(kept.solution):
            by_task[ex.task] = ex
    return list(by_task.values())


__all__ = ["FORMS", "ExampleStats", "example_from_trace", "examples_from_traces", "program_of",
           "rescore", "solution_of", "verified"]
