"""Run untrusted Python (the ``python`` tool, every learned tool) in a sandbox.

Each call is a fresh process tree in a fresh temporary directory with a wall-clock timeout,
output read as it comes (only the head is kept; a flood is killed), and limits on memory and
process count for the whole call (``tools/limits.py``: a cgroup where one is writable, else a
watchdog). Where bubblewrap works, the call also runs in its own namespaces with a read-only view
of only what it needs (``tools/isolation.py``): no network, no host ``/proc``, no home, no
``/etc``, and nothing it starts survives it. Where bubblewrap is missing or cannot start, the call
runs as a plain subprocess (``isolation="process"``), and every result and ``Sandbox.status``
say so: that mode keeps the limits but not the isolation. See docs/sandbox.md.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from whetstone.engine.errors import ToolError
from whetstone.tools.isolation import (
    DEFAULT_PACKAGES,
    REPORT_PREFIX,
    SITE_IN_SANDBOX,
    BwrapProbe,
    PythonView,
    bwrap_argv,
    find_bwrap,
    probe_bwrap,
)
from whetstone.tools.limits import (
    CgroupPlace,
    LimitKind,
    Limits,
    children,
    find_cgroup_place,
    make_limiter,
    stop_and_kill,
)
from whetstone.tools.sandbox_io import (
    HARD_OUTPUT_BYTES,
    KILL_GRACE_S,
    MAX_OUTPUT_BYTES,
    Sink,
    close_pipes,
    drain,
    pump,
)

__all__ = ["DEFAULT_MAX_TASKS", "DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT_S", "HARD_OUTPUT_BYTES",
           "MAX_OUTPUT_BYTES", "Sandbox", "SandboxResult", "SandboxStatus", "default_sandbox",
           "echo_last_expression", "run_python"]

log = logging.getLogger("whetstone.sandbox")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_TASKS = 64
DEFAULT_MAX_DISK_MB = 256  # everything the call writes into its folder, together
MAX_DISK_ENTRIES = 10_000
# Disk use is counted in allocated blocks, which include the script, folders and the file
# system's own bookkeeping: a file that stops at its size limit (= the folder's limit) must
# not also trip the folder's watcher because of that overhead.
DISK_SLACK_BYTES = 1024 * 1024
MAX_COLLECT_BYTES = 32 * 1024 * 1024  # what may come back from the call's ``out/`` folder
SCRIPT = "main.py"
TICK_S = 0.05  # how often limits, disk use and left-behind processes are checked
_MARK = "WHETSTONE_SANDBOX_CALL"  # process mode: finds what a call left behind
Isolation = Literal["bwrap", "process"]
WEAK_ISOLATION = ("bubblewrap is unavailable ({why}): tool code runs as a plain subprocess "
                  "that can read your files, see your processes and use the network. Install "
                  "it (Debian/Ubuntu: apt-get install bubblewrap).")
WEAK_LIMITS = ("no writable cgroup: memory and process limits are enforced by a watchdog "
               "that polls every {tick:g} s (a burst between two polls is not seen)")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    duration_s: float
    memory_exceeded: bool = False
    output_exceeded: bool = False  # killed for printing more than HARD_OUTPUT_BYTES
    processes_exceeded: bool = False  # a fork was refused (or the watchdog counted too many)
    disk_exceeded: bool = False  # wrote more than its folder may hold
    leftovers: int = 0  # processes still running when the program ended; all were killed
    isolation: Isolation = "process"
    limits: LimitKind = "watchdog"
    warnings: tuple[str, ...] = ()
    outputs: Mapping[str, bytes] = field(default_factory=dict)  # files left under collect/
    skipped: tuple[str, ...] = ()  # what under collect/ was not read: "out/x (a FIFO)"

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and not self.memory_exceeded
                and not self.processes_exceeded and not self.disk_exceeded)

    def failure(self, *, timeout_s: float, memory_mb: int, max_tasks: int) -> str | None:
        """The one-line error a tool shows the model for this call; None when it succeeded."""
        if self.timed_out:
            return f"timed out after {timeout_s:g} s and was killed"
        if self.output_exceeded:
            return (f"printed more than {HARD_OUTPUT_BYTES} bytes and was killed; print a "
                    "summary instead")
        if self.memory_exceeded:
            return f"exceeded the {memory_mb} MB memory limit"
        if self.processes_exceeded:
            return f"hit the process limit ({max_tasks} processes and threads) and was stopped"
        if self.disk_exceeded:
            return "wrote more than its folder may hold and was killed"
        if self.returncode != 0:
            last = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""
            return f"exit code {self.returncode}: {last}".rstrip(": ")
        return None

    def metadata(self) -> dict[str, Any]:
        """What a tool result records about how the code was sandboxed (JSON-safe; a weak
        mode's warnings included)."""
        sandbox: dict[str, Any] = {"isolation": self.isolation, "limits": self.limits}
        if self.warnings:
            sandbox["warnings"] = list(self.warnings)
        meta: dict[str, Any] = {"sandbox": sandbox}
        if self.leftovers:
            meta["leftovers_killed"] = self.leftovers
        if self.skipped:
            meta["not_collected"] = list(self.skipped)
        return meta


@dataclass(frozen=True)
class SandboxStatus:
    """How calls are sandboxed on this machine: what ``whetstone`` shows the user."""

    isolation: Isolation
    limits: LimitKind
    bwrap: str | None
    bwrap_version: str | None
    python: str
    packages: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def strong(self) -> bool:
        return self.isolation == "bwrap" and self.limits != "watchdog"

    def to_dict(self) -> dict[str, Any]:
        return {"isolation": self.isolation, "limits": self.limits, "bwrap": self.bwrap,
                "bwrap_version": self.bwrap_version, "python": self.python,
                "packages": list(self.packages), "warnings": list(self.warnings),
                "strong": self.strong}

    def describe(self) -> str:
        iso = (f"bubblewrap ({self.bwrap_version or self.bwrap}): own namespaces, no network, "
               "read-only view" if self.isolation == "bwrap" else "plain subprocess (WEAK)")
        lines = [f"isolation: {iso}", f"limits: {self.limits} (whole call)",
                 f"python: {self.python}; packages: {', '.join(self.packages) or '(none)'}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


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


def place_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (relative name -> content) under ``root``; a name that is empty,
    absolute, climbs with ``..`` or lands on the program itself is refused before anything of
    the call is written."""
    checked: list[tuple[Path, str | bytes]] = []
    for name, content in files.items():
        parts = Path(name).parts if name else ()
        if not parts or name in (".", SCRIPT) or "\x00" in name:
            raise ToolError(f"file name {name!r} is empty or reserved",
                            hint="name files relative to the program's folder, e.g. data/x.txt")
        target = (root / name).resolve()
        if Path(name).is_absolute() or ".." in parts or not target.is_relative_to(root.resolve()):
            raise ToolError(f"file name {name!r} is outside its folder",
                            hint="name files relative to the program's folder, without '..'")
        checked.append((target, content))
    for target, content in checked:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise ToolError(f"cannot place {target.relative_to(root.resolve())}: "
                            f"{exc.strerror or exc}", hint="use short, plain file names") from exc


def _disk_use(root: Path) -> tuple[int, int]:
    """(bytes, entries) under ``root``, links not followed; stops counting past the cap."""
    total, entries = 0, 0
    todo = [root]
    while todo and entries <= MAX_DISK_ENTRIES:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as it:
            for entry in it:
                entries += 1
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(Path(entry.path))
    return total, entries


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
# Non-blocking: opening a FIFO waits for a writer, which a finished call never brings; no
# controlling terminal; no link followed. Only a regular file is then read.
_COLLECT_FLAGS = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                  | getattr(os, "O_CLOEXEC", 0))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _read_regular(path: Path, budget: int) -> bytes | str:
    """The bytes of ``path`` (at most ``budget + 1``), or why it is not read: what it is
    instead of a regular file. The check is on the opened descriptor, so a file swapped for a
    FIFO or a link after the walk saw it is not read either."""
    try:
        fd = os.open(path, _COLLECT_FLAGS)
    except OSError as exc:  # ELOOP: a link; ENXIO: a socket; or gone
        with contextlib.suppress(OSError):
            return _kind(os.lstat(path).st_mode)
        return f"unreadable ({exc.strerror or exc})"
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return _kind(mode)
        return fh.read(budget + 1)


def _collect(folder: Path) -> tuple[dict[str, bytes], list[str]]:
    """Regular files under ``folder`` (relative name -> bytes), bounded, and what was left
    out ("out/x (a FIFO)"). Links (to files or folders), FIFOs, sockets and devices are never
    opened for reading: a call can neither make the caller read a host file for it nor block
    it on a pipe that no one writes."""
    out: dict[str, bytes] = {}
    skipped: list[str] = []
    if folder.is_symlink() or not folder.is_dir():
        return out, skipped
    budget = MAX_COLLECT_BYTES
    for here, dirs, names in os.walk(folder):  # does not descend into linked folders
        dirs.sort()
        for name in sorted(names):
            path = Path(here) / name
            rel = path.relative_to(folder)
            data = _read_regular(path, budget)
            if isinstance(data, str):
                skipped.append(f"{folder.name}/{rel} ({data})")
                continue
            if len(data) > budget:
                skipped.append(f"{folder.name}/{rel} (over {MAX_COLLECT_BYTES} bytes in all)")
                return out, skipped
            budget -= len(data)
            out[str(rel)] = data
    return out, skipped


def _marked(nonce: str) -> list[int]:
    needle = f"{_MARK}={nonce}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


def _sweep_marked(nonce: str) -> int:
    """Kill processes carrying this call's mark in their environment (process mode: the way
    to find a ``setsid`` daemon that left the process tree). Returns how many."""
    return len(stop_and_kill(lambda _known: _marked(nonce)))


class Sandbox:
    """Runs Python programs isolated as well as this machine allows; ``status`` says how.

    Build one with ``Sandbox.detect()`` (it probes bubblewrap and cgroups once) and reuse it."""

    def __init__(self, status: SandboxStatus, view: PythonView | None,
                 place: CgroupPlace | None) -> None:
        self.status = status
        self.view = view
        self.place = place

    @classmethod
    def detect(cls, *, isolation: Literal["auto", "bwrap", "process"] = "auto",
               limits: Literal["auto", "cgroup", "watchdog"] = "auto",
               packages: Sequence[str] = DEFAULT_PACKAGES, bwrap: str | None = None) -> Sandbox:
        """Probe the machine. ``isolation="bwrap"`` and ``limits="cgroup"`` raise ``ToolError``
        when that mode cannot work here; ``"process"`` and ``"watchdog"`` force the weaker
        modes. ``bwrap`` is the executable to use (default: found on PATH)."""
        view = PythonView.of_this_interpreter(packages)
        probe = BwrapProbe(None, None, False, "process isolation was requested")
        if isolation != "process":
            with tempfile.TemporaryDirectory(prefix="whetstone-probe-") as scratch:
                probe = probe_bwrap(view, scratch, bwrap or find_bwrap())
            if not probe.works and isolation == "bwrap":
                raise ToolError(f"cannot sandbox tool code: {probe.problem}",
                                hint="install bubblewrap (apt-get install bubblewrap) and make "
                                     "sure user namespaces are enabled")
        place = find_cgroup_place() if limits != "watchdog" else None
        if place is None and limits == "cgroup":
            raise ToolError("no writable cgroup with the memory and pids controllers here",
                            hint="run as root, or in a delegated cgroup v2 subtree")
        warnings = [] if probe.works else [WEAK_ISOLATION.format(why=probe.problem)]
        if place is None:
            warnings.append(WEAK_LIMITS.format(tick=TICK_S))
        if view.missing and probe.works:
            warnings.append(f"not installed, so not importable in the sandbox: "
                            f"{', '.join(view.missing)}")
        status = SandboxStatus(
            "bwrap" if probe.works else "process", place.kind if place else "watchdog",
            probe.path, probe.version, view.python if probe.works else sys.executable,
            tuple(name for _, name in view.packages if not name.endswith(".libs")),
            tuple(warnings))
        for w in status.warnings:
            log.warning("tool sandbox: %s", w)
        return cls(status, view if probe.works else None, place)

    def run_python(self, code: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   memory_mb: int = DEFAULT_MEMORY_MB, max_tasks: int = DEFAULT_MAX_TASKS,
                   max_disk_mb: int = DEFAULT_MAX_DISK_MB, stdin: str | bytes | None = None,
                   args: Sequence[str] = (), files: Mapping[str, str | bytes] | None = None,
                   env: Mapping[str, str] | None = None, collect: str | None = None
                   ) -> SandboxResult:
        """Run ``code`` as a script; never raises for the program's faults (a bad file name
        from the caller is a ``ToolError``). Returns within about ``timeout_s + 2 *
        KILL_GRACE_S`` whatever the program does. ``collect`` names a folder (relative to the
        program's) whose files come back in ``outputs``."""
        start = time.perf_counter()
        limits = Limits(memory_mb=memory_mb, max_tasks=max_tasks,
                        max_file_mb=min(max_disk_mb, 64))
        with tempfile.TemporaryDirectory(prefix="whetstone-sandbox-") as tmp:
            root = Path(tmp)
            place_files(root, files or {})
            (root / SCRIPT).write_text(code, encoding="utf-8")
            call = _Call(self, root, limits, max_disk_mb)
            data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
            result = call.run(args, data, timeout_s, env or {})
            outputs, skipped = _collect(root / collect) if collect else ({}, [])
        stderr = result.stderr
        if skipped:
            stderr += (f"\n... [not collected, only regular files come back: "
                       f"{', '.join(skipped[:5])}]")
        return replace(result, outputs=outputs, skipped=tuple(skipped), stderr=stderr,
                       duration_s=time.perf_counter() - start)


class _Call:
    """One run of one program: start it gated, attach the limits, pump, stop, clean up."""

    def __init__(self, box: Sandbox, root: Path, limits: Limits, max_disk_mb: int) -> None:
        self.box = box
        self.root = root
        self.limits = limits
        self.max_disk = max_disk_mb * 1024 * 1024
        self.nonce = uuid.uuid4().hex
        self.limiter = make_limiter(box.place, limits)
        self.leftovers = 0

    def _env(self, extra: Mapping[str, str]) -> dict[str, str]:
        tmp = str(self.root)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if self.box.view is not None:
            env["PYTHONPATH"] = SITE_IN_SANDBOX
        return {**env, **extra}

    def _argv(self, args: Sequence[str], extra_env: Mapping[str, str]
              ) -> tuple[list[str], dict[str, str]]:
        # The gate: a shell that waits for one line on stdin before it execs the rest, so the
        # cgroup and rlimits are in place before the program (or bubblewrap) can fork.
        gate = ["/bin/sh", "-c", 'IFS= read -r _ || exit 125; exec "$@"', "whetstone-gate"]
        script = str(self.root / SCRIPT)
        view = self.box.view
        if view is None or self.box.status.bwrap is None:
            env = {**self._env(extra_env), _MARK: self.nonce}
            return [*gate, sys.executable, "-s", "-B", script, *args], env
        command = [view.python, "-s", "-B", script, *args]
        argv = bwrap_argv(self.box.status.bwrap, view, str(self.root), self._env(extra_env),
                          command, f"{REPORT_PREFIX}-{self.nonce}")
        # bubblewrap's init can read its own environment: give it nothing of ours.
        return [*gate, *argv], {"PATH": "/usr/bin:/bin"}

    def _check(self, proc: subprocess.Popen[bytes]) -> str | None:
        tripped = self.limiter.tripped()
        if tripped is not None:
            return tripped
        used, entries = _disk_use(self.root)
        if used > self.max_disk + DISK_SLACK_BYTES or entries > MAX_DISK_ENTRIES:
            return "disk"
        if proc.poll() is not None and self.box.view is None:
            # The program is gone but its pipes are not closed: what holds them was left
            # behind (process mode; under bubblewrap our init has killed them already).
            self.leftovers += self.limiter.kill_all() + _sweep_marked(self.nonce)
        return None

    def run(self, args: Sequence[str], data: bytes, timeout_s: float,
            extra_env: Mapping[str, str]) -> SandboxResult:
        out, err = Sink(), Sink()
        argv, env = self._argv(args, extra_env)
        stopped: str | None = "interrupted"
        proc = subprocess.Popen(argv, cwd=self.root, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            self.limiter.attach(proc.pid, is_reaped=lambda: proc.returncode is not None)
            stopped = pump(proc, b"\n" + data, out, err, time.monotonic() + timeout_s,
                           lambda: self._check(proc), TICK_S)
        except OSError as exc:  # the limits could not be applied: the program never ran
            err.add(f"the sandbox could not apply its limits: {exc}".encode())
            stopped = "error"
        finally:
            if stopped is not None:  # also on an exception here: never leave it running
                self._kill(proc)
                drain(proc, out, err)
            close_pipes(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=KILL_GRACE_S)  # the leader may be in uninterruptible I/O
            tripped = self.limiter.tripped()
            left = self._clean_up()
        return self._result(proc, out, err, stopped or tripped, left)

    def _clean_up(self) -> int:
        """Kill whatever of the call is still there; the count is what a program that had
        finished left behind (in process mode: under bubblewrap our init reports that)."""
        killed = self.limiter.kill_all()
        if self.box.view is None:
            killed += _sweep_marked(self.nonce)
        self.limiter.close()
        return killed if self.box.view is None else 0

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        def kill_group() -> None:
            # One signal per process group reaches a whole fork bomb at once: our child's group
            # (the program, or bubblewrap) and its children's (under bubblewrap, the group of
            # the namespace's init: ten times faster than letting the namespace die alone).
            # Once our child is reaped its pid may name another process: the limiter (cgroup,
            # watchdog, marks) finds what is left instead.
            if proc.returncode is not None:
                return
            ours = os.getpgrp()
            for pid in [*children(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    if group != ours:
                        os.killpg(group, signal.SIGKILL)

        self.limiter.kill_all(first=kill_group)
        if self.box.view is None:
            _sweep_marked(self.nonce)

    def _result(self, proc: subprocess.Popen[bytes], out: Sink, err: Sink, stopped: str | None,
                left: int) -> SandboxResult:
        report = err.take_line(f"{REPORT_PREFIX}-{self.nonce}".encode())
        leftovers = self.leftovers + (0 if stopped else left)
        if report is not None:
            with contextlib.suppress(ValueError, IndexError):
                leftovers += int(report.split()[1])
        stderr = err.text()
        notes = {
            "output": f"killed: the program printed more than {HARD_OUTPUT_BYTES} bytes; "
                      "print less, e.g. a summary or the first lines",
            "memory": f"killed: the program and its children used more than "
                      f"{self.limits.memory_mb} MB together",
            "processes": f"stopped: the program tried to run more than "
                         f"{self.limits.max_tasks} processes and threads",
            "disk": f"killed: the program wrote more than {self.max_disk // 2**20} MB or "
                    f"{MAX_DISK_ENTRIES} files",
        }
        if stopped in notes:
            stderr += f"\n... [{notes[stopped]}]"
        if leftovers and not stopped:
            stderr += (f"\n... [the program left {leftovers} process(es) running; "
                       "they were killed]")
        timed_out = stopped == "timeout"
        status = self.box.status
        return SandboxResult(
            stdout=out.text(), stderr=stderr,
            returncode=None if timed_out else proc.returncode,
            timed_out=timed_out, duration_s=0.0,
            memory_exceeded=stopped == "memory" or "MemoryError" in stderr,
            output_exceeded=stopped == "output",
            processes_exceeded=stopped == "processes",
            disk_exceeded=stopped == "disk",
            leftovers=leftovers, isolation=status.isolation, limits=self.limiter.kind,
            warnings=status.warnings)


@functools.cache
def default_sandbox() -> Sandbox:
    """The sandbox for this machine, probed once per process (a probe costs one bubblewrap
    start); tools built without an explicit ``Sandbox`` use it."""
    return Sandbox.detect()


def run_python(code: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
               memory_mb: int = DEFAULT_MEMORY_MB, stdin: str | None = None,
               args: tuple[str, ...] = (), files: Mapping[str, str | bytes] | None = None,
               sandbox: Sandbox | None = None, max_tasks: int = DEFAULT_MAX_TASKS
               ) -> SandboxResult:
    """Run ``code`` in ``sandbox`` (the machine's default when None); see
    ``Sandbox.run_python``."""
    box = sandbox or default_sandbox()
    return box.run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, max_tasks=max_tasks,
                          stdin=stdin, args=args, files=files)
