"""Built-in tools: safe arithmetic and the python subprocess with its limits."""

from __future__ import annotations

import pytest

from engine.errors import ToolError
from tools.base import Toolbox
from tools.builtin import builtin_tools, calculate, make_python
from tools.sandbox import echo_last_expression, run_python


@pytest.mark.parametrize("expr,expected", [
    ("17 * 23", "391"), ("17 × 23", "391"), ("2^10", "1024"), ("(1200 - 350) / 5", "170"),
    ("7 / 2", "3.5"), ("-3 + 1", "-2"), ("sqrt(16)", "4"), ("1,000 + 1", "1001"),
    ("round(2.345, 2)", "2.35"), ("17*23=", "391"), ("10 // 3", "3"), ("2 ** -1", "0.5"),
])
def test_calculator_evaluates(expr: str, expected: str) -> None:
    assert calculate(expr) == expected


@pytest.mark.parametrize("expr,message", [
    ("__import__('os').system('echo hi')", "unsupported expression"),
    ("open('/etc/passwd')", "unsupported expression"),
    ("(1).__class__", "unsupported expression"),
    ("9 ** 9 ** 9", "too large"),
    ("1 / 0", "division by zero"),
    ("17 *", "cannot parse"),
    ("", "empty expression"),
    ("x + 1", "unsupported expression"),
])
def test_calculator_refuses_what_is_not_arithmetic(expr: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        calculate(expr)


def test_toolbox_reports_failures_as_observations() -> None:
    box = Toolbox.of(builtin_tools())
    assert box.call("calculator", "1/0").observation("calculator") == \
        "Error in calculator: division by zero"
    assert box.call("calculator", {"expression": "2+2"}).output == "4"
    assert box.call("calculator", '{"expression": "3*3"}').output == "9"
    assert "unknown tool 'browser'" in box.call("browser", "x").error  # type: ignore[operator]
    assert box.call("calculator", {"expr": "5+5"}).output == "10"  # lenient argument name


def test_python_tool_prints_the_last_expression() -> None:
    res = Toolbox.of([make_python()]).call("python", {"code": "x = 6\nx * 7"})
    assert res.ok and res.output.strip() == "42"


def test_python_tool_reports_exceptions() -> None:
    res = Toolbox.of([make_python()]).call("python", {"code": "raise ValueError('boom')"})
    assert res.error == "exit code 1: ValueError: boom"
    assert "Traceback" in res.output


def test_python_tool_kills_a_hang_at_its_timeout() -> None:
    res = Toolbox.of([make_python(timeout_s=1)]).call("python", {"code": "while True: pass"})
    assert res.timed_out and "timed out after 1 s" in (res.error or "")
    assert res.duration_s < 5


def test_python_tool_kills_children_too() -> None:
    code = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "import time; time.sleep(60)")
    res = run_python(code, timeout_s=1)
    assert res.timed_out and res.duration_s < 5  # communicate() returned: no orphan holds pipes


def test_python_tool_enforces_the_memory_limit() -> None:
    res = Toolbox.of([make_python(memory_mb=256)]).call(
        "python", {"code": "x = bytearray(1024 * 1024 * 1024)"})
    assert res.error == "exceeded the 256 MB memory limit"


def test_python_runs_isolated_in_a_temp_dir() -> None:
    res = run_python("import os; print(os.getcwd()); print(os.environ.get('WHETSTONE_HOME'))")
    cwd, home = res.stdout.splitlines()
    assert "whetstone-sandbox-" in cwd and home == "None"


def test_echo_last_expression_leaves_statements_and_prints_alone() -> None:
    assert echo_last_expression("print(1)") == "print(1)"
    assert echo_last_expression("x = 1") == "x = 1"
    assert echo_last_expression("def f(:") == "def f(:"
    assert "print(" in echo_last_expression("1 + 1")
