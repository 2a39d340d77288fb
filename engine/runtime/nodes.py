"""The graph's modules: ``prepare``, ``think``, ``act``, ``finish``.

Each node is a plain function of (state, context) returning a state update, so it can be tested
without LangGraph. Every node appends ``Step`` records; ``route`` on a step is the edge taken
next, which NLPG uses to key its notes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from engine.errors import BackendError
from engine.prompts import load_prompt, render_prompt
from engine.runtime.parse import ParsedCall, parse_reply
from engine.runtime.state import AgentContext, AgentState
from engine.types import Completion, Request, Step, Trace


def _step(kind: str, module: str, **kw: Any) -> dict[str, Any]:
    return Step(kind=kind, module=module, **kw).to_dict()  # type: ignore[arg-type]


def _tools_text(ctx: AgentContext, state: AgentState) -> str:
    lines = []
    for spec in ctx.toolbox.specs():
        lines.append(f"- {spec.name}: {spec.description}")
    for schema in state.get("answer_tools") or []:
        fn = schema.get("function", schema)
        params = json.dumps(fn.get("parameters", {}))
        lines.append(f"- {fn['name']}: {fn.get('description', '')} Input: JSON matching {params}")
    return "\n".join(lines) or "(none)"


def build_system_prompt(state: AgentState, ctx: AgentContext) -> tuple[str, dict[str, Any]]:
    """The system message: instructions, then guidance from plugins within the token budget."""
    parts = [ctx.config.system_prompt or load_prompt("agent_system")]
    if not ctx.native:
        parts.append(render_prompt("agent_react_format", tools=_tools_text(ctx, state)))
    meta: dict[str, Any] = {}
    budget = ctx.config.guidance_budget_tokens
    for plugin in ctx.plugins:
        g = plugin.guidance(state["task"], ctx, max(0, budget))
        if g is None:
            continue
        meta[plugin.name] = dict(g.meta)
        if g.library_version is not None:
            meta["library_version"] = g.library_version
        text = g.text.strip()
        if not text:
            continue
        parts.append(text if text.startswith("#") else f"# {g.title}\n{text}")
        budget -= ctx.backend.count_tokens(text)
    return "\n\n".join(p.strip("\n") for p in parts), meta


def prepare(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Build the system message (retrieving guidance) once per run."""
    start = time.time()
    system, meta = build_system_prompt(state, ctx)
    return {
        "system": system,
        "meta": {**(state.get("meta") or {}), **meta},
        "steps": [_step("prepare", "prepare", input={"task": state["task"]},
                        output={"system": system, "guidance": meta}, started=start,
                        duration_s=time.time() - start, route="think")],
    }


def _over_budget(state: AgentState, ctx: AgentContext) -> tuple[str, str] | None:
    cfg = ctx.config
    if state.get("n_calls", 0) >= cfg.max_steps:
        return "horizon", f"reached the step horizon ({cfg.max_steps} model calls) without an answer"
    if state.get("tokens", 0) >= cfg.max_total_tokens:
        return "budget", f"used the token budget ({state.get('tokens', 0)} >= {cfg.max_total_tokens})"
    if time.time() - ctx.clock_start >= cfg.timeout_s:
        return "timeout", f"ran past the wall-clock limit of {cfg.timeout_s:g} s"
    return None


def _request(state: AgentState, ctx: AgentContext) -> Request:
    cfg = ctx.config
    messages = [{"role": "system", "content": state["system"]}, *state.get("messages", [])]
    tools: list[Mapping[str, Any]] = []
    if ctx.native and not state.get("force_answer"):
        tools = [*ctx.toolbox.schemas(), *(state.get("answer_tools") or [])]
    remaining_time = cfg.timeout_s - (time.time() - ctx.clock_start)
    seed = None if cfg.seed is None else cfg.seed + state.get("n_calls", 0)
    return Request(
        messages=messages,  # type: ignore[arg-type]
        max_tokens=cfg.max_tokens_per_call,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        stop=() if ctx.native else ("\nObservation:",),
        seed=seed,
        tools=tuple(tools),
        timeout=max(1.0, remaining_time),
    )


MAX_CALLS_PER_STEP = 4


