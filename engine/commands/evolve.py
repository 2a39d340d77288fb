"""``whetstone evolve``: turn recorded traces into library changes, gated by eval.

    whetstone evolve trace2skill --tasks gsm8k@train:0:20 --skill word-math --create
    whetstone evolve trace2skill --skill word-math --traces "outcome=answered,score<1" --dry-run
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.syntax import Syntax

from engine.commands.common import (
    console,
    emit_json,
    handle_errors,
    json_option,
    library_option,
    model_option,
)
from engine.errors import ConfigError

_FILTER = re.compile(r"^\s*(\w+)\s*(<=|>=|=|<|>)\s*(.+?)\s*$")


def parse_trace_filter(text: str | None) -> dict[str, Any]:
    """``"outcome=answered,score<1,version=v2,since=2026-11-01,task=apples"`` -> TraceQuery
    keyword arguments."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = _FILTER.match(part)
        if not m:
            raise ConfigError(f"cannot read trace filter {part!r}",
                              hint='use key=value pairs, e.g. "outcome=answered,score<1"')
        key, op, value = m.groups()
        if key == "score":
            x = float(value)
            if op in ("<", "<="):
                out["max_score"] = x - (1e-9 if op == "<" else 0)
            elif op in (">", ">="):
                out["min_score"] = x + (1e-9 if op == ">" else 0)
            else:
                out["min_score"] = out["max_score"] = x
        elif key in ("since", "until"):
            out[key] = datetime.fromisoformat(value).replace(tzinfo=timezone.utc).timestamp()
        elif key in ("outcome", "task", "task_set") and op == "=":
            out[key] = value
        elif key == "version" and op == "=":
            out["library_version"] = value
        else:
            raise ConfigError(f"unknown trace filter {key}{op}",
                              hint="filters: outcome=, score<|>|=, version=, task=, task_set=, "
                                   "since=YYYY-MM-DD, until=YYYY-MM-DD")
    return out


def _bar(err: Any) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=err)


@click.group("evolve")
def evolve_group() -> None:
    """Evolve the library from recorded traces (every change is gated by eval)."""


@evolve_group.command("trace2skill")
@click.option("--tasks", "tasks_spec", default=None, metavar="SET",
              help="Learn from the traces of this task set (run it first if none are stored).")
@click.option("--skill", required=True, help="The skill to deepen (or to create with --create).")
@click.option("--create", is_flag=True, help="Start the skill from a draft if it is missing.")
@click.option("--description", default="", help="Front-matter description for --create.")
@click.option("--traces", "trace_filter", default=None, metavar="FILTER",
              help='e.g. "outcome=answered,score<1,version=v2,since=2026-11-01"')
@click.option("--limit", type=int, default=None, help="Use at most N (newest) traces.")
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Traces per analyst call.")
@model_option
@click.option("--analyst", default=None, help="Analyst model spec (default: the --model).")
@click.option("--sequential", is_flag=True, help="Baseline: edit the skill one trace at a time.")
@click.option("--executor", type=click.Choice(["asyncio", "ray"]), default="asyncio",
              show_default=True)
@click.option("--gate-tasks", default=None, metavar="SET",
              help="Held-out tasks for the gate (default: the traces' own tasks).")
@click.option("--gate-rule", default="not_worse", show_default=True)
@click.option("--concurrency", "-j", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--candidate", "candidate_name", default=None,
              help="Name for the candidate kept when the gate rejects the change.")
