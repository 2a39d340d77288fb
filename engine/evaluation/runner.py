"""Run tasks through a solver, score them, store the scored traces, summarise.

The solver is injected: ``solver(task, seed) -> Trace``. The CLI and API pass one that runs the
agent (the same runtime as ``whetstone run``) on the library version under test; tests pass
scripted ones. Each task gets its own seed, derived from the run's seed and the task id, so a
task's result does not depend on the order or concurrency it ran with, and two library versions
run with the same seed see the same per-task seeds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...library_store.traces import TraceStore
from ..errors import (
    ConfigError,
    EvalError,
    ModelLoadError,
    ModelNotInstalled,
    error_text,
)
from ..types import Trace
from .results import EvalResult, TaskResult
from .scorers import NamedScorer, ScoreFn, as_scorer
from .tasks import TaskRecord, TaskSet

log = logging.getLogger("whetstone.eval")

Solver = Callable[[TaskRecord, int], Trace]
ProgressFn = Callable[[int, int, TaskResult], None]

# Failures of the setup, the same for every task: stop the run rather than fail each task.
# A backend that cannot be reached is not one of them: each task's run records it and fails,
# whichever solver ran it (the agent records a failed model call in its trace), so a dead
# model gives a list of failed tasks and no accuracy, never a row of wrong answers.
FATAL = (ConfigError, ModelNotInstalled, ModelLoadError, EvalError)


def with_concurrency(solver: Solver, n: int, *, ordered: bool = False) -> Solver:
    """Tag ``solver`` with how many tasks its backend runs well at once (``-j auto``), and
    whether its backend's replies follow call order (``Capabilities.ordered``: then tasks run
    one at a time whatever ``-j`` says)."""
    solver.max_concurrency = 1 if ordered else max(1, int(n))  # type: ignore[attr-defined]
    solver.ordered = ordered  # type: ignore[attr-defined]
    return solver


def solver_concurrency(solver: Solver, requested: int | None = None) -> int:
    """How many tasks run at once: ``requested`` (None: ``-j auto``, the solver's tag, else
    1), brought down to 1 for an ``ordered`` solver, with a warning when that overrides a
    request."""
    if requested is None:
        return max(1, int(getattr(solver, "max_concurrency", 1)))
    if requested > 1 and getattr(solver, "ordered", False):
        log.warning("the model's replies follow call order (scripted: replays its list), so "
                    "tasks run one at a time, not %d at once: each gets the replies written "
                    "for it", requested)
        return 1
    return requested


def task_seed(seed: int, task_id: str) -> int:
    """The seed one task runs with: stable in (run seed, task id), in [0, 2**31)."""
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _label_text(expected: Any) -> str | None:
    if expected is None or isinstance(expected, str):
        return expected
    return json.dumps(expected, ensure_ascii=False, default=str)


def _most_common(values: Sequence[str | None]) -> str | None:
    present = [v for v in values if v]
    return max(set(present), key=present.count) if present else None


class _Run:
    """One evaluation in progress: runs and scores single tasks (thread-safe)."""

    def __init__(self, solver: Solver, scorers: dict[str, NamedScorer], seed: int,
                 task_set: str, store: TraceStore | None, run_id: str,
                 trace_meta: Mapping[str, Any] | None = None) -> None:
        self.solver, self.scorers, self.seed = solver, scorers, seed
        self.task_set, self.store, self.run_id = task_set, store, run_id
        self.trace_meta = dict(trace_meta or {})
        self.traces: dict[str, Trace] = {}

    def one(self, task: TaskRecord) -> TaskResult:
        s = task_seed(self.seed, task.id)
        t0 = time.perf_counter()
        try:
            trace = self.solver(task, s)
        except FATAL:
            raise
        except Exception as exc:  # noqa: BLE001 -- one task's crash fails that task, not the run
            log.warning("task %s: solver failed: %s: %s", task.id, type(exc).__name__, exc)
            return self._failed(task, s, time.perf_counter() - t0, exc)
        wall = time.perf_counter() - t0
        if not isinstance(trace, Trace):
            raise EvalError(f"the solver returned {type(trace).__name__} for task {task.id}, "
                            "not a Trace", hint="a solver is (task, seed) -> whetstone.engine.types.Trace")
        scorer = self.scorers.get("*") or self.scorers[task.scorer]
        tokens = trace.total_tokens or sum(st.tokens for st in trace.steps)
        duration = trace.duration_s
        latency = duration if duration is not None and duration >= 0 else wall
        meta = {**trace.meta, **self.trace_meta, "task_set": self.task_set, "task_id": task.id,
                "seed": s, "scorer": scorer.name, "eval_run": self.run_id}
        score: float | None = None
        failure: tuple[str, str] | None = None  # (error text, error type)
        if trace.error is not None:
            # The run itself failed (a model call that raised, a runtime error): there is no
            # answer to score, and a 0 would read a dead model as a wrong one.
            failure = (trace.error, _type_of(trace.error))
            log.warning("task %s: the run failed: %s", task.id, trace.error)
            meta["eval_error"] = trace.error
        else:
            try:
                score = scorer(trace, task)
            except Exception as exc:  # noqa: BLE001 -- a scorer's bug fails that task only
                # NamedScorer words a user scorer's exception as an EvalError: report the
                # original.
                error = exc.__cause__ if isinstance(exc, EvalError) and exc.__cause__ else exc
                where = f" (in scorer {scorer.name!r})"
                failure = (error_text(error) + where, type(error).__name__)
                log.warning("task %s: scorer %s failed: %s", task.id, scorer.name,
                            error_text(error))
                meta["eval_error"] = failure[0]
        # The trace is kept either way: the model time it cost is not thrown away.
        scored = trace.with_(score=score, label=_label_text(task.expected), meta=meta)
        if self.store is not None:
            self.store.append(scored)
        self.traces[task.id] = scored
        if failure is not None:
            return self._failed(task, s, latency, failure, trace=trace, tokens=tokens)
        assert score is not None
        return TaskResult(task_id=task.id, score=score, answer=trace.answer,
                          expected=task.expected, tokens=tokens, latency_s=latency,
                          trace_id=trace.id, outcome=trace.outcome, seed=s)

    @staticmethod
    def _failed(task: TaskRecord, seed: int, latency: float,
                failure: BaseException | tuple[str, str], *, trace: Trace | None = None,
                tokens: int = 0) -> TaskResult:
        """A failed task: not scored, its error kept (``score`` 0.0 is only a placeholder).
        ``failure``: the exception, or (error text, error type) already worded."""
        text, kind = failure if isinstance(failure, tuple) else (
            error_text(failure), type(failure).__name__)
        return TaskResult(task_id=task.id, score=0.0, expected=task.expected, seed=seed,
                          latency_s=latency, outcome="error", error=text, error_type=kind,
                          tokens=tokens, answer=trace.answer if trace is not None else None,
                          trace_id=trace.id if trace is not None else None)


def _type_of(error: str) -> str:
    """The class name a run's error text starts with ("BackendUnavailable: ..."), else
    ``RunFailed``: the filterable part of ``TaskResult.error_type``."""
    head = error.partition(":")[0]
    return head if head.isidentifier() and head[:1].isupper() else "RunFailed"


def _run_serial(run: _Run, tasks: Sequence[TaskRecord], done: dict[int, TaskResult],
                on_progress: ProgressFn | None) -> None:
    for i, task in enumerate(tasks):
        done[i] = run.one(task)
        if on_progress is not None:
            on_progress(len(done), len(tasks), done[i])


def _run_pool(run: _Run, tasks: Sequence[TaskRecord], done: dict[int, TaskResult],
              on_progress: ProgressFn | None, concurrency: int) -> None:
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="whetstone-eval")
    try:
        futures: dict[Future[TaskResult], int] = {
            pool.submit(run.one, task): i for i, task in enumerate(tasks)}
        pending = set(futures)
        while pending:
            # A timeout keeps the main thread waking up so Ctrl-C is seen promptly.
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=futures.__getitem__):
                i = futures[fut]
                done[i] = fut.result()
                if on_progress is not None:
                    on_progress(len(done), len(tasks), done[i])
    finally:
        # On Ctrl-C or a fatal error, drop queued tasks; running ones finish in the background.
        pool.shutdown(wait=False, cancel_futures=True)


def all_zero_warning(result: EvalResult) -> str | None:
    """A warning when every scored task of a run got 0: more often a scorer reading the
    wrong thing than a model wrong every time (tasks whose solver failed are reported apart)."""
    scored = [r for r in result.results if r.error is None]
    if len(scored) < 2 or any(r.score for r in scored):
        return None
    return (f"scorer {result.scorer!r} gave 0 to all {len(scored)} tasks; if the answers look "
            "right, check what the scorer reads (a user scorer gets the answer text and the "
            "task: see `whetstone eval --help`)")


def evaluate(
    tasks: TaskSet | Sequence[TaskRecord],
    solver: Solver,
    scorer: str | ScoreFn | None = None,
    *,
    concurrency: int = 1,
    seed: int = 0,
    on_progress: ProgressFn | None = None,
    store: TraceStore | None = None,
    task_set: str | None = None,
    model: str | None = None,
    library_version: str | None = None,
    label: str | None = None,
    results_dir: Path | str | None = None,
    trace_meta: Mapping[str, Any] | None = None,
    run_meta: Mapping[str, Any] | None = None,
) -> EvalResult:
    """Run every task through ``solver`` and score it.

    ``scorer``: a name or a function ``(prediction, task) -> float`` used for every task, or
    ``None``: each task's own ``scorer``. Each scored trace is appended to ``store`` with its
    score, its expected answer as label, and ``meta`` holding task_set, task_id, seed, scorer
    and eval_run. A task whose solver or scorer raises, or whose run ended in the ``error``
    outcome (``Trace.error``: a model call failed inside the agent), is a failed task, not a
    0: its error is recorded in ``TaskResult.error`` and it is left out of the accuracy (its
    trace is stored unscored, with ``meta["eval_error"]``), and the run goes on; only a
    setup error that is the same for every task (bad config, missing model, a bad task set:
    ``FATAL``) stops the run and is raised.
    Ctrl-C returns the tasks scored so far, with ``partial=True``. With ``results_dir`` the
    result is saved there (partial ones too) and ``meta["saved_to"]`` says where.
    ``trace_meta`` is added to every stored trace's ``meta`` (the gate marks its runs with it);
    ``run_meta`` to the result's (the CLI records the solver, so reports tell runs apart).
    """
    if concurrency < 1:
        raise EvalError(f"concurrency must be >= 1, got {concurrency}", hint="e.g. --concurrency 4")
    concurrency = solver_concurrency(solver, concurrency)
    task_list = tuple(tasks)
    name = task_set or (tasks.name if isinstance(tasks, TaskSet) else "tasks")
    # Resolve every scorer before any task runs, so a bad name fails fast.
    if scorer is not None:
        scorers = {"*": as_scorer(scorer, "")}
    else:
        scorers = {n: as_scorer(n, n) for n in sorted({t.scorer for t in task_list})}
    scorer_name = ("+".join(s.name for s in scorers.values()) if scorers else "none")
    ids = [t.id for t in task_list]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise EvalError(f"task ids must be unique; repeated: {dup}",
                        hint="results are paired by task id; give every task its own id")
    run_id = uuid.uuid4().hex[:12]
    run = _Run(solver, scorers, seed, name, store, run_id, trace_meta)
    done: dict[int, TaskResult] = {}
    started = time.time()
    partial = False
    fatal: BaseException | None = None
    try:
        if concurrency == 1:
            _run_serial(run, task_list, done, on_progress)
        else:
            _run_pool(run, task_list, done, on_progress, concurrency)
    except KeyboardInterrupt:
        partial = True
        log.warning("interrupted: keeping the %d of %d tasks scored so far", len(done),
                    len(task_list))
    except BaseException as exc:  # noqa: BLE001 -- saved as partial below, then re-raised
        partial, fatal = True, exc
    traces = list(run.traces.values())
    result = EvalResult(
        task_set=name, scorer=scorer_name,
        results=tuple(done[i] for i in sorted(done)),
        model=model if model is not None else (_most_common([t.model for t in traces]) or ""),
        library_version=library_version if library_version is not None else _most_common(
            [t.library_version for t in traces]),
        seed=seed, started=started, ended=time.time(), partial=partial,
        n_planned=len(task_list), label=label,
        meta={**dict(run_meta or {}), "run_id": run_id, "concurrency": concurrency,
              **({"stopped_by": f"{type(fatal).__name__}: {fatal}"} if fatal else {})},
    )
    warning = all_zero_warning(result)
    if warning is not None:
        log.warning("%s", warning)
        result = replace(result, meta={**result.meta, "warnings": [warning]})
    if results_dir is not None:
        path = result.save(results_dir)
        result = replace(result, meta={**result.meta, "saved_to": str(path)})
    if fatal is not None:
        raise fatal
    return result
