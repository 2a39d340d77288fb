"""Run untrusted Python in a subprocess with a wall-clock timeout and a memory limit.

The child runs in isolated mode (``-I``: no user site, no PYTHON* env), in a fresh temporary
directory, in its own process group so a timeout kills everything it spawned. This is the
first line of defence; the full sandbox (AST checks, no network) arrives with Dynamo.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
MAX_OUTPUT_BYTES = 64_000


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    duration_s: float
    memory_exceeded: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def echo_last_expression(code: str) -> str:
    """Like a REPL: print the value of a trailing expression (``17*23`` -> prints 391).

    Code that does not parse is returned unchanged so the child reports the SyntaxError.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    if isinstance(last.value, ast.Call) and getattr(last.value.func, "id", "") == "print":
        return code
    tail = ast.parse(
        f"__v = ({ast.unparse(last.value)})\n"
        "if __v is not None:\n"
        "    print(repr(__v) if isinstance(__v, str) else __v)\n"
    ).body
    tree.body[-1:] = tail
    return ast.unparse(tree)


def _limits(memory_mb: int) -> None:  # runs in the child before exec
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _decode(data: bytes | None) -> str:
    if not data:
        return ""
    text = data[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_OUTPUT_BYTES:
        text += f"\n... [{len(data) - MAX_OUTPUT_BYTES} bytes of output cut]"
    return text


def run_python(
    code: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    stdin: str | None = None,
    args: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` as a script in a child interpreter; never raises for the child's faults."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="whetstone-sandbox-") as tmp:
        script = Path(tmp) / "main.py"
        script.write_text(code, encoding="utf-8")
        for name, text in (files or {}).items():
            target = Path(tmp) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONIOENCODING": "utf-8",
               "HOME": tmp, "TMPDIR": tmp}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(script), *args],
            cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=lambda: _limits(memory_mb),  # noqa: PLW1509 -- rlimits must be set in the child; it only calls setrlimit
        )
        try:
            out, err = proc.communicate(input=(stdin or "").encode(), timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            timed_out = True
    stderr = _decode(err)
    return SandboxResult(
        stdout=_decode(out),
        stderr=stderr,
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        duration_s=time.perf_counter() - start,
        memory_exceeded="MemoryError" in stderr,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
