"""Exploration: the analyst looks for the calls that answer a training question no run did.

A short dialogue per question. The analyst sees the host's tools, what calls made so far showed
of the environment, calls that answered other questions, and the question with its expected
answer (a training label: it says what to look for, as Dynamo's tool maker is shown how close
its tools came to the labels). It writes one call at a time; each runs through the host's own
tools and its result goes back, until a result holds the expected answer or the turns run out.
The calls that got there become a workflow only if, with the question's values changed, they
answer other training questions of the same kind (``evolver.py`` checks): a call that holds
its answer, or that only fits its own question, is never kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from whetstone.engine.backends.base import Backend
from whetstone.engine.errors import BackendError
from whetstone.engine.methods.workflows import PROMPTS
from whetstone.engine.methods.workflows.induce import CallRecord
from whetstone.engine.methods.workflows.values import supports
from whetstone.engine.runtime.call_forms import json_calls, tool_call_blocks
from whetstone.engine.types import Request
from whetstone.tools.base import Tool, ToolResult

RESULT_CHARS = 1500


@dataclass
class Exploration:
    """One question explored: the calls up to the one that showed the answer (``found``), or
    every call tried; the analyst calls it took and the replies that were not calls."""

    question: str
    found: bool = False
    calls: list[CallRecord] = field(default_factory=list)
    analyst_calls: int = 0
    bad_replies: int = 0
    transcript: list[dict[str, str]] = field(default_factory=list)


def tools_text(tools: Sequence[Tool]) -> str:
    """The host's tools as the analyst reads them: name, parameters, description."""
    lines = []
    for t in tools:
        props = t.spec.parameters.get("properties") or {}
        params = ", ".join(f"{k}: {v.get('type', 'any')}" if isinstance(v, Mapping) else k
                           for k, v in props.items())
        desc = " ".join(t.spec.description.split())[:300]
        lines.append(f"- {t.name}({params}): {desc}")
    return "\n".join(lines)


def examples_text(examples: Sequence[tuple[str, CallRecord]]) -> str:
    if not examples:
        return ""
    out = [PROMPTS.render("explore.yaml#examples_head")]
    for question, call in examples:
        text = json.dumps({"name": call.tool, "arguments": call.arguments}, ensure_ascii=False)
        out.append(PROMPTS.render("explore.yaml#example", question=question, call=text))
    return "\n".join(out) + "\n"


def parse_call(text: str, names: Collection[str]) -> tuple[str, dict[str, Any]] | str:
    """The first call of a host tool in ``text``, or why there is none."""
    found = tool_call_blocks(text)
    if isinstance(found, str) or not found:
        found = json_calls(text, names)
    if isinstance(found, str):
        return found
    for f in found:
        if f.call.name in names:
            try:
                args = json.loads(f.call.arguments) if f.call.arguments.strip() else {}
            except ValueError:
                return f"the arguments of {f.call.name} are not a JSON object"
            if isinstance(args, dict):
                return f.call.name, args
            return f"the arguments of {f.call.name} are not a JSON object"
    if found:
        return f"{found[0].call.name!r} is not one of the tools"
    return "no call found"


async def explore(analyst: Backend, system: str, question: str, answer: Any,
                  call: Callable[[str, Mapping[str, Any]], ToolResult],
                  names: Collection[str], *, turns: int = 4, seed: int = 0,
                  temperature: float = 0.3, max_tokens: int = 300,
                  run_tool: Callable[..., Any] | None = None) -> Exploration:
    """Look for the calls that answer ``question`` (see the module docstring). ``call``
    runs a host tool; ``run_tool`` (an awaitable runner such as ``asyncio.to_thread``) keeps
    the event loop free while it does."""
    out = Exploration(question)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": PROMPTS.render("explore.yaml#task", question=question,
                                                   answer=str(answer))}]
    for turn in range(turns):
        request = Request(messages=tuple(messages), max_tokens=max_tokens,  # type: ignore[arg-type]
                          temperature=temperature, seed=seed + turn)
        out.analyst_calls += 1
        try:
            reply = (await analyst.acomplete(request)).text
        except BackendError:
            break
        messages.append({"role": "assistant", "content": reply})
        parsed = parse_call(reply, names)
        if isinstance(parsed, str):
            out.bad_replies += 1
            messages.append({"role": "user",
                             "content": PROMPTS.render("explore.yaml#bad_call", why=parsed)})
            continue
        tool, args = parsed
        result: ToolResult = await run_tool(call, tool, args) if run_tool is not None \
            else call(tool, args)
        if result.error is not None:
            messages.append({"role": "user", "content": PROMPTS.render(
                "explore.yaml#error", tool=tool, error=result.error[:RESULT_CHARS])})
            continue
        out.calls.append(CallRecord(tool, args, result.output))
        if supports(result.output, answer):
            out.found = True
            break
        text = result.output if len(result.output) <= RESULT_CHARS else \
            result.output[:RESULT_CHARS] + " …"
        messages.append({"role": "user", "content": PROMPTS.render(
            "explore.yaml#result", tool=tool, result=text, answer=str(answer))})
    out.transcript = messages
    return out


__all__ = ["Exploration", "examples_text", "explore", "parse_call", "tools_text"]
