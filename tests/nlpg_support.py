"""Synthetic traces and a scripted analyst for the NLPG tests."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.types import Request, Step, Trace

RUBRIC = "co_react_rubric"


def think(text: str, route: str, *, after_tool: str | None = None,
          call: str | None = None) -> Step:
    """A think step: the model's reply (a tool call when ``call``), after a tool result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You solve tasks."},
                                      {"role": "user", "content": "the task"}]
    if after_tool is not None:
        messages += [{"role": "assistant", "content": "", "tool_calls": []},
                     {"role": "tool", "content": after_tool}]
    calls = [{"function": {"name": "calculator", "arguments": json.dumps({"expression": call})}}
             ] if call else []
    return Step(kind="think", module="think", input={"messages": messages},
                output={"completion": {"text": text, "tool_calls": calls},
                        "parsed": "action" if call else "answer"}, route=route)


def act(observation: str) -> Step:
    return Step(kind="act", module="act", input={"tool": "calculator", "arguments": {}},
                output={"observation": observation}, route="think")


def rubric(lines: str, ids: Sequence[str] = ()) -> Step:
    meta = {"policy_notes": list(ids)} if ids else {}
    return Step(kind="rubric", module=RUBRIC, input={"phase": "early"},
                output={"rubric": lines}, route="think", meta=meta)


def trace(trace_id: str, *, score: float = 0.0, answer: str = "5", label: str = "7",
          steps: Sequence[Step] | None = None,
          shown: Mapping[str, Sequence[str]] | None = None, task: str = "Add 3 and 4.",
          outcome: str = "answered") -> Trace:
    """A scored run: prepare, [rubric, think -> act] , rubric, think -> finish by default."""
    body = list(steps) if steps is not None else [
        rubric("1. [1.0] compute"), think("Let me compute.", "act", call="3+4"), act("7"),
        rubric("1. [1.0] answer"), think("Final Answer: 5", "finish", after_tool="7")]
    all_steps = (Step(kind="prepare", module="prepare", route="think"), *body,
                 Step(kind="finish", module="finish", route="end"))
    meta: dict[str, Any] = {"reason": "answered", "task_id": trace_id}
    if shown:
        meta["nlpg"] = {"shown": {m: list(ids) for m, ids in shown.items()}}
    return Trace(id=trace_id, task=task, steps=all_steps, answer=answer, label=label,
                 outcome=outcome, score=score, meta=meta)  # type: ignore[arg-type]


def prompt_parts(request: Request) -> dict[str, str]:
    """module, route, feedback and notes of a backward-pass prompt (its first user message:
    a retry appends the error after it)."""
    text = next(m.text for m in request.messages if m.role == "user")
    return {"module": re.search(r"Module: ([\w-]+)\.", text).group(1),  # type: ignore[union-attr]
            "route": re.search(r'route "([^"]+)"', text).group(1),  # type: ignore[union-attr]
            "feedback": text.split("Feedback on what this step led to:\n", 1)[1],
            "notes": text.split("Notes this module was shown:\n", 1)[1].split("\n\n")[0],
            "text": text}


def is_curator(request: Request) -> bool:
    return next(m.text for m in request.messages if m.role == "user").startswith(
        "You keep the policy notes")


Verdict = Callable[[dict[str, str]], Any]
Curate = Callable[[Request], Any]


def analyst(verdict: Verdict, curate: Curate | None = None) -> ScriptedBackend:
    """A scripted analyst: ``verdict(parts)`` answers backward-pass prompts (a dict becomes
    JSON, a string is sent as is); ``curate(request)`` answers curator prompts."""

    def respond(request: Request) -> str:
        if is_curator(request):
            reply = curate(request) if curate else {"ops": []}
        else:
            reply = verdict(prompt_parts(request))
        return reply if isinstance(reply, str) else json.dumps(reply)

    return ScriptedBackend(responder=respond)
