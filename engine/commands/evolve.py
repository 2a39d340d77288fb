"""``whetstone evolve METHOD``: turn recorded traces into library changes, gated by eval.

    whetstone evolve METHOD --tasks gsm8k@train:0:20 [its options]
    whetstone evolve METHOD --traces "outcome=answered,score<1" --dry-run

One command per registered evolver (``whetstone.engine.methods.registry``), built when asked for: its
own options come from its config dataclass (``whetstone.engine.methods.base.knob`` fields), the shared
ones (which traces, which models, the gate) are the same for every evolver, and the command is
one call to ``Engine.evolve``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.syntax import Syntax

from ..errors import ConfigError
from ..evaluation.benchmarks import load_tasks
from ..evaluation.gate_rules import DEFAULT_RULE
from .common import (
    check_before_loading,
    concurrency_option,
    console,
    emit_json,
    executor_options,
    handle_errors,
    json_option,
    library_option,
    model_option,
    scorer_option,
    solver_option,
)
from .decisions import diff_summary, print_decision
from .progress import CommandProgress, choose_mode
from .tool_options import pop_tools, tool_click_options

_CONFIG = "config__"  # prefix of the parameters that come from the evolver's config


def _shared_options() -> list[click.Option]:
    """The options every evolver takes (fresh objects per command)."""
    decorators = [
        click.option("--tasks", "tasks_spec", default=None, metavar="SET",
                     help="Learn from the traces of this task set (run it first if none are "
                          "stored)."),
        click.option("--traces", "trace_filter", default=None, metavar="FILTER",
                     help='e.g. "outcome=answered,score<1,version=v2,since=2026-11-01"'),
        click.option("--limit", type=int, default=None, help="Use at most N (newest) traces."),
        model_option,
        click.option("--analyst", default=None, help="Analyst model spec (default: the "
                                                     "--model)."),
        click.option("--gate-tasks", default=None, metavar="SET",
                     help="Held-out tasks for the gate, e.g. gsm8k@dev:0:30 (default: the "
                          "traces' tasks in the dev split, held out from the evolver; none: "
                          "an error)."),
        click.option("--gate-rule", default=DEFAULT_RULE, show_default=True,
                     help="cost_aware: a clear gain passes; a tie passes only when the dev set "
                          "rules out a 10-point regression and the change costs no more "
                          "tokens; mean_not_worse: the old rule (docs/gate.md)."),
        scorer_option,
        click.option("--allow-errors", is_flag=True,
                     help="Let the gate decide even when some of its tasks failed (their "
                          "errors are listed; by default the change is kept as a candidate)."),
        concurrency_option,
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--candidate", "candidate_name", default=None,
                     help="Name for the candidate kept when the gate rejects the change."),
        click.option("--dry-run", is_flag=True,
                     help="Print the merged patch as a diff; write nothing."),
        click.option("--diff", "show_diff", is_flag=True,
                     help="Print the whole diff of the change (default: one line a file)."),
        solver_option,
        executor_options,
        *reversed(tool_click_options()),
        library_option,
        json_option,
    ]

    def collect() -> None:
        return None

    for decorate in decorators:  # each appends its option, so this keeps their order
        collect = decorate(collect)
    return list(collect.__click_params__)  # type: ignore[attr-defined]


def _click_type(tp: Any, meta: Any) -> tuple[Any, bool] | None:
    """(click type, is a flag) for a config field's type; None when a flag cannot carry it."""
    args = typing.get_args(tp)
    if type(None) in args:  # X | None
        rest = [a for a in args if a is not type(None)]
        tp = rest[0] if len(rest) == 1 else tp
    if meta.get("choices"):
        return click.Choice(list(meta["choices"])), False
    if typing.get_origin(tp) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(tp)]), False
    low = meta.get("min")
    if tp is bool:
        return None, True
    if tp is int:
        return (click.IntRange(min=int(low)) if low is not None else click.INT), False
    if tp is float:
        return (click.FloatRange(min=low) if low is not None else click.FLOAT), False
    if tp is str:
        return click.STRING, False
    return None


