"""How a ``rubric`` step (Co-ReAct's criteria for the next decision) prints in
``whetstone run`` and ``whetstone traces show``."""

from __future__ import annotations

from typing import Any

from ...printing import field, short


def print_rubric(out: Any, step: Any) -> None:
    """A step rubric: the criteria the next decision is held to (or why it was dropped)."""
    if step.error:
        out.print(f"[yellow]{short(step.error, 1000)}[/]", markup=True, soft_wrap=True)
        return
    out.print(f"[cyan]Rubric:[/] {short(field(step.output, 'rubric'), 800)}", markup=True,
              soft_wrap=True)