def _call_key(name: str, arguments: str) -> str:
    try:
        return name + json.dumps(json.loads(arguments), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return name + " ".join(arguments.split())


def _unique_calls(calls: tuple[ParsedCall, ...]) -> tuple[list[ParsedCall], int]:
    """Small models sometimes repeat one call dozens of times in a reply: run each once."""
    seen: set[str] = set()
    out: list[ParsedCall] = []
    for c in calls:
        key = _call_key(c.name, c.arguments)
        if key not in seen and len(out) < MAX_CALLS_PER_STEP:
            seen.add(key)
            out.append(c)
    return out, len(calls) - len(out)


def _assistant_message(completion: Completion, calls: list[ParsedCall], native: bool
                       ) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": completion.text}
    if native and calls:
        # Only the calls we run go into the history, so every call has exactly one result.
        msg["tool_calls"] = [
            {"id": c.id or f"call_{i}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)
        ]
    return msg


def think(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """One model decision: call the backend, then parse an action, an answer or an error."""
    stop = _over_budget(state, ctx)
    if stop:
        return {"outcome": stop[0], "reason": stop[1], "pending": []}
    request = _request(state, ctx)
    start = time.time()
    try:
        completion = ctx.call_model(request)
    except BackendError as exc:
        return {
            "outcome": "error", "reason": f"model call failed: {exc.message}", "pending": [],
            "steps": [_step("think", "think", input={"messages": [m.to_dict() for m in
                                                                   request.messages]},
                            error=str(exc), started=start, duration_s=time.time() - start,
                            route="finish")],
        }
    parsed = parse_reply(completion, native=ctx.native,
                         tool_names=_all_tool_names(state, ctx))
    update: dict[str, Any] = {
        "force_answer": False,
        "n_calls": state.get("n_calls", 0) + 1,
        "tokens": state.get("tokens", 0) + completion.total_tokens,
        "pending": [],
    }
    messages = list(state.get("messages", []))
    calls, dropped = _unique_calls(parsed.calls) if parsed.kind == "action" else ([], 0)
    calls = [c if c.id else ParsedCall(c.name, c.arguments, f"call_{state.get('n_calls', 0)}_{i}",
                                       c.native) for i, c in enumerate(calls)]
    messages.append(_assistant_message(completion, calls, ctx.native))
    route = "finish"
    error = None
    if parsed.kind == "action":
        update["pending"] = [{"id": c.id, "name": c.name, "arguments": c.arguments,
                              "native": c.native} for c in calls]
        route = "act"
    elif parsed.kind == "answer":
        update["answer"] = parsed.answer
    else:
        error = parsed.error
        route = "think"
        expected = (load_prompt("agent_expected_native") if ctx.native else render_prompt(
            "agent_expected_react", tools=", ".join(_all_tool_names(state, ctx)))).strip()
        messages.append({"role": "user",
                         "content": render_prompt("agent_parse_error", error=parsed.error,
                                                  expected=expected).strip()})
    update["messages"] = messages
    steps = [_step(
        "think", "think",
        input={"messages": [m.to_dict() for m in request.messages],
               "tools": [t["function"]["name"] for t in request.tools]},
        output={"completion": completion.to_dict(), "parsed": parsed.kind,
                "thought": parsed.thought},
        tokens=completion.total_tokens, started=start, duration_s=time.time() - start,
        error=None, route=route,
        meta={"latency_s": completion.latency_s, "prompt_tokens": completion.prompt_tokens,
              "completion_tokens": completion.completion_tokens,
              **({"duplicate_calls_dropped": dropped} if dropped else {})},
    )]
    if error is not None:
        steps.append(_step("observe", "think", input={"raw": completion.text},
                           output={"observation": messages[-1]["content"]},
                           error=f"unparseable reply: {error}", route="think"))
    update["steps"] = steps
    return update


def _all_tool_names(state: AgentState, ctx: AgentContext) -> list[str]:
    names = ctx.toolbox.names()
    names += [s.get("function", s)["name"] for s in state.get("answer_tools") or []]
    return names


def _answer_tool_names(state: AgentState) -> set[str]:
    return {s.get("function", s)["name"] for s in state.get("answer_tools") or []}


def act(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Run the pending tool calls; each result becomes an observation for the model."""
    messages = list(state.get("messages", []))
    steps: list[dict[str, Any]] = []
    answer_tools = _answer_tool_names(state)
    answer_calls: list[dict[str, Any]] = []
    observations: list[str] = []
    repeated = False
    earlier = _earlier_results(state)
    for call in state.get("pending") or []:
        name, raw = call["name"], call["arguments"]
        start = time.time()
        args: Any = raw
        bad_json = None
        if raw.strip().startswith("{") or call.get("native") or name in answer_tools:
            try:
                args = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                if call.get("native") or name in answer_tools:
                    bad_json = f"the arguments are not valid JSON ({exc.msg}): {raw}"
        if name in answer_tools and bad_json is None:
            answer_calls.append({"name": name, "arguments": args})
            steps.append(_step("act", "act", input={"tool": name, "arguments": args},
                               output={"observation": None, "answer_call": True},
                               started=start, route="finish"))
            continue
        key = _call_key(name, raw)
        tool_meta: dict[str, Any] = {}
        if bad_json is not None:
            obs, err, timed_out, dur = f"Error in {name}: {bad_json}", bad_json, False, 0.0
        elif key in earlier:
            repeated = True
            obs = render_prompt("agent_repeated_call", observation=earlier[key]).strip()
            err, timed_out, dur = None, False, 0.0
        else:
            result = ctx.toolbox.call(name, args)
            obs, err, timed_out, dur = (result.observation(name), result.error,
                                        result.timed_out, result.duration_s)
            tool_meta = dict(result.metadata)  # how it ran: sandbox mode, warnings, images
        observations.append(obs)
        if ctx.native:
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": name,
                             "content": obs})
        steps.append(_step("act", "act", input={"tool": name, "arguments": args},
                           output={"observation": obs, "timed_out": timed_out},
                           error=err, started=start, duration_s=dur, route="think",
                           meta={"tool": tool_meta} if tool_meta else {}))
    if not ctx.native and observations:
        messages.append({"role": "user", "content": "\n".join(
            render_prompt("agent_observation", observation=o).rstrip("\n")
            for o in observations)})
    elif observations and ctx.config.after_tool_nudge:
        messages.append({"role": "user", "content": load_prompt("agent_after_tool").strip()})
    update: dict[str, Any] = {"messages": messages, "steps": steps, "pending": [],
                              "force_answer": repeated}
    if answer_calls:
        update["answer"] = json.dumps(answer_calls[0] if len(answer_calls) == 1 else answer_calls)
    return update


def _earlier_results(state: AgentState) -> dict[str, str]:
    """Observations of calls already made in this run, by call."""
    out: dict[str, str] = {}
    for s in state.get("steps") or []:
        if s["kind"] == "act" and s.get("output") and s["output"].get("observation") is not None \
                and not s.get("error"):
            args = s["input"].get("arguments")
            raw = args if isinstance(args, str) else json.dumps(args)
            out.setdefault(_call_key(s["input"]["tool"], raw), s["output"]["observation"])
    return out


def finish(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Settle the outcome, collect plugin facts, build the trace and store it."""
    outcome = state.get("outcome") or ("answered" if state.get("answer") is not None else "error")
    reason = state.get("reason") or ("answered" if outcome == "answered" else "no answer")
    meta = dict(state.get("meta") or {})
    meta["reason"] = reason
    for plugin in ctx.plugins:
        extra = plugin.finish_meta(state)
        if extra:
            meta[plugin.name] = {**meta.get(plugin.name, {}), **dict(extra)}
    finish_step = _step("finish", "finish", output={"outcome": outcome, "reason": reason},
                        route="end")
    with_finish = {**state, "steps": [*(state.get("steps") or []), finish_step]}
    trace = build_trace(with_finish, ctx, outcome=outcome, meta=meta, ended=time.time())
    if ctx.trace_store is not None:
        ctx.trace_store.append(trace)
    return {"outcome": outcome, "reason": reason, "trace": trace.to_dict(),
            "steps": [finish_step]}


def build_trace(state: Mapping[str, Any], ctx: AgentContext, *, outcome: str,
                meta: Mapping[str, Any] | None = None, ended: float | None = None) -> Trace:
    """A ``Trace`` from the graph state (also used for interrupted and running runs)."""
    return Trace(
        id=state["trace_id"],
        task=state["task"],
        steps=tuple(Step.from_dict(s) for s in state.get("steps") or []),
        answer=state.get("answer"),
        label=state.get("label"),
        outcome=outcome,  # type: ignore[arg-type]
        library_version=ctx.library_version or (state.get("meta") or {}).get("library_version"),
        model=ctx.backend.spec,
        started=state["started"],
        ended=ended,
        total_tokens=state.get("tokens", 0),
        meta=dict(meta if meta is not None else state.get("meta") or {}),
    )


def route_after_think(state: AgentState) -> str:
    if state.get("outcome"):
        return "finish"
    if state.get("pending"):
        return "act"
    if state.get("answer") is not None:
        return "answered"
    return "retry"


def route_after_act(state: AgentState) -> str:
    return "answered" if state.get("answer") is not None else "continue"


__all__ = [
    "act",
    "build_system_prompt",
    "build_trace",
    "finish",
    "prepare",
    "route_after_act",
    "route_after_think",
    "think",
]
