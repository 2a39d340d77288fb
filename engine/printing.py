"""Helpers for printing model and tool text in a terminal, shared by the faces' step printer
and the printers methods declare for their own step kinds (``MethodSpec.step_kinds``).

Stored traces come from several writers and may predate a shape change, so every field is
read defensively (``field``): a step a printer does not understand prints a short line, never a
crash. Imports nothing of ours.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rich.markup import escape

# What a terminal acts on instead of showing: C0 controls but newline and tab (ESC starts
# "\033]0;title\a" and "\033[2J"), DEL, C1 controls (U+009B is a one-byte CSI), and the bidi
# controls that reorder what follows (U+202E shows "exe.txt" for "txt.exe").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")


def control_chars(text: str) -> list[str]:
    """The terminal control characters in ``text`` (see ``printable``), each once."""
    return list(dict.fromkeys(_CONTROL.findall(text)))


def printable(text: str) -> str:
    """``text`` with every terminal control character written out as its escape
    (``\\x1b``, ``\\u202e``): what the command line prints of a library, a trace or a model
    shows as written, and cannot retitle, clear or reorder the user's terminal."""
    return _CONTROL.sub(lambda m: ascii(m[0])[1:-1], text)


def short(value: Any, limit: int = 400) -> str:
    """Model or tool text, cut to ``limit`` and escaped for rich markup: a reply that contains
    ``[/b]`` or ``[red]`` is printed as written, not parsed (or crashed on) as a style."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    text = printable(text.strip())
    return escape(text if len(text) <= limit else text[:limit] + " …")


def field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a mapping, else None (outputs differ between writers)."""
    return value.get(key) if isinstance(value, Mapping) else None


def number(value: Any) -> float:
    """A stored count or time as a float (0 for anything that is not a number)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0
