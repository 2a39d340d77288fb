"""Run untrusted Python (the ``python`` tool, every learned tool) in a sandbox.

Each call is a fresh process tree in a fresh temporary directory with a wall-clock timeout,
output read as it comes (only the head is kept; a flood is killed), and limits on memory and
process count for the whole call (``tools/sandbox_limits.py``: a cgroup where one is writable, else a
watchdog), and never as root (``tools/privileges.py``: where Whetstone is root, each call gives
root up for uid 65534 first). Where bubblewrap works, the call also runs in its own namespaces,
under a seccomp filter, with a read-only view of only what it needs (``tools/isolation.py``):
no network, no host ``/proc``, no home, no ``/etc``, and nothing it starts survives it. Where bubblewrap is missing or cannot start, the call
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
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..engine.errors import ToolError
from .isolation import (
    DEFAULT_PACKAGES,
    REPORT_PREFIX,
    SITE_IN_SANDBOX,
    BwrapProbe,
    Launch,
    PythonView,
    find_bwrap,
    probe_bwrap,
)
from .privileges import (
    Drop,
    Identity,
    chown_tree,
    plan_drop,
    reachable,
    remove_stage_dir,
    work_parent,
)
from .sandbox_files import (
    MAX_DISK_ENTRIES,
    SCRIPT,
    collect_outputs,
    disk_use,
    place_files,
)
from .sandbox_io import (
    HARD_OUTPUT_BYTES,
    KILL_GRACE_S,
    MAX_OUTPUT_BYTES,
    Sink,
    close_pipes,
    drain,
    pump,
)
from .sandbox_limits import (
    CgroupPlace,
    LimitKind,
    Limits,
    children,
    find_cgroup_place,
    make_limiter,
    stop_and_kill,
)
from .seccomp import Filter, build_filter

__all__ = ["DEFAULT_MAX_TASKS", "DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT_S", "HARD_OUTPUT_BYTES",
           "MAX_OUTPUT_BYTES", "Sandbox", "SandboxResult", "SandboxStatus", "default_sandbox",
           "echo_last_expression", "run_python"]

log = logging.getLogger("whetstone.sandbox")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_TASKS = 64
DEFAULT_MAX_DISK_MB = 256  # everything the call writes into its folder, together
# Disk use is counted in allocated blocks, which include the script, folders and the file
# system's own bookkeeping: a file that stops at its size limit (= the folder's limit) must
# not also trip the folder's watcher because of that overhead.
DISK_SLACK_BYTES = 1024 * 1024
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
    runs_as: str = ""  # the identity sandboxed code has, in words
    seccomp: int = 0  # system calls its filter refuses (0: no filter)

    @property
    def strong(self) -> bool:
        return self.isolation == "bwrap" and self.limits != "watchdog"

    def to_dict(self) -> dict[str, Any]:
        return {"isolation": self.isolation, "limits": self.limits, "bwrap": self.bwrap,
                "bwrap_version": self.bwrap_version, "python": self.python,
                "packages": list(self.packages), "warnings": list(self.warnings),
                "runs_as": self.runs_as, "seccomp": self.seccomp, "strong": self.strong}

    def describe(self) -> str:
        iso = (f"bubblewrap ({self.bwrap_version or self.bwrap}): own namespaces, no network, "
               "read-only view" if self.isolation == "bwrap" else "plain subprocess (WEAK)")
        lines = [f"isolation: {iso}", f"runs as: {self.runs_as}",
                 f"seccomp: {self.seccomp} system calls refused" if self.seccomp
                 else "seccomp: none", f"limits: {self.limits} (whole call)",
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

    Build one with ``Sandbox.detect()`` (it probes bubblewrap and cgroups once) and reuse it.
    Code never runs as root: where Whetstone is root, each call gives root up for
    ``identity`` first (``tools/privileges.py``), or is refused when it cannot."""

    def __init__(self, status: SandboxStatus, launch: Launch | None,
                 place: CgroupPlace | None, *, seccomp: Filter | None = None,
                 drop: Drop | None = None, refusal: str | None = None,
                 work_dir: str | None = None, identity: Identity | None = None) -> None:
        self.status = status
        self.launch = launch  # None: process mode
        self.place = place
        self.seccomp = seccomp if seccomp is not None and seccomp.program else None
        self.drop = drop  # process mode as root: how it gives root up
        self.refusal = refusal  # why no code may run here at all
        self.work_dir = work_dir  # where call folders are made (None: the default)
        self.identity = identity or Identity()
        if launch is not None and launch.drop is not None and launch.drop.stage_dir:
            weakref.finalize(self, remove_stage_dir, launch.drop.stage_dir)

    @property
    def view(self) -> PythonView | None:
        return self.launch.view if self.launch is not None else None

    @classmethod
    def detect(cls, *, isolation: Literal["auto", "bwrap", "process"] = "auto",
               limits: Literal["auto", "cgroup", "watchdog"] = "auto",
               packages: Sequence[str] = DEFAULT_PACKAGES, bwrap: str | None = None,
               identity: Identity | None = None) -> Sandbox:
        """Probe the machine. ``isolation="bwrap"`` and ``limits="cgroup"`` raise ``ToolError``
        when that mode cannot work here; ``"process"`` and ``"watchdog"`` force the weaker
        modes. ``bwrap`` is the executable to use (default: found on PATH); ``identity`` the
        uid/gid code runs as where Whetstone is root (default 65534/65534)."""
        ident = identity or Identity()
        view = PythonView.of_this_interpreter(packages)
        probe = BwrapProbe(None, None, False, "process isolation was requested")
        seccomp = build_filter() if isolation != "process" else None
        root = os.geteuid() == 0
        work_dir = work_parent(ident) if root else None
        if isolation != "process":
            with tempfile.TemporaryDirectory(prefix="whetstone-probe-", dir=work_dir) as scratch:
                probe = probe_bwrap(view, scratch, bwrap or find_bwrap(), ident, seccomp)
            if not probe.works and isolation == "bwrap":
                raise ToolError(f"cannot sandbox tool code: {probe.problem}",
                                hint="install bubblewrap (apt-get install bubblewrap) and make "
                                     "sure user namespaces are enabled")
        place = find_cgroup_place() if limits != "watchdog" else None
        if place is None and limits == "cgroup":
            raise ToolError("no writable cgroup with the memory and pids controllers here",
                            hint="run as root, or in a delegated cgroup v2 subtree")
        warnings = [] if probe.works else [WEAK_ISOLATION.format(why=probe.problem)]
        drop, refusal = None, None
        if root and not probe.works:
            drop, refusal = _process_drop(ident)
            if refusal:
                warnings.append(refusal)
        if place is None:
            warnings.append(WEAK_LIMITS.format(tick=TICK_S))
        if view.missing and probe.works:
            warnings.append(f"not installed, so not importable in the sandbox: "
                            f"{', '.join(view.missing)}")
        if probe.works and seccomp is not None and seccomp.problem:
            warnings.append(seccomp.problem)
        status = SandboxStatus(
            "bwrap" if probe.works else "process", place.kind if place else "watchdog",
            probe.path, probe.version, view.python if probe.works else sys.executable,
            tuple(name for _, name in view.packages if not name.endswith(".libs")),
            tuple(warnings), _runs_as(ident, root, probe.works, refusal),
            seccomp.refused if probe.works and seccomp is not None and seccomp.program else 0)
        for w in status.warnings:
            log.warning("tool sandbox: %s", w)
        return cls(status, probe.launch if probe.works else None, place,
                   seccomp=seccomp if probe.works else None, drop=drop, refusal=refusal,
                   work_dir=work_dir, identity=ident)

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
        if self.refusal is not None:
            return SandboxResult("", f"refused: {self.refusal}", 126, False, 0.0,
                                 isolation=self.status.isolation, limits=self.status.limits,
                                 warnings=self.status.warnings)
        limits = Limits(memory_mb=memory_mb, max_tasks=max_tasks,
                        max_file_mb=min(max_disk_mb, 64))
        with tempfile.TemporaryDirectory(prefix="whetstone-sandbox-", dir=self.work_dir) as tmp:
            root = Path(tmp)
            place_files(root, files or {})
            (root / SCRIPT).write_text(code, encoding="utf-8")
            if self.work_dir is not None:  # we are root: the folder is the sandbox uid's
                chown_tree(tmp, self.identity)
            call = _Call(self, root, limits, max_disk_mb)
            data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
            result = call.run(args, data, timeout_s, env or {})
            outputs, skipped = collect_outputs(root / collect) if collect else ({}, [])
        stderr = result.stderr
        if skipped:
            stderr += (f"\n... [not collected, only regular files come back: "
                       f"{', '.join(skipped[:5])}]")
        return replace(result, outputs=outputs, skipped=tuple(skipped), stderr=stderr,
                       duration_s=time.perf_counter() - start)


