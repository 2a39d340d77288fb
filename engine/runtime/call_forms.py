"""The tool-call forms small models write as text, found with where they sit in the reply.

Measured on the embedded 0.5B model (docs/results.md, "Agent loop vs direct"): it writes its
calls as Qwen ``<tool_call>`` blocks, as the bare JSON object without the tags, inside a
```` ```json ```` fence, after ``Action:``, and, being a coder model, as a ```` ```python ````
block that prints what it wants to know. Each finder returns ``Found`` records (the call and
its span) or an error string when a call is clearly meant but cannot be read (the runtime
shows that error to the model rather than taking the reply as an answer).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, replace

from engine.replies import parse_call_arguments

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
# The start of a JSON call object: {"name": "...", "arguments"|"parameters": ...
_CALL_HEAD = re.compile(
    r'\{\s*"(?:name|tool|function)"\s*:\s*"(?P<name>[^"\\]{1,80})"\s*,\s*'
    r'"(?:arguments|parameters|input|args)"\s*:', re.DOTALL)
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(?P<code>.*?)(?:```|\Z)", re.DOTALL)
_NAME_KEYS = ("name", "tool", "function")
_ARG_KEYS = ("arguments", "parameters", "input", "args")


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the model wrote it. ``arguments`` is raw text (JSON or a plain input)."""

    name: str
    arguments: str
    id: str = ""
    native: bool = False  # came from the backend's native tool-call channel
    form: str = ""  # how it was written: native, tags, json, action, code


@dataclass(frozen=True)
class Found:
    """A call and the span of the reply it was read from."""

    start: int
    end: int
    call: ParsedCall


def _arguments_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_from_object(obj: object, tool_names: Collection[str]) -> ParsedCall | None:
    """A call from a decoded JSON value shaped like one: ``{"name": T, "arguments": {...}}``
    (``parameters`` / ``input`` / ``args`` for the arguments, ``tool`` / ``function`` for the
    name). It counts when ``T`` is an offered tool, or when the arguments are an object (a call
    to a tool that does not exist is still a call: the model is told so, it is not an answer).
    """
    if not isinstance(obj, dict):
        return None
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
    key = next((k for k in _ARG_KEYS if k in obj), None)
    if not name or key is None:
        return None
    args = obj[key]
    if name not in tool_names and not isinstance(args, dict):
        return None
    return ParsedCall(name, _arguments_text(args), form="json")


def tool_call_blocks(text: str) -> list[Found] | str:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen, Hermes); the
    closing tag may be missing at the end of the reply."""
    found: list[Found] = []
    for m in _TOOL_CALL_BLOCK.finditer(text):
        body = m.group(1).strip().strip("`").removeprefix("json").strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            obj = _repaired(body)
            if obj is None:
                return f"a <tool_call> block is not valid JSON ({exc.msg}): {body[:200]}"
        call = call_from_object(obj, ())
        if call is None:
            return 'a <tool_call> block needs {"name": ..., "arguments": {...}}'
        found.append(Found(m.start(), m.end(), replace(call, form="tags")))
    return found


def _repaired(body: str) -> object | None:
    """A call object written loosely (``engine.replies.parse_call_arguments``: a Python
    literal, a stray brace or fence after it) or whose closing braces the model left off (it
    stopped, or ran out)."""
    for tail in ("", "}", "}}", '"}}'):
        try:
            return parse_call_arguments(body + tail)
        except json.JSONDecodeError:
            continue
    return None


def json_calls(text: str, tool_names: Collection[str]) -> list[Found] | str:
    """JSON call objects anywhere in the text: bare, in a ```json fence, after "Final Answer:",
    or as items of a list. An object that starts like a call but is not valid JSON is an
    error (the reply meant to call a tool)."""
    decoder = json.JSONDecoder()
    found: list[Found] = []
    pos = 0
    while (m := _CALL_HEAD.search(text, pos)) is not None:
        try:
            obj, end = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError as exc:
            obj = _repaired(text[m.start():].rstrip().rstrip("`").rstrip())
            if obj is None:
                return (f"the call to {m.group('name')} is not valid JSON ({exc.msg}): "
                        f"{text[m.start():m.start() + 200]}")
            end = len(text)
        call = call_from_object(obj, tool_names)
        if call is not None:
            found.append(Found(m.start(), end, call))
        pos = end if call is not None else m.end()
    return found


def _prints(code: str) -> bool:
    """Whether running ``code`` shows something: it prints, or ends with an expression (the
    python tool echoes a final expression). A block that only defines functions is an answer
    (code for the user), not a request to run it."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return "print(" in code  # run it anyway: the model then sees its syntax error
    if not tree.body:
        return False
    if isinstance(tree.body[-1], ast.Expr):
        return True
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
               for n in ast.walk(tree))


def _tool_in_code(code: str, tool_names: Collection[str]) -> ParsedCall | None:
    """A block that is nothing but a call of another offered tool with literal arguments,
    ``calculator(expression="17 * 23")`` (or inside ``print(...)``): the embedded 0.5B writes
    its tool calls this way, and as a program it only raises a NameError."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    node = tree.body[0].value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "print" and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in tool_names):
        return None
    try:
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        args = [ast.literal_eval(a) for a in node.args]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if len(kwargs) != len(node.keywords) or (args and kwargs) or len(args) > 1:
        return None
    if args:  # one positional value: the tool's single input, as an Action line passes it
        raw = args[0] if isinstance(args[0], str) else json.dumps(args[0])
        return ParsedCall(node.func.id, raw, form="code")
    return ParsedCall(node.func.id, json.dumps(kwargs), form="code")


def code_blocks(text: str, tool: str, parameter: str,
                tool_names: Collection[str] = ()) -> list[Found]:
    """```` ```python ```` blocks that print something, as one call of the python tool
    ``tool`` (code in ``parameter``). Several blocks in one reply run as one program, in
    order, since a later block uses what an earlier one defined; the call's span runs from
    the first block to the end of the last. A lone block that only calls another of
    ``tool_names`` with literal arguments is that tool's call."""
    blocks = [m for m in _CODE_BLOCK.finditer(text) if m.group("code").strip()]
    if len(blocks) == 1:
        other = _tool_in_code(blocks[0].group("code"), set(tool_names) - {tool})
        if other is not None:
            return [Found(blocks[0].start(), blocks[0].end(), other)]
    if not blocks or not any(_prints(m.group("code")) for m in blocks):
        return []
    code = "\n\n".join(m.group("code").strip("\n") for m in blocks)
    return [Found(blocks[0].start(), blocks[-1].end(),
                  ParsedCall(tool, json.dumps({parameter: code}), form="code"))]


def ordered(*groups: list[Found]) -> list[Found]:
    """All found calls in reply order; a call inside another's span (a JSON object inside a
    ``<tool_call>`` block, say) is the same call and is dropped."""
    out: list[Found] = []
    for f in sorted((f for g in groups for f in g), key=lambda f: (f.start, -f.end)):
        if out and f.start < out[-1].end:
            continue
        out.append(f)
    return out
