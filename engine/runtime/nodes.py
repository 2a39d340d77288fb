"""The graph's modules: ``prepare``, ``think``, ``act``, ``finish``.

Each node is a plain function of (state, context) returning a state update, so it can be tested
without LangGraph. Every node appends ``Step`` records; ``route`` on a step is the edge taken
next, by which policy notes are keyed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from whetstone.engine.errors import BackendError, error_text
from whetstone.engine.prompts import load_prompt, render_prompt
from whetstone.engine.replies import parse_call_arguments
from whetstone.engine.runtime.parse import (
    Parsed,
    ParsedCall,
    ReplyRules,
    output_is_answer,
    parse_reply,
)
from whetstone.engine.runtime.prompting import (
    answer_tool_names,
    build_request,
    build_system_prompt,
    code_tool,
    offered_tools,
    required_tools,
    results_message,
    tool_format,
    with_images,
)
from whetstone.engine.runtime.state import AgentContext, AgentState
from whetstone.engine.types import CUT_REASON, Completion, Request, Step, Trace
from whetstone.library_store.trace_build import make_trace
from whetstone.tools.learned import answer_text


def _step(kind: str, module: str, **kw: Any) -> dict[str, Any]:
    return Step(kind=kind, module=module, **kw).to_dict()


def prepare(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Build the system message (retrieving guidance) once per run."""
    start = time.time()
    system, guidance, meta, tools, turns = build_system_prompt(state, ctx)
    required = required_tools(ctx, meta, tools)
    if ctx.tool_clashes:  # the trace says which learned tools the user's own displaced
        meta = {**meta, "tool_clashes": list(ctx.tool_clashes.values())}
    return {
        "system": system,
        "guidance": guidance,
        "demo_turns": turns,
        "tools": tools,
        "require_tools": required,
        "meta": {**(state.get("meta") or {}), **meta},
        "steps": [_step("prepare", "prepare", input={"task": state["task"]},
                        output={"system": system, "guidance": meta, "tools": tools,
                                **({"require_tools": required} if required else {})},
                        started=start, duration_s=time.time() - start, route="think")],
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


def _assistant_message(completion: Completion, calls: list[ParsedCall],
                       used_end: int | None = None) -> dict[str, Any]:
    """The reply as history. Calls that came through the backend's native channel go in
    ``tool_calls`` (only those we run, so every call has exactly one result); calls written
    in the text stay in the text, as the model wrote them, up to the last one run (a guessed
    result after it would contradict the real one)."""
    text = completion.text if used_end is None else completion.text[:used_end].rstrip()
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    native = [c for c in calls if c.native]
    if native:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in native]
    return msg


def _rules(state: AgentState, ctx: AgentContext) -> ReplyRules:
    if state.get("fresh_start"):  # no tools were shown: a code block is the answer's text
        return ReplyRules(tool_names=answer_tool_names(state), code_tool=None)
    return ReplyRules(tool_names=[*offered_tools(state, ctx), *answer_tool_names(state)],
                      code_tool=code_tool(state, ctx),
                      plain_is_answer=tool_format(ctx) != "react")


