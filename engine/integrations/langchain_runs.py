"""One LangChain or LangGraph run, one trace.

An agent built on a ``WhetstoneChatModel`` (a ``StateGraph`` with a ``ToolNode``, LangChain's
agents) calls the model once per decision: the model's reply asks for tools, the graph runs
them and calls the model again with the conversation so far and the tools' results. Those
calls are one run, and an evolver needs the whole run: what was asked, each decision, each
tool's result, the final answer.

The conversation carries the link. Every reply of a ``WhetstoneChatModel`` holds its trace id
in ``response_metadata``; a call whose conversation ends with that reply's tool calls
answered (``ToolMessage``s, nothing else after it) continues the reply's run, so its trace
grows by an ``act`` step per tool result (tool, arguments, observation, as the agent loop
records them) and a ``think`` step for the new decision, under the same id. A new user turn
starts a new run (its own trace, ``meta.langchain.previous`` naming the one before in the
conversation). LangGraph's ``thread_id``, when the graph runs with one, and LangChain's run id
of each call are kept in ``meta.langchain``.

A run whose last reply asks for tools is ``running`` until the model is called with their
results; one that ends there (a ``return_direct`` tool's output is the graph's answer) stays
``running``, since the answer is not something the model said.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from ..types import Step, Trace

TRACE_KEY = "whetstone_trace_id"  # in an AIMessage's response_metadata
PENDING = "waiting for the results of its tool calls"


@dataclass(frozen=True)
class RunLink:
    """Where a call stands in its run: the trace it continues (None: a new run), the tool
    results it brings (as ``act`` steps), and the trace of the turn before, if any."""

    continues: str | None = None
    tool_steps: tuple[Step, ...] = ()
    previous: str | None = None


def _trace_id(message: BaseMessage) -> str | None:
    value = (message.response_metadata or {}).get(TRACE_KEY) \
        if isinstance(message, AIMessage) else None
    return value if isinstance(value, str) and value else None


def _arguments(call: Mapping[str, Any]) -> Any:
    args = call.get("args")
    return dict(args) if isinstance(args, Mapping) else args


def link_of(messages: Sequence[BaseMessage]) -> RunLink:
    """The run a call with ``messages`` belongs to (see the module docstring)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if _trace_id(messages[i])), None)
    if last is None:
        return RunLink()
    reply, after = messages[last], messages[last + 1:]
    trace_id = _trace_id(reply)
    calls = {str(c.get("id")): c for c in getattr(reply, "tool_calls", None) or ()}
    if not after or not calls or not all(isinstance(m, ToolMessage) for m in after):
        # A new turn (a user message after the reply), or nothing asked of the tools.
        return RunLink(previous=trace_id) if any(isinstance(m, HumanMessage)
                                                 for m in after) else RunLink()
    now = time.time()
    steps = []
    for m in after:
        assert isinstance(m, ToolMessage)
        call = calls.get(str(m.tool_call_id)) or {}
        text = m.text if isinstance(m.content, (str, list)) else json.dumps(m.content)
        failed = getattr(m, "status", "success") == "error"
        steps.append(Step(kind="act", module="act", started=now, route="think",
                          input={"tool": str(call.get("name") or m.name or ""),
                                 "arguments": _arguments(call), "call_id": m.tool_call_id},
                          output={"observation": str(text)},
                          error=str(text) if failed else None))
    return RunLink(continues=trace_id, tool_steps=tuple(steps))


def _asks_for_tools(call: Trace) -> bool:
    completion = call.steps[-1].output.get("completion") if call.steps and isinstance(
        call.steps[-1].output, Mapping) else None
    return bool(isinstance(completion, Mapping) and completion.get("tool_calls"))


def run_trace(call: Trace, prior: Trace | None, link: RunLink,
              langchain: Mapping[str, Any]) -> Trace:
    """The run's trace after one more call: ``call`` is that call's own chat trace (one
    ``think`` step), ``prior`` the run's trace so far (None: the run starts here). A reply
    that asks for tools leaves the run ``running``: the tools' results come next."""
    facts = dict(langchain)
    outcome = call.outcome
    answer = call.answer
    if outcome == "answered" and _asks_for_tools(call):
        outcome, answer = "running", None
        call = call.with_(steps=(*call.steps[:-1], replace(call.steps[-1], route="act")))
    if prior is None:
        meta = {**call.meta, "langchain": {**facts, "calls": 1, **(
            {"previous": link.previous} if link.previous else {})}}
        if outcome == "running":
            meta["reason"] = PENDING
        return call.with_(outcome=outcome, answer=answer, meta=meta)
    before = dict(prior.meta.get("langchain") or {})
    runs = [*before.get("run_ids", ()), *facts.get("run_ids", ())]
    meta = {**prior.meta, **{k: v for k, v in call.meta.items() if k != "reason"},
            "langchain": {**before, **facts, "run_ids": runs,
                          "calls": int(before.get("calls", 1)) + 1}}
    meta.pop("reason", None)
    if outcome != "answered":
        meta["reason"] = call.meta.get("reason") or PENDING
    return prior.with_(steps=(*prior.steps, *link.tool_steps, *call.steps), answer=answer,
                       outcome=outcome, ended=call.ended,
                       total_tokens=prior.total_tokens + call.total_tokens, meta=meta)
