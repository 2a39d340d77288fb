"""What a long command shows while it works, on stderr: bars on a terminal, plain lines off one
(a log, a CI job, a pipe), or with ``--json`` one JSON event per line.

A phase reports ``(phase, done, total)``; ``total`` 0 is a count without an end (the analyst
calls so far). Plain lines and JSON events come when a phase starts, when it ends, and in
between at most every ``every_s`` seconds, so a log of a thousand tasks stays readable.
``note(text)`` says one thing (the traces read, the gate's start).
"""

from __future__ import annotations

import contextlib
import json
import time
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from .common import log_events_as_json


def measured_rate(task: Task) -> float | None:
    """Tasks per second as measured: the tasks completed over the wall time since the bar
    started (None before the first one). Not rich's own estimate, which counts the tasks of
    its last 30 s over the time from the first of them to the last: after a slow first task,
    or when tasks finish in batches (``-j``), it read 2-30x the real rate."""
    elapsed = task.finished_time if task.finished_time is not None else task.elapsed
    if not task.completed or not elapsed:
        return None
    return task.completed / elapsed


class RateColumn(ProgressColumn):
    """Tasks per minute, measured (``measured_rate``; ``-`` until a task is done)."""

    def render(self, task: Task) -> Text:
        rate = measured_rate(task)
        return Text("- tasks/min" if rate is None else f"{rate * 60:.1f} tasks/min")


class EtaColumn(ProgressColumn):
    """The time left at the measured rate (``-:--:--`` until a task is done)."""

    def render(self, task: Task) -> Text:
        rate = measured_rate(task)
        if task.finished:
            return Text("0:00:00")
        if rate is None or task.remaining is None:
            return Text("-:--:--")
        left = int(task.remaining / rate + 0.5)
        return Text(f"{left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}")


class CommandProgress:
    """Progress on ``err``: ``mode`` ``bars``, ``lines`` or ``json`` (``choose_mode``)."""

    def __init__(self, err: Console, mode: str, *, every_s: float = 5.0) -> None:
        self.err = err
        self.mode = mode
        self.every_s = every_s
        self.start = time.monotonic()
        self._bar: Progress | None = None
        self._tasks: dict[str, Any] = {}
        self._last: dict[str, float] = {}
        self._held: dict[str, tuple[int, int]] = {}  # the newest figures not shown yet
        self._logs: contextlib.ExitStack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        if self.mode == "json":
            self._logs.enter_context(log_events_as_json())
        if self.mode == "bars":
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), RateColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=self.err)
            self._bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._flush()
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
        self._logs.close()

    def _emit(self, event: dict[str, Any]) -> None:
        event["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self.err.print(json.dumps(event, ensure_ascii=False), markup=False, highlight=False,
                       soft_wrap=True)

    def progress(self, phase: str, done: int, total: int) -> None:
        """``done`` of ``total`` in ``phase`` (``total`` 0: a running count)."""
        if self._bar is not None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total or None)
            self._bar.update(self._tasks[phase], completed=done, total=total or None)
            return
        now = time.monotonic()
        first = phase not in self._last
        last = bool(total) and done >= total
        if first:
            self._flush()  # a new phase: what the others reached last is shown first
        if not (first or last or now - self._last[phase] >= self.every_s):
            self._held[phase] = (done, total)
            return
        self._last[phase] = now
        self._held.pop(phase, None)
        self._show(phase, done, total)

    def _flush(self) -> None:
        for phase, (done, total) in list(self._held.items()):
            self._held.pop(phase, None)
            self._show(phase, done, total)

    def _show(self, phase: str, done: int, total: int) -> None:
        if self.mode == "json":
            self._emit({"event": "progress", "phase": phase, "done": done,
                        **({"total": total} if total else {})})
        else:
            self.err.print(f"{phase}: {done}" + (f"/{total}" if total else ""), markup=False,
                           highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        """One thing to say now (a phase begins, what was read)."""
        self._flush()
        if self.mode == "json":
            self._emit({"event": "note", "text": text})
        elif self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.err.print(text, markup=False, highlight=False, soft_wrap=True)


def choose_mode(err: Console, as_json: bool) -> str:
    """``json`` with ``--json``, ``bars`` on a terminal, else ``lines``."""
    if as_json:
        return "json"
    return "bars" if err.is_terminal else "lines"
