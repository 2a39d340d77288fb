"""How runs look in a terminal: one line (or a few) per step, in the ReAct vocabulary, and
the result. Shared by ``whetstone run`` and ``whetstone traces show``.

Traces come from several writers, each with its own step shapes: the agent loop (a ``think``
output is a dict with ``thought``/``parsed``/``completion``), the direct solver (the output is
the reply text), chat mode (``{"completion": {...}}``) and verifications (``verify`` steps holding a
whole check). Stored traces may also predate a shape change, so every field is read defensively:
a step this module does not understand prints a short line, never a crash.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any


def short(value: Any, limit: int = 400) -> str:
    """Model or tool text, cut to ``limit`` and escaped for rich markup: a reply that contains
    ``[/b]`` or ``[red]`` is printed as written, not parsed (or crashed on) as a style."""
    from rich.markup import escape

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    text = text.strip()
    return escape(text if len(text) <= limit else text[:limit] + " …")


def _get(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a mapping, else None (outputs differ between writers)."""
    return value.get(key) if isinstance(value, Mapping) else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0


def _calls(completion: Any) -> list[tuple[Any, Any]]:
    """(name, arguments) of each tool call a stored completion made."""
    out = []
    for call in _get(completion, "tool_calls") or ():
        fn = _get(call, "function") or call  # stored in the OpenAI shape, or flat
        out.append((_get(fn, "name"), _get(fn, "arguments")))
    return out


def _ended_on_calls(trace: Any) -> bool:
    """The last decision of the trace made tool calls and wrote no text (a chat exchange a
    client runs tools for): its stored "answer" is those calls, not an answer."""
    last = next((s for s in reversed(trace.steps or ()) if s.kind == "think"), None)
    completion = _get(last.output, "completion") if last is not None else None
    return bool(_calls(completion)) and not str(_get(completion, "text") or "").strip()


def _think(out: Any, step: Any) -> None:
    """A model call: the agent's thought (not repeated when it is just the answer), the tool
    calls a chat-mode or direct reply made, then its tokens and time."""
    if step.error:
        out.print(f"[red]Model call failed:[/] {short(step.error, 2000)}", markup=True)
        return
    output, meta = step.output, step.meta or {}
    completion = _get(output, "completion")
    thought = _get(output, "thought")
    if isinstance(thought, str) and thought.strip():
        reply = _get(completion, "text")
        answer_only = _get(output, "parsed") == "answer" and \
            thought.strip() == (reply if isinstance(reply, str) else "").strip()
        if not answer_only:
            out.print(f"[cyan]Thought:[/] {short(thought, 1200)}", markup=True, soft_wrap=True)
    elif _get(output, "parsed") is None:
        # Chat mode and the direct solver: a reply without tool calls is the answer, printed
        # below; one with calls is a decision: its text a thought, its calls calls (never an
        # "Answer: f({...})").
        calls = _calls(completion)
        text = _get(completion, "text")
        if calls and isinstance(text, str) and text.strip():
            out.print(f"[cyan]Thought:[/] {short(text, 1200)}", markup=True, soft_wrap=True)
        for name, arguments in calls:
            out.print(f"[magenta]Tool call:[/] {short(name)}({short(arguments)})", markup=True,
                      soft_wrap=True)
    tokens = meta.get("completion_tokens", step.tokens)
    seconds = meta.get("latency_s", step.duration_s)
    out.print(f"[dim]  ({int(_number(tokens))} tokens, {_number(seconds):.1f} s)[/]",
              markup=True)


def _act(out: Any, step: Any) -> None:
    tool, args = _get(step.input, "tool"), _get(step.input, "arguments")
    observation = _get(step.output, "observation")
    if not observation:
        out.print(f"[magenta]Action:[/] {short(tool)}({short(args)})", markup=True)
        return
    out.print(f"[magenta]Action:[/] {short(tool)}\\[{short(args)}]", markup=True,
              soft_wrap=True)
    style = "red" if step.error else "green"
    out.print(f"[{style}]Observation:[/] {short(observation, 800)}", markup=True,
              soft_wrap=True)


