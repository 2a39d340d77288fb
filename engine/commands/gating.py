"""Change control on the command line: the gate's options every library write takes
(``library commit``, ``import``, ``rollback``, ``candidates apply``), landing a write through
the gate (``engine/evolution/landing.py``) and saying what happened, and ``whetstone library
config``, where a library's ``require_gate`` is set.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.markup import escape

from whetstone.engine.backends.base import auto_concurrency
from whetstone.engine.commands.common import (
    Concurrency,
    console,
    default_library_path,
    emit_json,
    handle_errors,
    json_option,
    library_option,
    scorer_option,
    solver_option,
)
from whetstone.engine.commands.decisions import print_decision
from whetstone.engine.commands.progress import CommandProgress, choose_mode
from whetstone.engine.commands.tool_options import pop_tools, tool_click_options
from whetstone.engine.errors import EXIT_GATE_REFUSED, ConfigError, LibraryError
from whetstone.engine.evaluation.gate import gate_tasks
from whetstone.engine.evaluation.gate_rules import DEFAULT_RULE, parse_rule
from whetstone.engine.methods.base import LibraryPatch
from whetstone.engine.methods.registry import default_registry
from whetstone.library_store.change_control import (
    SETTING,
    candidate_changes,
    check_gated,
    rollback_changes,
    view_changes,
)
from whetstone.library_store.store import Library

if TYPE_CHECKING:
    from whetstone.engine.evolution.landing import GateChoice
    from whetstone.engine.evolution.pipeline import EvolveResult

F = TypeVar("F", bound=Callable[..., Any])
_GATE_PARAMS = ("gate_tasks", "gate_rule", "scorer", "model", "solver", "concurrency", "seed",
                "allow_errors", "candidate_name")


@dataclass(frozen=True)
class GatedWrite:
    """What the gate options asked for: the gate's tasks (None: none) and options, and the
    model, solver and tools its runs use."""

    tasks: str | None = None
    rule: str = DEFAULT_RULE
    seed: int = 0
    scorer: str | None = None
    allow_errors: bool = False
    candidate: str | None = None
    model: str = "embedded"
    solver: str = "agent"
    concurrency: int | None = None
    agent_tools: list[Any] = field(default_factory=list)

    def choice(self, tasks: Any = None, concurrency: int = 1) -> GateChoice:
        """The ``GateChoice`` ``landing.land`` takes (``tasks``: the loaded ones)."""
        # lazy: the evolve path loads the evaluation runner; `whetstone --help` imports us
        from whetstone.engine.evolution.landing import GateChoice

        return GateChoice(tasks=tasks if tasks is not None else self.tasks, rule=self.rule,
                          seed=self.seed, concurrency=concurrency, scorer=self.scorer,
                          allow_errors=self.allow_errors, candidate=self.candidate)


def gate_options(fn: F) -> F:
    """``--gate-tasks`` and the options of the gate ``evolve`` has (rule, scorer, model,
    solver, concurrency, seed, allow-errors, the candidate's name, the agent's tools), handed to
    the command as one ``gate`` parameter (a ``GatedWrite``). Put it below ``handle_errors``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {k: kwargs.pop(k) for k in _GATE_PARAMS}
        agent_tools = pop_tools(kwargs).pop("agent_tools")
        if values["gate_tasks"] is not None:
            parse_rule(values["gate_rule"])  # a bad rule fails before any model loads
        gate = GatedWrite(tasks=values["gate_tasks"], rule=values["gate_rule"],
                          seed=values["seed"], scorer=values["scorer"],
                          allow_errors=values["allow_errors"],
                          candidate=values["candidate_name"], model=values["model"],
                          solver=values["solver"], concurrency=values["concurrency"],
                          agent_tools=agent_tools)
        return fn(*args, gate=gate, **kwargs)

    out: Any = wrapper
    for option in tool_click_options():
        out = option(out)
    decorators = [
        click.option("--candidate", "candidate_name", default=None,
                     help="Name for the candidate kept when the gate refuses the change."),
        click.option("--allow-errors", is_flag=True,
                     help="Let the gate decide even when some of its tasks failed."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="The gate's run seed."),
        click.option("--concurrency", "-j", type=Concurrency(), default="auto",
                     show_default=True, help="Gate tasks run at once."),
        solver_option,
        click.option("--model", "model", envvar="WHETSTONE_MODEL", default="embedded",
                     show_default=True, help="The model the gate runs (see `whetstone "
                                             "models`)."),
        scorer_option,
        click.option("--gate-rule", default=DEFAULT_RULE, show_default=True,
                     help="The gate's rule, as `evolve --gate-rule` (docs/gate.md)."),
        click.option("--gate-tasks", default=None, metavar="SET",
                     help="Held-out tasks to gate the change on, as `evolve --gate-tasks` "
                          "(e.g. gsm8k@dev:0:30). Without: it goes live unmeasured, marked "
                          "ungated, or is refused where the library sets require_gate."),
    ]
    for decorate in decorators:
        out = decorate(out)
    return out  # type: ignore[no-any-return]


