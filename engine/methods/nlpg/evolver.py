"""The NLPG evolver: policy notes per module, learned by walking scored runs backwards.

Each of ``steps`` update steps:

1. *rollouts*: the next ``batch`` labelled tasks run over the library as it stands (the start
   version, then a preview with the notes so far), through ``EvolveContext.run_agent``. With no
   tasks to run (a plain ``fit`` call), the next ``batch`` given traces are the step's runs;
2. *counters*: a note shown in a run that succeeded gets ``helpful + 1``; a note the backward
   pass names as having misled its module in a failed run gets ``harmful + 1``. Runs that fail
   without naming a note change no counter: a failure on a hard task says nothing about a note
   by itself (most runs of a small model fail);
3. *backward pass* over each failed run (``whetstone.engine.methods.nlpg.backward``): per-visit blame and
   a correction per (module, route), the feedback passed upstream rewritten by the analyst;
4. *bounded update* per module (``whetstone.engine.methods.nlpg.memory``): notes with harmful > helpful
   are retired, the corrections folded per (module, route) go to the curator (the analyst, or
   the rules), and at most ``max_ops`` operations land, never past ``budget_tokens``.

The notes after the last step are the patch: one library version, gated like any other by the
caller. Progress is saved after every analysed run and every step, under
``<library>/state/nlpg/`` (``Library.state``), so an interrupted evolve started again with the same start version,
tasks and options resumes where it stopped (rollouts already stored are not run again).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ....library_store.traces import TraceQuery
from ...backends.base import Backend
from ...errors import ConfigError
from ...evaluation.tasks import tasks_from_traces
from ...types import Trace
from ..analyst import AnalystStats
from ..base import EvolveContext, LibraryPatch, knob, library_texts
from .backward import (
    CorrectionGroup,
    Walk,
    WalkSettings,
    aggregate,
    shown_notes,
    walk_trace,
)
from .curator import curate
from .memory import (
    ApplyReport,
    Memory,
    apply_ops,
    count_uses,
    memory_changes,
    memory_from_dict,
    memory_from_files,
    memory_to_dict,
    note_tokens,
    retire_ops,
)
from .notes import PolicyNote

if TYPE_CHECKING:
    from ....library_store.state import MethodState
    from ....library_store.store import Snapshot
    from ...evaluation.tasks import TaskRecord

StepHook = Callable[[Mapping[str, Any], Memory], None]  # (step report, memory after it)


@dataclass(frozen=True)
class NLPGConfig:
    """Knobs of the NLPG evolver."""

    batch: int = knob(8, help="Runs per update step.", min=1)
    steps: int = knob(1, help="Update steps (each: run a batch, walk it back, update).", min=1)
    max_ops: int = knob(4, help="Most operations (ADD, EDIT, AGREE, REMOVE) per module per "
                                "step.", min=1)
    budget_tokens: int = knob(300, help="Most tokens of notes per module.", min=10)
    curator: str = knob("analyst", choices=("analyst", "rules"),
                        help="Who turns corrections into operations (rules: without an "
                             "analyst call; also the fallback).")
    max_visits: int = knob(3, help="Most module visits walked back per run.", min=1)
    min_weight: float = knob(0.1, help="Stop walking upstream when less blame is left.", min=0)
    modules: str = knob("", help="Modules to learn notes for, comma-separated (default: "
                                 "every module that calls the model).")
    learn_from_success: bool = knob(False, help="Also ask what the answering step of a "
                                                "successful run did right.")
    success_threshold: float = knob(1.0, help="A run scoring at least this succeeded.")
    workers: int = knob(4, help="Analyst calls in flight at once.", min=1)
    temperature: float = knob(0.3, help="The analyst's sampling temperature.", min=0)
    max_tokens: int = knob(512, help="Most tokens per analyst reply.", min=1)
    resume: bool = knob(True, help="Resume an interrupted run of this evolve.")
    seed: int = knob(0, cli=False)  # set from the shared --seed

    def module_set(self) -> frozenset[str] | None:
        names = frozenset(m.strip() for m in self.modules.split(",") if m.strip())
        return names or None


@dataclass
class _State:
    """Progress of one fit (what the checkpoint holds)."""

    memory: Memory
    done: int = 0
    reports: list[dict[str, Any]] = field(default_factory=list)
    stats: AnalystStats = field(default_factory=AnalystStats)
    counts: Counter[str] = field(default_factory=Counter)
    pending: dict[str, Any] | None = None  # the step in progress: its runs and walks

    def to_dict(self) -> dict[str, Any]:
        return {"memory": memory_to_dict(self.memory), "done": self.done,
                "reports": self.reports, "stats": asdict(self.stats),
                "counts": dict(self.counts), "pending": self.pending}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> _State:
        return cls(memory=memory_from_dict(d["memory"]), done=int(d["done"]),
                   reports=list(d["reports"]), stats=AnalystStats(**d["stats"]),
                   counts=Counter(d.get("counts") or {}), pending=d.get("pending"))


class _Checkpoint:
    """One fit's progress in ``<library>/state/nlpg/<key>.json`` (no store: not saved)."""

    def __init__(self, saved: MethodState | None, key: str) -> None:
        self.saved, self.key = saved, key

    def load(self) -> _State | None:
        data = self.saved.load(self.key) if self.saved is not None else None
        if data is None:
            return None
        try:
            return _State.from_dict(data["state"])
        except (KeyError, TypeError, ValueError):
            return None  # a foreign file: start over rather than fail

    def save(self, state: _State, *, finished: bool = False) -> None:
        if self.saved is not None:
            self.saved.save(self.key, {"format": 1, "key": self.key, "finished": finished,
                                       "saved": time.time(), "state": state.to_dict()})

    def drop_finished_others(self) -> None:
        """Remove the checkpoints of other fits that finished (their patch was returned)."""
        if self.saved is None:
            return
        for other in self.saved.stored_keys():
            if other != self.key and (self.saved.load(other) or {}).get("finished"):
                self.saved.remove(other)


