"""Run untrusted Python in a subprocess with a wall-clock timeout and a memory limit.

The child runs in isolated mode (``-I``: no user site, no PYTHON* env), in a fresh temporary
directory, in its own process group so a timeout kills everything it spawned. Output is read
as it comes and only its head is kept, so a program that prints without end costs no memory.
This is the first line of defence; the full sandbox (AST checks, no network) arrives with Dynamo.
"""

from __future__ import annotations

import ast
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
MAX_OUTPUT_BYTES = 64_000  # kept per stream; the rest is counted and cut
HARD_OUTPUT_BYTES = 4 * MAX_OUTPUT_BYTES  # a child printing more than this is killed
KILL_GRACE_S = 0.5  # after a kill, how long to wait for the last output and the exit
_CHUNK = 65_536


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    duration_s: float
    memory_exceeded: bool = False
    output_exceeded: bool = False  # killed for printing more than HARD_OUTPUT_BYTES

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


class _Sink:
    """The first ``MAX_OUTPUT_BYTES`` of one output stream, and how many bytes came in all."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = MAX_OUTPUT_BYTES - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def text(self) -> str:
        text = bytes(self.kept).decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n... [{self.total - len(self.kept)} bytes of output cut]"
        return text


def _pump(proc: subprocess.Popen[bytes], data: bytes, out: _Sink, err: _Sink,
          deadline: float) -> str | None:
    """Feed stdin and read stdout/stderr as they come until the child closes its pipes and
    exits. Returns why it stopped early: ``"timeout"``, ``"output"`` or None."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    pending = memoryview(data)
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for key, _ in sel.select(remaining):
                fd = int(key.fd)
                if fd not in sinks:  # stdin is writable
                    try:
                        pending = pending[os.write(fd, pending[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]  # the child stopped reading: drop the rest
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = _read(fd)
                if chunk is None:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                sinks[fd].add(chunk)
                if out.total + err.total > HARD_OUTPUT_BYTES:
                    return "output"
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "timeout"  # it closed its pipes but kept running
    return None


def _read(fd: int) -> bytes | None:
    """One chunk from a non-blocking pipe; None when nothing is there after all."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None


def _drain(proc: subprocess.Popen[bytes], out: _Sink, err: _Sink) -> None:
    """After a kill, read what the pipes still hold for at most ``KILL_GRACE_S``.

    A grandchild that left the process group (``setsid``) keeps the pipes open, so EOF may
    never come: the wait is bounded instead of lasting as long as the grandchild lives."""
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    deadline = time.monotonic() + KILL_GRACE_S
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(remaining):
                fd = int(key.fd)
                chunk = _read(fd)
                if chunk == b"" or (chunk and out.total + err.total > HARD_OUTPUT_BYTES):
                    sel.unregister(fd)
                elif chunk:
                    sinks[fd].add(chunk)


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass  # stdin with unwritten data to a dead child


def run_python(
    code: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    stdin: str | None = None,
    args: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` as a script in a child interpreter; never raises for the child's faults.

    Returns within about ``timeout_s + 2 * KILL_GRACE_S``, even when the code leaves processes
    behind that hold its output pipes."""
    start = time.perf_counter()
    out, err = _Sink(), _Sink()
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
        stopped: str | None = "interrupted"
        try:
            stopped = _pump(proc, (stdin or "").encode(), out, err,
                            time.monotonic() + timeout_s)
        finally:
            if stopped is not None:  # also on an exception here: never leave the child running
                _kill_group(proc)
                _drain(proc, out, err)
            _close_pipes(proc)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass  # the leader ignored SIGKILL for now (uninterruptible I/O); reaped later
    timed_out = stopped == "timeout"
    output_exceeded = stopped == "output"
    stderr = err.text()
    if output_exceeded:
        stderr += (f"\n... [killed: the program printed more than {HARD_OUTPUT_BYTES} bytes; "
                   "print less, e.g. a summary or the first lines]")
    return SandboxResult(
        stdout=out.text(),
        stderr=stderr,
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        duration_s=time.perf_counter() - start,
        memory_exceeded="MemoryError" in stderr,
        output_exceeded=output_exceeded,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
