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

from ...library_store.store import Library, Snapshot
from ...library_store.traces import TraceQuery
from ...tools.base import Tool
from ..backends.base import Backend
from ..backends.counted import CountedCalls
from ..errors import ConfigError, EvalError, TasksFailed
from ..evaluation.answers import normalise
from ..evaluation.gate import DEFAULT_RULE, Decision, run_gate
from ..evaluation.gate import gate_tasks as resolve_gate_tasks
from ..evaluation.runner import ProgressFn, Solver, evaluate
from ..evaluation.tasks import (
    TaskRecord,
    TaskSet,
    parse_spec,
    split_of,
    tasks_from_traces,
)
from ..library.checks import validate_library
from ..methods.base import EvolveContext, Evolver, LibraryPatch, Progress
from ..types import LibraryVersion, Trace
from .leaks import drop_label_leaks, labelled_tasks
from .summary import held_summary


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
                  on_progress: Progress | None = None, scorer: str | None = None
                  ) -> list[Trace]:
    """The training traces ``query`` selects (``training_traces``). With ``tasks``, only that
    set's traces; when none are stored yet and ``make_solver`` is given, the set is run first
    (phase ``collect <name>``, scored by ``scorer`` when given). ``ConfigError`` when nothing
    matches."""
    if tasks is not None:
        query = replace(query, task_set=tasks.name)
    traces = training_traces(library.traces.query(query), limit)
    if not traces and tasks is not None and make_solver is not None:
        report = on_progress or (lambda phase, done, total: None)
        phase = f"collect {tasks.name}"
        report(phase, 0, len(tasks))
        evaluate(tasks, make_solver(None), scorer, concurrency=concurrency, seed=seed,
                 store=library.traces, model=model or None,
                 on_progress=lambda done, n, r: report(phase, done, n))
        traces = training_traces(library.traces.query(query), limit)
    if not traces:
        raise ConfigError("no traces match", hint="run `whetstone eval --tasks SET` first, or "
                                                  "widen --traces (see `whetstone traces ls`)")
    return traces


HELD_OUT = "dev"  # the split of the traces' tasks the default gate decides on


def task_key(trace: Trace) -> str:
    """What a trace's task is for the split rule: its task id (set by eval, and by imports
    that carry one), else its question text, so two runs of one question share a split."""
    return str(trace.meta.get("task_id") or trace.task)


@dataclass
class GateSplit:
    """Which traces the evolver learns from and which tasks the gate decides on: never the
    same task. ``withheld``: traces kept from the evolver, by why (``dev``: the gate's,
    ``test``: left for a test report, ``gate``: a task of the gate set named)."""

    train: list[Trace]
    gate: TaskSet | Sequence[TaskRecord]
    withheld: dict[str, int] = field(default_factory=dict)
    held_out: bool = False  # the gate's tasks were held out by the split rule (no gate named)

    def to_dict(self) -> dict[str, Any]:
        return {"train_traces": len(self.train), "gate_tasks": len(self.gate),
                "held_out": self.held_out, "withheld": dict(self.withheld)}


def _suggest_gate(tasks: TaskSet | None) -> str:
    """``--gate-tasks`` for the set the evolve learns from: its dev split."""
    if tasks is not None:
        try:
            return f"{parse_spec(tasks.name).source}@{HELD_OUT}:0:30"
        except EvalError:
            pass
    return f"SET@{HELD_OUT}:0:30"


def _no_held_out(why: str, tasks: TaskSet | None) -> ConfigError:
    return ConfigError(
        f"the gate has no held-out task: {why}, and it never decides on a task the evolver "
        "learned from",
        hint=f"name held-out tasks: --gate-tasks {_suggest_gate(tasks)} (Python: "
             "gate_tasks=...); docs/gate.md, \"Which tasks the gate decides on\"")


def plan_gate(tasks: TaskSet | None,
              gate_tasks: TaskSet | Sequence[TaskRecord] | str | None, *,
              need_gate: bool = True
              ) -> tuple[TaskSet | None, TaskSet | Sequence[TaskRecord] | None]:
    """Before any trace is read: (the tasks the evolve learns from, the gate's tasks; None:
    the traces' held-out tasks, ``split_for_gate``). Named ``gate_tasks`` leave ``tasks``
    without them (by id or question); otherwise the gate takes ``tasks``' dev split (the
    records themselves) and the evolve learns from its train split only. ``ConfigError``
    with the command to run when that leaves the gate nothing (``need_gate``)."""
    if gate_tasks is not None:
        gate = resolve_gate_tasks(gate_tasks)
        ids, questions = {t.id for t in gate}, {normalise(t.prompt) for t in gate}
        learn = None if tasks is None else TaskSet(name=tasks.name, tasks=tuple(
            t for t in tasks if t.id not in ids and normalise(t.prompt) not in questions))
        if tasks is not None and learn is not None and len(tasks) and not len(learn):
            raise ConfigError(f"nothing to learn from: every task of {tasks.name} is one the "
                              "gate decides on", hint="gate on other tasks than you learn "
                                                      "from: --tasks SET@train --gate-tasks "
                                                      "SET@dev")
        return learn, gate
    if tasks is None:
        return None, None
    dev = tuple(t for t in tasks if split_of(t.id) == HELD_OUT)
    if need_gate and not dev:
        raise _no_held_out(f"none of the {len(tasks)} tasks of {tasks.name} falls in the "
                           f"{HELD_OUT} split", tasks)
    learn = TaskSet(name=tasks.name, tasks=tuple(t for t in tasks if split_of(t.id) == "train"))
    return learn, TaskSet(name=f"{tasks.name}, its {HELD_OUT} split", tasks=dev)


