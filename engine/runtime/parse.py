"""Read the model's reply leniently: native tool calls, ``Action: tool[input]``, ``<tool_call>``
JSON blocks, or ``Final Answer:``. Never raises: an unusable reply is ``kind="invalid"`` with
the reason, and the runtime shows that reason to the model as an observation."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from engine.types import Completion

# "Final Answer:" counts at the start of a line; mid-sentence ("to reach the final answer: I
# need 17*23") only when the reply has no Action at all.
_FINAL = re.compile(r"\bfinal\s+answer\s*\**\s*:\s*\**", re.IGNORECASE)
_FINAL_LINE = re.compile(r"(?:^|\n)[^\w\n]*final\s+answer\s*\**\s*:\s*\**", re.IGNORECASE)
_ACTION = re.compile(r"(?:^|\n)\W*action\s*\**\s*:\s*\**\s*", re.IGNORECASE)
_ACTION_INPUT = re.compile(r"\n\W*action\s+input\s*\**\s*:\s*", re.IGNORECASE)
_OBSERVATION = re.compile(r"\n\W*observation\s*:", re.IGNORECASE)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][\w.-]*")
# "Action: Final Answer" + "Action Input: 42" (LangChain's convention) is an answer.
_FINAL_TOOL = re.compile(r"final[\s_-]*answer\b", re.IGNORECASE)
FINAL_TOOL = "final_answer"
_CLOSERS = {"[": "]", "(": ")"}


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the model wrote it. ``arguments`` is raw text (JSON or a plain input)."""

    name: str
    arguments: str
    id: str = ""
    native: bool = False  # came from the backend's native tool-call channel


@dataclass(frozen=True)
class Parsed:
    kind: Literal["action", "answer", "invalid"]
    calls: tuple[ParsedCall, ...] = ()
    answer: str | None = None
    thought: str = ""
    error: str | None = None
    raw: str = ""


def _bracketed(text: str, open_at: int) -> tuple[str, bool]:
    """The text inside the bracket opening at ``open_at``; False when it never closes.

    Brackets inside quoted strings do not count (``python[print("]")]``); when the quotes do
    not pair up (an apostrophe in ``search[what's up]``) the brackets are counted plainly.
    """
    for quotes in (True, False):
        inner = _scan_bracket(text, open_at, quotes)
        if inner is not None:
            return inner, True
    return text[open_at + 1:], False


def _scan_bracket(text: str, open_at: int, quotes: bool) -> str | None:
    opener = text[open_at]
    closer = _CLOSERS[opener]
    depth, quote, i = 0, "", open_at
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif quotes and ch in "\"'":
            quote = ch
        elif ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
        i += 1
    return None


def parse_action(text: str) -> ParsedCall | None | str:
    """Find ``Action: ...`` in ``text``. Returns a call, None (no action), or an error string."""
    m = _ACTION.search(text)
    if not m:
        return None
    rest = text[m.end():]
    obs = _OBSERVATION.search(rest)
    if obs:  # the model imagined the observation; ignore everything from there
        rest = rest[:obs.start()]
    rest = rest.strip()
    if rest[:1] == "`":  # Action: `calculator[2+3]`
        rest = rest.strip("`").strip()
    if rest.startswith("{"):
        try:
            obj, _ = json.JSONDecoder().raw_decode(rest)  # the first object; text may follow
            name = obj.get("name") or obj.get("tool") or obj.get("action")
            args = obj.get("arguments", obj.get("input", obj.get("action_input", {})))
            if name:
                return ParsedCall(str(name), args if isinstance(args, str) else json.dumps(args))
        except (ValueError, AttributeError):
            pass
        return "the Action is not valid JSON"
    name_m = _FINAL_TOOL.match(rest) or _NAME.match(rest)
    if not name_m:
        return "the Action does not start with a tool name"
    name = FINAL_TOOL if name_m.re is _FINAL_TOOL else name_m.group(0).rstrip(".")
    after = rest[name_m.end():]
    stripped = after.lstrip(" \t")
    if stripped[:1] == ":" and stripped[1:2] in (" ", "\t") and "\n" not in stripped.strip():
        return ParsedCall(name, stripped[1:].strip())  # Action: calculator: 2+3
    if stripped[:1] in _CLOSERS:
        inner, closed = _bracketed(stripped, 0)
        if not closed:
            return f"the input of Action {name} has no closing {_CLOSERS[stripped[0]]!r}"
        return ParsedCall(name, inner.strip())
    ai = _ACTION_INPUT.search("\n" + after)
    if ai:
        value = ("\n" + after)[ai.end():].strip()
        return ParsedCall(name, value.strip("`").strip())
    if not after.strip() or after.startswith("\n"):
        return ParsedCall(name, "")
    return f"could not read the input of Action {name}"


