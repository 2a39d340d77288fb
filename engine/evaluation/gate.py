"""The regression gate every evolver calls before a library change becomes current.

The default rule, ``cost_aware``, reads the paired comparison of the candidate with the current
version on the gate's tasks (the dev split) and what each run cost per task:

- a clear gain (the paired interval's lower end above 0) is accepted, whatever it costs;
- a clear loss (the interval's upper end below 0) is rejected;
- anything else is a tie, a difference inside the noise of the dev set. A tie is accepted only
  when the dev set could not have missed a regression of ``MARGIN`` (10 points) or more and the
  candidate does not make runs more expensive: at most ``MAX_TOKEN_RATIO`` (1.02) times the
  current's tokens per task, and does not score lower (cost never buys a negative
  difference: fewer tokens can mean the model gave up sooner). Otherwise it is rejected,
  saying which.

``run_gate`` widens an underpowered tie's dev set once before deciding, to a larger slice of the
same split where one exists (``wider_slice``); the decision says when it still could not tell.
docs/gate.md gives the numbers that chose the defaults.

Conditions (combine with ``&``; all must hold):

- ``cost_aware`` (default): as above.
- ``not_worse`` / ``not_worse=M``: non-inferiority: the paired interval's lower end is above -M
  (default M = ``MARGIN``). A tie on 30 tasks rarely passes it: its interval is that wide.
- ``mean_not_worse``: the old default, the mean paired difference >= 0 (a tie passes at any
  cost and any size of dev set).
- ``min_delta=X``: the difference is at least X (e.g. ``min_delta=0.02``).
- ``ci_lower>X``: the lower end of the paired-bootstrap interval is above X; ``ci_lower>0``
  means significantly better.
- ``mcnemar<X``: the candidate is better and McNemar's exact p-value is below X (0/1 scores).
- ``tokens<=R``: unless the gain is clear, tokens per task at most R times the current's.
- ``latency<=R``: the same for seconds per task. Recorded but not in the default: on shared
  machines the same work measured 0.33x to 2.0x its own latency at another time.

``Decision.to_dict()`` is what goes into the candidate version's manifest; ``decide_again``
applies a rule to a saved one.

A run in which tasks failed (a solver or scorer error) decides nothing unless the caller
allows it (``allow_errors``, ``--allow-errors``): which tasks fail can differ between the two
runs by chance (a race, a flaky upstream), and the difference would then be the failures'.
Allowed, a failed task is neither a win nor a loss: the rule is applied to the tasks scored in
both runs, the decision names the tasks left out, each counts as a possible loss in what the dev
set could have missed, and more than ``MAX_FAILED`` of the tasks failed refuses the decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from whetstone.engine.errors import EvalError, TasksFailed
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.compare import Comparison, compare
from whetstone.engine.evaluation.gate_rules import (
    DEFAULT_RULE,
    EPS,
    FEW_TASKS,
    MARGIN,
    MAX_FAILED,
    MAX_GATE_TASKS,
    Condition,
    Evidence,
    apply_rule,
    decide_again,
    parse_rule,
    ratio,
    summary,
)
from whetstone.engine.evaluation.results import EvalResult
from whetstone.engine.evaluation.runner import ProgressFn, Solver, evaluate
from whetstone.engine.evaluation.scorers import ScoreFn
from whetstone.engine.evaluation.stats import tasks_to_tell
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet, parse_spec
from whetstone.library_store.traces import TraceStore


@dataclass(frozen=True)
class Decision:
    """The gate's verdict with everything needed to audit it: the paired figures, what each
    run cost per task, and how large a regression the tasks could have missed."""

    accepted: bool
    rule: str
    reasons: tuple[str, ...]
    candidate_score: float
    current_score: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float | None
    n_tasks: int
    task_set: str
    scorer: str
    seed: int
    candidate: str
    current: str
    wins: int
    losses: int
    left_out: tuple[str, ...] = ()  # tasks failed in either run (only with allow_errors)
    decided_at: float = field(default_factory=time.time)
    results: dict[str, str] = field(default_factory=dict)  # which run -> saved result file
    verdict: str = "tie"  # gain | loss | tie (Evidence.verdict)
    could_miss: float = 0.0  # the largest regression the tasks could have missed
    power_bound: float = MARGIN
    candidate_tokens: float = 0.0  # per paired task
    current_tokens: float = 0.0
    candidate_latency_s: float = 0.0
    current_latency_s: float = 0.0
    widened_from: Mapping[str, Any] | None = None  # the first slice's figures, when widened
    tasks: tuple[str, ...] = ()  # the ids of every task the decision read, left out included
    scorer_fit: Mapping[str, Any] | None = None  # set when most tasks scored 0 on both sides
    # the tasks that changed: task, current, candidate (scores), current_trace,
    # candidate_trace (the runs' trace ids), wins first
    flipped: tuple[Mapping[str, Any], ...] = ()

    @property
    def token_ratio(self) -> float | None:
        return ratio(self.candidate_tokens, self.current_tokens)

    @property
    def latency_ratio(self) -> float | None:
        return ratio(self.candidate_latency_s, self.current_latency_s)

    @property
    def needs_more(self) -> bool:
        """A tie the tasks could not tell: more tasks could decide it."""
        return self.verdict == "tie" and self.could_miss >= self.power_bound - EPS

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; stored in the candidate version's manifest."""
        return {
            "accepted": self.accepted, "rule": self.rule, "reasons": list(self.reasons),
            "candidate_score": self.candidate_score, "current_score": self.current_score,
            "difference": self.difference, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "confidence": self.confidence, "ci_method": "paired bootstrap (percentile)",
            "mcnemar_p": self.p_value, "n_tasks": self.n_tasks, "task_set": self.task_set,
            "scorer": self.scorer, "seed": self.seed, "candidate": self.candidate,
            "current": self.current, "wins": self.wins, "losses": self.losses,
            "left_out": list(self.left_out), "decided_at": self.decided_at,
            "results": dict(self.results), "verdict": self.verdict,
            "could_miss": self.could_miss, "power_bound": self.power_bound,
            "candidate_tokens": self.candidate_tokens, "current_tokens": self.current_tokens,
            "token_ratio": self.token_ratio, "candidate_latency_s": self.candidate_latency_s,
            "current_latency_s": self.current_latency_s, "latency_ratio": self.latency_ratio,
            "widened_from": dict(self.widened_from) if self.widened_from else None,
            "tasks": list(self.tasks),
            "scorer_fit": dict(self.scorer_fit) if self.scorer_fit else None,
            "flipped": [dict(f) for f in self.flipped],
        }