def split_for_gate(traces: Sequence[Trace], *,
                   gate: TaskSet | Sequence[TaskRecord] | None = None, held_out: bool = True,
                   tasks: TaskSet | None = None, scorer: str | None = None,
                   need_gate: bool = True) -> GateSplit:
    """Keep the gate's tasks out of what the evolver learns from.

    ``held_out`` (no gate named): the traces' tasks are split by the split rule
    (``split_of(task_key(trace))``): ``train`` traces learn, ``dev`` ones are the gate's (its
    tasks: ``gate`` when ``plan_gate`` gave them, else the labelled dev traces as tasks, scored
    by ``scorer`` when given), ``test`` ones do neither (a test report on the same set stays
    clean). Otherwise every trace whose task is one of ``gate``'s, by id or by question, is
    withheld. ``ConfigError`` naming ``--gate-tasks`` when no held-out task exists
    (``need_gate``), or when every trace given is the gate's."""
    if held_out:
        by_split: dict[str, list[Trace]] = {"train": [], "dev": [], "test": []}
        for t in traces:
            by_split[split_of(task_key(t))].append(t)
        if gate is None:
            newest: dict[str, Trace] = {}
            for t in by_split[HELD_OUT]:
                if t.label is not None:
                    newest[task_key(t)] = t  # oldest first: one task per question, the newest
            gate = tasks_from_traces(list(newest.values()), scorer=scorer or "normalised",
                                     name=f"the traces' {HELD_OUT} split",
                                     scorer_wins=scorer is not None)
            if need_gate and not len(gate):
                dev = len(by_split[HELD_OUT])
                raise _no_held_out(
                    f"none of the {dev} trace(s) of {HELD_OUT}-split tasks has a label (an "
                    "expected answer)" if dev else f"no task of the {len(traces)} trace(s) "
                    f"falls in the {HELD_OUT} split", tasks)
        split = GateSplit(by_split["train"], gate, {k: len(v) for k, v in by_split.items()
                                                    if k != "train" and v}, held_out=True)
    else:
        gate = gate or ()
        ids, questions = {t.id for t in gate}, {normalise(t.prompt) for t in gate}
        train = [t for t in traces
                 if task_key(t) not in ids and normalise(t.task) not in questions]
        split = GateSplit(train, gate, {"gate": len(traces) - len(train)}
                          if len(train) < len(traces) else {})
    if traces and not split.train:
        raise ConfigError(
            f"nothing to learn from: every one of the {len(traces)} trace(s) is a task the "
            "gate decides on (" + ", ".join(f"{n} {k}" for k, n in split.withheld.items())
            + ")", hint="learn from other tasks (--tasks SET@train, --traces FILTER), or "
                        "gate on other tasks (--gate-tasks SET@dev)")
    return split


@dataclass
class EvolveResult:
    """What happened to a patch. Exactly one of ``version`` / ``candidate`` is set when the
    gate ran (a candidate also when the gate accepted a change not to be committed); neither
    on a dry run or an empty patch. ``traces``: how many it learned from."""

    patch: LibraryPatch
    diff: str
    decision: Decision | None = None
    version: LibraryVersion | None = None
    candidate: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""
    traces: int = 0
    split: dict[str, Any] = field(default_factory=dict)  # GateSplit.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.patch.method, "message": self.patch.message,
            "changed": sorted(self.patch.changes), "diff": self.diff,
            "decision": self.decision.to_dict() if self.decision else None,
            "version": self.version.id if self.version else None,
            "candidate": self.candidate, "seconds": self.seconds, "note": self.note,
            "details": dict(self.patch.details), "costs": dict(self.patch.costs),
            "traces": self.traces, "split": dict(self.split),
        }