@dataclass
class _Plan:
    """Where each step's runs come from: tasks to run (online) or given traces."""

    tasks: list[TaskRecord]
    traces: list[Trace]
    batch: int

    @property
    def online(self) -> bool:
        return bool(self.tasks)

    def tasks_for(self, step: int) -> list[TaskRecord]:
        n = len(self.tasks)
        start = (step - 1) * self.batch
        return [self.tasks[(start + i) % n] for i in range(min(self.batch, n))]

    def traces_for(self, step: int) -> list[Trace]:
        return self.traces[(step - 1) * self.batch: step * self.batch]


def _score(trace: Trace) -> float | None:
    """The run's score; a run stopped at a limit without an answer is a 0, one that failed
    (outcome ``error``) or answered unscored is unmeasured (None)."""
    if trace.score is not None:
        return trace.score
    return None if trace.outcome in ("answered", "error") else 0.0


class NLPG:
    """Policy notes per module: walk scored runs backwards, then a bounded update.

    The evolver (``whetstone.engine.methods.base.Evolver``): ``fit`` returns a ``LibraryPatch`` for
    ``policies/<module>.md``; runs and the gate use the ``nlpg`` runtime method, which shows
    each module its notes.
    """

    name = "nlpg"
    config_class = NLPGConfig
    runtime_methods: ClassVar[tuple[str, ...]] = ("nlpg",)

    def __init__(self, config: NLPGConfig | None = None, on_step: StepHook | None = None
                 ) -> None:
        self.config = config or NLPGConfig()
        self.on_step = on_step or (lambda report, memory: None)

    # -- fit ----------------------------------------------------------------------------

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch:
        """Run the update steps and return the notes as a patch (see the module docstring)."""
        started = time.perf_counter()
        context = context or EvolveContext()
        files = library_texts(library, "policies/")
        start, malformed = memory_from_files(files)
        plan = self._plan(traces, context)
        if not plan.online and not plan.traces:
            raise ConfigError("no runs to learn from",
                              hint="pass --tasks SET (labelled tasks), or traces with scores")
        checkpoint = self._checkpoint(library, context, plan)
        state = (checkpoint.load() if self.config.resume else None) or _State(memory=start)
        resumed = state.done or bool(state.pending)
        start_id = None if isinstance(library, Mapping) else library.id
        for step in range(state.done + 1, self.config.steps + 1):
            runs = self._runs(step, plan, state, context, checkpoint, start, start_id,
                              list(traces))
            if not runs:
                state.counts["steps_without_runs"] += 1
                break
            asyncio.run(self._step(step, runs, state, analyst, labels, context, checkpoint))
            self.on_step(state.reports[-1], state.memory)
        checkpoint.save(state, finished=True)
        checkpoint.drop_finished_others()
        return self._patch(start, state, malformed, bool(resumed), time.perf_counter() - started,
                           analyst.count_tokens)

    def _plan(self, traces: Sequence[Trace], context: EvolveContext) -> _Plan:
        can_run = context.make_solver is not None and context.store is not None
        pool: list[TaskRecord] = []
        if can_run:
            pool = list(context.tasks) if context.tasks is not None else list(
                tasks_from_traces([t for t in traces if t.label is not None]))
        pool.sort(key=lambda t: t.id)
        random.Random(self.config.seed).shuffle(pool)
        return _Plan(pool, list(traces), self.config.batch)

    def _checkpoint(self, library: Snapshot | Mapping[str, str], context: EvolveContext,
                    plan: _Plan) -> _Checkpoint:
        cfg = {k: v for k, v in asdict(self.config).items() if k not in ("resume", "workers")}
        start = None if isinstance(library, Mapping) else library.id
        ids = [t.id for t in plan.tasks] or [t.id for t in plan.traces]
        key = hashlib.sha256(json.dumps({"config": cfg, "start": start, "runs": ids,
                                         "model": context.model}, sort_keys=True).encode()
                             ).hexdigest()[:16]
        # Libraries from before the state/ layout kept this under .state/nlpg/.
        saved = context.library.state("nlpg", legacy=(".state/nlpg",)) \
            if context.library is not None and start is not None else None
        return _Checkpoint(saved, key)

    # -- one step -------------------------------------------------------------------------

    def _runs(self, step: int, plan: _Plan, state: _State, context: EvolveContext,
              checkpoint: _Checkpoint, start: Memory, start_id: str | None,
              given: list[Trace]) -> list[Trace]:
        """The step's scored runs: given traces, or rollouts (stored ones reused)."""
        if not plan.online:
            return plan.traces_for(step)
        assert context.store is not None
        tasks = plan.tasks_for(step)
        wanted = {t.id for t in tasks}
        have: dict[str, Trace] = {}
        changes = memory_changes(start, state.memory)
        if not changes and step == 1:  # runs over the start version already made
            for t in given:
                # With notes to show, only runs that showed them (the nlpg method was on).
                shown_ok = not start or "nlpg" in t.meta
                if t.library_version == start_id and t.meta.get("task_id") in wanted \
                        and shown_ok:
                    have[str(t.meta["task_id"])] = t
        for t in context.store.query():
            if t.meta.get("nlpg_run") == checkpoint.key and t.meta.get("nlpg_step") == step \
                    and t.meta.get("task_id") in wanted \
                    and t.outcome not in ("running", "error"):
                have[str(t.meta["task_id"])] = t
        missing = [t for t in tasks if t.id not in have]
        state.counts["runs_reused"] += len(tasks) - len(missing)
        if missing:
            snapshot = None
            if changes:
                assert context.library is not None
                snapshot = context.library.preview(
                    changes, label=f"nlpg-{checkpoint.key[:8]}-s{step}", method=self.name)
            result = context.run_agent(missing, snapshot=snapshot, phase=f"step {step} runs",
                                       trace_meta={"nlpg_run": checkpoint.key,
                                                   "nlpg_step": step})
            state.counts["agent_runs"] += result.n
            if result.partial:  # interrupted: what ran is stored and will be reused
                checkpoint.save(state)
                raise KeyboardInterrupt
            ran = {r.trace_id for r in result.results if r.trace_id}
            if ran:
                for t in context.store.query(TraceQuery(ids=frozenset(ran))):
                    have[str(t.meta.get("task_id"))] = t
        return [have[t.id] for t in tasks if t.id in have]

    def _success(self, trace: Trace) -> bool | None:
        score = _score(trace)
        return None if score is None else score >= self.config.success_threshold

    async def _step(self, step: int, runs: Sequence[Trace], state: _State, analyst: Backend,
                    labels: Mapping[str, str] | None, context: EvolveContext,
                    checkpoint: _Checkpoint) -> None:
        if state.pending is None or state.pending.get("step") != step:
            state.pending = {"step": step, "walks": {}}
        walks = await self._walk_all(step, runs, state, analyst, labels, context, checkpoint)
        helpful: Counter[tuple[str, str]] = Counter()
        for t in runs:
            if self._success(t):
                for module, ids in shown_notes(t).items():
                    helpful.update((module, i) for i in ids)
        harmful = Counter(m for w in walks for m in w.misleading)
        memory = count_uses(state.memory, helpful, harmful)
        groups = aggregate([c for w in walks for c in w.corrections])
        scores = [x for x in (_score(t) for t in runs) if x is not None]  # measured runs
        report: dict[str, Any] = {
            "step": step, "runs": [t.id for t in runs],
            "mean_score": round(sum(scores) / len(scores), 4) if scores else None,
            "walked": len(walks), "corrections": sum(len(w.corrections) for w in walks),
            "helpful": sum(helpful.values()), "harmful": sum(harmful.values()),
            "groups": {m: [g.to_dict() for g in gs] for m, gs in groups.items()},
            "modules": {}}
        for w in walks:
            state.stats.add(w.stats)
            state.counts["repairs"] += w.repairs
        state.counts["unscored"] += sum(self._success(t) is None for t in runs)
        for module in sorted(set(memory) | set(groups)):
            memory[module], applied = await self._update_module(
                module, memory.get(module, []), groups.get(module, []), state, analyst, step)
            report["modules"][module] = applied.to_dict()
        state.memory = {m: notes for m, notes in memory.items() if notes}
        state.reports.append(report)
        state.done, state.pending = step, None
        checkpoint.save(state)

    async def _update_module(self, module: str, notes: list[PolicyNote],
                             groups: Sequence[CorrectionGroup], state: _State,
                             analyst: Backend, step: int) -> tuple[list[PolicyNote], ApplyReport]:
        """One module's bounded update: retire, ask the curator, apply within the bound."""
        cfg = self.config
        ops = retire_ops(notes)[:cfg.max_ops]
        gone = {o.id for o in ops}
        if groups and len(ops) < cfg.max_ops:
            cur = await curate(
                module, [n for n in notes if n.id not in gone], groups,
                analyst=analyst if cfg.curator == "analyst" else None,
                max_ops=cfg.max_ops - len(ops), budget=cfg.budget_tokens,
                count=analyst.count_tokens, temperature=cfg.temperature,
                max_tokens=cfg.max_tokens, seed=cfg.seed + 7919 * step)
            state.stats.add(cur.stats)
            state.counts["curator_repairs"] += cur.repairs
            state.counts["curator_ops_dropped"] += cur.dropped_ops
            state.counts["curator_fallbacks"] += int(cur.fallback)
            ops += cur.ops
        return apply_ops(module, notes, ops, max_ops=cfg.max_ops, budget=cfg.budget_tokens,
                         count=analyst.count_tokens)

    async def _walk_all(self, step: int, runs: Sequence[Trace], state: _State,
                        analyst: Backend, labels: Mapping[str, str] | None,
                        context: EvolveContext, checkpoint: _Checkpoint) -> list[Walk]:
        cfg = self.config
        todo = [t for t in runs if self._success(t) is False
                or (cfg.learn_from_success and self._success(t))]
        settings = WalkSettings(max_visits=cfg.max_visits, min_weight=cfg.min_weight,
                                temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                modules=cfg.module_set())
        assert state.pending is not None
        saved: dict[str, Any] = state.pending["walks"]
        sem = asyncio.Semaphore(cfg.workers)
        done = 0

        async def one(i: int, trace: Trace) -> Walk:
            nonlocal done
            if trace.id in saved:
                walk = Walk.from_dict(saved[trace.id])
            else:
                async with sem:
                    expected = (labels or {}).get(trace.id, trace.label)
                    walk = await walk_trace(trace, analyst, state.memory, expected=expected,
                                            success=bool(self._success(trace)),
                                            settings=settings, seed=cfg.seed + 1000 * step + i)
                saved[trace.id] = walk.to_dict()
                checkpoint.save(state)
            done += 1
            context.on_progress(f"step {step} backward", done, len(todo))
            return walk

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(todo))))

    # -- the patch --------------------------------------------------------------------------

    def _patch(self, start: Memory, state: _State, malformed: int, resumed: bool,
               seconds: float, count: Callable[[str], int]) -> LibraryPatch:
        changes = memory_changes(start, state.memory)
        totals: Counter[str] = Counter()
        for report in state.reports:
            for rep in report["modules"].values():
                totals.update(o["op"] for o in rep["ops"])
        modules = {m: {"notes": len(notes), "tokens": note_tokens(notes, count)}
                   for m, notes in state.memory.items()}
        summary = ", ".join(f"{k} {totals[k]}" for k in ("ADD", "EDIT", "AGREE", "REMOVE"))
        message = (f"nlpg: {state.done} step(s) over {sum(len(r['runs']) for r in state.reports)}"
                   f" runs; {summary}; notes now " + (", ".join(
                       f"{m} {v['notes']}" for m, v in sorted(modules.items())) or "none"))
        stats = state.stats
        return LibraryPatch(
            method=self.name, changes=changes, message=message[:500],
            details={"steps": state.reports, "modules": modules, "resumed": bool(resumed),
                     "report": {"analyst": stats.to_dict(), "malformed_lines": malformed,
                                **dict(state.counts)}},
            costs={"analyst_calls": stats.calls, "analyst_prompt_tokens": stats.prompt_tokens,
                   "analyst_completion_tokens": stats.completion_tokens,
                   "agent_runs": state.counts["agent_runs"],
                   "seconds": {"fit": round(seconds, 3),
                               "analyst": round(stats.seconds, 3)}})


__all__ = ["NLPG", "NLPGConfig", "PolicyNote"]
