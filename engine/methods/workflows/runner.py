"""Running a workflow: its calls, in order, through the host's own tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from whetstone.engine.methods.workflows.records import Workflow, fill
from whetstone.engine.methods.workflows.values import select
from whetstone.tools.base import ToolResult

# A call of a host tool by name: (tool, arguments) -> result (a failure is a result).
CallFn = Callable[[str, Mapping[str, Any]], ToolResult]


@dataclass
class WorkflowRun:
    """What one run of a workflow did: the value it read (None when it read none), the error
    that stopped it, and each call with its result."""

    value: str | None = None
    error: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


def run_workflow(workflow: Workflow, values: Mapping[str, str], call: CallFn) -> WorkflowRun:
    """Run ``workflow`` with the task's slot ``values`` (every task slot must have one)."""
    out = WorkflowRun()
    known = dict(values)
    missing = [s.name for s in workflow.task_slots if not known.get(s.name)]
    if missing:
        out.error = "no value for " + ", ".join(missing)
        return out
    result = ""
    for i, step in enumerate(workflow.steps):
        args = {k: fill(v, known) for k, v in step.arguments.items()}
        res = call(step.tool, args)
        out.calls.append({"tool": step.tool, "arguments": args, "result": res.output,
                          **({"error": res.error} if res.error else {})})
        if res.error is not None:
            out.error = f"{step.tool}: {res.error}"
            return out
        result = res.output
        for slot in workflow.slots:
            if slot.from_step == i and slot.select is not None:
                got = select(result, slot.select)
                if not got:
                    out.error = f"step {i + 1} ({step.tool}) gave no value for {slot.name}"
                    return out
                known[slot.name] = got
    out.value = select(result, workflow.answer)
    if out.value is None:
        out.error = "the last call's result holds no answer where this workflow reads it"
    return out


__all__ = ["CallFn", "WorkflowRun", "run_workflow"]
