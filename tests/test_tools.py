"""Built-in tools: safe arithmetic and the python subprocess with its limits."""

from __future__ import annotations

import time

import pytest

from tests.sandbox_support import marker, survivors
from whetstone.engine.errors import ToolError
from whetstone.tools.base import Toolbox
from whetstone.tools.builtin import builtin_tools, calculate, make_python
from whetstone.tools.sandbox import MAX_OUTPUT_BYTES, echo_last_expression, run_python


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


def test_calculator_bounds_factorial_before_computing_and_refuses_complex_results() -> None:
    assert calculate("factorial(10)") == "3628800"
    assert calculate("factorial(1000)").startswith("402387260077")
    start = time.monotonic()
    with pytest.raises(ToolError, match=r"factorial\(2000000\) is too large"):
        calculate("factorial(2000000)")
    assert time.monotonic() - start < 1
    with pytest.raises(ToolError, match="not a real number"):
        calculate("(-8)**(1/3)")
    with pytest.raises(ToolError, match="cannot be interpreted as an integer"):
        calculate("factorial(2.5)")


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


def test_python_tool_returns_when_a_setsid_grandchild_holds_the_pipes() -> None:
    word = marker()
    code = ("import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()  # leaves the process group, so killpg misses it\n"
            "    print('grandchild', os.getpid(), flush=True)\n"
            "    time.sleep(60)\n"
            "    os._exit(0)\n"
            "time.sleep(60)")
    start = time.monotonic()
    res = run_python(code, timeout_s=1, args=(word,))
    wall = time.monotonic() - start
    # The pid it printed is its own namespace's under bubblewrap: never kill by it here.
    assert survivors(word) == []
    assert res.timed_out and res.returncode is None
    assert wall < 3.5  # timeout + the bounded grace, not the grandchild's lifetime
    assert "grandchild" in res.stdout  # output printed before the kill is kept


def test_python_tool_keeps_the_head_of_endless_output_and_kills_it() -> None:
    code = "import sys\nb = b'x' * (1 << 20)\nwhile True: sys.stdout.buffer.write(b)"
    res = run_python(code, timeout_s=20)
    assert res.output_exceeded and not res.timed_out and not res.ok
    assert res.duration_s < 10  # killed at the output cap, not at the timeout
    assert res.stdout.startswith("x" * MAX_OUTPUT_BYTES)
    assert len(res.stdout) < MAX_OUTPUT_BYTES + 100 and "bytes of output cut" in res.stdout
    tool = Toolbox.of([make_python(timeout_s=20)]).call("python", {"code": code})
    assert "printed more than" in (tool.error or "")


def test_python_tool_passes_large_stdin_and_keeps_small_output_whole() -> None:
    res = run_python("import sys; print(len(sys.stdin.read()))", stdin="y" * 1_000_000)
    assert res.ok and res.stdout == "1000000\n" and not res.output_exceeded


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