def _process_drop(identity: Identity) -> tuple[Drop | None, str | None]:
    """Process mode as root: give root up when the uid can reach this interpreter, else refuse
    every call (tool code must never run as root)."""
    needed = [os.path.realpath(sys.executable), sys.base_prefix, sys.prefix]
    blocked = [p for p in needed if not reachable(p, identity)]
    drop = plan_drop(identity, need_stages=False)
    if not blocked and isinstance(drop, Drop):
        return drop, None
    why = (drop if isinstance(drop, str) else
           f"uid {identity.uid} cannot read this Python ({blocked[0]})")
    return None, (f"tool code is refused: without bubblewrap it would run as root, and root "
                  f"cannot be given up here ({why}); install bubblewrap (apt-get install "
                  "bubblewrap) or run Whetstone as a normal user")


def _runs_as(identity: Identity, root: bool, bwrap: bool, refusal: str | None) -> str:
    if refusal is not None:
        return "nothing runs (refused: see the warnings)"
    if not root:
        inside = f"uid {identity.uid} in its own user namespace, " if bwrap else ""
        return f"{inside}your uid {os.geteuid()} on the host, no capabilities"
    where = "in its own user namespace" if bwrap else "on the host"
    return f"{identity.describe()} ({where}; Whetstone is root and gives root up first)"


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
        if self.box.launch is not None:
            env["PYTHONPATH"] = SITE_IN_SANDBOX
        return {**env, **extra}

    def _argv(self, args: Sequence[str], extra_env: Mapping[str, str],
              seccomp_fd: int | None) -> tuple[list[str], dict[str, str]]:
        # The gate: a shell that waits for one line on stdin before it execs the rest, so the
        # cgroup and rlimits are in place before the program (or bubblewrap) can fork.
        gate = ["/bin/sh", "-c", 'IFS= read -r _ || exit 125; exec "$@"', "whetstone-gate"]
        script = str(self.root / SCRIPT)
        launch = self.box.launch
        if launch is None:
            env = {**self._env(extra_env), _MARK: self.nonce}
            command = [sys.executable, "-s", "-B", script, *args]
            if self.box.drop is not None:
                command = self.box.drop.argv(command)
            return [*gate, *command], env
        command = [launch.view.python, "-s", "-B", script, *args]
        argv = launch.argv(str(self.root), self._env(extra_env), command,
                           f"{REPORT_PREFIX}-{self.nonce}", seccomp_fd)
        # bubblewrap's init can read its own environment: give it nothing of ours.
        return [*gate, *argv], {"PATH": "/usr/bin:/bin"}

    def _check(self, proc: subprocess.Popen[bytes]) -> str | None:
        tripped = self.limiter.tripped()
        if tripped is not None:
            return tripped
        used, entries = disk_use(self.root)
        if used > self.max_disk + DISK_SLACK_BYTES or entries > MAX_DISK_ENTRIES:
            return "disk"
        if proc.poll() is not None and self.box.launch is None:
            # The program is gone but its pipes are not closed: what holds them was left
            # behind (process mode; under bubblewrap our init has killed them already).
            self.leftovers += self.limiter.kill_all() + _sweep_marked(self.nonce)
        return None

    def run(self, args: Sequence[str], data: bytes, timeout_s: float,
            extra_env: Mapping[str, str]) -> SandboxResult:
        out, err = Sink(), Sink()
        seccomp = self.box.seccomp
        fd = seccomp.open_fd() if seccomp is not None and self.box.launch is not None else None
        argv, env = self._argv(args, extra_env, fd)
        stopped: str | None = "interrupted"
        try:
            proc = subprocess.Popen(argv, cwd=self.root, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, pass_fds=() if fd is None else (fd,))
        finally:
            if fd is not None:
                os.close(fd)  # the child holds its own copy until bubblewrap reads it
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
        if self.box.launch is None:
            killed += _sweep_marked(self.nonce)
        self.limiter.close()
        return killed if self.box.launch is None else 0

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
        if self.box.launch is None:
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
