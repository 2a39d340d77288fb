"""The user's own Python functions and LangChain tools as agent tools.

A typed function with a docstring is a tool, its JSON schema read the way a learned tool's is
(``whetstone.tools.learned``): the parameters' annotations (JSON types, ``Literal``, ``X |
None``, ``Annotated[str, "task"]`` for the task text the runtime passes) and the docstring's
summary and ``Args:`` section::

    def order_status(order_id: int, verbose: bool = False) -> str:
        \"\"\"Look up an order in the shop's system.

        Args:
            order_id: the order number the customer gave.
            verbose: include every line item.
        \"\"\"

A function without them is refused with what to add: the model can only fill a parameter it
is told the type and meaning of. Unlike a learned tool, a function is the user's own code: it
runs in this process, with the user's rights, outside the sandbox (docs/mcp.md, "What runs
where"). A LangChain ``BaseTool`` keeps its own name, description and argument schema.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engine.errors import ConfigError, ToolError
from ..engine.loading import load_function
from ..engine.types import ToolSpec
from .base import Tool
from .learned import (
    ANSWER_MARK,
    INJECT_SOURCES,
    MAX_DESCRIPTION,
    check_spec_arguments,
    parse_docstring,
)

# OpenAI's rule for function names.
FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")
_SCALARS: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}
_LISTS = (list, tuple, Sequence, typing.List, typing.Tuple)  # noqa: UP006 - the old spellings too
_DICTS = (dict, Mapping, typing.Dict)  # noqa: UP006
_EXAMPLE = ('def lookup(order_id: int, verbose: bool = False) -> str:\n'
            '    """Look up an order.\n\n    Args:\n'
            '        order_id: the order number.\n        verbose: include every line."""')


class _TypeProblem(Exception):
    pass


def _schema_of(tp: Any) -> dict[str, Any]:
    """The JSON schema of a resolved annotation (``learned.annotation_schema``'s rules)."""
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _schema_of(rest[0])
        raise _TypeProblem(f"{tp} is a union; take one JSON type (or X | None)")
    if origin is typing.Literal:
        if not all(isinstance(a, (str, int, float, bool)) for a in args):
            raise _TypeProblem("Literal[...] takes str, int, float or bool constants")
        return {"enum": list(args)}
    if tp in (list, tuple) or origin in _LISTS:
        return {"type": "array", **({"items": _schema_of(args[0])} if args else {})}
    if tp is dict or origin in _DICTS:
        if args and args[0] is not str:
            raise _TypeProblem("dict keys must be str (JSON objects)")
        return {"type": "object",
                **({"additionalProperties": _schema_of(args[1])} if len(args) == 2 else {})}
    raise _TypeProblem(f"{getattr(tp, '__name__', tp)!r} is not a JSON type (int, float, str, "
                       "bool, list[...], dict[str, ...], Literal[...], X | None)")


def _json_default(value: Any, where: str) -> Any:
    if isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise _TypeProblem(f"{where}: defaults must be JSON values") from exc
    return value


def _refuse(fn: Callable[..., Any], what: str) -> ConfigError:
    name = getattr(fn, "__qualname__", repr(fn))
    return ConfigError(f"function {name} cannot be a tool: {what}",
                       hint="a tool is a named function with a type on every parameter and "
                            "the return value, and a docstring whose first line says what it "
                            f"does and whose Args: section describes each parameter, e.g.\n"
                            f"{_EXAMPLE}")


