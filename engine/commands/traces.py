"""``whetstone traces ls | show``: the recorded runs every evolver learns from."""

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


@click.group("traces")
def traces_group() -> None:
    """Recorded traces: the input of every evolver."""


def trace_store(library_path: Path | None) -> TraceStore:
    """The trace store of the library at ``library_path`` (default: the home library)."""
    return TraceStore((library_path or default_library_path()) / "traces")


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
