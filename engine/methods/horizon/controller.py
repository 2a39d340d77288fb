"""Elastic Horizon's controller: a closed loop for the step budget (``RunConfig.max_steps``).

The budget follows the 90th percentile of the lengths (model calls) of *successful* runs on
similar tasks, read from the library's traces as they arrive, bounded by ``[min_steps,
max_steps]``. The estimate has to see past its own budget: a run cut off at its horizon says
only "it needed more than B calls, or would never have succeeded". So:

* lengths are estimated with the Aalen-Johansen cumulative incidence of success, the
  competing event being a finished run that failed (a wrong answer), and runs stopped by a
  limit counted as censored at their budget: runs cut short by a tight budget do not drag the
  estimate down, and runs that kept the budget busy without succeeding do not count as
  successes;
* the estimate only reaches as far as the evidence: the ``edge`` is the longest length that
  at least ``min_runs`` runs had the budget to reach. When the percentile sits on the edge
  (the last observed step still holds a tenth of the successes), the tail is unknown and the
  controller probes upwards; when most runs hit the limit and none succeed, likewise;
* otherwise the budget moves towards the percentile with gain ``gain`` (1: jump), snapping
  when within half a step.

From an over-capacity start the budget falls to the percentile; from an under-capacity start
it climbs by probes until the successes' distribution is seen whole, then settles; as the
window slides past the last probe's runs it probes again, so the loop keeps re-checking a
changing workload at a bounded cost (``tests/test_horizon.py`` simulates both starts).

Pure: it reads ``Trace`` objects, which the runtime method (``whetstone.engine.methods.horizon.plugin``) takes
from the library's ``TraceStore`` (``read_since``: only the records written since its last
run).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...types import Trace

LIMIT_OUTCOMES = frozenset({"horizon", "budget", "timeout"})
_HORIZON_REASON = re.compile(r"step horizon \((\d+) model calls?\)")


@dataclass(frozen=True)
class RunRecord:
    """What the controller needs from one finished run.

    ``length``: model calls made; ``success``: it reached a good answer (the scorer's score
    when there is one, else an answer at all); ``censored``: a limit stopped it; ``budget``:
    the step horizon it ran with, when known; ``family``: its task family (the task set's
    name for an eval's traces, "" for single runs).
    """

    id: str
    task: str
    length: int
    success: bool
    censored: bool
    budget: int | None
    family: str
    started: float
    split: str = ""  # the eval's split (train, dev, test), "" when none


def task_split(task_set: str | None) -> str:
    """``gsm8k@train:0:50`` -> ``train``; no split -> ""."""
    m = re.search(r"@(\w+)", task_set or "")
    return m.group(1) if m else ""


def task_family(task_set: str | None) -> str:
    """``gsm8k@train:0:50`` -> ``gsm8k``; a path to a .jsonl file -> its stem; None -> ""."""
    if not task_set:
        return ""
    base = re.split(r"[@:]", task_set, maxsplit=1)[0]
    return Path(base).stem if base.endswith(".jsonl") else base


def record_from_trace(trace: Trace, *, min_score: float = 1.0) -> RunRecord | None:
    """A ``RunRecord`` from one stored trace, or None for a run still going, interrupted,
    failed (outcome ``error``: its length says nothing about the task) or with no model
    call."""
    outcome = trace.outcome
    if outcome in (None, "running", "interrupted", "error"):
        return None
    length = sum(1 for s in trace.steps if s.kind == "think" and not s.error)
    if length == 0:
        return None
    meta = trace.meta or {}
    budget = (meta.get("budgets") or {}).get("max_steps")
    if budget is None and outcome == "horizon":
        m = _HORIZON_REASON.search(str(meta.get("reason") or ""))
        budget = int(m.group(1)) if m else length
    score = trace.score
    success = (score >= min_score) if isinstance(score, (int, float)) else outcome == "answered"
    return RunRecord(
        id=str(trace.id), task=str(trace.task or ""), length=length,
        success=bool(success) and outcome == "answered", censored=outcome in LIMIT_OUTCOMES,
        budget=int(budget) if budget is not None else None,
        family=task_family(meta.get("task_set")), started=float(trace.started or 0.0),
        split=task_split(meta.get("task_set")))


@dataclass(frozen=True)
class LengthEstimate:
    """The success-length percentile and how far the evidence reaches."""

    quantile: int | None  # None: no success observed
    edge: int  # the longest length at least ``min_runs`` runs could reach
    successes: int
    runs: int
    censored: int


def success_quantile(records: Sequence[RunRecord], q: float = 0.9, *,
                     min_runs: int = 20) -> LengthEstimate:
    """The ``q`` quantile of successful lengths, censoring-aware (see the module docstring):
    the smallest length ``t <= edge`` whose cumulative incidence of success reaches ``q``
    times the incidence at the edge."""
    successes = sum(r.success for r in records)
    censored = sum(r.censored for r in records)
    reach = sorted((max(r.budget or 0, r.length) for r in records), reverse=True)
    edge = reach[min(min_runs, len(reach)) - 1] if reach else 0
    if successes == 0 or edge == 0:
        return LengthEstimate(None, edge, successes, len(records), censored)
    # Aalen-Johansen with two causes (success, failure) and censoring at a limit.
    survival, incidence = 1.0, [0.0] * (edge + 1)
    for t in range(1, edge + 1):
        at_risk = sum(1 for r in records if r.length >= t)
        wins = sum(1 for r in records if r.length == t and r.success)
        fails = sum(1 for r in records if r.length == t and not r.success and not r.censored)
        incidence[t] = incidence[t - 1] + (survival * wins / at_risk if at_risk else 0.0)
        if at_risk:
            survival *= 1.0 - (wins + fails) / at_risk
    total = incidence[edge]
    if total <= 0:
        return LengthEstimate(None, edge, successes, len(records), censored)
    quantile = next(t for t in range(1, edge + 1) if incidence[t] >= q * total - 1e-12)
    return LengthEstimate(quantile, edge, successes, len(records), censored)


@dataclass(frozen=True)
class HorizonDecision:
    """One budget the controller chose, and why (recorded in the trace)."""

    max_steps: int
    reason: str  # cold start | p90 | probe | hold
    estimate: LengthEstimate | None = None
    target: float | None = None

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {"max_steps": self.max_steps, "reason": self.reason,
                "target": None if self.target is None else round(self.target, 3),
                **({"quantile": est.quantile, "edge": est.edge, "successes": est.successes,
                    "runs": est.runs, "censored": est.censored} if est else {})}


@dataclass
class HorizonController:
    """The budget for the next run of a task family, from that family's newest runs.

    ``budget`` is the controller's state (a float, so a gain below 1 moves it smoothly);
    ``update(records)`` moves it and returns the decision. ``grow_when_censored``: the share
    of runs stopped by a limit above which, with too few successes to estimate, it probes.
    """

    budget: float
    min_steps: int = 2
    max_steps: int = 16
    quantile: float = 0.9
    gain: float = 0.5
    growth: float = 0.5
    window: int = 200
    min_successes: int = 5
    min_runs: int = 20
    grow_when_censored: float = 0.5
    history: list[HorizonDecision] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.budget = float(self._clamp(self.budget))

    def _clamp(self, value: float) -> float:
        return min(float(self.max_steps), max(float(self.min_steps), value))

    def _probe(self, edge: int) -> float:
        return edge + max(1, math.ceil(self.growth * edge))

    def update(self, records: Iterable[RunRecord]) -> HorizonDecision:
        recent = sorted(records, key=lambda r: r.started)[-self.window:]
        est = success_quantile(recent, self.quantile, min_runs=self.min_runs) if recent else None
        if est is None:
            return self._decide(None, "cold start", None)
        if est.successes < self.min_successes:
            if est.runs and est.censored / est.runs >= self.grow_when_censored:
                return self._decide(self._probe(max(est.edge, int(self.budget))), "probe", est)
            return self._decide(None, "hold", est)
        assert est.quantile is not None
        if est.quantile >= est.edge and est.edge < self.max_steps:
            return self._decide(self._probe(est.edge), "probe", est)
        return self._decide(float(est.quantile), "p90", est)

    def _decide(self, target: float | None, reason: str,
                est: LengthEstimate | None) -> HorizonDecision:
        if target is not None:
            target = self._clamp(target)
            # A probe jumps: it must run at the new budget to see past the old one.
            gain = 1.0 if reason == "probe" else self.gain
            moved = self.budget + gain * (target - self.budget)
            self.budget = target if abs(target - moved) < 0.5 else moved
        decision = HorizonDecision(math.ceil(self.budget - 1e-9), reason, est, target)
        self.history = [*self.history[-99:], decision]
        return decision
