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

from whetstone.engine.replies import json_safe, parse_call_arguments

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
# The start of a call object, JSON or a Python dict: {"name": "...", "arguments": ...
_CALL_HEAD = re.compile(
    r'\{\s*["\'](?:name|tool|function|action)["\']\s*:\s*["\'](?P<name>[^"\'\\]{1,80})["\']'
    r'\s*,\s*["\'](?:arguments|parameters|input|args|action_input)["\']\s*:', re.DOTALL)
# Where an object with a quoted first key starts; a name key somewhere in it (cheap filter
# before the lenient reading).
_OBJECT_START = re.compile(r"\{\s*[\"']")
_NAME_KEY = re.compile(r"[\"'](?:name|tool|function|action)[\"']\s*:")
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(?P<code>.*?)(?:```|\Z)", re.DOTALL)
_NAME_KEYS = ("name", "tool", "function", "action")
_ARG_KEYS = ("arguments", "parameters", "input", "args", "action_input")
# What may surround call objects in a python block that is nothing but calls.
_ONLY_CALLS = re.compile(r"(?:\s|#[^\n]*|print|json\.dumps|[()\[\],;])*")


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the model wrote it. ``arguments`` is raw text (JSON or a plain input)."""

    name: str
    arguments: str
    id: str = ""
    native: bool = False  # came from the backend's native tool-call channel
    form: str = ""  # how it was written: native, tags, json, action, code, text (Python call syntax outside a fence)


@dataclass(frozen=True)
class Found:
    """A call and the span of the reply it was read from."""

    start: int
    end: int
    call: ParsedCall
    # A program made of several python blocks: the blocks' spans. A call written between
    # them (in a block or fence of its own) is not part of the program and still runs.
    parts: tuple[tuple[int, int], ...] = ()


def _arguments_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(json_safe(value), ensure_ascii=False)


def call_from_object(obj: object, tool_names: Collection[str]) -> ParsedCall | None:
    """A call from a decoded JSON value shaped like one: ``{"name": T, "arguments": {...}}``
    (``parameters`` / ``input`` / ``args`` / ``action_input`` for the arguments, ``tool`` /
    ``function`` / ``action`` for the name; OpenAI's ``{"function": {...}}`` wrapper). It counts when ``T`` is an offered tool, or when the arguments are an object (a call
    to a tool that does not exist is still a call: the model is told so, it is not an answer).
    """
    if not isinstance(obj, dict):
        return None
    inner = obj.get("function")
    if isinstance(inner, dict) and not any(k in obj for k in _ARG_KEYS):
        return call_from_object(inner, tool_names)  # OpenAI's {"type": "function", ...}
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
    """A call object written loosely (``whetstone.engine.replies.parse_call_arguments``: a Python
    literal, a stray brace or fence after it) or whose closing braces the model left off (it
    stopped, or ran out)."""
    for tail in ("", "}", "}}", '"}}'):
        try:
            return parse_call_arguments(body + tail)
        except json.JSONDecodeError:
            continue
    return None


_CLOSER = {"{": "}", "[": "]", "(": ")"}


def bracket_end(text: str, start: int, *, quotes: bool = True) -> int | None:
    """The end (one past the closer) of the bracket opening at ``start``: ``{``, ``[`` or
    ``(``. With ``quotes``, brackets inside quoted strings (either quote) do not count. None
    when it never closes."""
    opener, closer = text[start], _CLOSER[text[start]]
    depth, quote, i = 0, "", start
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
                return i + 1
        i += 1
    return None


def object_at(text: str, start: int) -> tuple[object, int] | None:
    """The value of the object opening at ``start`` and where it ends: JSON, else (when it
    has a name key) read leniently: a Python dict (single quotes, ``True``), trailing
    commas."""
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        pass
    end = bracket_end(text, start)
    if end is None or not _NAME_KEY.search(text, start, end):
        return None
    try:
        return parse_call_arguments(text[start:end]), end
    except json.JSONDecodeError:
        return None


def json_calls(text: str, tool_names: Collection[str]) -> list[Found] | str:
    """Call objects anywhere in the text, as JSON or as a Python dict: bare, in a ```json or
    ```python fence, after "Final Answer:", as items of a list, inside a wrapper. An object
    that starts like a call but cannot be read is an error (the reply meant to call a
    tool)."""
    found: list[Found] = []
    pos = 0
    while (m := _OBJECT_START.search(text, pos)) is not None:
        at = m.start()
        read = object_at(text, at)
        if read is None:
            head = _CALL_HEAD.match(text, at)
            if head is None:
                pos = at + 1
                continue
            obj = _repaired(text[at:].rstrip().rstrip("`").rstrip())
            if obj is None:
                return (f"the call to {head.group('name')} is not valid JSON: "
                        f"{text[at:at + 200]}")
            read = (obj, len(text))
        obj, end = read
        call = call_from_object(obj, tool_names)
        if call is not None:
            found.append(Found(at, end, call))
        # Past a call; into anything else (a call may sit inside a wrapper object).
        pos = end if call is not None else at + 1
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


def tool_in_code(code: str, tool_names: Collection[str]) -> ParsedCall | None:
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
        kwargs = {k.arg: json_safe(ast.literal_eval(k.value)) for k in node.keywords if k.arg}
        args = [json_safe(ast.literal_eval(a)) for a in node.args]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if len(kwargs) != len(node.keywords) or (args and kwargs) or len(args) > 1:
        return None
    if args:  # one positional value: the tool's single input, as an Action line passes it
        raw = args[0] if isinstance(args[0], str) else json.dumps(args[0])
        return ParsedCall(node.func.id, raw, form="code")
    return ParsedCall(node.func.id, json.dumps(kwargs), form="code")


def text_calls(text: str, tool_names: Collection[str]) -> list[Found]:
    """Calls of offered tools written as Python outside any fence, ``price_of(name="Amber
    Kettle")`` or ``price_of("Amber Kettle")`` in a reply or its final answer: the 0.5B
    writes a tool it was offered this way, and taken as text it was the run's answer."""
    if not tool_names:
        return []
    names = "|".join(re.escape(n) for n in sorted(tool_names, key=len, reverse=True))
    found: list[Found] = []
    for m in re.finditer(r"(?<![\w.])(?:" + names + r")\s*\(", text):
        end = bracket_end(text, m.end() - 1)
        if end is None:
            continue
        call = tool_in_code(text[m.start():end], tool_names)
        if call is not None:
            found.append(Found(m.start(), end, replace(call, form="text")))
    return found


def _block_calls(block: re.Match[str], tool_names: Collection[str]) -> list[Found]:
    """The calls a python block holds as call objects: it is a call, not a program, when an
    object names an offered tool, or when it holds nothing but call objects (the model wrote
    its call in the fence it writes most, and as a program it only echoes the object). The
    first call's span starts at the fence and the last one's ends at the closing fence."""
    code, offset = block.group("code"), block.start("code")
    calls = json_calls(code, tool_names)
    if isinstance(calls, str) or not calls:
        return []
    edges = [0, *(x for f in calls for x in (f.start, f.end)), len(code)]
    rest = "".join(code[edges[i]:edges[i + 1]] for i in range(0, len(edges), 2))
    if not (any(f.call.name in tool_names for f in calls) or _ONLY_CALLS.fullmatch(rest)):
        return []
    # Written as a program (form "code"): as for a program, text after it was written before
    # it ran (often a guessed result), and its result answers when it ends the reply.
    out = [Found(offset + f.start, offset + f.end, replace(f.call, form="code")) for f in calls]
    out[0] = replace(out[0], start=block.start())
    out[-1] = replace(out[-1], end=block.end())
    return out


def code_blocks(text: str, tool: str, parameter: str,
                tool_names: Collection[str] = ()) -> list[Found]:
    """```` ```python ```` blocks that print something, as one call of the python tool
    ``tool`` (code in ``parameter``). Several blocks in one reply run as one program, in
    order, since a later block uses what an earlier one defined; the call's span runs from
    the first block to the end of the last. A block that holds call objects is those calls
    (``_block_calls``); a lone block that only calls another of ``tool_names`` with literal
    arguments is that tool's call."""
    blocks = [m for m in _CODE_BLOCK.finditer(text) if m.group("code").strip()]
    found: list[Found] = []
    program: list[re.Match[str]] = []
    for m in blocks:
        calls = _block_calls(m, tool_names)
        found += calls
        if not calls:
            program.append(m)
    if len(blocks) == 1 and program:
        other = tool_in_code(blocks[0].group("code"), set(tool_names) - {tool})
        if other is not None:
            return [Found(blocks[0].start(), blocks[0].end(), other)]
    if program and any(_prints(m.group("code")) for m in program):
        code = "\n\n".join(m.group("code").strip("\n") for m in program)
        found.append(Found(program[0].start(), program[-1].end(),
                           ParsedCall(tool, json.dumps({parameter: code}), form="code"),
                           parts=tuple(m.span() for m in program)))
    return found


def _covers(outer: Found, inner: Found) -> bool:
    """Whether ``inner`` is written inside ``outer`` (inside one of a program's blocks, not
    between them)."""
    if not outer.parts:
        return inner.start < outer.end
    return any(a <= inner.start < b for a, b in outer.parts)


def ordered(*groups: list[Found]) -> list[Found]:
    """All found calls in reply order; a call inside another's span (a JSON object inside a
    ``<tool_call>`` block, say) is the same call and is dropped."""
    out: list[Found] = []
    for f in sorted((f for g in groups for f in g), key=lambda f: (f.start, -f.end)):
        if any(_covers(o, f) for o in out):
            continue
        out.append(f)
    return out
