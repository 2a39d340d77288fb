"""What the model is shown: the system message, the tools offered, each request, each result.

Three ways to offer tools (``RunConfig.tool_format``):

- ``tags`` (the default when the backend's chat template knows tool calls): the tools are
  listed one line each in the system message, and the model calls them the way its template
  taught it, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; results come back in
  ``<tool_response>``. The template's own tools block (every JSON schema plus its preamble) is
  ~300 tokens for the two built-in tools, more than a GSM8K question; this is ~50.
- ``native``: the tools go to the backend as ``request.tools`` and its template renders them.
- ``react``: ``Action: tool[input]`` / ``Observation:`` text, for models without tool calls.

With the ``python`` tool offered and ``RunConfig.code_blocks`` on, a ```` ```python ```` block
that prints something is a call too: a coder model's own way to compute (it writes the block,
then ```` ```output ````, where generation stops and the real output goes). Task-given answer
tools (BFCL) go through the backend's native channel when it has one, exactly as the direct
solver offers them, so both solvers show the model the same function documents.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from whetstone.engine.prompts import load_prompt, render_prompt
from whetstone.engine.runtime.plugins import collect_guidance
from whetstone.engine.runtime.state import AgentContext, AgentState
from whetstone.engine.types import Request

ToolFormat = Literal["native", "tags", "react"]
CODE_OUTPUT_STOP = "```output"


def tool_format(ctx: AgentContext) -> ToolFormat:
    """The format this run offers tools in (``RunConfig.tool_format``; ``auto`` picks ``tags``
    when the backend's template has tool calls, else ``react``)."""
    fmt = ctx.config.tool_format
    if fmt == "auto":
        return "tags" if ctx.backend.capabilities.tool_calls else "react"
    return fmt  # type: ignore[return-value]


def answer_tool_names(state: Mapping[str, Any]) -> list[str]:
    return [s.get("function", s)["name"] for s in state.get("answer_tools") or []]


def offered_tools(state: Mapping[str, Any], ctx: AgentContext) -> list[str]:
    """The tools of this run (chosen by ``prepare``; every tool of the toolbox before it ran)."""
    names = state.get("tools")
    return list(names) if names is not None else ctx.toolbox.names()


def code_tool(state: Mapping[str, Any], ctx: AgentContext) -> str | None:
    """The tool a printed ```` ```python ```` block calls this run, if any."""
    if not ctx.config.code_blocks or tool_format(ctx) == "native":
        return None
    return "python" if "python" in offered_tools(state, ctx) else None


def _signature(name: str, parameters: Mapping[str, Any]) -> str:
    props = list((parameters.get("properties") or {}).keys())
    required = set(parameters.get("required") or props)
    return f"{name}({', '.join(p if p in required else p + '?' for p in props)})"


_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")  # "e.g. 17" does not end a sentence


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    m = _SENTENCE_END.search(text)
    return text if m is None else text[:m.start() + 1]


def tool_lines(state: Mapping[str, Any], ctx: AgentContext, *, full_answer_tools: bool
               ) -> list[str]:
    """One line per tool: ``- name(param, optional?): first sentence of its description``.
    Answer tools keep their whole JSON schema when ``full_answer_tools`` (the model must see
    every parameter's type and meaning to fill them, and no template shows them)."""
    lines = []
    skip = {code_tool(state, ctx)}  # the code block instruction covers it
    for spec in ctx.toolbox.specs():
        if spec.name in offered_tools(state, ctx) and spec.name not in skip:
            lines.append(f"- {_signature(spec.name, spec.parameters)}: "
                         f"{_first_sentence(spec.description)}")
    if full_answer_tools:
        for schema in state.get("answer_tools") or []:
            fn = schema.get("function", schema)
            lines.append(f"- {fn['name']}: {fn.get('description', '')} Arguments: JSON matching "
                         f"{json.dumps(fn.get('parameters', {}))}")
    return lines


def _native_answer_tools(ctx: AgentContext) -> bool:
    return ctx.backend.capabilities.tool_calls and tool_format(ctx) != "react"


def tools_text(state: Mapping[str, Any], ctx: AgentContext) -> str:
    """The tool instructions of the system message ('' when there is nothing to say)."""
    fmt = tool_format(ctx)
    if fmt == "native":
        return ""
    lines = tool_lines(state, ctx, full_answer_tools=not _native_answer_tools(ctx))
    parts = []
    if code_tool(state, ctx):
        parts.append(load_prompt("agent_tools_code").strip())
    if fmt == "react":
        parts.append(render_prompt("agent_react_format", tools="\n".join(lines) or "(none)"))
    elif lines:
        parts.append(render_prompt("agent_tools_tags", tools="\n".join(lines)).strip())
    return "\n".join(parts)


def choose_tools(ctx: AgentContext, meta: Mapping[str, Any], *, answer_tools: bool = False
                 ) -> list[str]:
    """The tools a run offers: the agent's own (not when the task brings ``answer_tools``,
    unless ``RunConfig.own_tools_with_answer_tools``), and each plugin's for what its
    guidance showed (``read_skill`` only when a skill was listed)."""
    own = not answer_tools or ctx.config.own_tools_with_answer_tools
    names = [n for n in ctx.toolbox.names() if own and n not in ctx.plugin_tools]
    for plugin in ctx.plugins:  # a name the user's tool took is not the plugin's to offer
        names += [n for n in plugin.offer(meta.get(plugin.name) or {}).names
                  if n not in ctx.tool_clashes]
    return list(dict.fromkeys(names))


def required_tools(ctx: AgentContext, meta: Mapping[str, Any], offered: Sequence[str]
                   ) -> list[str]:
    """The offered tools the plugins require the first decision to call one of."""
    names: list[str] = []
    for plugin in ctx.plugins:
        names += [n for n in plugin.offer(meta.get(plugin.name) or {}).required
                  if n in offered and n not in ctx.tool_clashes]
    return list(dict.fromkeys(names))


# How a reply that calls a tool begins, per tool format: with one tool, up to its arguments
# (OpenAI's tool_choice naming a function); with several, up to the name (tool_choice
# "required": the model picks).
# The prefix ends on a token boundary the model would write itself ("{", not ": "): a prefix
# ending in a space made the 0.5B continue with "1}".
_CALL_PREFIX = {"tags": ('<tool_call>{"name": "', '", "arguments": {'),
                "native": ('<tool_call>\n{"name": "', '", "arguments": {'),
                "react": ("Action: ", "[")}


def call_prefix(state: Mapping[str, Any], ctx: AgentContext, fmt: str) -> str:
    """The prefill that makes this decision a call of a required tool ('' for none: not the
    first decision, a fresh start, tools off, or a backend that cannot prefill)."""
    names = state.get("require_tools") or []
    if not names or state.get("n_calls", 0) or state.get("fresh_start") \
            or state.get("force_answer") or not ctx.backend.capabilities.prefill:
        return ""
    head, after_name = _CALL_PREFIX[fmt]
    return head + (names[0] + after_name if len(names) == 1 else "")


def build_system_prompt(state: AgentState, ctx: AgentContext
                        ) -> tuple[str, str, dict[str, Any], list[str], list[dict[str, str]]]:
    """The system message (instructions, the tools, then the plugins' guidance within the
    token budget), the guidance alone, what the guidance showed, the tools offered, and the
    plugins' demonstration turns (they go between the system message and the task)."""
    guidance, meta, turns = collect_guidance(ctx.plugins, ctx, state["task"],
                                             ctx.config.guidance_budget_tokens)
    tools = choose_tools(ctx, meta, answer_tools=bool(state.get("answer_tools")))
    with_tools: dict[str, Any] = {**state, "tools": tools}
    parts = [ctx.config.system_prompt or load_prompt("agent_system"),
             tools_text(with_tools, ctx), guidance]
    system = "\n\n".join(p.strip("\n") for p in parts if p.strip())
    return system, guidance, meta, tools, turns


def with_step_guidance(messages: list[dict[str, Any]], state: AgentState
                       ) -> list[dict[str, Any]]:
    """The before-think nodes' text for this decision at the end of the conversation, for this
    call only (never kept in ``messages``): joined to a trailing user turn (some chat templates
    refuse two user turns in a row), else as a new user turn."""
    notes = [t.strip() for t in (state.get("step_guidance") or {}).values() if t.strip()]
    if not notes:
        return messages
    text = "\n\n".join(notes)
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "user" and isinstance(last.get("content"), str):
        return [*messages[:-1], {**last, "content": last["content"].rstrip() + "\n\n" + text}]
    return [*messages, {"role": "user", "content": text}]


def _task_turn(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The conversation up to the model's first reply: the task as the user gave it."""
    out: list[Mapping[str, Any]] = []
    for m in messages:
        if m["role"] != "user":
            break
        out.append(m)
    return out


def build_request(state: AgentState, ctx: AgentContext) -> Request:
    """The next model call: the system message, the conversation (with this decision's step
    guidance), the tools, the stops."""
    cfg = ctx.config
    fmt = tool_format(ctx)
    tools: list[Mapping[str, Any]] = []
    stops: tuple[str, ...] = ()
    seed = None if cfg.seed is None else cfg.seed + state.get("n_calls", 0)
    if state.get("fresh_start"):
        # The tools failed twice: decide afresh on the task alone, as the direct solver
        # would (the library's guidance as the system message, no tools, no failed attempts
        # in view: the 0.5B answers the failures with a guess, not with its own reasoning),
        # seeded like the run's first call.
        guidance = (state.get("guidance") or "").strip()
        messages = [*([{"role": "system", "content": guidance}] if guidance else []),
                    *state.get("demo_turns", []), *_task_turn(state.get("messages", []))]
        seed = cfg.seed
    else:
        messages = with_step_guidance(
            [{"role": "system", "content": state["system"]}, *state.get("demo_turns", []),
             *state.get("messages", [])], state)
        if not state.get("force_answer"):
            if fmt == "native":
                tools = [s for s in ctx.toolbox.schemas()
                         if s["function"]["name"] in offered_tools(state, ctx)]
            if _native_answer_tools(ctx):
                tools += list(state.get("answer_tools") or [])
        stops = {"react": ("\nObservation:",), "tags": ("<tool_response>",), "native": ()}[fmt]
        if code_tool(state, ctx):
            stops += (CODE_OUTPUT_STOP,)
    remaining_time = cfg.timeout_s - (time.time() - ctx.clock_start)
    return Request(
        messages=messages,  # type: ignore[arg-type]
        max_tokens=cfg.max_tokens_per_call, temperature=cfg.temperature, top_p=cfg.top_p,
        stop=stops, seed=seed, tools=tuple(tools), timeout=max(1.0, remaining_time),
        prefix=call_prefix(state, ctx, fmt),
    )


def results_message(results: Sequence[tuple[str, str]], ctx: AgentContext, *,
                    nudge: bool = False, after: str = "agent_after_tool") -> dict[str, Any]:
    """One user message with the results of calls read from the reply's text, each shown the
    way the model's format shows results: ``(form, observation)`` pairs in call order (a
    python block's output as ```` ```output ````), then the reminder that the model may
    answer now when ``nudge``, worded by the prompt ``after`` (after failed calls: fix them or
    work the problem out without tools; a small model otherwise answers with a guess)."""
    fmt = tool_format(ctx)
    pieces = []
    for form, observation in results:
        if form == "code":
            prompt = "agent_code_output"
        else:
            prompt = "agent_observation" if fmt == "react" else "agent_tool_response"
        pieces.append(render_prompt(prompt, observation=observation).rstrip("\n"))
    if nudge:
        pieces.append(load_prompt(after).strip())
    return {"role": "user", "content": "\n".join(pieces)}


def with_images(messages: list[dict[str, Any]], images: Sequence[str]) -> list[dict[str, Any]]:
    """``messages`` with the images tools returned shown to a model that reads images: as
    image parts of the last user message (the results), else of a new one."""
    parts = [{"type": "image", "image": path} for path in images]
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user":
        content = last.get("content")
        text = [{"type": "text", "text": content}] if isinstance(content, str) else \
            list(content or [])
        return [*messages[:-1], {**last, "content": [*text, *parts]}]
    intro = {"type": "text", "text": load_prompt("agent_tool_images").strip()}
    return [*messages, {"role": "user", "content": [intro, *parts]}]