def config_options(config_class: type, taken: set[str]) -> list[click.Option]:
    """One option per CLI-settable field of an evolver's config dataclass. Fields marked
    ``cli=False``, of types a flag cannot carry, or whose flag a shared option already uses,
    are left out (a field named like a shared option takes that option's value)."""
    hints = typing.get_type_hints(config_class)
    out: list[click.Option] = []
    for f in dataclasses.fields(config_class):
        meta = dict(f.metadata)
        flag = "--" + f.name.replace("_", "-")
        required = f.default is dataclasses.MISSING and \
            f.default_factory is dataclasses.MISSING
        found = _click_type(hints.get(f.name), meta)
        if not meta.get("cli", True) or flag in taken or (found is None and not required):
            continue
        if found is None:
            raise ConfigError(f"{config_class.__name__}.{f.name} cannot be set from the "
                              "command line but has no default",
                              hint="give it a default, or a str/int/float/bool type")
        kind, is_flag = found
        default = None if required else f.default
        if is_flag and default is True:
            flag = f"{flag}/--no-{f.name.replace('_', '-')}"
        show = not is_flag and default not in (None, "")
        # A required option gets no default at all: click takes an explicit None as one.
        extra: dict[str, Any] = {} if required else {"default": default}
        out.append(click.Option([flag, _CONFIG + f.name], type=kind, is_flag=is_flag,
                                required=required, show_default=show,
                                help=meta.get("help") or None, **extra))
    return out


def evolver_command(name: str, evolver_class: Any) -> click.Command:
    """``whetstone evolve NAME`` for one registered evolver."""
    shared = _shared_options()
    taken = {o for p in shared for o in (*p.opts, *p.secondary_opts)}
    doc = (evolver_class.__doc__ or "").strip()
    summary = doc.split("\n\n")[0].replace("\n", " ") if doc else f"Evolve with {name}."

    @handle_errors
    def callback(**params: Any) -> None:
        options = {k[len(_CONFIG):]: v for k, v in params.items() if k.startswith(_CONFIG)}
        shared_values = {k: v for k, v in params.items() if not k.startswith(_CONFIG)}
        _run(name, options, **pop_tools(shared_values))

    return click.Command(name, params=[*config_options(evolver_class.config_class, taken),
                                       *shared], callback=callback, help=summary,
                         short_help=summary)


class EvolveGroup(click.Group):
    """The ``evolve`` group: a command per registered evolver, looked up when invoked (so
    ``whetstone --help`` imports no method)."""

    def _registry(self, ctx: click.Context) -> Any:
        # lazy: `whetstone --help` imports every command module
        from ..methods.registry import default_registry

        return ctx.meta.setdefault("whetstone.methods", default_registry())

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self._registry(ctx).names("evolver")

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        registry = self._registry(ctx)
        if cmd_name not in registry.names("evolver"):
            return None
        try:
            return evolver_command(cmd_name, registry.entry("evolver", cmd_name).load())
        except ConfigError as exc:  # a broken plugin must not take `evolve --help` down
            return _broken_command(cmd_name, exc)


def _broken_command(name: str, error: ConfigError) -> click.Command:
    """A command that reports why the evolver ``name`` cannot be used."""

    @handle_errors
    def callback(**_: Any) -> None:
        raise error

    return click.Command(name, callback=callback, help=f"(unusable: {error.message})",
                         context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})


@click.group("evolve", cls=EvolveGroup)
def evolve_group() -> None:
    """Evolve the library from recorded traces (every change is gated by eval)."""


