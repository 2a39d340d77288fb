"""How runs look in a terminal: one line (or a few) per step, in the ReAct vocabulary, and
the result. Shared by ``whetstone run`` and ``whetstone traces show``.

Traces come from several writers, each with its own step shapes: the agent loop (a ``think``
output is a dict with ``thought``/``parsed``/``completion``), the direct solver (the output is
the reply text) and chat mode (``{"completion": {...}}``); the step kinds a method adds are
printed by the printer it declares (``MethodSpec.step_kinds``). Stored traces may also predate
a shape change, so every field is read defensively: a step this module does not understand
prints a short line, never a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..printing import field as _get
from ..printing import number as _number
from ..printing import short


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


def _other(out: Any, step: Any) -> None:
    if step.kind in ("prepare", "finish"):
        return  # the task and the outcome are printed around the steps
    line = f"[dim]{short(step.kind)} ({short(step.module)})[/]"
    if step.error:
        line += f" [red]{short(step.error, 1000)}[/]"
    out.print(line, markup=True, soft_wrap=True)


StepPrinter = Callable[[Any, Any], None]  # (rich console, Step) -> None
_PRINTERS: dict[str, StepPrinter] = {"think": _think, "act": _act, "observe": _observe}


def print_step(out: Any, step: Any, printers: Mapping[str, StepPrinter] | None = None
               ) -> None:
    """One line (or a few) per step, in the ReAct vocabulary users know. ``printers`` are
    the methods' own, for the step kinds they add (``MethodRegistry.step_printers``); a kind
    no printer knows prints one short line."""
    (_PRINTERS.get(step.kind) or (printers or {}).get(step.kind) or _other)(out, step)


def print_result(out: Any, trace: Any) -> None:
    """The answer (or why there is none), then the trace id, tokens and time."""
    took = (trace.ended or time.time()) - trace.started
    if trace.outcome == "answered" and _ended_on_calls(trace):
        out.print("[bold green]Replied with tool calls[/] (above): the caller runs them",
                  markup=True)
    elif trace.outcome == "answered":
        out.print(f"[bold green]Answer:[/] {short(trace.answer or '', 100_000)}", markup=True,
                  soft_wrap=True)
    elif trace.outcome == "length":  # the text as it came, said to be cut
        out.print(f"[bold yellow]Answer, cut at the length limit (outcome length):[/] "
                  f"{short(trace.answer or '', 100_000)}", markup=True, soft_wrap=True)
    else:
        reason = short((trace.meta or {}).get("reason", ""), 2000)
        out.print(f"[bold yellow]No answer[/] ({trace.outcome}): {reason}",
                  markup=True, soft_wrap=True)
    out.print(f"[dim]trace {trace.id} · {trace.total_tokens} tokens · {took:.1f} s · "
              f"`whetstone traces show {trace.id}`[/]", markup=True, soft_wrap=True)