def parse_tool_call_blocks(text: str) -> list[ParsedCall] | str:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks written as text."""
    calls: list[ParsedCall] = []
    for i, m in enumerate(_TOOL_CALL_BLOCK.finditer(text)):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            return f"a <tool_call> block is not valid JSON ({exc.msg})"
        if not isinstance(obj, dict) or not obj.get("name"):
            return 'a <tool_call> block needs {"name": ..., "arguments": {...}}'
        args = obj.get("arguments", {})
        calls.append(ParsedCall(str(obj["name"]),
                                args if isinstance(args, str) else json.dumps(args), f"call_{i}"))
    return calls


def parse_bare_json_call(text: str, tool_names: Collection[str]) -> list[ParsedCall]:
    """A reply that is only ``{"name": <tool>, "arguments": {...}}`` (small models often drop
    the ``<tool_call>`` tags), possibly fenced, or a list of such objects."""
    body = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    if fence:
        body = fence.group(1)
    if not body.startswith(("{", "[")):
        return []
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return []
    items = obj if isinstance(obj, list) else [obj]
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("name") not in tool_names:
            return []
        args = item.get("arguments", item.get("parameters", {}))
        calls.append(ParsedCall(str(item["name"]),
                                args if isinstance(args, str) else json.dumps(args), f"call_{i}"))
    return calls


def _final_marks(text: str) -> list[re.Match[str]]:
    """Where "Final Answer:" markers are: at line starts, or anywhere when there is no Action."""
    marks = list(_FINAL_LINE.finditer(text))
    if not marks and not _ACTION.search(text):
        marks = list(_FINAL.finditer(text))
    return marks


def _final_answer(text: str, marks: list[re.Match[str]]) -> str | None:
    if not marks:
        return None
    rest = text[marks[-1].end():]  # the last one wins: small models sometimes restate it
    for stop in (_ACTION, _OBSERVATION):  # a call or an imagined observation after it
        m = stop.search(rest)
        if m:
            rest = rest[:m.start()]
    return rest.strip().strip("*").strip() or None


def _thought(text: str, marks: list[re.Match[str]]) -> str:
    cut = len(text)
    if marks:
        cut = marks[0].start()
    m = _ACTION.search(text)
    if m:
        cut = min(cut, m.start())
    thought = text[:cut].strip()
    return re.sub(r"^\W*thought\s*:\s*", "", thought, flags=re.IGNORECASE)


def parse_reply(completion: Completion, *, native: bool,
                tool_names: Collection[str] = ()) -> Parsed:
    """Decide what the model asked for.

    ``native``: the backend delivers tool calls natively; then a reply with no call and no
    ``Final Answer:`` marker is itself the answer (the model's own format). In text mode a reply
    needs an ``Action:`` or a ``Final Answer:``.
    """
    text = completion.text or ""
    marks = _final_marks(text)
    thought = _thought(text, marks)
    if completion.tool_calls:
        calls = tuple(ParsedCall(c.name, c.arguments, c.id, native=True)
                      for c in completion.tool_calls)
        return Parsed("action", calls=calls, thought=text.strip(), raw=text)
    if "<tool_call>" in text:
        blocks = parse_tool_call_blocks(text)
        if isinstance(blocks, str):
            return Parsed("invalid", error=blocks, thought=thought, raw=text)
        if blocks:
            return Parsed("action", calls=tuple(blocks), thought=text.split("<tool_call>")[0]
                          .strip(), raw=text)
    bare = parse_bare_json_call(text, tool_names)
    if bare:
        return Parsed("action", calls=tuple(bare), raw=text)
    action = parse_action(text)
    final = _final_answer(text, marks)
    if isinstance(action, ParsedCall) and action.name == FINAL_TOOL \
            and FINAL_TOOL not in tool_names:
        if action.arguments.strip():
            return Parsed("answer", answer=action.arguments.strip(), thought=thought, raw=text)
        return Parsed("invalid", error="Action: Final Answer needs the answer as its input",
                      thought=thought, raw=text)
    if isinstance(action, ParsedCall):
        am = _ACTION.search(text)
        if final is None or (am and marks and am.start() < marks[0].start()):
            return Parsed("action", calls=(action,), thought=thought, raw=text)
    if final is not None:
        wrapped = parse_bare_json_call(final, tool_names)  # "Final Answer: {tool call JSON}"
        if wrapped:
            return Parsed("action", calls=tuple(wrapped), thought=thought, raw=text)
        return Parsed("answer", answer=final, thought=thought, raw=text)
    if isinstance(action, str):
        return Parsed("invalid", error=action, thought=thought, raw=text)
    if not text.strip():
        why = "the reply was empty"
        if completion.finish_reason == "length":
            why = "the reply was cut off before it said anything"
        return Parsed("invalid", error=why, raw=text)
    if native:
        return Parsed("answer", answer=text.strip(), thought=thought, raw=text)
    if completion.finish_reason == "length":
        return Parsed("invalid", error="the reply was cut off before an Action or a Final Answer",
                      thought=thought, raw=text)
    return Parsed("invalid", error="the reply has neither an Action nor a Final Answer",
                  thought=thought, raw=text)
