"""How runs look in a terminal: one line (or a few) per step, in the ReAct vocabulary, and
the result. Shared by ``whetstone run`` and ``whetstone traces show``."""

from __future__ import annotations

import json
import time
from typing import Any


def short(value: Any, limit: int = 400) -> str:
    """Model or tool text, cut to ``limit`` and escaped for rich markup: a reply that contains
    ``[/b]`` or ``[red]`` is printed as written, not parsed (or crashed on) as a style."""
    from rich.markup import escape

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.strip()
    return escape(text if len(text) <= limit else text[:limit] + " …")


def print_step(out: Any, step: Any) -> None:
    """One line (or a few) per step, in the ReAct vocabulary users know."""
    if step.kind == "think" and step.output:
        thought = (step.output.get("thought") or "").strip()
        answer_only = step.output.get("parsed") == "answer" and \
            thought == (step.output.get("completion", {}).get("text") or "").strip()
        if thought and not answer_only:
            out.print(f"[cyan]Thought:[/] {short(thought, 1200)}", markup=True, soft_wrap=True)
        meta = step.meta or {}
        out.print(f"[dim]  ({meta.get('completion_tokens', 0)} tokens, "
                  f"{meta.get('latency_s', 0):.1f} s)[/]", markup=True)
    elif step.kind == "think" and step.error:
        out.print(f"[red]Model call failed:[/] {short(step.error, 2000)}", markup=True)
    elif step.kind == "act":
        if not step.output or not step.output.get("observation"):
            out.print(f"[magenta]Action:[/] {short(step.input.get('tool'))}"
                      f"({short(step.input.get('arguments'))})", markup=True)
            return
        args = step.input.get("arguments")
        out.print(f"[magenta]Action:[/] {short(step.input.get('tool'))}\\[{short(args)}]",
                  markup=True, soft_wrap=True)
        style = "red" if step.error else "green"
        out.print(f"[{style}]Observation:[/] {short(step.output.get('observation'), 800)}",
                  markup=True, soft_wrap=True)
    elif step.kind == "observe":
        error = step.error or ""  # already says "unparseable reply: ..."
        out.print(f"[yellow]{short(error[:1].upper() + error[1:], 2000)}[/]", markup=True,
                  soft_wrap=True)


def print_result(out: Any, trace: Any) -> None:
    """The answer (or why there is none), then the trace id, tokens and time."""
    took = (trace.ended or time.time()) - trace.started
    if trace.outcome == "answered":
        out.print(f"[bold green]Answer:[/] {short(trace.answer, 100_000)}", markup=True,
                  soft_wrap=True)
    else:
        reason = short(trace.meta.get("reason", ""), 2000)
        out.print(f"[bold yellow]No answer[/] ({trace.outcome}): {reason}",
                  markup=True, soft_wrap=True)
    out.print(f"[dim]trace {trace.id} · {trace.total_tokens} tokens · {took:.1f} s · "
              f"`whetstone traces show {trace.id}`[/]", markup=True)
