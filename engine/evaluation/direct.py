"""``direct_solver``: one model call per task, no agent loop and no library.

The baseline a library is measured against, and a real solver for tests driven by the
``scripted:`` backend. The agent's own solver (the runtime) is built by the CLI and API.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from engine.backends.base import Backend
from engine.evaluation.runner import Solver
from engine.evaluation.tasks import TaskRecord
from engine.prompts import render_prompt
from engine.types import Message, Request, Step, Trace


def task_messages(task: TaskRecord, system: str | None = None) -> list[Message]:
    """The chat messages for a task: optional system text, the evidence, the question (with its
    image as an image part when there is one)."""
    out: list[Message] = []
    sys_parts = [p for p in (system, render_prompt("eval_evidence", evidence=task.evidence)
                             if task.evidence else None) if p]
    if sys_parts:
        out.append(Message("system", "\n\n".join(sys_parts)))
    if task.messages:
        out += list(task.messages)
    elif task.image:
        out.append(Message("user", ({"type": "image", "image": task.image},
                                    {"type": "text", "text": task.question})))
    else:
        out.append(Message("user", task.question))
    return out


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return raw  # kept verbatim: the scorer sees exactly what the model wrote


def direct_solver(backend: Backend, *, model: str | None = None,
                  library_version: str | None = None, system: str | None = None,
                  max_tokens: int = 512, temperature: float = 0.0) -> Solver:
    """A solver that asks ``backend`` once per task and records a one-step trace (plus an
    ``act`` step per native tool call, ``input={"tool": name, "arguments": {...}}``)."""

    def solve(task: TaskRecord, seed: int) -> Trace:
        started = time.time()
        request = Request(messages=tuple(task_messages(task, system)), max_tokens=max_tokens,
                          temperature=temperature, seed=seed, tools=task.tools)
        c = backend.complete(request)
        steps = [Step(kind="think", module="think", input=None, output=c.text,
                      tokens=c.total_tokens, started=started, duration_s=c.latency_s,
                      route="act" if c.tool_calls else "finish")]
        steps += [Step(kind="act", module="act",
                       input={"tool": tc.name, "arguments": _arguments(tc.arguments)},
                       started=time.time()) for tc in c.tool_calls]
        return Trace(id=uuid.uuid4().hex, task=task.prompt, steps=tuple(steps), answer=c.text,
                     outcome="answered", library_version=library_version,
                     model=model or backend.spec, started=started, ended=time.time(),
                     total_tokens=c.total_tokens, meta={"solver": "direct"})

    return solve