def open_library_for(path: Path | None) -> Library:
    """The library, opened even when its view is broken (the versions are the truth); a
    broken view is reported on stderr with what to do. Every write through it is checked by
    ``validate_library`` (the Library's default)."""
    lib = default_registry().open_library(path or default_library_path(), quiet=True)
    if lib.view_problem is not None:
        err = console(stderr=True)
        err.print(f"[yellow]warning:[/] {escape(lib.view_problem.message)}", markup=True,
                  soft_wrap=True)
        err.print(f"[yellow]hint:[/] {escape(lib.view_problem.hint or '')}", markup=True,
                  soft_wrap=True)
    return lib


def runtime_methods_for(paths: Mapping[str, Any]) -> list[str]:
    """The runtime methods that read the folders a change touches (a method's own root,
    such as the policy notes): the gate runs with them, so the change reaches the prompt."""
    return [s.name for s in default_registry().specs() if s.runtime and any(
        p.startswith(f"{root.name}/") for root in s.roots for p in paths)]


def run_write(library: Library, patch: LibraryPatch, *, by: str, gate: GatedWrite,
              expect_parent: str | None = None, how_to_gate: str | None = None,
              as_json: bool = False) -> EvolveResult:
    """Land ``patch`` (``landing.land``): ungated without gate tasks (no model loads), else
    through the gate on ``gate.model``, its progress on stderr."""
    # lazy: the evolve path loads the evaluation runner; `whetstone --help` imports us
    from whetstone.engine.evolution.landing import land

    if gate.tasks is None:
        return land(patch, library, by=by, gate=gate.choice(), expect_parent=expect_parent,
                    how_to_gate=how_to_gate)
    from whetstone.engine.api import Engine  # lazy: loads numpy and 31 more of our modules

    tasks = gate_tasks(gate.tasks)  # a bad spec fails before the model loads
    err = console(stderr=True)
    with err.status(f"loading {gate.model} …"):
        engine = Engine(gate.model, library=library.root, checkpointing=False,
                        solver=gate.solver, tools=gate.agent_tools,
                        methods=runtime_methods_for(patch.changes))
    try:
        choice = gate.choice(tasks, gate.concurrency or auto_concurrency(engine.backend))
        which: list[str] = []
        with CommandProgress(err, choose_mode(err, as_json)) as shown:
            return land(patch, engine.library, by=by, gate=choice,
                        make_solver=lambda snap: engine.solver(snapshot=snap),
                        expect_parent=expect_parent, on_phase=shown.note, on_run=which.append,
                        on_progress=lambda done, n, r: shown.progress(f"gate: {which[-1]}",
                                                                      done, n))
    finally:
        engine.close()


def result_dict(result: EvolveResult) -> dict[str, Any]:
    """A write's result for ``--json``: the version or the candidate, the decision, and
    whether it went live gated."""
    return {"version": result.version.id if result.version else None,
            "parent": result.version.parent if result.version else None,
            "candidate": result.candidate, "gated": result.decision is not None,
            "decision": result.decision.to_dict() if result.decision else None,
            "note": result.note, "changed": sorted(result.patch.changes)}


def refused(result: EvolveResult | None) -> None:
    """Exit 12 (``EXIT_GATE_REFUSED``) when a gated write did not go live."""
    if result is not None and result.version is None:
        raise SystemExit(EXIT_GATE_REFUSED)


def print_result(result: EvolveResult, *, done: str) -> None:
    """The outcome of a write: ``done`` (e.g. ``committed hand edits as``) and the version;
    that it went live unmeasured; or the gate's decision and the candidate it kept."""
    out = console()
    if result.decision is not None:
        print_decision(out, result.decision.to_dict())
    elif result.note and result.version is None:
        out.print(f"[yellow]{escape(result.note)}[/]", markup=True, soft_wrap=True)
    if result.version is not None:
        out.print(f"{done} version [bold]{result.version.id}[/]", markup=True, soft_wrap=True)
    if result.version is not None and result.decision is None:
        out.print(f"[yellow]warning:[/] {result.version.id} {escape(result.note)}; `whetstone "
                  "library log` marks it ungated (gate a write with --gate-tasks SET@dev)",
                  markup=True, soft_wrap=True)
    if result.candidate:
        out.print(f"not applied: kept as candidate [bold]{result.candidate}[/] "
                  f"(`whetstone library candidates show {result.candidate}`)", markup=True,
                  soft_wrap=True)


# -- the writes -----------------------------------------------------------------------------

