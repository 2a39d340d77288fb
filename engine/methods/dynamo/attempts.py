"""Dynamo's ATTEMPT and CHECK phases: the agent's runs on the training tasks, as attempts the
analyst reads and the rounds compare."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ...types import Trace
from ..analyst import render_trace
from .parts import (
    Attempt,
)

if TYPE_CHECKING:
    from ...evaluation.tasks import TaskRecord
from .run import RunCore


class AttemptPhase(RunCore):
    """Run the agent and keep what it did as attempts (see ``evolver.py``)."""

    def _attempt_of(self, task: TaskRecord, trace: Trace | None, score: float) -> Attempt:
        expected = task.expected if isinstance(task.expected, str) else json.dumps(
            task.expected, ensure_ascii=False)
        text = render_trace(trace, max_chars=2500) if trace is not None else \
            f"Task: {task.prompt}\n(the run was not stored)"
        return Attempt(task.id, trace.id if trace else "", score, task.prompt, expected,
                       trace.answer if trace else None, text, task.image)

    def _first_attempts(self, traces: Sequence[Trace]) -> dict[str, Attempt]:
        """Round 1's attempts: the given runs of these tasks (scored by the task's scorer when
        they carry no score), the missing ones run now over the current library."""
        # lazy: loads filelock and 41 more of our modules
        from ...evaluation.scorers import get_scorer

        out: dict[str, Attempt] = {}
        for t in traces:
            task = self.tasks.get(str(t.meta.get("task_id")))
            # A failed run (outcome error) is no attempt: the task is run again below.
            if task is None or t.outcome in ("running", "error") or "evolve_preview" in t.meta:
                continue
            score = t.score if t.score is not None else get_scorer(task.scorer)(t, task)
            out[task.id] = self._attempt_of(task, t, score)
        missing = [i for i in self.tasks if i not in out]
        if missing:
            out.update(self._attempt(missing, None, "attempts"))
        return {i: out[i] for i in self.tasks if i in out}

    def _attempt(self, ids: list[str], changes: Mapping[str, str] | None, phase: str
                 ) -> dict[str, Attempt]:
        """Run the agent on ``ids`` over the current library plus ``changes`` (None: the
        current library); an interrupted run keeps what finished and resumes from it."""
        # lazy: loads filelock and 6 more of our modules
        from ....library_store.traces import TraceQuery

        st, ctx = self.state, self.context
        done = {i: a for i, a in st.pending.items() if i in ids}
        todo = [self.tasks[i] for i in ids if i not in done]
        snapshot = None
        if changes is not None:
            assert ctx.library is not None
            snapshot = ctx.library.preview(changes, label=f"dynamo-{phase.replace(' ', '-')}",
                                           method="dynamo")
        result = ctx.run_agent(todo, snapshot=snapshot, phase=phase) if todo else None
        if result is not None:
            st.agent_runs += result.n
            assert ctx.store is not None
            traces = {t.id: t for t in ctx.store.query(TraceQuery(ids=frozenset(
                r.trace_id for r in result.results if r.trace_id)))}
            for r in result.results:
                # A failed task is unmeasured: no attempt, never a wrong answer to the
                # analyst or the training accuracy (rounds compare the tasks both measured).
                if r.scored:
                    done[r.task_id] = self._attempt_of(self.tasks[r.task_id],
                                                       traces.get(r.trace_id or ""), r.score)
            if result.partial:
                st.pending = done
                self.save()
                raise KeyboardInterrupt(f"dynamo {phase}: interrupted; run the same evolve "
                                        "again to resume")
        st.pending = {}
        return {i: done[i] for i in ids if i in done}

