"""Change control for the writes a person makes: a hand commit, an import, a rollback, a
candidate applied. Each lands through the same gate as ``evolve`` (``gate_and_apply``: a
refused change is kept as a candidate) when gate tasks are named; without them it is committed
(a person chose it), marked in its manifest as ungated (``scores["ungated"]``: which command,
and that it went live unmeasured), unless the library requires a gate
(``change_control.requires_gate``): then it refuses, naming the command to run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from whetstone.engine.evaluation.gate import DEFAULT_RULE
from whetstone.engine.evaluation.runner import ProgressFn, Solver
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
from whetstone.engine.evolution.pipeline import EvolveResult, gate_and_apply, patch_diff
from whetstone.engine.methods.base import LibraryPatch
from whetstone.library_store.change_control import SETTING, check_gated
from whetstone.library_store.store import Library, Snapshot

UNMEASURED = ("went live unmeasured: no gate ran (no --gate-tasks), so nothing says whether it "
              "helps or hurts")


@dataclass(frozen=True)
class GateChoice:
    """How a write is gated: its held-out ``tasks`` (None: none, the write goes live
    ungated) and the gate's options, as ``evolve`` takes them."""

    tasks: TaskSet | Sequence[TaskRecord] | str | None = None
    rule: str = DEFAULT_RULE
    seed: int = 0
    concurrency: int = 1
    scorer: str | None = None
    allow_errors: bool = False
    candidate: str | None = None


def ungated_record(by: str) -> dict[str, Any]:
    """What an ungated version's manifest keeps under ``scores["ungated"]``."""
    return {"by": by, "note": UNMEASURED}


def land(patch: LibraryPatch, library: Library, *, by: str, gate: GateChoice,
         make_solver: Callable[[Snapshot], Solver] | None = None,
         expect_parent: str | None = None, how_to_gate: str | None = None,
         on_progress: ProgressFn | None = None, on_phase: Callable[[str], None] | None = None,
         on_run: Callable[[str], None] | None = None) -> EvolveResult:
    """Land ``patch`` as the command ``by`` (``library commit``): through the gate when
    ``gate.tasks`` are named (``make_solver`` builds a solver over a snapshot), else as an
    ungated version with ``note`` saying it went live unmeasured. ``GateRequired`` (with
    ``how_to_gate``, the command to run, as its hint) when the library requires a gate and none
    is named."""
    if gate.tasks is None:
        check_gated(library, None, what=f"`whetstone {by}`", hint=how_to_gate and (
            f"name held-out tasks for the gate: `{how_to_gate}`, or turn the setting off: "
            f"`whetstone library config {SETTING} false`"))
        diff = patch_diff(library, patch.changes)
        version = library.commit(patch.changes, method=patch.method, message=patch.message,
                                 scores={"ungated": ungated_record(by)}, costs=patch.costs,
                                 expect_parent=expect_parent)
        return EvolveResult(patch=patch, diff=diff, version=version, note=UNMEASURED)
    if make_solver is None:
        raise ValueError("a gated write needs make_solver")
    return gate_and_apply(patch, library, make_solver=make_solver, gate_tasks=gate.tasks,
                          rule=gate.rule, seed=gate.seed, concurrency=gate.concurrency,
                          candidate_name=gate.candidate, allow_errors=gate.allow_errors,
                          scorer=gate.scorer, on_progress=on_progress, on_phase=on_phase,
                          on_run=on_run)