def patch_diff(library: Library, changes: Mapping[str, str | bytes | None],
               snapshot: Snapshot | None = None) -> str:
    """A unified diff from the current version to the current version plus ``changes``
    (bytes read as UTF-8, what is not shown replaced)."""
    snap = snapshot or library.snapshot()
    out: list[str] = []
    for path in sorted(changes):
        before = snap.read_bytes(path).decode("utf-8", "replace") if snap.exists(path) \
            else None
        raw = changes[path]
        after = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
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
    scorer: str | None = None,
    commit: bool = True,
) -> EvolveResult:
    """Score ``patch`` against the current version and land it as a version or a candidate.
    ``scorer`` (a name ``get_scorer`` reads) scores every gate task instead of its own.
    ``commit=False`` keeps an accepted change as a candidate too (``decision.accepted`` says
    it passed): a learner serves it as a canary before it may become current.
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
    say(f"gate: the current version and the candidate on {len(gate_tasks)} task(s)"
        if not isinstance(gate_tasks, str) else f"gate: on {gate_tasks}")
    start = time.perf_counter()
    try:
        decision = run_gate(
            gate_tasks, make_solver(preview), make_solver(current), scorer, rule=rule, seed=seed,
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
    if decision.accepted and commit:
        say("commit: a new version")
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
    scorer: str | None = None,
    commit: bool = True,
) -> EvolveResult:
    """Learn from traces with ``evolver`` and land the patch through the gate.

    ``traces`` are used as given; otherwise ``query`` (default: every finished trace)
    selects them from the library's store, newest ``limit``, only ``tasks``' own when given
    (running ``tasks`` first when none are stored). The gate scores on ``gate_tasks``;
    without, on the traces' own dev-split tasks, held out from the evolver
    (``split_for_gate``: the gate never decides on a task the evolver learned from). A gate
    run with failed tasks decides nothing unless ``allow_errors`` (see ``gate_and_apply``).
    ``agent_tools()``: the tools the agent runs with (``EvolveContext.agent_tools``).
    ``scorer`` (the person's choice: ``--scorer``) scores every task instead of its own: the
    runs collected, the evolver's own runs of ``tasks`` and the gate. ``commit=False``: an
    accepted change is kept as a candidate (``gate_and_apply``).
    """
    report = on_progress or (lambda phase, done, total: None)
    say = on_phase or (lambda phase: None)
    learn, gate = plan_gate(tasks, gate_tasks, need_gate=not dry_run)
    if scorer is not None and learn is not None:
        learn = TaskSet(name=learn.name, tasks=tuple(t.with_(scorer=scorer) for t in learn))
    chosen = list(traces) if traces is not None else select_traces(
        library, query or TraceQuery(), limit=limit, tasks=learn, make_solver=make_solver,
        concurrency=concurrency, seed=seed, model=model, on_progress=report, scorer=scorer)
    split = split_for_gate(chosen, gate=gate, held_out=gate_tasks is None, tasks=tasks,
                           scorer=scorer, need_gate=not dry_run)
    report("traces read", len(chosen), len(chosen))
    withheld = ", ".join(f"{n} {why}" for why, n in split.withheld.items())
    say(f"traces: {len(chosen)} read, {len(split.train)} to learn from"
        + (f" ({withheld} kept out)" if withheld else "") + f"; the gate: {len(split.gate)} "
        f"task(s){' held out of them' if split.held_out else ''}")
    # Each analyst call is reported as it returns, whatever the evolver does with the model.
    analyst = CountedCalls(analyst, lambda n: report("analyst calls", n, 0))
    context = EvolveContext(
        library=library, make_solver=make_solver, tasks=learn, store=library.traces,
        model=model, seed=seed, concurrency=concurrency, max_agent_runs=max_agent_runs,
        on_progress=lambda phase, done, total: report(f"{evolver.name} {phase}", done, total),
        on_phase=say)
    if agent_tools:
        context.agent_tools = agent_tools
    say(f"fit: {evolver.name} on {len(split.train)} trace(s)")
    start = time.perf_counter()
    snapshot = library.snapshot()
    patch = evolver.fit(split.train, snapshot, analyst, labels, context=context)
    fit_s = round(time.perf_counter() - start, 3)
    pairs = [(t.task, (labels or {}).get(t.id, t.label)) for t in split.train]
    pairs += [(t.question, t.expected) for t in learn or () if t.question]
    patch, leaks = drop_label_leaks(patch, labelled_tasks(pairs))
    if leaks.total:
        say(f"label leaks: {leaks.total} line(s) that held a training answer dropped"
            + (f", {len(leaks.refused)} file(s) refused" if leaks.refused else ""))
    held = {*(p for p in snapshot.files() if p not in patch.changes),
            *(p for p, text in patch.changes.items() if text is not None)}
    patch = replace(patch, message=held_summary(patch.message, held, patch.changes))
    which: list[str] = []
    result = gate_and_apply(
        patch, library, make_solver=make_solver, gate_tasks=split.gate, rule=rule, seed=seed,
        concurrency=concurrency, candidate_name=candidate_name, dry_run=dry_run,
        on_progress=lambda done, n, r: report(f"gate: {which[-1]}", done, n),
        on_phase=say, on_run=which.append, allow_errors=allow_errors, scorer=scorer,
        commit=commit)
    result.traces = len(split.train)
    result.split = split.to_dict()
    result.seconds["fit"] = fit_s
    return result