def commit_edits(lib: Library, message: str, gate: GatedWrite, *,
                 as_json: bool = False) -> EvolveResult:
    """``library commit``: the hand edits in the view, landed (``run_write``)."""
    changes, base = view_changes(lib)
    if not changes:
        raise LibraryError("no hand edits to commit: the view equals " + base,
                           hint="edit files under skills/ or policies/ first")
    return run_write(lib, LibraryPatch("edit", changes, message), by="library commit",
                     gate=gate, expect_parent=base, as_json=as_json,
                     how_to_gate=f"whetstone library commit -m {shlex.quote(message)} "
                                 "--gate-tasks SET@dev")


def roll_back(lib: Library, target: str, message: str, gate: GatedWrite, *,
              as_json: bool = False) -> EvolveResult:
    """``library rollback``: the change back to ``target``'s files, landed."""
    changes = rollback_changes(lib, target)
    if not changes:
        raise LibraryError(f"nothing to roll back: the current version equals {target}",
                           hint="`whetstone library log` lists the versions")
    patch = LibraryPatch("rollback", changes, message or f"rollback to {target}")
    return run_write(lib, patch, by="library rollback", gate=gate,
                     expect_parent=lib.current_id(), as_json=as_json,
                     how_to_gate=f"whetstone library rollback {target} --gate-tasks SET@dev")


def apply_candidate(lib: Library, name: str, gate: GatedWrite, *, force: bool = False,
                    as_json: bool = False) -> EvolveResult:
    """``library candidates apply``: without gate tasks the candidate is applied as it is,
    marked ungated whatever its gate said before; with them it is gated now, against the
    current version (refused, it stays a candidate, its decision the new one)."""
    # lazy: the evolve path loads the evaluation runner; `whetstone --help` imports us
    from whetstone.engine.evolution.landing import UNMEASURED, ungated_record
    from whetstone.engine.evolution.pipeline import EvolveResult

    cand = lib.candidates.get(name)
    if gate.tasks is None:
        check_gated(lib, None, what="`whetstone library candidates apply`", hint=(
            f"gate it now: `whetstone library candidates apply {name} --gate-tasks SET@dev`"))
        v = lib.candidates.apply(name, force=force, scores={
            "ungated": ungated_record("library candidates apply")})
        return EvolveResult(LibraryPatch(cand.method, dict.fromkeys(cand.changes),
                                         cand.message), "", version=v, note=UNMEASURED)
    clashes = lib.candidates.conflicts(name)
    if clashes and not force:
        raise LibraryError(f"candidate {name} was prepared on {cand.base}; since then "
                           f"{', '.join(clashes[:5])} changed",
                           hint="review `whetstone library candidates show` and apply with "
                                "--force")
    patch = LibraryPatch(cand.method, candidate_changes(lib, name),
                         f"apply candidate {name}: {cand.message}", costs=cand.costs)
    result = run_write(lib, patch, by="library candidates apply", as_json=as_json,
                       gate=replace(gate, candidate=name))
    if result.version is not None:
        lib.candidates.drop(name)
    return result


# -- whetstone library config --------------------------------------------------------------

def _flag(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "on", "yes", "1"):
        return True
    if low in ("false", "off", "no", "0"):
        return False
    raise ConfigError(f"{text!r} is not true or false", hint="e.g. require_gate true")


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a whole number", hint="e.g. 30") from None
    if n < 0:
        raise ConfigError(f"{n} is below 0", hint="give 0 or more")
    return n


def _days(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number of days", hint="e.g. 30 or 0.5") from None
    if not n >= 0:
        raise ConfigError(f"{text} is below 0", hint="give 0 or more")
    return n


# The settings library.json holds, what each means, and how its value is read.
SETTINGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    SETTING: (("every write must pass a gate: an ungated commit, import, rollback or "
               "candidate refuses (true/false)"), _flag),
    "trace_keep_days": ("days of traces kept (older files dropped after each write)", _days),
    "trace_max_bytes": ("bytes of traces kept, the oldest files dropped first (0: no cap)",
                        _count),
    "trace_max_record_bytes": ("bytes one trace record may take; longer ones are cut", _count),
}


@click.command("config")
@click.argument("key", required=False)
@click.argument("value", required=False)
@library_option
@json_option
@handle_errors
def config_cmd(key: str | None, value: str | None, library_path: Path | None,
               as_json: bool) -> None:
    """Show or set the library's settings (its library.json): KEY shows one, KEY VALUE sets
    it, KEY unset removes it (its default applies). require_gate true makes every write
    without a passing gate refuse."""
    lib = open_library_for(library_path)
    if key is not None and key not in SETTINGS:
        raise ConfigError(f"unknown library setting {key!r}",
                          hint="settings: " + ", ".join(SETTINGS))
    if key is not None and value is not None:
        parsed = None if value.strip().lower() == "unset" else SETTINGS[key][1](value)
        lib.update_settings(**{key: parsed})
    settings = lib.settings()
    shown = {k: settings.get(k) for k in ([key] if key else SETTINGS)}
    if as_json:
        emit_json(shown)
        return
    for k, v in shown.items():
        click.echo(f"{k} = {json.dumps(v) if v is not None else '(unset)'}  # {SETTINGS[k][0]}")
