"""The one path every evolver takes, from stored traces to a new library version.

    select traces (a filter over the store; run the task set first when none are stored)
    -> evolver.fit(traces, snapshot, analyst, labels, context=...) -> LibraryPatch
    -> preview snapshot -> run_gate(current vs preview on the gate tasks)
    -> accepted: commit as a new version (decision, costs in the manifest)
    -> rejected: kept as a named candidate (inspect and apply it by hand later)

``make_solver(snapshot)`` builds the agent's solver over a library snapshot; the caller
(``Engine.evolve``) injects it, so this module knows nothing about backends. Progress is
reported as ``on_progress(phase, done, total)``: ``collect <set>``, ``<method> <phase>``,
``gate: current``, ``gate: candidate``.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from whetstone.engine.backends.base import Backend
from whetstone.engine.errors import ConfigError, TasksFailed
from whetstone.engine.evaluation.gate import DEFAULT_RULE, Decision, run_gate
from whetstone.engine.evaluation.runner import ProgressFn, Solver, evaluate
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet, tasks_from_traces
from whetstone.engine.evolution.summary import held_summary
from whetstone.engine.methods.base import EvolveContext, Evolver, LibraryPatch, Progress
from whetstone.engine.runtime.library_tools import validate_library
from whetstone.engine.types import LibraryVersion, Trace
from whetstone.library_store.store import Library, Snapshot
from whetstone.library_store.traces import TraceQuery
from whetstone.tools.base import Tool


def training_traces(traces: Iterable[Trace], limit: int | None = None) -> list[Trace]:
    """What an evolver learns from: finished runs, without the gate's own runs and an
    evolver's runs over a preview (they score libraries that may never be committed, the
    gate's often on held-out tasks that must not leak into training), and without runs that
    failed (outcome ``error``: a model call that raised says nothing about what the model
    does, and read as a failure it would teach a lesson nobody measured). Oldest first; the
    newest ``limit`` when given."""
    kept = [t for t in traces if t.outcome not in ("running", "error") and "gate" not in t.meta
            and "evolve_preview" not in t.meta]
    return kept[-limit:] if limit else kept


def select_traces(library: Library, query: TraceQuery, *, limit: int | None = None,
                  tasks: TaskSet | None = None, make_solver: Callable[[Snapshot | None], Solver]
                  | None = None, concurrency: int = 1, seed: int = 0, model: str = "",
                  on_progress: Progress | None = None) -> list[Trace]:
    """The training traces ``query`` selects (``training_traces``). With ``tasks``, only that
    set's traces; when none are stored yet and ``make_solver`` is given, the set is run first
    (phase ``collect <name>``). ``ConfigError`` when nothing matches."""
    if tasks is not None:
        query = replace(query, task_set=tasks.name)
    traces = training_traces(library.traces.query(query), limit)
    if not traces and tasks is not None and make_solver is not None:
        report = on_progress or (lambda phase, done, total: None)
        phase = f"collect {tasks.name}"
        report(phase, 0, len(tasks))
        evaluate(tasks, make_solver(None), concurrency=concurrency, seed=seed,
                 store=library.traces, model=model or None,
                 on_progress=lambda done, n, r: report(phase, done, n))
        traces = training_traces(library.traces.query(query), limit)
    if not traces:
        raise ConfigError("no traces match", hint="run `whetstone eval --tasks SET` first, or "
                                                  "widen --traces (see `whetstone traces ls`)")
    return traces


@dataclass
class EvolveResult:
    """What happened to a patch. Exactly one of ``version`` / ``candidate`` is set when the
    gate ran; neither on a dry run or an empty patch. ``traces``: how many it learned from."""

    patch: LibraryPatch
    diff: str
    decision: Decision | None = None
    version: LibraryVersion | None = None
    candidate: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""
    traces: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.patch.method, "message": self.patch.message,
            "changed": sorted(self.patch.changes), "diff": self.diff,
            "decision": self.decision.to_dict() if self.decision else None,
            "version": self.version.id if self.version else None,
            "candidate": self.candidate, "seconds": self.seconds, "note": self.note,
            "details": dict(self.patch.details), "costs": dict(self.patch.costs),
            "traces": self.traces,
        }


def patch_diff(library: Library, changes: Mapping[str, str | None],
               snapshot: Snapshot | None = None) -> str:
    """A unified diff from the current version to the current version plus ``changes``."""
    snap = snapshot or library.snapshot()
    out: list[str] = []
    for path in sorted(changes):
        before = snap.read_text(path) if snap.exists(path) else None
        after = changes[path]
        if before == after:
            continue
        out += difflib.unified_diff(
            (before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
            fromfile=f"a/{path}" if before is not None else "/dev/null",
            tofile=f"b/{path}" if after is not None else "/dev/null")
    return "".join(out)


def gate_and_apply(
    patch: LibraryPatch,
    library: Library,
    *,
    make_solver: Callable[[Snapshot], Solver],
    gate_tasks: TaskSet | Sequence[TaskRecord] | str,
    rule: str = DEFAULT_RULE,
    seed: int = 0,
    concurrency: int = 1,
    candidate_name: str | None = None,
    dry_run: bool = False,
    on_progress: ProgressFn | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_run: Callable[[str], None] | None = None,
    allow_errors: bool = False,
) -> EvolveResult:
    """Score ``patch`` against the current version and land it as a version or a candidate.
    ``on_run`` is told which of the gate's two runs ("current", "candidate") starts. When
    tasks fail in a gate run, nothing is decided (unless ``allow_errors``): the patch is kept
    as a candidate and ``note`` names the failed tasks."""
    say = on_phase or (lambda phase: None)
    current = library.snapshot()
    diff = patch_diff(library, patch.changes, current)
    result = EvolveResult(patch=patch, diff=diff)
    if patch.empty or not diff:
        result.note = "the evolver proposed no change"
        return result
    if dry_run:
        result.note = "dry run: nothing scored or written"
        return result
    preview = library.preview(patch.changes, label=patch.method, method=patch.method)
    # The library's own validator (the faces open it with every method's), else the core rules.
    problems = (library.validator or validate_library)(preview, sorted(patch.changes))
    if problems:
        result.note = "the change breaks the library's rules: " + "; ".join(
            str(p) for p in problems[:5])
        result.candidate = _save_candidate(library, patch, candidate_name, None, result.note)
        return result
    say("gate")
    start = time.perf_counter()
    try:
        decision = run_gate(
            gate_tasks, make_solver(preview), make_solver(current), rule=rule, seed=seed,
            concurrency=concurrency, store=library.traces, candidate_version=preview.id,
            current_version=current.id, on_progress=on_progress, on_run=on_run,
            allow_errors=allow_errors)
    except TasksFailed as exc:
        # The fit's work is kept: the gate can be run again once the failures are fixed.
        result.seconds["gate"] = round(time.perf_counter() - start, 3)
        result.note = f"{exc.message}; {exc.hint}"
        result.candidate = _save_candidate(library, patch, candidate_name, None, result.note)
        return result
    result.seconds["gate"] = round(time.perf_counter() - start, 3)
    result.decision = decision
    scores = {"gate": decision.to_dict()}
    costs = {**dict(patch.costs), "gate_seconds": result.seconds["gate"]}
    if decision.accepted:
        say("commit")
        # validate=False: validate_library has passed this very change on a preview of
        # ``current``, and expect_parent lands it only on that version, so the committed
        # tree is the one checked; checking it again would only repeat the work.
        result.version = library.commit(
            patch.changes, method=patch.method, message=patch.message, scores=scores,
            costs=costs, validate=False, expect_parent=current.id)
    else:
        result.candidate = _save_candidate(library, patch, candidate_name, decision, "")
    return result


def _save_candidate(library: Library, patch: LibraryPatch, name: str | None,
                    decision: Decision | None, note: str) -> str:
    scores: dict[str, Any] = {"gate": decision.to_dict()} if decision else {"rejected": note}
    cand = library.candidates.save(name, patch.changes, method=patch.method,
                                   message=patch.message, scores=scores, costs=dict(patch.costs))
    return cand.name


def evolve(
    evolver: Evolver,
    library: Library,
    *,
    analyst: Backend,
    make_solver: Callable[[Snapshot | None], Solver],
    traces: Sequence[Trace] | None = None,
    query: TraceQuery | None = None,
    limit: int | None = None,
    tasks: TaskSet | None = None,
    labels: Mapping[str, str] | None = None,
    gate_tasks: TaskSet | Sequence[TaskRecord] | str | None = None,
    rule: str = DEFAULT_RULE,
    seed: int = 0,
    concurrency: int = 1,
    candidate_name: str | None = None,
    dry_run: bool = False,
    model: str = "",
    max_agent_runs: int | None = None,
    on_progress: Progress | None = None,
    on_phase: Callable[[str], None] | None = None,
    allow_errors: bool = False,
    agent_tools: Callable[[], Sequence[Tool]] | None = None,
) -> EvolveResult:
    """Learn from traces with ``evolver`` and land the patch through the gate.

    ``traces`` are used as given; otherwise ``query`` (default: every finished trace)
    selects them from the library's store, newest ``limit``, only ``tasks``' own when given
    (running ``tasks`` first when none are stored). The gate scores on ``gate_tasks``
    (default: the traces' own tasks); a gate run with failed tasks decides nothing unless
    ``allow_errors`` (see ``gate_and_apply``). ``agent_tools()``: the tools the agent runs
    with (``EvolveContext.agent_tools``).
    """
    report = on_progress or (lambda phase, done, total: None)
    say = on_phase or (lambda phase: None)
    chosen = list(traces) if traces is not None else select_traces(
        library, query or TraceQuery(), limit=limit, tasks=tasks, make_solver=make_solver,
        concurrency=concurrency, seed=seed, model=model, on_progress=report)
    context = EvolveContext(
        library=library, make_solver=make_solver, tasks=tasks, store=library.traces,
        model=model, seed=seed, concurrency=concurrency, max_agent_runs=max_agent_runs,
        on_progress=lambda phase, done, total: report(f"{evolver.name} {phase}", done, total),
        on_phase=say)
    if agent_tools:
        context.agent_tools = agent_tools
    say("fit")
    start = time.perf_counter()
    snapshot = library.snapshot()
    patch = evolver.fit(chosen, snapshot, analyst, labels, context=context)
    fit_s = round(time.perf_counter() - start, 3)
    held = {*(p for p in snapshot.files() if p not in patch.changes),
            *(p for p, text in patch.changes.items() if text is not None)}
    patch = replace(patch, message=held_summary(patch.message, held, patch.changes))
    gate_set = gate_tasks if gate_tasks is not None else tasks_from_traces(chosen)
    which: list[str] = []
    result = gate_and_apply(
        patch, library, make_solver=make_solver, gate_tasks=gate_set, rule=rule, seed=seed,
        concurrency=concurrency, candidate_name=candidate_name, dry_run=dry_run,
        on_progress=lambda done, n, r: report(f"gate: {which[-1]}", done, n),
        on_phase=say, on_run=which.append, allow_errors=allow_errors)
    result.traces = len(chosen)
    result.seconds["fit"] = fit_s
    return result
