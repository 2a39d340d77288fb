"""The regression gate every evolver calls before a library change becomes current.

Rules (combine with ``&``; all must hold):

- ``not_worse`` (default): accept when the candidate scores at least as well as the current
  version on the same tasks (mean paired difference >= 0). Evolvers run it on the dev split.
- ``min_delta=X``: the difference is at least X (e.g. ``min_delta=0.02``).
- ``ci_lower>X``: the lower end of the paired-bootstrap interval is above X; ``ci_lower>0``
  means significantly better.
- ``mcnemar<X``: the candidate is better and McNemar's exact p-value is below X (0/1 scores).

``Decision.to_dict()`` is what goes into the candidate version's manifest.

A run in which tasks failed (a solver or scorer error) decides nothing unless the caller
allows it (``allow_errors``, ``--allow-errors``): which tasks fail can differ between the two
runs by chance (a race, a flaky upstream), and the difference would then be the failures'.
Allowed, the rule is applied to the tasks scored in both runs and the decision says how many
were left out.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from whetstone.engine.errors import EvalError, TasksFailed
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.compare import Comparison, compare
from whetstone.engine.evaluation.results import EvalResult
from whetstone.engine.evaluation.runner import ProgressFn, Solver, evaluate
from whetstone.engine.evaluation.scorers import ScoreFn
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet, parse_spec
from whetstone.library_store.traces import TraceStore

DEFAULT_RULE = "not_worse"
_EPS = 1e-12  # float noise in a mean of differences must not turn a tie into a rejection

_CONDITION = re.compile(
    r"^\s*(?P<kind>not_worse|min_delta|ci_lower|mcnemar)\s*"
    r"(?:(?P<op>=|>|<)\s*(?P<x>[-+0-9.eE]+))?\s*$"
)
_OPS = {"not_worse": None, "min_delta": "=", "ci_lower": ">", "mcnemar": "<"}


@dataclass(frozen=True)
class Condition:
    """One parsed condition of a rule."""

    kind: str
    threshold: float = 0.0

    def __str__(self) -> str:
        op = _OPS[self.kind]
        return self.kind if op is None else f"{self.kind}{op}{self.threshold:g}"

    def check(self, c: Comparison) -> tuple[bool, str]:
        """Whether the comparison (candidate = b) passes, and a sentence saying why."""
        if self.kind == "not_worse":
            ok = c.difference >= -_EPS
            return ok, f"difference {c.difference:+.4f} {'>=' if ok else '<'} 0"
        if self.kind == "min_delta":
            ok = c.difference >= self.threshold - _EPS
            return ok, f"difference {c.difference:+.4f} {'>=' if ok else '<'} {self.threshold:g}"
        if self.kind == "ci_lower":
            ok = c.ci_low > self.threshold
            return ok, f"CI lower bound {c.ci_low:+.4f} {'>' if ok else '<='} {self.threshold:g}"
        if c.p_value is None:
            raise EvalError(f"rule {self} needs McNemar's test, which needs 0/1 scores",
                            hint="use ci_lower>0 for continuous scores")
        ok = c.difference > _EPS and c.p_value < self.threshold
        return ok, (f"difference {c.difference:+.4f} with McNemar p={c.p_value:.4g} "
                    f"({'passes' if ok else 'fails'} p<{self.threshold:g} and better)")


def parse_rule(rule: str) -> tuple[Condition, ...]:
    """Parse ``cond[&cond...]``; see the module docstring for the conditions."""
    conds: list[Condition] = []
    for part in rule.split("&"):
        m = _CONDITION.match(part)
        kind = m.group("kind") if m else None
        if not m or kind is None or (m.group("op") or None) != _OPS[kind]:
            raise EvalError(f"cannot read gate rule {rule!r} (at {part.strip()!r})",
                            hint="rules: not_worse, min_delta=X, ci_lower>X, mcnemar<X; "
                                 "combine with &")
        try:
            x = float(m.group("x")) if m.group("x") else 0.0
        except ValueError:
            raise EvalError(f"gate rule {rule!r}: {m.group('x')!r} is not a number",
                            hint="e.g. min_delta=0.02") from None
        conds.append(Condition(kind, x))
    return tuple(conds)


@dataclass(frozen=True)
class Decision:
    """The gate's verdict with everything needed to audit it."""

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
            "left_out": list(self.left_out), "decided_at": self.decided_at, "results": dict(self.results),
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


def gate(candidate: EvalResult, current: EvalResult, rule: str = DEFAULT_RULE, *,
         confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
         allow_errors: bool = False) -> Decision:
    """Decide whether ``candidate`` may replace ``current``; both must cover the same tasks.
    A run with failed tasks raises ``TasksFailed`` unless ``allow_errors``."""
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
    checks = [cond.check(c) for cond in conds]
    results = {k: r.meta["saved_to"] for k, r in (("candidate", candidate), ("current", current))
               if "saved_to" in r.meta}
    return Decision(
        accepted=all(ok for ok, _ in checks), rule="&".join(str(x) for x in conds),
        reasons=tuple(why for _, why in checks), candidate_score=c.score_b,
        current_score=c.score_a, difference=c.difference, ci_low=c.ci_low, ci_high=c.ci_high,
        confidence=confidence, p_value=c.p_value, n_tasks=c.n, task_set=candidate.task_set,
        scorer=candidate.scorer, seed=candidate.seed, candidate=candidate.name,
        current=current.name, wins=len(c.wins), losses=len(c.losses), results=results,
        left_out=tuple(sorted(set(c.failed_in_a) | set(c.failed_in_b))),
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
) -> Decision:
    """Evaluate the current and the candidate library on the same tasks with the same seed,
    then ``gate`` them. Ctrl-C during either run is re-raised (a partial run decides nothing).
    ``on_run("current" | "candidate")`` is called as each of the two runs starts. Failed
    tasks in either run raise ``TasksFailed`` (both runs are saved) unless ``allow_errors``."""
    parse_rule(rule)  # a bad rule fails before any task runs
    chosen = gate_tasks(tasks)
    runs: dict[str, EvalResult] = {}
    for which, solver, version in (("current", solve_with_current, current_version),
                                   ("candidate", solve_with_candidate, candidate_version)):
        if on_run is not None:
            on_run(which)
        runs[which] = evaluate(
            chosen, solver, scorer, concurrency=concurrency, seed=seed, on_progress=on_progress,
            store=store, library_version=version, label=which if version is None else None,
            results_dir=results_dir, trace_meta={"gate": which})
        if runs[which].partial:
            raise KeyboardInterrupt
    return gate(runs["candidate"], runs["current"], rule, seed=seed, allow_errors=allow_errors)