def _marked(tp: Any) -> tuple[Any, str | None]:
    """``(X, mark)`` for ``Annotated[X, "mark"]``, else ``(tp, None)``."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *marks = typing.get_args(tp)
        if len(marks) == 1 and isinstance(marks[0], str):
            return base, marks[0]
    return tp, None


def function_spec(fn: Callable[..., Any], *, name: str | None = None) -> ToolSpec:
    """The ``ToolSpec`` of a typed, documented function; ``ConfigError`` saying what to add
    when it is not one."""
    name = str(name or getattr(fn, "__name__", ""))
    if not FUNCTION_NAME.match(name or ""):
        raise _refuse(fn, f"{name!r} is not a tool name (letters, digits, _ and -; a lambda "
                          "needs a def)")
    doc = inspect.getdoc(fn) or ""
    description, param_docs = parse_docstring(doc)
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise _refuse(fn, f"its annotations cannot be read ({exc})") from exc
    untyped = [p for p in sig.parameters if p not in hints]
    if untyped or "return" not in hints:
        missing = [f"parameter {p!r}" for p in untyped] + \
            (["the return value (-> str)"] if "return" not in hints else [])
        raise _refuse(fn, f"add a type annotation to {', '.join(missing)}")
    if not description:
        raise _refuse(fn, "add a docstring whose first line says what it does (the model "
                          "reads it to decide when to call it)")
    props: dict[str, Any] = {}
    required: list[str] = []
    inject: dict[str, str] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise _refuse(fn, "take named parameters only (no *args, **kwargs or /)")
        tp, mark = _marked(hints[p.name])
        if mark is not None:
            if mark not in INJECT_SOURCES or tp is not str:
                raise _refuse(fn, f'parameter {p.name!r}: the only parameter mark is '
                                  'Annotated[str, "task"] (the runtime passes the task text)')
            inject[p.name] = mark
            continue
        try:
            schema = _schema_of(tp)
            if p.default is not p.empty:
                schema["default"] = _json_default(p.default, f"parameter {p.name!r}")
        except _TypeProblem as exc:
            raise _refuse(fn, f"parameter {p.name!r}: {exc}") from exc
        if param_docs.get(p.name):
            schema["description"] = param_docs[p.name]
        props[p.name] = schema
        if p.default is p.empty:
            required.append(p.name)
    _, mark = _marked(hints["return"])
    if mark is not None and mark != ANSWER_MARK:
        raise _refuse(fn, f'return value: unknown mark {mark!r}; use Annotated[str, "answer"] '
                          "when the output is the answer")
    module = getattr(fn, "__module__", None) or "?"
    return ToolSpec(name=name, description=description[:MAX_DESCRIPTION],
                    parameters={"type": "object", "properties": props, "required": required},
                    source=f"python:{module}:{getattr(fn, '__qualname__', name)}",
                    inject=inject, returns_answer=mark == ANSWER_MARK)


def _text(value: Any) -> str:
    """A result as the model reads it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


def _run_coroutine(coro: Any) -> Any:
    # Its own loop on its own thread: the agent may be running inside an event loop already.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def function_tool(fn: Callable[..., Any], *, name: str | None = None) -> Tool:
    """A typed, documented function as a ``Tool`` (``function_spec``); it runs in this
    process. Arguments are checked against its schema first (a number written as text is
    coerced); an exception it raises is the model's observation."""
    spec = function_spec(fn, name=name)

    def run(args: Mapping[str, Any]) -> str:
        try:
            checked = check_spec_arguments(spec, args)
        except ValueError as exc:
            raise ToolError(str(exc), hint=f"{spec.name} takes "
                            f"{json.dumps(spec.parameters.get('properties', {}))}") from exc
        value = fn(**checked)
        if inspect.isawaitable(value):
            value = _run_coroutine(value)
        return _text(value)

    return Tool(spec, run)


def is_langchain_tool(obj: Any) -> bool:
    """Whether ``obj`` is a LangChain ``BaseTool`` (checked without importing LangChain)."""
    return any(c.__name__ == "BaseTool" and c.__module__.startswith("langchain_core")
               for c in type(obj).__mro__)


def langchain_tool(tool: Any) -> Tool:
    """A LangChain ``BaseTool`` as a ``Tool``: its name, description and argument schema
    (the arguments the model fills; injected ones stay LangChain's), called with
    ``invoke``. ``return_direct`` makes its output the answer, as in LangChain."""
    # heavy: langchain-core
    from langchain_core.utils.function_calling import convert_to_openai_tool

    fn = convert_to_openai_tool(tool)["function"]
    params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
    spec = ToolSpec(name=tool.name, description=tool.description or tool.name,
                    parameters=params, source=f"langchain:{type(tool).__name__}",
                    returns_answer=bool(getattr(tool, "return_direct", False)))

    def run(args: Mapping[str, Any]) -> str:
        out = tool.invoke(dict(args))
        content = getattr(out, "content", out)  # a ToolMessage from a content_and_artifact tool
        return _text(content)

    return Tool(spec, run)


def import_function(ref: str) -> Callable[..., Any]:
    """The function ``module:function`` or ``path/to/file.py:function`` names (what
    ``whetstone run --tools`` takes); ``ConfigError`` when it cannot be found."""
    return load_function(ref, what="tool")


__all__ = ["function_spec", "function_tool", "import_function", "is_langchain_tool",
           "langchain_tool"]
