"""The process each stdio MCP server runs under (Linux), so nothing it starts outlives it.

    python -I -S mcp_reaper.py PARENT_PID COMMAND [ARGS ...]

The SDK starts every server in a session of its own and kills that process group if the
server does not exit when its stdin closes; a child left behind by a server that does exit
(``Popen(["sleep", "600"])``), and a daemon that left the group (``setsid`` and a second
fork), would live on. This script is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``):
whatever the server starts, however it detaches, is re-parented here when its own parent
exits, never to init. It starts the server on its own stdin and stdout (and lets go of
them), waits for it, then kills every process left below it and exits with the server's
status. A SIGTERM, SIGINT or SIGHUP (the SDK's kill, a closed terminal) does the same at
once, and so does the death of the thread that started it (``PR_SET_PDEATHSIG``:
whetstone killed with ``kill -9``).

Standalone on purpose: it imports nothing but the standard library (run as a file with
``-I -S``, it starts in a few tens of milliseconds and reads nothing of the environment's
Python settings). ``tools/mcp_client.py`` runs it; docs/mcp.md says what it covers.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 0.5  # between SIGTERM and SIGKILL for what the server left behind


class _Stop(Exception):
    """A signal asked this process to stop."""


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """The pids whose parent is this process (read from /proc, so orphans re-parented here
    by the subreaper count too)."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone since the listing
        if int(fields[1]) == me:
            out.append(int(name))
    return out


def _reap() -> None:
    """Collect every child that has exited, without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all() -> None:
    """SIGTERM to everything below this process, a short grace, then SIGKILL until nothing
    is left (a killed process's own children are re-parented here and go next)."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        while True:
            _reap()
            left = _children()
            if not left or time.monotonic() > deadline:
                break
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        if not left:
            return


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: mcp_reaper.py PARENT_PID COMMAND [ARGS ...]\n")
        return 2
    parent, command = int(argv[0]), argv[1:]

    def stop(signum: int, frame: object) -> None:
        raise _Stop(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        sys.stderr.write("whetstone: no child subreaper here; a server's detached children "
                         "may outlive it\n")
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # whetstone died before the line above: nobody to serve
        return 1
    status = 1
    try:
        try:
            server = os.posix_spawnp(command[0], command, os.environ)
        except OSError as exc:
            sys.stderr.write(f"cannot start {command[0]}: {exc.strerror or exc}\n")
            return 127
        # Let go of the pipes: the client sees the end of stdout when the server and its
        # children are gone, not when this process is.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        while True:
            pid, raw = os.wait()  # any child: orphans re-parented here are reaped too
            if pid == server:
                status = os.waitstatus_to_exitcode(raw)
                break
    except _Stop:
        status = 143
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the clean-up itself is not cut short
        _kill_all()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
