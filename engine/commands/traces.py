"""``whetstone traces ls | show | prune | import``: the recorded runs every evolver learns
from."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from ...library_store.store import Library
from ...library_store.trace_build import check_kind, trace_kind
from ...library_store.traces import TraceQuery, TraceStore
from ...library_store.traces import trace_store as open_trace_store
from ..methods.registry import default_registry
from .common import (
    console,
    default_library_path,
    emit_json,
    handle_errors,
    json_option,
    library_option,
    scorer_option,
)
from .display import print_result, print_step, short


@click.group("traces")
def traces_group() -> None:
    """Recorded traces: the input of every evolver."""


def trace_store(library_path: Path | None) -> TraceStore:
    """The trace store of the library at ``library_path`` (default: the home library), with
    the bounds its ``library.json`` sets."""
    # lazy: numpy and 78 more of our modules; `whetstone --help` imports every command module
    from ..library.opening import may_create_library

    root = library_path or default_library_path()
    library = Library(root)
    if not library.is_initialized() and not may_create_library(root):
        Library.open(root)  # raises: a mistyped --library is an error, not an empty store
    if library.store is not None:
        return library.traces  # the store's tables, bounded as its settings say
    return open_trace_store(root / "traces", library.settings())


@traces_group.command("ls")
@library_option
@click.option("--outcome", default=None, help="answered | length | horizon | budget | "
                                               "timeout | interrupted | error | running")
@click.option("--task", "task_filter", default=None, help="Substring of the task.")
@click.option("--kind", default=None, help="agent | direct | chat | verify | mcp | import "
                                           "(what made the trace).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--ids", "ids_only", is_flag=True,
              help="Print only the trace ids, one a line, whole (for scripts: `xargs`).")
@json_option
@handle_errors
def traces_ls(library_path: Path | None, outcome: str | None, task_filter: str | None,
              kind: str | None, limit: int, ids_only: bool, as_json: bool) -> None:
    """List traces, newest last."""
    store = trace_store(library_path)
    found = store.query(TraceQuery(outcome=outcome, task=task_filter, limit=limit,
                                   source=None if kind is None else check_kind(kind)))
    for problem in store.problems:
        console(stderr=True).print(f"[yellow]warning:[/] {short(problem, 2000)}", markup=True)
    if ids_only and not as_json:
        for t in found:
            click.echo(t.id)
        return
    if as_json:
        emit_json([{"id": t.id, "kind": trace_kind(t), "task": t.task, "outcome": t.outcome,
                    "answer": t.answer,
                    "score": t.score, "tokens": t.total_tokens, "started": t.started,
                    "model": t.model} for t in found])
        return
    out = console()
    rows = [{"id": t.id, "started": time.strftime("%m-%d %H:%M", time.localtime(t.started)),
             "kind": trace_kind(t), "outcome": t.outcome,
             "score": "" if t.score is None else f"{t.score:g}",
             "tokens": str(t.total_tokens), "task": short(t.task, 60),
             "answer": short(t.answer or "", 30)} for t in found]
    names = _columns_that_fit(rows, out.width)
    widths = _flexible_widths(rows, names, out.width)
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for name in names:
        table.add_column(name, no_wrap=True, overflow="ellipsis",
                         justify="right" if name in ("score", "tokens") else "left",
                         width=widths.get(name), min_width=_width(rows, name)
                         if name not in widths else None)
    for row in rows:
        table.add_row(*(row[n] for n in names))
    out.print(table)


_COLUMNS = ("id", "started", "kind", "outcome", "score", "tokens", "task", "answer")
# Dropped in this order when the terminal is too narrow for all of them: the id is never cut
# (it is what the user copies into `traces show`), nor the outcome.
_DROP_ORDER = ("answer", "started", "kind", "score", "tokens", "task")
_FLEX_MIN = {"task": 12, "answer": 6}


def _width(rows: list[dict[str, str]], name: str) -> int:
    return max([len(name), *(len(r[name]) for r in rows)])


def _columns_that_fit(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns of ``traces ls`` a terminal ``width`` wide shows in full (the flexible task
    and answer columns at least at their minimum), two spaces between columns."""
    names = list(_COLUMNS)
    for drop in (None, *_DROP_ORDER):
        if drop is not None:
            names.remove(drop)
        need = sum(_FLEX_MIN.get(n) or _width(rows, n) for n in names) + 2 * (len(names) - 1)
        if need <= width:
            break
    return names


def _flexible_widths(rows: list[dict[str, str]], names: list[str], width: int
                     ) -> dict[str, int]:
    """Widths of the task and answer columns: what the fixed columns leave, the answer
    taking at most a third of it."""
    flex = [n for n in names if n in _FLEX_MIN]
    fixed = sum(_width(rows, n) for n in names if n not in _FLEX_MIN)
    left = max(0, width - fixed - 2 * (len(names) - 1))
    out: dict[str, int] = {}
    if "answer" in flex:
        out["answer"] = max(_FLEX_MIN["answer"], min(_width(rows, "answer"), left // 3))
        left -= out["answer"]
    if "task" in flex:
        out["task"] = max(_FLEX_MIN["task"], min(_width(rows, "task"), left))
    return out


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
    printers = default_registry().step_printers()
    for step in trace.steps:
        print_step(out, step, printers)
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


@traces_group.command("import")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "otlp-json", "openai", "langsmith"]),
              help="The files' format (auto: read from their content).")
@click.option("--phoenix", default=None, metavar="URL",
              help="Also read a Phoenix server's spans (with --project).")
@click.option("--project", default=None, help="The Phoenix project (name or id).")
@scorer_option
@library_option
@json_option
@handle_errors
def traces_import(files: tuple[Path, ...], fmt: str, phoenix: str | None, project: str | None,
                  scorer: str | None, library_path: Path | None, as_json: bool) -> None:
    """Read traces recorded elsewhere (OTLP JSON, OpenAI chat logs as JSONL, LangSmith
    exports, a Phoenix project) into the store, for `evolve` to learn from; malformed
    records are listed and skipped (exit 11), re-imports are recognised
    (docs/observability.md). --scorer: the scorer the gate scores these traces' tasks with
    (without it, normalised exact match); traces with an expected answer and no score are
    scored by it as they are imported."""
    # lazy: the readers load urllib.request and 8 of our modules; `whetstone --help` imports us
    from .trace_import import run_import

    run_import(trace_store(library_path), files, fmt, phoenix, project, as_json, scorer)
