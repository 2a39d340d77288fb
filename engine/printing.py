"""Helpers for printing model and tool text in a terminal, shared by the faces' step printer
and the printers methods declare for their own step kinds (``MethodSpec.step_kinds``).

Stored traces come from several writers and may predate a shape change, so every field is
read defensively (``field``): a step a printer does not understand prints a short line, never a
crash. Imports nothing of ours.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich.markup import escape


def short(value: Any, limit: int = 400) -> str:
    """Model or tool text, cut to ``limit`` and escaped for rich markup: a reply that contains
    ``[/b]`` or ``[red]`` is printed as written, not parsed (or crashed on) as a style."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    text = text.strip()
    return escape(text if len(text) <= limit else text[:limit] + " …")


def field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a mapping, else None (outputs differ between writers)."""
    return value.get(key) if isinstance(value, Mapping) else None


def number(value: Any) -> float:
    """A stored count or time as a float (0 for anything that is not a number)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0
