"""Paired comparison of two evaluation results on the same tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import EvalError
from .results import EvalResult
from .stats import is_binary, mcnemar_exact, paired_bootstrap


@dataclass(frozen=True)
class Comparison:
    """b against a on the tasks both scored. ``difference`` is mean(b - a) with its paired
    bootstrap interval; ``p_value`` is McNemar's exact test (``None`` unless every score is
    0/1). ``wins``: tasks b scored higher on; ``losses``: lower. ``only_in_a``/``only_in_b``:
    tasks one run did not have; ``failed_in_a``/``failed_in_b``: tasks both ran but one
    failed on (solver or scorer error), left out of the pairing (``left_out`` counts both)."""

    a_name: str
    b_name: str
    task_ids: tuple[str, ...]
    score_a: float
    score_b: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float | None
    wins: tuple[str, ...]
    losses: tuple[str, ...]
    ties: int
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    failed_in_a: tuple[str, ...] = ()
    failed_in_b: tuple[str, ...] = ()
    n_resamples: int = 10_000
    seed: int = 0

    @property
    def n(self) -> int:
        return len(self.task_ids)

    @property
    def left_out(self) -> int:
        """Tasks of either run not paired: missing from the other, or failed in either."""
        return len(set(self.only_in_a) | set(self.only_in_b) | set(self.failed_in_a)
                   | set(self.failed_in_b))

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a_name, "b": self.b_name, "n": self.n,
            "score_a": self.score_a, "score_b": self.score_b, "difference": self.difference,
            "ci_low": self.ci_low, "ci_high": self.ci_high, "confidence": self.confidence,
            "ci_method": "paired bootstrap (percentile)", "n_resamples": self.n_resamples,
            "seed": self.seed, "mcnemar_p": self.p_value,
            "wins": list(self.wins), "losses": list(self.losses), "ties": self.ties,
            "only_in_a": list(self.only_in_a), "only_in_b": list(self.only_in_b),
            "failed_in_a": list(self.failed_in_a), "failed_in_b": list(self.failed_in_b),
            "left_out": self.left_out,
        }


def compare(a: EvalResult, b: EvalResult, *, confidence: float = 0.95,
            n_resamples: int = 10_000, seed: int = 0) -> Comparison:
    """Compare ``b`` with ``a`` task by task (paired by task id, in ``a``'s order), on the
    tasks scored in both: a task either run failed on is left out (and named), never
    counted as a 0 for one side."""
    sa, sb = a.scores, b.scores  # scored tasks only
    ids_a = [r.task_id for r in a.results]
    ids_b = [r.task_id for r in b.results]
    set_a, set_b = set(ids_a), set(ids_b)
    common = tuple(t for t in sa if t in sb)
    if not common:
        failed = len(a.failed) + len(b.failed)
        why = f" scored in both ({failed} failed task(s) left out)" if failed else ""
        raise EvalError(f"{a.name!r} and {b.name!r} share no task{why}, so they cannot be "
                        "paired",
                        hint="evaluate both on the same task set and slice" if not failed
                        else "fix what made the tasks fail and evaluate again")
    xa = [sa[t] for t in common]
    xb = [sb[t] for t in common]
    diff = paired_bootstrap(xa, xb, confidence, n_resamples, seed)
    p = mcnemar_exact(xa, xb).p_value if is_binary(xa) and is_binary(xb) else None
    wins = tuple(t for t in common if sb[t] > sa[t])
    losses = tuple(t for t in common if sb[t] < sa[t])
    return Comparison(
        a_name=a.name, b_name=b.name, task_ids=common,
        score_a=sum(xa) / len(xa), score_b=sum(xb) / len(xb),
        difference=diff.difference, ci_low=diff.low, ci_high=diff.high, confidence=confidence,
        p_value=p, wins=wins, losses=losses, ties=len(common) - len(wins) - len(losses),
        only_in_a=tuple(t for t in ids_a if t not in set_b),
        only_in_b=tuple(t for t in ids_b if t not in set_a),
        failed_in_a=tuple(r.task_id for r in a.failed if r.task_id in set_b),
        failed_in_b=tuple(r.task_id for r in b.failed if r.task_id in set_a),
        n_resamples=n_resamples, seed=seed,
    )