def _run(method: str, options: dict[str, Any], *, tasks_spec: str | None,
         trace_filter: str | None, limit: int | None, model: str, analyst: str | None,
         gate_tasks: str | None, gate_rule: str, allow_errors: bool, scorer: str | None,
         concurrency: int | None, seed: int, candidate_name: str | None, dry_run: bool,
         show_diff: bool, library_path: Path | None, solver: str, as_json: bool,
         agent_tools: list[Any], executor: str, ray_address: str | None) -> None:
    """Build the engine and call ``Engine.evolve`` (its runs on a Ray cluster with
    ``--executor ray``), showing its progress on stderr (bars on a terminal, plain lines off
    one, JSON events with ``--json``)."""
    from ..api import Engine  # lazy: loads numpy and 31 more of our modules

    check_before_loading(specs=(model, analyst), task_sets=(tasks_spec, gate_tasks),
                         rule=gate_rule, trace_filter=trace_filter)
    err = console(stderr=True)
    with err.status(f"loading {model} …"):
        engine = Engine(model, library=library_path, checkpointing=False, solver=solver,
                        tools=agent_tools)
    cluster = None
    try:
        if executor == "ray":
            # lazy: ray, the scale extra
            from ..scale import RayExecutor

            with err.status("connecting to Ray …"):
                cluster = RayExecutor(ray_address, workers=concurrency)
        with CommandProgress(err, choose_mode(err, as_json)) as shown:
            result = engine.evolve(
                method, tasks=tasks_spec, trace_filter=trace_filter, limit=limit,
                analyst=analyst, gate_tasks=load_tasks(gate_tasks) if gate_tasks else None,
                rule=gate_rule, seed=seed, concurrency=concurrency,
                candidate_name=candidate_name, dry_run=dry_run, on_progress=shown.progress,
                on_phase=shown.note, allow_errors=allow_errors, scorer=scorer, cluster=cluster,
                **options)
    finally:
        if cluster is not None:
            cluster.close()
        engine.close()
    if as_json:
        emit_json(result.to_dict())
        return
    _print(result, show_diff=show_diff or dry_run)


def _print(result: Any, *, show_diff: bool) -> None:
    """The verdict first (the gate's decision and where the change went), then what the
    evolver did, then the diff: whole with ``--diff`` (or a dry run), else one line a file."""
    # lazy: `whetstone --help` imports every command module
    from ..methods.registry import default_registry

    out = console()
    if result.note:
        out.print(f"[yellow]{escape(result.note)}[/]", markup=True, soft_wrap=True)
    if result.decision is not None:
        print_decision(out, result.decision.to_dict())
    if result.version is not None:
        out.print(f"new library version [bold]{result.version.id}[/]", markup=True)
    if result.candidate:
        out.print(f"kept as candidate [bold]{result.candidate}[/]: "
                  f"`whetstone library candidates show {result.candidate}`", markup=True,
                  soft_wrap=True)
    out.print(f"[bold]{escape(result.patch.message)}[/]", markup=True, soft_wrap=True)
    calls = result.patch.costs.get("analyst_calls")
    out.print(f"{result.traces} traces" + (f" · {calls} analyst calls" if calls is not None
                                           else ""), markup=False)
    leaks = result.patch.details.get("label_leaks")
    if isinstance(leaks, dict) and leaks.get("lines_dropped"):
        refused = leaks.get("files_refused") or []
        out.print(f"label leaks: {leaks['lines_dropped']} line(s) that held a training answer "
                  "dropped" + (f"; refused whole: {', '.join(refused)}" if refused else ""),
                  markup=False, soft_wrap=True)
        for line in leaks.get("examples") or ():
            out.print(f"  - {line}", markup=False, soft_wrap=True)
    summary = default_registry().summary_of(result.patch.method)  # what the method reports
    for line in summary(result.patch.details) if summary is not None else ():
        out.print(line, markup=False, soft_wrap=True)
    if not result.diff:
        return
    if show_diff:
        out.print(Syntax(result.diff, "diff", word_wrap=True))
        return
    where = (f"`whetstone library candidates show {result.candidate}`" if result.candidate
             else f"`whetstone library diff {result.version.parent} {result.version.id}`"
             if result.version is not None else "--diff")
    out.print(f"diff ({where} shows it whole):", markup=False, soft_wrap=True)
    for line in diff_summary(result.diff):
        out.print(f"  {line}", markup=False, soft_wrap=True)
