"""The solver ``whetstone eval`` uses: each task goes through the same agent runtime as
``whetstone run`` (same graph, tools, library retrieval), one trace per task."""

from __future__ import annotations

import json
from typing import Any

from ..runtime.agent import Agent
from ..types import Trace
from .direct import task_messages
from .runner import Solver
from .tasks import TaskRecord


def _label(expected: Any) -> str | None:
    if expected is None:
        return None
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


def agent_messages(task: TaskRecord) -> list[dict[str, Any]]:
    """The task as the conversation the agent starts from. The agent brings its own system
    message, so a task's evidence goes in front of the question in the user turn."""
    msgs = [m.to_dict() for m in task_messages(task)]
    if msgs and msgs[0]["role"] == "system":
        evidence = msgs.pop(0)["content"]
        first = next((m for m in msgs if m["role"] == "user"), None)
        if first is not None and isinstance(first["content"], str):
            first["content"] = f"{evidence}\n\nQuestion: {first['content']}"
        elif first is not None:
            first["content"] = [{"type": "text", "text": evidence}, *first["content"]]
    return msgs


def agent_solver(agent: Agent) -> Solver:
    """``(task, seed) -> Trace`` through ``agent``; task tools become answer tools (BFCL)."""

    def solve(task: TaskRecord, seed: int) -> Trace:
        return agent.run(task.prompt, label=_label(task.expected),
                         answer_tools=list(task.tools), messages=agent_messages(task),
                         seed=seed, meta={"task_id": task.id})

    return solve