def _observe(out: Any, step: Any) -> None:
    # The runtime's reason ("unparseable reply: ...", "tool call not run: ..."), never the
    # reminder it sent the model, which would read as if the model had said it.
    error = step.error or ""
    out.print(f"[yellow]{short(error[:1].upper() + error[1:], 2000)}[/]", markup=True,
              soft_wrap=True)


_MARK = {True: "[green]supported[/]", False: "[red]contradicted[/]"}


def _verify(out: Any, step: Any) -> None:
    """A verification: each claim of the last round with its verdict, then the summary."""
    if step.error:
        out.print(f"[red]Verification failed:[/] {short(step.error, 2000)}", markup=True,
                  soft_wrap=True)
        return
    rounds = _get(step.output, "rounds")
    last = rounds[-1] if isinstance(rounds, list) and rounds else None
    claims = [c for c in _get(last, "claims") or () if isinstance(c, Mapping)]
    for c in claims:
        mark = _MARK.get(c.get("supported"), "[yellow]not supported[/]")
        checked = f"; evidence says {short(c.get('checked'), 200)}" if c.get("checked") else ""
        out.print(f"  {mark}  {short(c.get('claim'), 400)} — claimed "
                  f"{short(c.get('claimed'), 200)}{checked}", markup=True, soft_wrap=True)
    flagged = sum(bool(c.get("flagged")) for c in claims)
    verdict = "[red]hallucination flagged[/]" if _get(step.output, "flagged") else \
        "[green]supported by the evidence[/]"
    out.print(f"[cyan]Verify:[/] {verdict}: {flagged} of {len(claims)} claim(s) flagged"
              + (" · answer revised" if _get(step.output, "revised") else ""), markup=True)


def _rubric(out: Any, step: Any) -> None:
    """A step rubric: the criteria the next decision is held to (or why it was dropped)."""
    if step.error:
        out.print(f"[yellow]{short(step.error, 1000)}[/]", markup=True, soft_wrap=True)
        return
    out.print(f"[cyan]Rubric:[/] {short(_get(step.output, 'rubric'), 800)}", markup=True,
              soft_wrap=True)


def _other(out: Any, step: Any) -> None:
    if step.kind in ("prepare", "finish"):
        return  # the task and the outcome are printed around the steps
    line = f"[dim]{short(step.kind)} ({short(step.module)})[/]"
    if step.error:
        line += f" [red]{short(step.error, 1000)}[/]"
    out.print(line, markup=True, soft_wrap=True)


_PRINTERS: dict[str, Callable[[Any, Any], None]] = {
    "think": _think, "act": _act, "observe": _observe, "verify": _verify, "rubric": _rubric}


def print_step(out: Any, step: Any) -> None:
    """One line (or a few) per step, in the ReAct vocabulary users know."""
    _PRINTERS.get(step.kind, _other)(out, step)


def print_result(out: Any, trace: Any) -> None:
    """The answer (or why there is none), then the trace id, tokens and time."""
    took = (trace.ended or time.time()) - trace.started
    if trace.outcome == "answered" and _ended_on_calls(trace):
        out.print("[bold green]Replied with tool calls[/] (above): the caller runs them",
                  markup=True)
    elif trace.outcome == "answered":
        out.print(f"[bold green]Answer:[/] {short(trace.answer or '', 100_000)}", markup=True,
                  soft_wrap=True)
    else:
        reason = short((trace.meta or {}).get("reason", ""), 2000)
        out.print(f"[bold yellow]No answer[/] ({trace.outcome}): {reason}",
                  markup=True, soft_wrap=True)
    out.print(f"[dim]trace {trace.id} · {trace.total_tokens} tokens · {took:.1f} s · "
              f"`whetstone traces show {trace.id}`[/]", markup=True)