@click.option("--dry-run", is_flag=True, help="Print the merged patch as a diff; write nothing.")
@library_option
@json_option
@handle_errors
def trace2skill_cmd(tasks_spec: str | None, skill: str, create: bool, description: str,
                    trace_filter: str | None, limit: int | None, workers: int, batch_size: int,
                    model: str, analyst: str | None, sequential: bool, executor: str,
                    gate_tasks: str | None, gate_rule: str, concurrency: int, seed: int,
                    candidate_name: str | None, dry_run: bool, library_path: Path | None,
                    as_json: bool) -> None:
    """Distil a skill from traces: parallel analysts, hierarchical merge, then the gate."""
    from engine.api import Engine
    from engine.backends.registry import get_backend
    from engine.evaluation.benchmarks import load_tasks
    from engine.evaluation.runner import evaluate
    from engine.evaluation.tasks import tasks_from_traces
    from engine.methods.evolve import gate_and_apply, training_traces
    from engine.methods.trace2skill import Trace2Skill, Trace2SkillConfig
    from library_store.traces import TraceQuery

    err = console(stderr=True)
    with err.status(f"loading {model} …"):
        engine = Engine(model, library=library_path, checkpointing=False)
        analyst_backend = engine.backend if not analyst or analyst == model \
            else get_backend(analyst)
    query = parse_trace_filter(trace_filter)
    task_set = load_tasks(tasks_spec) if tasks_spec else None
    if task_set is not None:
        query["task_set"] = task_set.name
    traces = training_traces(engine.traces.query(TraceQuery(**query)), limit)
    if not traces and task_set is not None:
        err.print(f"no stored traces for {task_set.name}: running its {len(task_set)} tasks "
                  "first", markup=False)
        with _bar(err) as bar:
            t = bar.add_task(f"collect {task_set.name}", total=len(task_set))
            evaluate(task_set, engine.solver(), concurrency=concurrency, seed=seed,
                     store=engine.traces, model=engine.backend.spec,
                     on_progress=lambda done, n, r: bar.update(t, completed=done))
        traces = training_traces(engine.traces.query(TraceQuery(**query)), limit)
    if not traces:
        raise ConfigError("no traces match", hint="run `whetstone eval --tasks SET` first, or "
                                                  "widen --traces (see `whetstone traces ls`)")
    config = Trace2SkillConfig(skill=skill, create=create, description=description,
                               workers=workers, batch_size=batch_size, sequential=sequential,
                               executor=executor, seed=seed)
    with _bar(err) as bar:
        phases: dict[str, Any] = {}

        def on_progress(phase: str, done: int, total: int) -> None:
            if phase not in phases:
                phases[phase] = bar.add_task(f"trace2skill {phase}", total=total)
            bar.update(phases[phase], completed=done)

        snap = engine.library.snapshot()
        patch = Trace2Skill(config, on_progress=on_progress).fit(
            traces, snap.texts(f"skills/{skill}/"), analyst_backend)
    gate_set = load_tasks(gate_tasks) if gate_tasks else tasks_from_traces(traces)
    with _bar(err) as bar:
        # run_gate scores the current version, then the candidate, on the same tasks.
        bars: list[Any] = []

        def on_gate(done: int, n: int, r: Any) -> None:
            if not bars or (done == 1 and len(bars) == 1 and bar.tasks[bars[0]].completed == n):
                bars.append(bar.add_task(f"gate: {'current' if not bars else 'candidate'}",
                                         total=n))
            bar.update(bars[-1], completed=done)

        result = gate_and_apply(
            patch, engine.library, make_solver=lambda s: engine.solver(snapshot=s),
            gate_tasks=gate_set, rule=gate_rule, seed=seed, concurrency=concurrency,
            candidate_name=candidate_name, dry_run=dry_run, on_progress=on_gate)
    engine.close()
    if as_json:
        emit_json(result.to_dict())
        return
    _print(result, len(traces))


def _print(result: Any, n_traces: int) -> None:
    out = console()
    report = result.patch.details.get("report", {})
    mp = report.get("map", {})
    out.print(f"[bold]{escape(result.patch.message)}[/]", markup=True, soft_wrap=True)
    out.print(f"{n_traces} traces · {mp.get('calls', 0)} analyst calls · "
              f"{mp.get('retries', 0)} retried · {mp.get('dropped', 0)} dropped · "
              f"{report.get('folded', 0)} folded · {report.get('conflicts_resolved', 0)} "
              f"conflicts resolved", markup=False)
    if result.diff:
        out.print(Syntax(result.diff, "diff", word_wrap=True))
    if result.note:
        out.print(f"[yellow]{escape(result.note)}[/]", markup=True)
    d = result.decision
    if d is not None:
        verdict = "[green]accepted[/]" if d.accepted else "[red]rejected[/]"
        out.print(f"gate {verdict} ({d.rule}): candidate {d.candidate_score:.3f} vs current "
                  f"{d.current_score:.3f}, difference {d.difference:+.3f} "
                  f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}] on {d.n_tasks} tasks", markup=True)
    if result.version is not None:
        out.print(f"new library version [bold]{result.version.id}[/]", markup=True)
    if result.candidate:
        out.print(f"kept as candidate [bold]{result.candidate}[/]: "
                  f"`whetstone library candidates show {result.candidate}`", markup=True)
