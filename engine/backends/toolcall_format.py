"""Native tool calls written as text: Qwen / Hermes ``<tool_call>{...}</tool_call>`` blocks.

Local backends generate plain text; a model trained for tools writes its calls inside these
blocks. ``parse_tool_calls`` turns them into ``ToolCall`` records and returns the text outside
them. Small models often drop the tags and write the bare object
(``{"name": "calculator", "arguments": {...}}``; the embedded 0.5B model does so every time),
so a bare object at the start of a line that names an offered tool counts as a call too.
Parsing is lenient (a missing closing tag or outer brace is forgiven) but never invents data:
arguments that are not valid JSON are kept verbatim so the runtime can show the model its own
mistake. ``StreamGate`` decides how much streamed text may be shown so that the streamed
chunks add up to exactly the final ``Completion.text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..types import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# A block runs to its closing tag, or to the end of the text when the model never closed it.
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
# Where a bare call may start: a "{" opening a line (after optional indentation).
_BARE_START = re.compile(r"^[ \t]*\{", re.MULTILINE)
_BARE_NAMED = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_FENCE_BEFORE = re.compile(r"(?:^|\n)[ \t]*```[\w-]*[ \t]*\n[ \t]*\Z")
_FENCE_AFTER = re.compile(r"\s*```[ \t]*(?:\n|\Z)")
# For streaming: a line that may open a bare call ("{" or a code fence), even half-written.
_CALL_LINE = re.compile(r"^[ \t]*(?:\{|`)", re.MULTILINE)


def _default_id(index: int) -> str:
    return f"call_{index}"


def _arguments_text(value: object) -> str:
    """Arguments as JSON text; a string is taken to be JSON text already (some models do that)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _one_call(body: str, call_id: str) -> ToolCall:
    raw = body.strip()
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        args = obj.get("arguments", obj.get("parameters", {}))
        return ToolCall(name=obj["name"], arguments=_arguments_text(args), id=call_id)
    # Malformed wrapper. Recover the name and, when the arguments value itself is valid JSON
    # (typically the outer closing brace is missing), that value; otherwise keep the raw text.
    name_m = _NAME.search(raw)
    name = json.loads(f'"{name_m.group(1)}"') if name_m else ""
    args_m = _ARGS.search(raw)
    if args_m is None:
        return ToolCall(name=name, arguments=raw, id=call_id)
    rest = raw[args_m.end():]
    try:
        value, _ = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError:
        return ToolCall(name=name, arguments=rest.strip(), id=call_id)
    return ToolCall(name=name, arguments=_arguments_text(value), id=call_id)


def _bare_calls(text: str, tool_names: Collection[str]) -> list[tuple[int, int, str]]:
    """Spans (start, end, body) of untagged call objects that name an offered tool."""
    spans: list[tuple[int, int, str]] = []
    decoder = json.JSONDecoder()
    pos = 0
    while (m := _BARE_START.search(text, pos)) is not None:
        start = m.end() - 1
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            named = _BARE_NAMED.match(text, start)
            if named and named.group(1) in tool_names:
                spans.append((start, len(text), text[start:]))  # unbalanced: runs to the end
                break
            pos = m.end()
            continue
        if (isinstance(obj, dict) and obj.get("name") in tool_names
                and ("arguments" in obj or "parameters" in obj)):
            body = text[start:end]
            # a code fence that only wraps the call goes with it
            before = _FENCE_BEFORE.search(text, 0, start)
            after = _FENCE_AFTER.match(text, end)
            if before and after:
                start, end = before.start(), after.end()
            spans.append((start, end, body))
        pos = end
    return spans


def _visible_text(pieces: Sequence[str]) -> str:
    return "\n".join(p.strip() for p in pieces if p.strip())


def parse_tool_calls(text: str, make_id: Callable[[int], str] = _default_id,
                     tool_names: Collection[str] = ()) -> tuple[str, tuple[ToolCall, ...]]:
    """Split model output into (visible text, tool calls).

    ``<tool_call>`` blocks always count. When there are none, bare call objects count if they
    name one of ``tool_names`` (the tools offered). The visible text is the text outside the
    calls, each piece stripped and the pieces joined with newlines (no calls: ``text.strip()``).
    """
    spans = [(m.start(), m.end(), m.group(1)) for m in _BLOCK.finditer(text)]
    if not spans and tool_names:
        spans = _bare_calls(text, tool_names)
    calls: list[ToolCall] = []
    pieces: list[str] = []
    pos = 0
    for i, (start, end, body) in enumerate(spans):
        pieces.append(text[pos:start])
        calls.append(_one_call(body, make_id(i)))
        pos = end
    pieces.append(text[pos:])
    return _visible_text(pieces), tuple(calls)


def offered_tool_names(tools: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Names of the tools in OpenAI ``tools`` entries (``{"type": "function", "function": ...}``)."""
    names = set()
    for t in tools:
        fn = t.get("function", t)
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return frozenset(names)


def format_tool_calls(calls: Sequence[ToolCall]) -> str:
    """The inverse: calls as ``<tool_call>`` text, for chat templates without tool support."""
    out = []
    for c in calls:
        try:
            args: object = c.parsed_arguments()
        except json.JSONDecodeError:
            args = c.arguments
        out.append(f"{OPEN}\n" + json.dumps({"name": c.name, "arguments": args},
                                             ensure_ascii=False) + f"\n{CLOSE}")
    return "\n".join(out)


class StreamGate:
    """Holds back streamed text that the final completion will not contain.

    Text is released only up to the first stop string or tool-call opening (a ``<tool_call>``
    tag, or a line starting with ``{`` or a code fence, where a bare call may begin), never a
    tail that could be the start of one, and never leading/trailing whitespace (the final text
    is stripped). ``feed`` returns what may be shown now; ``finish`` returns the rest of the final
    text once it is known. The released pieces always add up to a prefix of the final text.
    """

    def __init__(self, stops: Sequence[str] = (), hold_tool_calls: bool = False) -> None:
        self._markers = [s for s in stops if s] + ([OPEN] if hold_tool_calls else [])
        self._hold_lines = hold_tool_calls
        self._buf = ""
        self._sent = ""
        self._closed = False

    def _visible(self) -> str:
        text = self._buf
        hits = [text.find(m) for m in self._markers if m in text]
        if self._hold_lines and (line := _CALL_LINE.search(text)) is not None:
            hits.append(line.start())
        if hits:
            self._closed = True
            return text[:min(hits)].strip()
        hold = 0
        for m in self._markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    hold = max(hold, k)
                    break
        return text[:len(text) - hold].strip()

    def feed(self, piece: str) -> str:
        if self._closed or not piece:
            return ""
        self._buf += piece
        visible = self._visible()
        if not visible.startswith(self._sent):
            return ""
        new, self._sent = visible[len(self._sent):], visible
        return new

    def finish(self, final_text: str) -> str:
        """What remains to be shown of ``final_text`` after everything released so far."""
        if not final_text.startswith(self._sent):
            return ""
        rest, self._sent = final_text[len(self._sent):], final_text
        return rest
