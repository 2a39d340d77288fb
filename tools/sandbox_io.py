"""The pipes of a sandboxed call: feed stdin, keep the head of each output stream, stop on a
deadline, an output flood or whatever a periodic check reports, and never wait on a pipe that a
left-behind process holds open."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Callable

MAX_OUTPUT_BYTES = 64_000  # kept per stream; the rest is counted and cut
HARD_OUTPUT_BYTES = 4 * MAX_OUTPUT_BYTES  # a child printing more than this is killed
KILL_GRACE_S = 0.5  # after a kill, how long to wait for the last output and the exit
TAIL_BYTES = 512  # the end of each stream is kept too: the sandbox's own report line is there
_CHUNK = 65_536


class Sink:
    """The first ``MAX_OUTPUT_BYTES`` of one output stream, its last ``TAIL_BYTES``, and how
    many bytes came in all."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = MAX_OUTPUT_BYTES - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.tail = (self.tail + chunk)[-TAIL_BYTES:]

    def take_line(self, prefix: bytes) -> bytes | None:
        """Remove and return the last line starting with ``prefix`` from the end of the stream
        (where the sandbox's init writes its report after the program has exited)."""
        at = self.tail.rfind(b"\n" + prefix)
        if at < 0:
            return None
        line = bytes(self.tail[at + 1:]).split(b"\n", 1)[0]
        cut = len(self.tail) - at  # bytes from the report's newline to the end of the stream
        self.total -= cut
        if self.total < len(self.kept):
            del self.kept[self.total:]
        del self.tail[at:]
        return line

    def text(self) -> str:
        text = bytes(self.kept).decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n... [{self.total - len(self.kept)} bytes of output cut]"
        return text


def _read(fd: int) -> bytes | None:
    """One chunk from a non-blocking pipe; None when nothing is there after all."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None


def pump(proc: subprocess.Popen[bytes], data: bytes, out: Sink, err: Sink, deadline: float,
         check: Callable[[], str | None], tick_s: float) -> str | None:
    """Feed stdin and read stdout/stderr as they come until the child closes its pipes and
    exits, calling ``check`` every ``tick_s``. Returns why it stopped early: ``"timeout"``,
    ``"output"``, whatever ``check`` returned, or None."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    pending = memoryview(data)
    next_check = time.monotonic() + tick_s
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while sel.get_map() or proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if now >= next_check:
                next_check = now + tick_s
                reason = check()
                if reason is not None:
                    return reason
            wait = max(0.0, min(deadline, next_check) - now)
            if not sel.get_map():
                time.sleep(min(wait, 0.01))  # pipes closed; waiting for the exit
                continue
            for key, _ in sel.select(wait):
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
    return None


def drain(proc: subprocess.Popen[bytes], out: Sink, err: Sink) -> None:
    """After a kill, read what the pipes still hold for at most ``KILL_GRACE_S``.

    A process that escaped the kill would keep the pipes open, so EOF may never come: the wait
    is bounded instead of lasting as long as that process lives."""
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {f.fileno(): s for f, s in ((proc.stdout, out), (proc.stderr, err)) if not f.closed}
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


def close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):  # stdin with unwritten data to a dead child
                pipe.close()
