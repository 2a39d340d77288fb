"""Structured answers in model replies: find the JSON object a model was asked for.

Models wrap JSON in prose and code fences and make small slips in it; every method that asks a
model (an analyst, a rubric generator, a checker) for JSON reads the reply through here, and a
reply with no usable object is a ``ParseError`` that carries the raw text.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from .errors import ParseError


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
        cand = _latex_escapes(cand)
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


# LaTeX commands whose backslash and first letter read as a JSON escape (\t, \b, \f, \n, \r):
# a model writing "\text{m}" or "\boxed{540}" inside a JSON string means the command, not a
# tab or a backspace (seen in the 0.5B analyst's changelogs on GSM8K).
_LATEX = re.compile(r"(?<!\\)\\(?=(?:text|times|tfrac|theta|tau|boxed|begin|binom|beta|bar|"
                    r"frac|forall|neq|nabla|right|rangle|rho|rfloor|rceil)(?![A-Za-z]))")


def _latex_escapes(text: str) -> str:
    """Double the backslash of LaTeX commands that JSON would read as control characters."""
    return _LATEX.sub(r"\\\\", text)


def salvage_truncated_json(text: str) -> Any | None:
    """The JSON object a reply started but never finished (cut at its token limit), closed
    after its last complete element: ``{"clusters": [{...}, {... `` reads as the first
    cluster. None when nothing complete precedes the cut. Callers count the repair: what was
    after the cut is lost."""
    start = text.find("{")
    if start < 0:
        return None
    body = text[start:]
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []  # (end of a complete element, closers still open)
    in_str = esc = False
    for i, ch in enumerate(body):
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack:
                break
            stack.pop()
            if not stack:
                return None  # complete: not truncated (the ordinary parse failed on it)
            cuts.append((i + 1, "".join(reversed(stack))))
    for end, closers in reversed(cuts[-16:]):
        try:
            return json.loads(_repair(body[:end] + closers))
        except json.JSONDecodeError:
            continue
    return None


def _repair(text: str) -> str:
    """Undo the most common small-model JSON slips: trailing commas, raw newlines in strings,
    and LaTeX backslashes (``\\$``, ``\\sqrt``) that are not JSON escapes (seen from the
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


def json_safe(value: Any) -> Any:
    """A value ``ast.literal_eval`` read, as JSON can hold it: sets and tuples become lists
    (sets sorted when they can be), bytes text, complex numbers and anything else their
    ``repr``. A small model's ``{"code", "print(1)"}`` is a set literal, not an error."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [json_safe(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return repr(value)


# Longest argument text tried as a Python literal (literal_eval is not cheap on huge input).
_MAX_LITERAL_CHARS = 20_000


def parse_call_arguments(raw: str) -> Any:
    """A tool call's arguments as small models write them: JSON; else the first object in the
    text (a code fence around it, a stray brace or prose after it, the slips ``_repair``
    undoes); else a Python dict literal (``True``, ``None``, single quotes: the embedded 0.5B
    writes its calls in ```` ```python ```` blocks). Raises the first ``JSONDecodeError`` when
    none of these reads."""
    text = raw.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        error = first
    body = re.sub(r"^```\w*\s*|\s*```\s*$", "", text)
    start = body.find("{")
    if start < 0:
        raise error
    try:
        return json.JSONDecoder().raw_decode(body[start:])[0]
    except json.JSONDecodeError:
        pass
    ends = [i for i, ch in enumerate(body) if ch == "}" and i > start][::-1][:4]
    for end in ends:
        cand = body[start:end + 1]
        try:
            return json.loads(_repair(cand))
        except json.JSONDecodeError:
            pass
        if len(cand) <= _MAX_LITERAL_CHARS:
            try:
                value = ast.literal_eval(cand)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                continue
            if isinstance(value, dict):
                return json_safe(value)
    raise error
