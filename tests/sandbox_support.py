"""Helpers for the sandbox tests: find processes a call left behind, by a marker in argv."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


def marker() -> str:
    """A unique word to put in a sandboxed program's argv."""
    return f"whetstone-test-{uuid.uuid4().hex}"


def processes_with(word: str) -> list[int]:
    """Host pids whose command line contains ``word`` (the sandbox's processes are visible from
    the host's PID namespace, under their host pids)."""
    needle = word.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # exited while we looked
    return found


def survivors(word: str, grace_s: float = 0.0) -> list[int]:
    """Processes still carrying ``word`` after ``grace_s`` (zombies not yet reaped count too:
    they show an empty cmdline, so they are not found)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = processes_with(word)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)
