"""Gate a ``LibraryPatch`` and land it: the same path for every evolver.

    patch -> preview snapshot -> run_gate(current vs preview on the gate tasks)
          -> accepted: commit as a new version (decision, costs in the manifest)
          -> rejected: kept as a named candidate (inspect and apply it by hand later)

``make_solver(snapshot)`` builds the agent's solver over a library snapshot; the caller
(``Engine``) injects it, so this module knows nothing about backends.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.evaluation.gate import Decision, run_gate
from engine.evaluation.runner import ProgressFn, Solver
from engine.evaluation.tasks import TaskRecord, TaskSet
from engine.methods.base import LibraryPatch
from engine.types import LibraryVersion, Trace
from library_store.store import Library, Snapshot
from skills.loader import validate_snapshot


def training_traces(traces: Iterable[Trace], limit: int | None = None) -> list[Trace]:
    """What an evolver learns from: finished runs, without the gate's own runs (they score
    libraries that may never be committed, often on held-out tasks that must not leak into
    training). Oldest first; the newest ``limit`` when given."""
    kept = [t for t in traces if t.outcome != "running" and "gate" not in t.meta]
    return kept[-limit:] if limit else kept


@dataclass
class EvolveResult:
    """What happened to a patch. Exactly one of ``version`` / ``candidate`` is set when the
    gate ran; neither on a dry run or an empty patch."""

    patch: LibraryPatch
    diff: str
    decision: Decision | None = None
    version: LibraryVersion | None = None
    candidate: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.patch.method, "message": self.patch.message,
            "changed": sorted(self.patch.changes), "diff": self.diff,
            "decision": self.decision.to_dict() if self.decision else None,
            "version": self.version.id if self.version else None,
            "candidate": self.candidate, "seconds": self.seconds, "note": self.note,
            "details": dict(self.patch.details), "costs": dict(self.patch.costs),
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
    rule: str = "not_worse",
    seed: int = 0,
    concurrency: int = 1,
    candidate_name: str | None = None,
    dry_run: bool = False,
    on_progress: ProgressFn | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> EvolveResult:
    """Score ``patch`` against the current version and land it as a version or a candidate."""
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
    problems = validate_snapshot(preview, sorted(patch.changes))
    if problems:
        result.note = "the change breaks the library's rules: " + "; ".join(
            str(p) for p in problems[:5])
        result.candidate = _save_candidate(library, patch, candidate_name, None, result.note)
        return result
    say("gate")
    start = time.perf_counter()
    decision = run_gate(
        gate_tasks, make_solver(preview), make_solver(current), rule=rule, seed=seed,
        concurrency=concurrency, store=library.traces, candidate_version=preview.id,
        current_version=current.id, on_progress=on_progress)
    result.seconds["gate"] = round(time.perf_counter() - start, 3)
    result.decision = decision
    scores = {"gate": decision.to_dict()}
    costs = {**dict(patch.costs), "gate_seconds": result.seconds["gate"]}
    if decision.accepted:
        say("commit")
        result.version = library.commit(
            patch.changes, method=patch.method, message=patch.message, scores=scores,
            costs=costs, validate=validate_snapshot, expect_parent=current.id)
    else:
        result.candidate = _save_candidate(library, patch, candidate_name, decision, "")
    return result


def _save_candidate(library: Library, patch: LibraryPatch, name: str | None,
                    decision: Decision | None, note: str) -> str:
    scores: dict[str, Any] = {"gate": decision.to_dict()} if decision else {"rejected": note}
    cand = library.candidates.save(name, patch.changes, method=patch.method,
                                   message=patch.message, scores=scores, costs=dict(patch.costs))
    return cand.name
