"""How a ``verify`` step (MARCH's check of an answer) prints in ``whetstone run`` and
``whetstone traces show``: each claim of the last round with its verdict, then the summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...printing import field, short

_MARK: dict[Any, str] = {True: "[green]supported[/]", False: "[red]contradicted[/]"}


def print_verify(out: Any, step: Any) -> None:
    """A verification: each claim of the last round with its verdict, then the summary."""
    if step.error:
        out.print(f"[red]Verification failed:[/] {short(step.error, 2000)}", markup=True,
                  soft_wrap=True)
        return
    rounds = field(step.output, "rounds")
    last = rounds[-1] if isinstance(rounds, list) and rounds else None
    claims = [c for c in field(last, "claims") or () if isinstance(c, Mapping)]
    for c in claims:
        mark = _MARK.get(c.get("supported"), "[yellow]not supported[/]")
        checked = f"; evidence says {short(c.get('checked'), 200)}" if c.get("checked") else ""
        out.print(f"  {mark}  {short(c.get('claim'), 400)} — claimed "
                  f"{short(c.get('claimed'), 200)}{checked}", markup=True, soft_wrap=True)
    flagged = sum(bool(c.get("flagged")) for c in claims)
    verdict = "[red]hallucination flagged[/]" if field(step.output, "flagged") else \
        "[green]supported by the evidence[/]"
    out.print(f"[cyan]Verify:[/] {verdict}: {flagged} of {len(claims)} claim(s) flagged"
              + (" · answer revised" if field(step.output, "revised") else ""), markup=True)
