"""Built-in tools: ``calculator`` (safe AST arithmetic, no ``eval``) and ``python`` (a script
run in the sandbox of ``tools/sandbox.py``: its own namespaces, whole-call limits, a timeout)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..engine.errors import ToolError
from ..engine.types import ToolSpec
from .base import Tool, ToolResult
from .sandbox import (
    DEFAULT_MAX_TASKS,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    Sandbox,
    default_sandbox,
    echo_last_expression,
)

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_FACTORIAL = 1000  # factorial(1000) has 2568 digits; far larger ones run for seconds


def _factorial(n: Any) -> int:
    # Checked before computing: the size check on the result comes too late for factorial.
    if isinstance(n, int) and n > _MAX_FACTORIAL:
        raise ToolError(f"factorial({n}) is too large (limit factorial({_MAX_FACTORIAL}))",
                        hint="use the python tool with math.lgamma for the size of large "
                             "factorials")
    return math.factorial(n)


_FUNCS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max,
    "floor": math.floor, "ceil": math.ceil, "log": math.log, "log10": math.log10,
    "log2": math.log2, "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "factorial": _factorial, "gcd": math.gcd, "lcm": math.lcm,
}
_CONSTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_MAX_POW_EXPONENT = 1000
_MAX_INT_DIGITS = 4000


def _check_size(value: Any) -> Any:
    if isinstance(value, complex):  # only ** makes one: a negative base, a fractional power
        raise ToolError("the result is not a real number (a negative number raised to a "
                        "fractional power)",
                        hint="for a real root of a negative number write -(8 ** (1/3))")
    if isinstance(value, int) and value.bit_length() > _MAX_INT_DIGITS * 3.33:
        raise ToolError("result too large", hint="split the computation into smaller steps")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POW_EXPONENT:
            raise ToolError(f"exponent {right} is too large (limit {_MAX_POW_EXPONENT})")
        return _check_size(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCS and not node.keywords:
        return _check_size(_FUNCS[node.func.id](*[_eval(a) for a in node.args]))
    what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise ToolError(
        f"unsupported expression {what!r}",
        hint="use numbers, + - * / // % **, parentheses and "
             + ", ".join(sorted(_FUNCS)) + ", pi, e",
    )


def _normalise(expression: str) -> str:
    # Models write 17 × 23, 2^10, 1,000 and trailing '='; accept the common forms.
    expr = expression.strip().strip("`").rstrip("=").strip()
    expr = expr.replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    return expr.replace(",", "") if "(" not in expr else expr


def calculate(expression: str) -> str:
    """Evaluate arithmetic safely and return the result as text (ints stay exact)."""
    expr = _normalise(expression)
    if not expr:
        raise ToolError("empty expression", hint="pass an arithmetic expression such as 17*23")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}",
                        hint="pass one arithmetic expression such as (3+4)*5") from exc
    try:
        value = _eval(tree)
    except ZeroDivisionError as exc:
        raise ToolError("division by zero") from exc
    except (OverflowError, ValueError, TypeError) as exc:
        raise ToolError(str(exc)) from exc
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return repr(round(value, 12))
    return str(value)


CALCULATOR_SPEC = ToolSpec(
    name="calculator",
    # No worked numbers here: a small model copied "17 * 23" from this line into calls on
    # tasks that never mention them, and answered 391 (seen on both engines).
    description="Evaluate an arithmetic expression written with the task's numbers, exactly. "
                "Supports + - * / // % **, parentheses, sqrt, abs, round, min, max, floor, ceil, "
                "log, exp, pi.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string",
                                      "description": "The arithmetic expression to evaluate."}},
        "required": ["expression"],
    },
    source="builtin:calculator",
)

PYTHON_SPEC = ToolSpec(
    name="python",
    description="Run a short Python 3 program and return what it prints (the value of a final "
                "expression is printed too). No network, no files kept between calls.",
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code to run."}},
        "required": ["code"],
    },
    source="builtin:python",
)


def _calculator_fn(args: Mapping[str, Any]) -> str:
    expr = args.get("expression")
    if expr is None:  # models sometimes name the argument differently
        expr = next((v for v in args.values() if isinstance(v, (str, int, float))), None)
    if expr is None:
        raise ToolError("missing 'expression'", hint='call calculator with {"expression": "17*23"}')
    return calculate(str(expr))


def make_calculator() -> Tool:
    return Tool(CALCULATOR_SPEC, _calculator_fn)


def make_python(timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB, *,
                max_tasks: int = DEFAULT_MAX_TASKS, sandbox: Sandbox | None = None) -> Tool:
    """The ``python`` tool with its limits. Without ``sandbox`` it uses the machine's default,
    probed at the first call."""

    def run(args: Mapping[str, Any]) -> ToolResult:
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError("missing 'code'", hint='call python with {"code": "print(1+1)"}')
        box = sandbox or default_sandbox()
        res = box.run_python(echo_last_expression(code), timeout_s=timeout_s,
                             memory_mb=memory_mb, max_tasks=max_tasks)
        output = res.stdout + (("\n" if res.stdout else "") + res.stderr if res.stderr else "")
        error = res.failure(timeout_s=timeout_s, memory_mb=memory_mb, max_tasks=max_tasks)
        return ToolResult(output, error, res.duration_s, timed_out=res.timed_out,
                          metadata=res.metadata())

    return Tool(replace(PYTHON_SPEC, timeout_s=timeout_s), run)


def builtin_tools(names: tuple[str, ...] = ("calculator", "python"), *,
                  python_timeout_s: float = DEFAULT_TIMEOUT_S,
                  python_memory_mb: int = DEFAULT_MEMORY_MB) -> list[Tool]:
    """The built-in tools by name."""
    makers: dict[str, Callable[[], Tool]] = {
        "calculator": make_calculator,
        "python": lambda: make_python(python_timeout_s, python_memory_mb),
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ToolError(f"unknown built-in tool(s): {', '.join(unknown)}",
                        hint=f"built-in tools: {', '.join(makers)}")
    return [makers[n]() for n in names]