def check_no_errors(runs: Sequence[tuple[str, EvalResult]], *, what: str,
                    option: str = "--allow-errors") -> None:
    """Raise ``TasksFailed`` naming the failed tasks of each run, if any failed."""
    bad = [(which, r) for which, r in runs if r.n_errors]
    if not bad:
        return
    lines = "; ".join(f"{which}: {r.errors_line(3)}" for which, r in bad)
    raise TasksFailed(
        f"{what} refused: tasks failed, so the result could turn on which ones did ({lines})",
        hint=f"fix the cause and run again (the saved results list every failed task), or pass "
             f"{option} to decide on the tasks scored in both runs")


def _per_task(result: EvalResult, ids: Sequence[str], what: str) -> float:
    """Mean tokens (or latency) per task over the paired ``ids``."""
    by_id = {r.task_id: r for r in result.results}
    values = [float(getattr(by_id[t], what)) for t in ids]
    return sum(values) / len(values) if values else 0.0


def _cut(value: Any, most: int = 80) -> str:
    text = " ".join(str("" if value is None else value).split())
    return text if len(text) <= most else text[:most - 1] + "…"


def scorer_fit(candidate: EvalResult, current: EvalResult, ids: Sequence[str],
               shown: int = 3) -> tuple[str, dict[str, Any]] | None:
    """When more than half of the paired ``ids`` scored 0 in both runs, a reason saying the
    scorer may not fit, with ``shown`` answer/label pairs (the current run's, answered tasks
    first), and the figures; None otherwise. A scorer that reads the answer wrongly (exact
    match on "2.5 meters" against "2.5") scores both sides 0 and the gate sees a tie."""
    cur = {r.task_id: r for r in current.results}
    cand = {r.task_id: r for r in candidate.results}
    zero = [t for t in ids if cur[t].score == 0 and cand[t].score == 0]
    if not ids or len(zero) * 2 <= len(ids):
        return None
    picked = sorted(zero, key=lambda t: not (cur[t].answer or "").strip())[:shown]
    pairs = [{"task": t, "answer": _cut(cur[t].answer), "label": _cut(cur[t].expected)}
             for t in picked]
    shown_pairs = "; ".join(f"{p['answer']!r} for {p['label']!r}" for p in pairs)
    why = (f"the scorer ({candidate.scorer}) may not fit: {len(zero)} of {len(ids)} paired "
           f"tasks scored 0 on both sides; answer for label: {shown_pairs}. If these answers "
           "are right, choose the scorer: --scorer value, numeric, contains, or "
           "FILE.py:FUNCTION")
    return why, {"both_zero": len(zero), "paired": len(ids), "pairs": pairs}


