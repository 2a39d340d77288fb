"""``whetstone traces ls | show | prune``: the recorded runs every evolver learns from."""

from __future__ import annotations

import time
from pathlib import Path

import click

from engine.commands.common import (
    console,
    default_library_path,
    emit_json,
    handle_errors,
    json_option,
    library_option,
)
from engine.commands.display import print_result, print_step, short
from library_store.traces import TraceStore
from library_store.traces import trace_store as open_trace_store


@click.group("traces")
def traces_group() -> None:
    """Recorded traces: the input of every evolver."""


def trace_store(library_path: Path | None) -> TraceStore:
    """The trace store of the library at ``library_path`` (default: the home library), with
    the bounds its ``library.json`` sets."""
    from library_store.store import Library

    root = library_path or default_library_path()
    return open_trace_store(root / "traces", Library(root).settings())


@traces_group.command("ls")
@library_option
@click.option("--outcome", default=None, help="answered | horizon | budget | timeout | "
                                               "interrupted | error | running")
@click.option("--task", "task_filter", default=None, help="Substring of the task.")
@click.option("--limit", type=int, default=20, show_default=True)
@json_option
@handle_errors
def traces_ls(library_path: Path | None, outcome: str | None, task_filter: str | None,
              limit: int, as_json: bool) -> None:
    """List traces, newest last."""
    from rich.table import Table

    from library_store.traces import TraceQuery

    store = trace_store(library_path)
    found = store.query(TraceQuery(outcome=outcome, task=task_filter, limit=limit))
    for problem in store.problems:
        console(stderr=True).print(f"[yellow]warning:[/] {short(problem, 2000)}", markup=True)
    if as_json:
        emit_json([{"id": t.id, "task": t.task, "outcome": t.outcome, "answer": t.answer,
                    "score": t.score, "tokens": t.total_tokens, "started": t.started,
                    "model": t.model} for t in found])
        return
    table = Table("id", "started", "outcome", "score", "tokens", "task", "answer")
    for t in found:
        table.add_row(t.id, time.strftime("%Y-%m-%d %H:%M", time.localtime(t.started)),
                      t.outcome, "" if t.score is None else f"{t.score:g}",
                      str(t.total_tokens), short(t.task, 50), short(t.answer or "", 30))
    console().print(table)


@traces_group.command("show")
@click.argument("trace_id")
@library_option
@json_option
@handle_errors
def traces_show(trace_id: str, library_path: Path | None, as_json: bool) -> None:
    """Show one trace (an id prefix is enough)."""
    trace = trace_store(library_path).get(trace_id)
    if as_json:
        emit_json(trace.to_dict())
        return
    out = console()
    out.print(f"[bold]{trace.id}[/] · {short(trace.model)} · library {trace.library_version or '-'}",
              markup=True)
    out.print(f"[bold]Task:[/] {short(trace.task, 100_000)}", markup=True, soft_wrap=True)
    for step in trace.steps:
        print_step(out, step)
    print_result(out, trace)


def _size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


@traces_group.command("prune")
@library_option
@click.option("--max-bytes", type=click.IntRange(min=0), default=None,
              help="Keep at most this many bytes of traces, dropping the oldest files "
                   "(default: library.json's trace_max_bytes, else 1 GiB; 0: no cap).")
@click.option("--keep-days", type=click.FloatRange(min=0), default=None,
              help="Drop files of traces started more than this many days ago "
                   "(default: library.json's trace_keep_days, else keep every day).")
@json_option
@handle_errors
def traces_prune(library_path: Path | None, max_bytes: int | None, keep_days: float | None,
                 as_json: bool) -> None:
    """Delete the oldest trace files: past an age, and while the store is over its size cap.
    The servers and evals apply the size cap themselves after each write."""
    store = trace_store(library_path)
    before = store.size()
    removed = store.prune(keep_days, max_bytes=max_bytes)
    after = store.size()
    if as_json:
        emit_json({"removed": [str(p) for p in removed], "bytes_before": before,
                   "bytes_after": after})
        return
    console().print(f"removed {len(removed)} file(s); the store holds {_size_text(after)} "
                    f"(was {_size_text(before)})", markup=False)
