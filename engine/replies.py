"""Structured answers in model replies: find the JSON object a model was asked for.

Models wrap JSON in prose and code fences and make small slips in it; every method that asks a
model (an analyst, a rubric generator, a checker) for JSON reads the reply through here, and a
reply with no usable object is a ``ParseError`` that carries the raw text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.errors import ParseError


def extract_json_object(text: str, *, what: str = "a JSON object",
                        hint: str | None = None) -> Any:
    """The first JSON object in ``text`` (in a ``json`` fence or bare in prose), after undoing
    common small-model slips; ``ParseError`` carrying the raw reply otherwise. ``what`` names
    the expected object in the message ("the reply is not <what>: ...")."""
    candidates = re.findall(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start: text.rfind("}") + 1])
    last_err = "no JSON object found"
    for cand in candidates:
        try:
            return json.loads(cand)
        except json.JSONDecodeError as exc:
            last_err = f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            try:
                return json.loads(_repair(cand))
            except json.JSONDecodeError:
                continue
    raise ParseError(f"the reply is not {what}: {last_err}", text,
                     hint=hint or "reply with one JSON object")


def _repair(text: str) -> str:
    """Undo the most common small-model JSON slips: trailing commas, raw newlines in strings,
    and LaTeX backslashes (``\\$``, ``\\text``) that are not JSON escapes (seen from the
    embedded 0.5B analyst on GSM8K traces)."""
    text = re.sub(r",\s*([}\]])", r"\1", text)
    text = re.sub(r'\\(?![\\"/bfnrtu])', r"\\\\", text)
    out, in_str, esc = [], False, False
    for ch in text:
        if in_str and ch == "\n":
            out.append("\\n")
            continue
        out.append(ch)
        if esc:
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == '"':
            in_str = not in_str
    return "".join(out)