def flipped_tasks(candidate: EvalResult, current: EvalResult, c: Comparison
                  ) -> tuple[dict[str, Any], ...]:
    """The paired tasks whose score changed, wins then losses, with both runs' trace ids
    (``whetstone traces show ID`` opens each run)."""
    cur = {r.task_id: r for r in current.results}
    cand = {r.task_id: r for r in candidate.results}
    return tuple({"task": t, "current": cur[t].score, "candidate": cand[t].score,
                  "current_trace": cur[t].trace_id, "candidate_trace": cand[t].trace_id}
                 for t in (*c.wins, *c.losses))


def _few_line(c: Comparison) -> str:
    p = "" if c.p_value is None else f"; McNemar p = {c.p_value:.3g}"
    return (f"only {c.n} paired tasks: an interval on fewer than {FEW_TASKS} is rough, read it "
            f"as a hint, not a measurement{p}")


def _failed_line(c: Comparison, left_out: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(left_out[:most]) + (f" and {len(left_out) - most} more"
                                           if len(left_out) > most else "")
    return (f"{len(left_out)} task(s) failed and are left out, neither a win nor a loss "
            f"(current {len(c.failed_in_a)}, candidate {len(c.failed_in_b)}): {shown}")


def gate(candidate: EvalResult, current: EvalResult, rule: str = DEFAULT_RULE, *,
         confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
         allow_errors: bool = False, power_bound: float = MARGIN,
         max_failed: float = MAX_FAILED) -> Decision:
    """Decide whether ``candidate`` may replace ``current``; both must cover the same tasks.
    A run with failed tasks raises ``TasksFailed`` unless ``allow_errors``; allowed, more than
    ``max_failed`` of the tasks left out raises it all the same."""
    conds = parse_rule(rule)
    for r, which in ((candidate, "candidate"), (current, "current")):
        if r.partial:
            raise EvalError(f"the {which} evaluation is partial ({r.n} of {r.n_planned} tasks)",
                            hint="gate only on complete runs; evaluate again")
    if not allow_errors:
        check_no_errors((("current", current), ("candidate", candidate)), what="the gate")
    c = compare(current, candidate, confidence=confidence, n_resamples=n_resamples, seed=seed)
    if c.only_in_a or c.only_in_b:
        raise EvalError(
            f"candidate and current were evaluated on different tasks ({len(c.only_in_b)} only "
            f"in the candidate, {len(c.only_in_a)} only in the current)",
            hint="evaluate both on the same tasks with the same seed (run_gate does)")
    left_out = tuple(sorted(set(c.failed_in_a) | set(c.failed_in_b)))
    total = c.n + len(left_out)
    if left_out and len(left_out) > max_failed * total + EPS:
        raise TasksFailed(
            f"the gate refused: {len(left_out)} of {total} tasks failed "
            f"({len(left_out) / total:.0%}, more than {max_failed:.0%}), too many to decide on "
            f"the rest ({_failed_line(c, left_out)})",
            hint="fix the cause and run the gate again (the saved results list every failed "
                 "task's error)")
    ev = Evidence(
        difference=c.difference, ci_low=c.ci_low, ci_high=c.ci_high, n=c.n,
        p_value=c.p_value, left_out=len(left_out),
        confidence=confidence, bound=power_bound,
        candidate_tokens=_per_task(candidate, c.task_ids, "tokens"),
        current_tokens=_per_task(current, c.task_ids, "tokens"),
        candidate_latency_s=_per_task(candidate, c.task_ids, "latency_s"),
        current_latency_s=_per_task(current, c.task_ids, "latency_s"))
    ok, reasons = apply_rule(conds, ev)
    if c.n < FEW_TASKS:
        reasons += (_few_line(c),)
    fit = scorer_fit(candidate, current, c.task_ids)
    if fit is not None:
        reasons += (fit[0],)
    if left_out:
        reasons += (_failed_line(c, left_out),)
    cut = [f"{which} {r.n_length}" for which, r in (("candidate", candidate),
                                                    ("current", current)) if r.n_length]
    if cut:
        reasons += ("answers cut at the length limit (outcome length), scored as written: "
                    + ", ".join(cut),)
    results = {k: r.meta["saved_to"] for k, r in (("candidate", candidate), ("current", current))
               if "saved_to" in r.meta}
    return Decision(
        accepted=ok is True, rule="&".join(str(x) for x in conds), reasons=reasons,
        candidate_score=c.score_b, current_score=c.score_a, difference=c.difference,
        ci_low=c.ci_low, ci_high=c.ci_high, confidence=confidence, p_value=c.p_value,
        n_tasks=c.n, task_set=candidate.task_set, scorer=candidate.scorer,
        seed=candidate.seed, candidate=candidate.name, current=current.name,
        wins=len(c.wins), losses=len(c.losses), results=results, left_out=left_out,
        verdict=ev.verdict, could_miss=ev.could_miss, power_bound=power_bound,
        candidate_tokens=ev.candidate_tokens or 0.0, current_tokens=ev.current_tokens or 0.0,
        candidate_latency_s=ev.candidate_latency_s or 0.0,
        current_latency_s=ev.current_latency_s or 0.0, tasks=c.task_ids + left_out,
        scorer_fit=fit[1] if fit is not None else None,
        flipped=flipped_tasks(candidate, current, c),
    )


def gate_tasks(tasks: TaskSet | Sequence[TaskRecord] | str) -> TaskSet | Sequence[TaskRecord]:
    """Tasks for the gate. A packaged set named without a split is narrowed to its dev split;
    files and explicit splits are taken as given."""
    if not isinstance(tasks, str):
        return tasks
    spec = parse_spec(tasks)
    if spec.split is None and not (spec.source.endswith(".jsonl") or Path(spec.source).exists()):
        return load_tasks(str(replace(spec, split="dev")))
    return load_tasks(tasks)


def wider_slice(tasks: TaskSet | Sequence[TaskRecord], could_miss: float, *,
                bound: float = MARGIN, max_tasks: int = MAX_GATE_TASKS
                ) -> tuple[TaskSet | None, str]:
    """A larger slice of the same set and split that starts with ``tasks``, sized so that the
    spread seen would rule out a regression of ``bound`` (at least twice as many tasks, at
    most ``max_tasks``), or None and why there is none. Only a set named by a sliced spec
    (``gsm8k@dev:0:30``) can grow: a list of records or a whole split cannot."""
    name = tasks.name if isinstance(tasks, TaskSet) else ""
    n = len(tasks)
    if not name:
        return None, "the gate's tasks are a list of records, not a slice of a task set"
    try:
        spec = parse_spec(name)
    except EvalError:
        return None, f"{name!r} is not a task-set spec"
    if spec.end is None:
        return None, f"{name} is already the whole of its split"
    if n >= max_tasks:
        return None, f"{n} tasks is already the most the gate widens to ({max_tasks})"
    want = min(max_tasks, max(2 * n, tasks_to_tell(n, could_miss, bound)))
    start = spec.start or 0
    try:
        wider = load_tasks(str(replace(spec, end=start + want)))
    except EvalError as exc:
        return None, f"cannot load a larger slice of {name}: {exc.message}"
    if [t.id for t in wider.tasks[:n]] != [t.id for t in tasks]:
        return None, f"the tasks given are not the first {n} of {name}'s split"
    if len(wider) <= n:
        return None, f"{name} already holds every task of its split"
    return wider, ""


def _merged(first: EvalResult, more: EvalResult, name: str) -> EvalResult:
    """One result of both slices' runs (the second holds only the tasks the first lacks)."""
    return replace(first, task_set=name, results=first.results + more.results,
                   n_planned=first.n_planned + more.n_planned, ended=more.ended,
                   meta={k: v for k, v in first.meta.items() if k != "saved_to"})


def run_gate(
    tasks: TaskSet | Sequence[TaskRecord] | str,
    solve_with_candidate: Solver,
    solve_with_current: Solver,
    scorer: str | ScoreFn | None = None,
    *,
    rule: str = DEFAULT_RULE,
    seed: int = 0,
    concurrency: int = 1,
    store: TraceStore | None = None,
    results_dir: Path | str | None = None,
    candidate_version: str | None = None,
    current_version: str | None = None,
    on_progress: ProgressFn | None = None,
    on_run: Callable[[str], None] | None = None,
    allow_errors: bool = False,
    widen: bool = True,
    power_bound: float = MARGIN,
    max_tasks: int = MAX_GATE_TASKS,
    max_failed: float = MAX_FAILED,
) -> Decision:
    """Evaluate the current and the candidate library on the same tasks with the same seed,
    then ``gate`` them. A tie the tasks could not tell (``Decision.needs_more``) is run again
    once on a larger slice (``wider_slice``; only the tasks added) and decided on all of them,
    unless ``widen`` is false; the decision keeps the first slice's figures in
    ``widened_from``, or says why it could not widen. Ctrl-C during a run is re-raised (a
    partial run decides nothing). ``on_run("current" | "candidate")`` is called as each run
    starts. Failed tasks in a run raise ``TasksFailed`` (the runs are saved) unless
    ``allow_errors``."""
    conds = parse_rule(rule)  # a bad rule fails before any task runs
    # A rule on the mean alone (the old default, min_delta) reads no interval: more tasks
    # would not change what it asks, so it decides on the tasks given, as it always did.
    widen = widen and any(c.kind not in ("mean_not_worse", "min_delta") for c in conds)
    solvers = {"current": (solve_with_current, current_version),
               "candidate": (solve_with_candidate, candidate_version)}

    def run_both(chosen: TaskSet | Sequence[TaskRecord]) -> dict[str, EvalResult]:
        runs: dict[str, EvalResult] = {}
        for which, (solver, version) in solvers.items():
            if on_run is not None:
                on_run(which)
            runs[which] = evaluate(
                chosen, solver, scorer, concurrency=concurrency, seed=seed,
                on_progress=on_progress, store=store, library_version=version,
                label=which if version is None else None, results_dir=results_dir,
                trace_meta={"gate": which})
            if runs[which].partial:
                raise KeyboardInterrupt
        return runs

    def decide(runs: dict[str, EvalResult]) -> Decision:
        return gate(runs["candidate"], runs["current"], rule, seed=seed,
                    allow_errors=allow_errors, power_bound=power_bound, max_failed=max_failed)

    chosen = gate_tasks(tasks)
    runs = run_both(chosen)
    first = decide(runs)
    if not widen or not first.needs_more:
        return first
    wider, why = wider_slice(chosen, first.could_miss, bound=power_bound, max_tasks=max_tasks)
    if wider is None:
        return replace(first, reasons=first.reasons + (f"could not widen the dev set: {why}",))
    have = {t.id for t in chosen}
    more = run_both(TaskSet(name=wider.name, tasks=tuple(t for t in wider if t.id not in have)))
    both = {k: _merged(runs[k], more[k], wider.name) for k in runs}
    wide = decide(both)
    saved = dict(first.results)
    saved.update({f"{k} (widened)": r.meta["saved_to"] for k, r in more.items()
                  if "saved_to" in r.meta})
    note = (f"widened the dev set from {first.task_set} ({first.n_tasks} tasks: could have "
            f"missed {first.could_miss:.3f}) to {wide.task_set} ({wide.n_tasks} tasks)")
    return replace(wide, reasons=wide.reasons + (note,), results=saved, widened_from={
        "task_set": first.task_set, "n_tasks": first.n_tasks, "difference": first.difference,
        "ci_low": first.ci_low, "ci_high": first.ci_high, "could_miss": first.could_miss,
        "wins": first.wins, "losses": first.losses, "token_ratio": first.token_ratio})


__all__ = ["DEFAULT_RULE", "MARGIN", "MAX_FAILED", "MAX_GATE_TASKS", "Condition", "Decision",
           "Evidence", "apply_rule", "check_no_errors", "decide_again", "gate", "gate_tasks",
           "parse_rule", "run_gate", "summary", "wider_slice"]
