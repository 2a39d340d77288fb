"""Confidence intervals and paired tests for scores in [0, 1].

- ``wilson_interval``: for binary outcomes (k successes of n).
- ``bootstrap_interval``: percentile bootstrap of the mean, for continuous scores (seeded).
- ``paired_bootstrap``: the mean paired difference b - a with a percentile bootstrap interval
  that resamples tasks, so both versions are always judged on the same draw (seeded).
- ``mcnemar_exact``: McNemar's exact test (two-sided binomial on the discordant pairs).
- ``independent_difference``: the difference of two independent (weighted) means of scores in
  [0, 1] with Newcombe's score interval (two live arms of a canary, never paired).
- ``missed_regression``: how large a drop a paired comparison of n tasks could have missed
  (``unseen_share``: the least any n tasks leave open).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from ..errors import EvalError

IntervalMethod = Literal["wilson", "bootstrap"]


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise EvalError(f"confidence must be in (0, 1), got {confidence}", hint="e.g. 0.95")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def is_binary(scores: Sequence[float]) -> bool:
    """True when every score is exactly 0 or 1."""
    return all(s in (0.0, 1.0) for s in scores)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when ``n`` is 0."""
    if n < 0 or not 0 <= successes <= n:
        raise EvalError(f"need 0 <= successes <= n, got {successes} of {n}", hint="check counts")
    if n == 0:
        return 0.0, 1.0
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n the bounds are exactly 0 or 1; the formula leaves float residue there.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def wilson_bounds(p: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's interval for a proportion ``p`` seen over ``n`` trials, ``n`` possibly
    fractional (an effective count of weighted trials); (0, 1) when ``n`` is 0."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise EvalError(f"need 0 <= p <= 1 and n >= 0, got {p} over {n}", hint="check counts")
    if n == 0:
        return 0.0, 1.0
    z = _z(confidence)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """(the weighted mean, Kish's effective count (sum w)^2 / sum w^2); (0, 0) when the
    weights sum to 0."""
    if len(values) != len(weights) or any(w < 0 for w in weights):
        raise EvalError("weights must be as many as the values and never negative",
                        hint="check the weights")
    total = sum(weights)
    if total <= 0:
        return 0.0, 0.0
    mean = sum(v * w for v, w in zip(values, weights, strict=False)) / total
    return mean, total * total / sum(w * w for w in weights)


@dataclass(frozen=True)
class Difference:
    """``mean_b - mean_a`` of two independent samples with its interval; ``n_a``, ``n_b``
    are (effective) counts."""

    difference: float
    low: float
    high: float
    mean_a: float
    mean_b: float
    n_a: float
    n_b: float
    confidence: float = 0.95


def independent_difference(mean_a: float, n_a: float, mean_b: float, n_b: float,
                           confidence: float = 0.95) -> Difference:
    """``mean_b - mean_a`` of two independent means of scores in [0, 1] with Newcombe's
    hybrid score interval (his method 10: each side's Wilson bounds, squared and added), which
    keeps its coverage with few trials where the normal interval does not. Counts may be
    effective (weighted, ``weighted_mean``); scores between 0 and 1 have a variance of at most
    p(1 - p), so for them the interval errs wide. A side with no trials gives (-1, 1)."""
    la, ua = wilson_bounds(mean_a, n_a, confidence)
    lb, ub = wilson_bounds(mean_b, n_b, confidence)
    d = mean_b - mean_a
    low = d - math.sqrt((mean_b - lb) ** 2 + (ua - mean_a) ** 2)
    high = d + math.sqrt((ub - mean_b) ** 2 + (mean_a - la) ** 2)
    return Difference(d, max(-1.0, low), min(1.0, high), mean_a, mean_b, n_a, n_b, confidence)


def _percentiles(samples: Sequence[float], confidence: float) -> tuple[float, float]:
    import numpy as np  # heavy: numpy

    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(np.asarray(samples), [alpha, 1 - alpha])
    return float(lo), float(hi)


def bootstrap_means(values: Sequence[float], n_resamples: int = 10_000, seed: int = 0
                    ) -> list[float]:
    """Means of ``n_resamples`` resamples (with replacement) of ``values``; seeded."""
    import numpy as np  # heavy: numpy

    if n_resamples < 1:
        raise EvalError(f"n_resamples must be >= 1, got {n_resamples}", hint="e.g. 10000")
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return []
    rng = np.random.default_rng(seed)
    # Chunks keep memory flat for large sets: (chunk, n) index draws at a time.
    out: list[float] = []
    chunk = max(1, 2_000_000 // data.size)
    left = n_resamples
    while left:
        k = min(chunk, left)
        idx = rng.integers(0, data.size, size=(k, data.size))
        out.extend(data[idx].mean(axis=1).tolist())
        left -= k
    return out


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95,
                       n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean; (0, 1) for no values."""
    _z(confidence)
    if not values:
        return 0.0, 1.0
    return _percentiles(bootstrap_means(values, n_resamples, seed), confidence)


@dataclass(frozen=True)
class Interval:
    """A mean with its confidence interval and the method that made it."""

    mean: float
    low: float
    high: float
    method: IntervalMethod
    confidence: float = 0.95


def score_interval(scores: Sequence[float], confidence: float = 0.95, seed: int = 0,
                   n_resamples: int = 10_000) -> Interval:
    """Accuracy with its interval: Wilson when every score is 0/1, else percentile bootstrap."""
    n = len(scores)
    mean = sum(scores) / n if n else 0.0
    if is_binary(scores):
        lo, hi = wilson_interval(round(sum(scores)), n, confidence)
        return Interval(mean, lo, hi, "wilson", confidence)
    lo, hi = bootstrap_interval(scores, confidence, n_resamples, seed)
    return Interval(mean, lo, hi, "bootstrap", confidence)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of b - a over paired tasks, with its paired-bootstrap interval."""

    difference: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    n_resamples: int = 10_000
    seed: int = 0


def paired_bootstrap(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                     n_resamples: int = 10_000, seed: int = 0) -> PairedDifference:
    """The mean paired difference ``b - a`` and a percentile interval from resampling tasks."""
    if len(a) != len(b):
        raise EvalError(f"paired scores differ in length ({len(a)} vs {len(b)})",
                        hint="compare results on the same tasks")
    if not a:
        raise EvalError("no paired scores to compare", hint="the two results share no task")
    _z(confidence)
    diffs = [y - x for x, y in zip(a, b, strict=False)]
    mean = sum(diffs) / len(diffs)
    lo, hi = _percentiles(bootstrap_means(diffs, n_resamples, seed), confidence)
    return PairedDifference(mean, lo, hi, len(diffs), confidence, n_resamples, seed)


@dataclass(frozen=True)
class McNemar:
    """McNemar's exact test. ``b_only``: tasks only b got right; ``a_only``: only a."""

    a_only: int
    b_only: int
    p_value: float


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> McNemar:
    """Two-sided exact McNemar test on paired binary outcomes (0/1 scores)."""
    if len(a) != len(b):
        raise EvalError(f"paired outcomes differ in length ({len(a)} vs {len(b)})",
                        hint="compare results on the same tasks")
    if not (is_binary(a) and is_binary(b)):
        raise EvalError("McNemar's test needs binary (0/1) scores",
                        hint="use the paired bootstrap for continuous scores")
    a_only = sum(1 for x, y in zip(a, b, strict=False) if x == 1.0 and y == 0.0)
    b_only = sum(1 for x, y in zip(a, b, strict=False) if x == 0.0 and y == 1.0)
    n = a_only + b_only
    if n == 0:
        return McNemar(a_only, b_only, 1.0)
    k = min(a_only, b_only)
    # Exact integer arithmetic: 2 * P(X <= k), X ~ Binomial(n, 1/2); int / int rounds correctly.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return McNemar(a_only, b_only, min(1.0, 2 * tail / 2**n))


def unseen_share(n: int, confidence: float = 0.95) -> float:
    """The largest share of tasks that could change for the worse with none of ``n`` showing
    it: (1 - f) ** n = (1 - confidence) / 2 (11.6% for 30 tasks, 6.0% for 60, 3.6% for 100)."""
    if n < 1:
        raise EvalError(f"need at least one task, got {n}", hint="pass the comparison's n")
    _z(confidence)
    return 1.0 - ((1.0 - confidence) / 2) ** (1.0 / n)


def tasks_to_tell(n: int, could_miss: float, bound: float, confidence: float = 0.95) -> int:
    """About how many paired tasks would rule out a regression of ``bound`` at the spread seen
    on ``n`` that could have missed ``could_miss``: an interval's half-width shrinks as
    1/sqrt(n), a quarter more for the estimate's own noise, and never fewer than rule out
    ``bound`` unseen (``unseen_share``: 36 tasks for 0.10)."""
    if n < 1 or bound <= 0:
        raise EvalError(f"need n >= 1 and a bound above 0, got {n} and {bound}",
                        hint="pass the comparison's n and the gate's bound")
    _z(confidence)
    spread = math.ceil(n * (could_miss / bound) ** 2 * 1.25)
    unseen = math.floor(math.log((1.0 - confidence) / 2) / math.log(1.0 - bound)) + 1
    return max(n + 1, spread, unseen)


def missed_regression(ci_low: float, n: int, *, left_out: int = 0, confidence: float = 0.95,
                      floor: bool = True) -> float:
    """How large a regression (a drop in mean score) a paired comparison could have missed.

    ``ci_low``: the lower end of the paired interval of b - a over ``n`` paired tasks. The
    answer is ``-ci_low``, and with ``floor`` never less than ``unseen_share(n)``: a change
    for the worse on that share of tasks could hide behind "nothing changed" (where the
    bootstrap reports [0, 0]) or behind one task better and none worse. ``left_out`` tasks
    (failed in either run, not paired) were not measured and each could hide a loss: over all
    ``n + left_out`` tasks the lower end is ``(n * low - left_out) / (n + left_out)``."""
    if left_out < 0:
        raise EvalError(f"need left_out >= 0, got {left_out}", hint="pass the comparison's counts")
    if n == 0:
        return 1.0
    low = min(ci_low, -unseen_share(n, confidence)) if floor else ci_low
    return max(0.0, (left_out - n * low) / (n + left_out))