def think(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """One model decision: call the backend, then parse an action, an answer or an error."""
    stop = _over_budget(state, ctx)
    if stop:
        return {"outcome": stop[0], "reason": stop[1], "pending": []}
    request = build_request(state, ctx)
    start = time.time()
    try:
        completion = ctx.call_model(request)
    except BackendError as exc:
        return {
            "outcome": "error", "reason": f"model call failed: {exc.message}", "pending": [],
            "error": error_text(exc),
            "steps": [_step("think", "think", input={"messages": [m.to_dict() for m in
                                                                   request.messages]},
                            error=str(exc), started=start, duration_s=time.time() - start,
                            route="finish")],
        }
    rules = _rules(state, ctx)
    parsed = parse_reply(completion, rules)
    forced = bool(state.get("force_answer"))
    why: str | None = None  # what the trace says went wrong with the reply
    if forced and parsed.kind == "action" \
            and not {c.name for c in parsed.calls} & set(answer_tool_names(state)):
        # Tools are off after a repeated call (in the tags and ReAct formats the model can
        # still write one): not run, not the answer, asked again. The trace records what
        # happened; the reminder is the runtime's words to the model, not the reply's.
        parsed = replace(parsed, kind="invalid", calls=(),
                         error=load_prompt("agent_tools_off").strip())
        why = ("tool call not run: tools were off for this reply (the same call had been "
               "made before); the model was asked for the answer")
    update: dict[str, Any] = {
        "force_answer": forced and parsed.kind == "invalid",
        "fresh_start": False,
        "step_guidance": {},  # used by this call; the next decision gets fresh guidance
        "n_calls": state.get("n_calls", 0) + 1,
        "tokens": state.get("tokens", 0) + completion.total_tokens,
        "pending": [],
    }
    messages = list(state.get("messages", []))
    calls, dropped = _unique_calls(parsed.calls) if parsed.kind == "action" else ([], 0)
    calls = [c if c.id else replace(c, id=f"call_{state.get('n_calls', 0)}_{i}")
             for i, c in enumerate(calls)]
    messages.append(_assistant_message(completion, calls, parsed.used_end))
    route = "finish"
    if parsed.kind == "action":
        update["pending"] = [{"id": c.id, "name": c.name, "arguments": c.arguments,
                              "native": c.native, "form": c.form,
                              "final_program": parsed.ends_with_program and c is calls[-1]}
                             for c in calls]
        route = "act"
    elif parsed.kind == "answer":
        update["answer"] = parsed.answer
        if completion.finish_reason == "length":  # kept, but not a whole answer
            update["outcome"], update["reason"] = "length", CUT_REASON
    else:
        route = "think"
        retry = parsed.error if forced else _retry_text(parsed, rules, ctx)
        messages.append({"role": "user", "content": retry})
    update["messages"] = messages
    update["steps"] = _think_steps(request, completion, parsed, route, start, dropped,
                                   messages[-1]["content"] if route == "think" else None,
                                   why=why)
    return update


def _retry_text(parsed: Parsed, rules: ReplyRules, ctx: AgentContext) -> str:
    """What the model is told when its reply could not be used."""
    if tool_format(ctx) == "react":
        expected = render_prompt("agent_expected_react", tools=", ".join(rules.tool_names))
    else:
        expected = load_prompt("agent_expected_native")
    return render_prompt("agent_parse_error", error=parsed.error,
                         expected=expected.strip()).strip()


def _think_steps(request: Request, completion: Completion, parsed: Parsed, route: str,
                 start: float, dropped: int, retry: str | None, *, why: str | None = None
                 ) -> list[dict[str, Any]]:
    """The think step (and an observe step when the reply could not be used: its ``error``
    says why, ``why`` when given, else the parser's reason; its observation is what the
    model is told)."""
    steps = [_step(
        "think", "think",
        input={"messages": [m.to_dict() for m in request.messages],
               "tools": [t["function"]["name"] for t in request.tools]},
        output={"completion": completion.to_dict(), "parsed": parsed.kind,
                "thought": parsed.thought,
                **({"call_forms": [c.form for c in parsed.calls]} if parsed.calls else {})},
        tokens=completion.total_tokens, started=start, duration_s=time.time() - start,
        error=None, route=route,
        meta={"latency_s": completion.latency_s, "prompt_tokens": completion.prompt_tokens,
              "completion_tokens": completion.completion_tokens,
              **({"duplicate_calls_dropped": dropped} if dropped else {})},
    )]
    if retry is not None:
        steps.append(_step("observe", "think", input={"raw": completion.text},
                           output={"observation": retry},
                           error=why or f"unparseable reply: {parsed.error}", route="think"))
    return steps


def _arguments(call: Mapping[str, Any], answer_tools: set[str]) -> tuple[Any, str | None]:
    """The call's arguments (parsed when they are JSON) and why they are unusable, if so."""
    name, raw = call["name"], call["arguments"]
    must_be_json = bool(call.get("native")) or name in answer_tools
    if not (raw.strip().startswith("{") or must_be_json):
        return raw, None
    try:
        return (parse_call_arguments(raw) if raw.strip() else {}), None
    except json.JSONDecodeError as exc:
        if must_be_json:
            return raw, f"the arguments are not valid JSON ({exc.msg}): {raw}"
        return raw, None


def _run_one(call: Mapping[str, Any], args: Any, offered: set[str],
             earlier: Mapping[str, tuple[str, bool]], ctx: AgentContext, task: str
             ) -> tuple[str, str | None, bool, float, str, dict[str, Any]]:
    """Run one call: (observation, error, timed out, seconds, outcome, how it ran) where
    outcome is ``ran`` (output), ``empty``, ``failed`` or ``repeated`` and how it ran is the
    tool's metadata (sandbox mode, warnings, images)."""
    name = call["name"]
    if name not in offered:
        err = f"unknown tool {name!r}; available tools: {', '.join(sorted(offered)) or '(none)'}"
        return f"Error in {name}: {err}", err, False, 0.0, "failed", {}
    key = _call_key(name, call["arguments"])
    if key in earlier:
        seen, failed = earlier[key]
        obs = render_prompt("agent_repeated_call", observation=seen).strip()
        # A failing call repeated counts as failing again (it is not run again).
        if failed:
            return obs, "repeated a call that failed", False, 0.0, "failed", {}
        return obs, None, False, 0.0, "repeated", {}
    result = ctx.toolbox.call(name, args, task=task)
    outcome = "failed" if not result.ok else "ran" if result.output.strip() else "empty"
    return (result.observation(name), result.error, result.timed_out, result.duration_s,
            outcome, dict(result.metadata))


def _returns_answer(ctx: AgentContext, name: str) -> bool:
    tool = ctx.toolbox.tools.get(name)
    return tool is not None and tool.spec.returns_answer


def act(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Run the pending tool calls; each result becomes an observation for the model.

    A call of a task-given answer tool is the answer. A python block that ended the reply and
    printed a value is the answer too (``RunConfig.answer_with_program_output``); one that
    printed a call, or no value, is not (``parse.output_is_answer``)."""
    messages = list(state.get("messages", []))
    steps: list[dict[str, Any]] = []
    answer_tools = set(answer_tool_names(state))
    offered = set(offered_tools(state, ctx)) | answer_tools
    answer_calls: list[dict[str, Any]] = []
    text_results: list[tuple[str, str]] = []
    program_answer: str | None = None
    repeated = False
    outcomes: list[str] = []
    images: list[str] = []  # image files the tools returned for the model to look at
    earlier = _earlier_results(state)
    for call in state.get("pending") or []:
        name = call["name"]
        start = time.time()
        args, bad_json = _arguments(call, answer_tools)
        if name in answer_tools and bad_json is None:
            answer_calls.append({"name": name, "arguments": args})
            steps.append(_step("act", "act", input={"tool": name, "arguments": args},
                               output={"observation": None, "answer_call": True},
                               started=start, route="finish"))
            continue
        tool_meta: dict[str, Any] = {}
        if bad_json is not None:
            obs, err, timed_out, dur, outcome = (f"Error in {name}: {bad_json}", bad_json,
                                                 False, 0.0, "failed")
        else:
            obs, err, timed_out, dur, outcome, tool_meta = _run_one(
                call, args, offered, earlier, ctx, str(state.get("task") or ""))
        repeated = repeated or outcome == "repeated"
        outcomes.append(outcome)
        images += [str(p) for p in tool_meta.get("image_inputs") or ()]
        if call.get("final_program") and outcome == "ran" \
                and ctx.config.answer_with_program_output and output_is_answer(obs, offered):
            program_answer = obs.strip()
        if outcome == "ran" and _returns_answer(ctx, name):
            program_answer = answer_text(obs)  # an answer tool: its output is the answer
        if call.get("native"):
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": name,
                             "content": obs})
        else:
            text_results.append((call.get("form") or "", obs))
        steps.append(_step("act", "act", input={"tool": name, "arguments": args},
                           output={"observation": obs, "timed_out": timed_out,
                                   **({"form": call["form"]} if call.get("form") else {})},
                           error=err, started=start, duration_s=dur,
                           route="finish" if program_answer is not None else "think",
                           meta={"tool": tool_meta} if tool_meta else {}))
    # Rounds in a row where every call failed (0, 1 or 2): at 2 the tools are off.
    failed_rounds = 0
    if outcomes and set(outcomes) == {"failed"}:
        failed_rounds = 2 if _previous_round_failed(state) else 1
    update = _after_act(state, ctx, messages, steps, text_results, answer_calls,
                        program_answer, repeated or failed_rounds == 2, failed_rounds)
    if images and ctx.backend.capabilities.vision and "answer" not in update:
        update["messages"] = with_images(update["messages"], images)
    return update


def _previous_round_failed(state: AgentState) -> bool:
    """Whether every call of the round before this one failed (this round's think is the
    last step so far)."""
    errors: list[bool] = []
    for s in reversed((state.get("steps") or [])[:-1]):
        if s["kind"] == "think":
            break
        if s["kind"] == "act":
            errors.append(bool(s.get("error")))
    return bool(errors) and all(errors)


def _after_act(state: AgentState, ctx: AgentContext, messages: list[dict[str, Any]],
               steps: list[dict[str, Any]], text_results: list[tuple[str, str]],
               answer_calls: list[dict[str, Any]], program_answer: str | None,
               repeated: bool, failed_rounds: int = 0) -> dict[str, Any]:
    """The state update after the calls ran: results into the conversation, or the answer."""
    nudge = (ctx.config.after_tool_nudge and program_answer is None
             and tool_format(ctx) != "react")  # ReAct has its own "Final Answer:" protocol
    if text_results:
        messages.append(results_message(text_results, ctx, nudge=nudge,
                                        after=_after_prompt(failed_rounds)))
    elif nudge and len(messages) > len(state.get("messages", [])):
        prompt = _after_prompt(failed_rounds)
        messages.append({"role": "user", "content": load_prompt(prompt).strip()})
    fresh = failed_rounds == 2 and ctx.config.fresh_start_after_failures
    update: dict[str, Any] = {"messages": messages, "steps": steps, "pending": [],
                              "force_answer": repeated, "fresh_start": fresh}
    if answer_calls:
        update["answer"] = json.dumps(answer_calls[0] if len(answer_calls) == 1 else answer_calls)
    elif program_answer is not None:
        update["answer"] = program_answer
    return update


def _after_prompt(failed_rounds: int) -> str:
    """The reminder after results: answer now; after a failed round, fix it or solve it
    yourself; after a second one in a row, solve it yourself."""
    return ("agent_after_tool", "agent_after_error", "agent_after_errors")[min(failed_rounds, 2)]


def _earlier_results(state: AgentState) -> dict[str, tuple[str, bool]]:
    """Observations of calls already made in this run (failed ones too), by call."""
    out: dict[str, tuple[str, bool]] = {}
    for s in state.get("steps") or []:
        # Failed calls too: a small model repeats a failing call until the horizon.
        if s["kind"] == "act" and s.get("output") and s["output"].get("observation") is not None:
            args = s["input"].get("arguments")
            raw = args if isinstance(args, str) else json.dumps(args)
            out.setdefault(_call_key(s["input"]["tool"], raw),
                           (s["output"]["observation"], bool(s.get("error"))))
    return out


def finish(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Settle the outcome, the reason and the meta (the plugins' facts, the error) and the
    end time. It writes nothing: ``Agent`` builds the final trace from the state this leaves
    (``build_trace``) and is the run's one writer."""
    outcome = state.get("outcome") or ("answered" if state.get("answer") is not None else "error")
    reason = state.get("reason") or ("answered" if outcome == "answered" else "no answer")
    meta = dict(state.get("meta") or {})
    meta["reason"] = reason
    if outcome == "error":
        meta["error"] = state.get("error") or reason
    for plugin in ctx.plugins:
        extra = plugin.finish_meta(state)
        if extra:
            meta[plugin.name] = {**meta.get(plugin.name, {}), **dict(extra)}
    finish_step = _step("finish", "finish", output={"outcome": outcome, "reason": reason},
                        route="end")
    return {"outcome": outcome, "reason": reason, "meta": meta, "ended": time.time(),
            "steps": [finish_step]}


def build_trace(state: Mapping[str, Any], ctx: AgentContext, *, outcome: str | None = None,
                meta: Mapping[str, Any] | None = None, ended: float | None = None) -> Trace:
    """The ``agent`` trace of the graph state, built by
    ``whetstone.library_store.trace_build.make_trace`` with the id the run was started with.

    With no arguments it is the final trace of a finished run (the outcome, meta and end time
    ``finish`` settled); a running or stopped run passes its own ``outcome`` (and ``meta``,
    ``ended``)."""
    if outcome is None:  # the finished run
        outcome, ended = state["outcome"], state.get("ended")
    return make_trace(
        "agent",
        trace_id=state["trace_id"],
        task=state["task"],
        steps=(Step.from_dict(s) for s in state.get("steps") or []),
        answer=state.get("answer"),
        label=state.get("label"),
        outcome=outcome,  # type: ignore[arg-type]
        library_version=ctx.library_version or (state.get("meta") or {}).get("library_version"),
        model=ctx.backend.shown_spec,
        started=state["started"],
        ended=ended,
        total_tokens=state.get("tokens", 0),
        meta=meta if meta is not None else state.get("meta") or {},
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
