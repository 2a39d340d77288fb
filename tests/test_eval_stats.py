"""Intervals and paired tests against values computed by hand."""

from __future__ import annotations

import math

import pytest

from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.stats import (
    bootstrap_interval,
    bootstrap_means,
    mcnemar_exact,
    paired_bootstrap,
    score_interval,
    wilson_interval,
)


def test_wilson_interval_hand_computed() -> None:
    # 8 of 10, z = 1.959964: centre = (0.8 + z^2/20) / (1 + z^2/10) = 0.71674,
    # half = z * sqrt(0.016 + z^2/400) / (1 + z^2/10) = 0.22658 -> [0.4902, 0.9433].
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.49016, abs=1e-4) and hi == pytest.approx(0.94332, abs=1e-4)
    # 0 of 20: [0, z^2/(20 + z^2)] = [0, 0.16113].
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(3.841459 / (20 + 3.841459), abs=1e-6)
    # 20 of 20 mirrors it.
    assert wilson_interval(20, 20)[0] == pytest.approx(20 / (20 + 3.841459), abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # A 99% interval is wider.
    assert wilson_interval(8, 10, 0.99)[0] < 0.49


def test_wilson_refuses_impossible_counts() -> None:
    with pytest.raises(EvalError):
        wilson_interval(11, 10)
    with pytest.raises(EvalError, match="confidence"):
        wilson_interval(1, 10, confidence=1.5)


def test_mcnemar_exact_hand_computed() -> None:
    # a right only on 6 tasks, b right only on 1: n = 7, k = 1,
    # p = 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128 = 0.125.
    a = [1] * 6 + [0] + [1, 0, 1]
    b = [0] * 6 + [1] + [1, 0, 1]
    m = mcnemar_exact(a, b)
    assert (m.a_only, m.b_only) == (6, 1) and m.p_value == pytest.approx(0.125)
    # 10 vs 0: p = 2 / 1024.
    assert mcnemar_exact([1] * 10, [0] * 10).p_value == pytest.approx(2 / 1024)
    # Balanced discordance: p = 1.
    assert mcnemar_exact([1, 0], [0, 1]).p_value == 1.0
    # No discordant pair at all.
    assert mcnemar_exact([1, 1, 0], [1, 1, 0]).p_value == 1.0
    # 3 vs 1: 2 * (1 + 4) / 16 = 0.625.
    assert mcnemar_exact([1, 1, 1, 0], [0, 0, 0, 1]).p_value == pytest.approx(0.625)


def test_mcnemar_is_exact_for_large_counts() -> None:
    # 600 vs 400 discordant pairs: compare with a normal approximation (continuity corrected).
    a = [1] * 600 + [0] * 400
    b = [0] * 600 + [1] * 400
    p = mcnemar_exact(a, b).p_value
    z = (abs(600 - 400) - 1) / math.sqrt(1000)
    approx = 2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2))))
    assert 0 < p < 1e-8 and p == pytest.approx(approx, rel=0.2)


def test_mcnemar_needs_binary_paired_scores() -> None:
    with pytest.raises(EvalError, match="binary"):
        mcnemar_exact([0.5], [1.0])
    with pytest.raises(EvalError, match="length"):
        mcnemar_exact([1], [1, 0])


def test_paired_bootstrap_of_two_tasks_matches_the_exact_distribution() -> None:
    # diffs [0, 1]: resampled means are 0 (p=1/4), 0.5 (1/2), 1 (1/4), so the 95% percentile
    # interval is [0, 1] and the bootstrap means average 0.5.
    d = paired_bootstrap([0, 0], [0, 1], n_resamples=20_000, seed=1)
    assert d.difference == 0.5 and (d.low, d.high) == (0.0, 1.0)
    means = bootstrap_means([0.0, 1.0], 20_000, seed=1)
    assert sum(m == 0.0 for m in means) / len(means) == pytest.approx(0.25, abs=0.02)
    assert sum(m == 0.5 for m in means) / len(means) == pytest.approx(0.5, abs=0.02)


def test_paired_bootstrap_is_paired() -> None:
    # b beats a by exactly 0.2 on every task: the paired interval is the single point 0.2,
    # although each version's own scores vary widely from task to task.
    a = [0.0, 0.8, 0.1, 0.7, 0.3, 0.5, 0.0, 0.6]
    b = [x + 0.2 for x in a]
    d = paired_bootstrap(a, b)
    assert d.difference == pytest.approx(0.2)
    assert d.low == pytest.approx(0.2) and d.high == pytest.approx(0.2)
    # An unpaired view of the same numbers would be far wider.
    lo_a, hi_a = bootstrap_interval(a)
    assert hi_a - lo_a > 0.3


def test_paired_bootstrap_is_seeded() -> None:
    a = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    b = [1, 1, 1, 0, 1, 0, 1, 1, 1, 1]
    assert paired_bootstrap(a, b, seed=3) == paired_bootstrap(a, b, seed=3)
    d = paired_bootstrap(a, b, seed=3)
    assert d.difference == pytest.approx(0.2) and d.low < 0.2 < d.high
    assert paired_bootstrap(a, b, seed=4) != d  # another seed draws other resamples


def test_paired_bootstrap_refuses_bad_input() -> None:
    with pytest.raises(EvalError, match="length"):
        paired_bootstrap([1], [1, 0])
    with pytest.raises(EvalError, match="no paired"):
        paired_bootstrap([], [])
    with pytest.raises(EvalError, match="n_resamples"):
        bootstrap_means([1.0], 0)


def test_score_interval_picks_wilson_for_binary_and_bootstrap_otherwise() -> None:
    ci = score_interval([1.0] * 8 + [0.0] * 2)
    assert ci.method == "wilson" and ci.mean == 0.8 and ci.low == pytest.approx(0.49016, abs=1e-4)
    ci = score_interval([0.5, 0.7, 0.9, 0.2])
    assert ci.method == "bootstrap" and ci.low < ci.mean < ci.high
    assert ci.low >= 0.2 and ci.high <= 0.9
