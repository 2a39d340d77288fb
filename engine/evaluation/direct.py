"""``direct_solver``: one model call per task, in the model's own chat template, no agent loop.

The baseline every agent result is read against (``whetstone eval --solver direct``), and a real
solver for tests driven by the ``scripted:`` backend. The library still acts: each plugin's
``guidance`` (the skills the agent's ``SkillsPlugin`` would retrieve) goes in the system
message; with an empty library there is no system message, so the template's own default
applies. Task-given tools (BFCL) are offered natively and each call becomes an ``act`` step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...library_store.trace_build import make_trace
from ...tools.base import Toolbox
from ..backends.base import Backend
from ..prompts import render_prompt
from ..runtime.plugins import Plugin, collect_guidance
from ..runtime.state import AgentContext, RunConfig
from ..types import CUT_REASON, Message, Request, Step, Trace
from .runner import Solver
from .tasks import TaskRecord


def task_messages(task: TaskRecord, system: str | None = None,
                  turns: Sequence[Mapping[str, str]] = ()) -> list[Message]:
    """The chat messages for a task: optional system text, the evidence, demonstration
    ``turns`` (earlier exchanges), the question (with its image as an image part when there is
    one)."""
    out: list[Message] = []
    sys_parts = [p for p in (system, render_prompt("eval_evidence", evidence=task.evidence)
                             if task.evidence else None) if p]
    if sys_parts:
        out.append(Message("system", "\n\n".join(sys_parts)))
    out += [Message(t["role"], t["content"]) for t in turns]  # type: ignore[arg-type]
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
                  plugins: Sequence[Plugin] = (), guidance_budget_tokens: int = 1_200,
                  max_tokens: int = 512, temperature: float = 0.0) -> Solver:
    """A solver that asks ``backend`` once per task and records a one-step trace (plus an
    ``act`` step per native tool call, ``input={"tool": name, "arguments": {...}}``).

    ``system`` is fixed system text; ``plugins`` add their guidance for each task after it
    (``whetstone.engine.runtime.plugins.collect_guidance``), and what they showed goes in the trace's ``meta``.
    Their ``adjust_config`` may change the call's sampling (temperature, top-p, max tokens),
    as it does for an agent run.
    """
    ctx = AgentContext(backend=backend, toolbox=Toolbox())

    def solve(task: TaskRecord, seed: int) -> Trace:
        started = time.time()
        extra, meta, turns = collect_guidance(plugins, ctx, task.prompt, guidance_budget_tokens)
        sys_text = "\n\n".join(p for p in (system, extra) if p) or None
        config = RunConfig(max_tokens_per_call=max_tokens, temperature=temperature, seed=seed)
        for p in plugins:
            config = p.adjust_config(task.prompt, config)
        request = Request(messages=tuple(task_messages(task, sys_text, turns)),
                          max_tokens=config.max_tokens_per_call, temperature=config.temperature,
                          top_p=config.top_p, seed=seed, tools=task.tools)
        c = backend.complete(request)
        steps = [Step(kind="think", module="think",
                      input={"messages": [m.to_dict() for m in request.messages]},
                      output=c.text, tokens=c.total_tokens, started=started,
                      duration_s=c.latency_s, route="act" if c.tool_calls else "finish",
                      meta={"prompt_tokens": c.prompt_tokens,
                            "completion_tokens": c.completion_tokens})]
        steps += [Step(kind="act", module="act",
                       input={"tool": tc.name, "arguments": _arguments(tc.arguments)},
                       started=time.time()) for tc in c.tool_calls]
        version = meta.pop("library_version", None) or library_version
        cut = c.finish_reason == "length"
        if cut:
            meta["reason"] = CUT_REASON
        return make_trace("direct", task=task.prompt, steps=steps, answer=c.text,
                          outcome="length" if cut else "answered", library_version=version,
                          model=model or backend.shown_spec, started=started, ended=time.time(),
                          total_tokens=c.total_tokens, meta={"solver": "direct", **meta})

    return solve
