"""Is the canary worse? Live feedback on the canary against the current version.

Every replica routes a share of conversations to the canary and records on each trace which
arm served it (``meta["canary"]``: its id and ``canary`` or ``current``); feedback adds a
score, the hash of the key that sent it and the weight the server gives that key. Both arms
are read over the same window (the canary's life) and compared as two independent means with
Newcombe's interval (``stats.independent_difference``).

One key cannot decide. Within each arm a key's weight is capped at ``max_key_share`` of the
arm (water-filling: the largest keys are cut down to one level, the rest kept), so a flood
from one key is worth at most that share; and a decision (promote, roll back) is taken only
when it is also what the numbers say with each key's feedback left out in turn (the others'
means over the whole window's counts: ``without_key``): no single key's feedback is what
moves it. A flood can at most keep a canary undecided, until it
expires (``max_scored``) and the current version stays.

The rules (``CanaryRules``; defaults in docs/learning.md):

- **roll back** at once when the interval's upper end is below 0 (the canary is worse), once
  each arm has ``min_rollback`` weighted scores;
- **promote** when the canary arm has ``min_scored`` weighted scores and the interval's lower
  end is above ``-margin`` (not worse by more than the margin);
- **expire** when the canary arm reaches ``max_scored`` undecided;
- otherwise **wait**.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..evaluation.stats import independent_difference, weighted_mean
from ..types import Trace

ARMS = ("canary", "current")
UNKEYED = "unkeyed"  # feedback recorded without a key (the Python API, older traces)
# The trace meta fields the server writes: the arm, and who scored and with what weight.
CANARY_META = "canary"
FEEDBACK_KEY = "feedback_key"
FEEDBACK_WEIGHT = "feedback_weight"


@dataclass(frozen=True)
class CanaryRules:
    """When a canary is promoted, rolled back or expires (see the module docstring)."""

    min_scored: int = 100
    margin: float = 0.05
    max_key_share: float = 0.5
    min_keys: int = 3
    min_rollback: int = 20
    max_scored: int = 1000
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.min_scored < 1 or self.min_rollback < 1 or self.max_scored < self.min_scored:
            raise ConfigError(f"need min_scored >= 1, min_rollback >= 1 and max_scored >= "
                              f"min_scored, got {self.min_scored}, {self.min_rollback}, "
                              f"{self.max_scored}", hint="e.g. --min-scored 100 --max-scored "
                                                          "400")
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError(f"the margin must be in [0, 1), got {self.margin}",
                              hint="e.g. --margin 0.05")
        if not 0.0 < self.max_key_share <= 1.0:
            raise ConfigError(f"the largest share of one key must be in (0, 1], got "
                              f"{self.max_key_share}", hint="e.g. --max-key-share 0.5")
        if self.min_keys < 1:
            raise ConfigError(f"min_keys must be 1 or more, got {self.min_keys}")


@dataclass(frozen=True)
class Scored:
    """One scored request of a canary's window."""

    arm: str
    score: float
    key: str
    weight: float = 1.0
    trace_id: str = ""


def canary_of(trace: Trace) -> tuple[str, str] | None:
    """(canary id, arm) of a trace served while a canary ran; None otherwise."""
    info = trace.meta.get(CANARY_META)
    if not isinstance(info, Mapping):
        return None
    cid, arm = info.get("id"), info.get("arm")
    return (cid, arm) if isinstance(cid, str) and arm in ARMS else None


def scored_of(traces: Iterable[Trace], canary_id: str) -> list[Scored]:
    """The scored requests of the canary ``canary_id`` (latest record of each trace)."""
    out: list[Scored] = []
    for t in traces:
        where = canary_of(t)
        if where is None or where[0] != canary_id or t.score is None:
            continue
        key = t.meta.get(FEEDBACK_KEY) or UNKEYED
        weight = t.meta.get(FEEDBACK_WEIGHT, 1.0)
        weight = float(weight) if isinstance(weight, (int, float)) and weight >= 0 else 1.0
        out.append(Scored(where[1], min(1.0, max(0.0, float(t.score))), str(key), weight, t.id))
    return out


def cap_shares(totals: Mapping[str, float], max_share: float) -> dict[str, float]:
    """Each key's weight after capping at ``max_share`` of the total (water-filling: one
    level ``L`` with ``L = max_share * sum(min(w, L))``; the keys above it are cut to it).
    With too few keys to keep every share under the cap (one key and a cap below 1), every
    weight is 0: they cannot make a comparison."""
    keys = sorted(totals, key=lambda k: totals[k])
    w = [max(0.0, totals[k]) for k in keys]
    if max_share >= 1.0 or not w:
        return dict(zip(keys, w, strict=False))
    eps = 1e-12
    below = 0.0  # the sum of the keys kept whole
    for j in range(len(w) + 1):
        capped = len(w) - j
        if capped == 0:
            if w[-1] <= max_share * below + eps:
                return dict(zip(keys, w, strict=False))
            break
        denom = 1.0 - max_share * capped
        if denom > eps:
            level = max_share * below / denom
        elif abs(denom) <= eps and below <= eps:
            level = w[j]  # exactly 1/max_share keys: all at the smallest
        else:
            level = -1.0
        if level >= 0 and (j == 0 or w[j - 1] <= level + eps) and level <= w[j] + eps:
            return {k: min(x, level) for k, x in zip(keys, w, strict=False)}
        below += w[j]
    return {k: 0.0 for k in keys}


@dataclass(frozen=True)
class Comparison:
    """The canary's mean against the current version's over the same window."""

    canary: float
    current: float
    n_canary: float  # weighted scores after the cap
    n_current: float
    difference: float
    low: float
    high: float
    keys: int  # keys with weight on either arm
    requests: dict[str, int]  # scored requests per arm, before weights
    eff_canary: float = 0.0  # Kish's effective counts, what the interval is taken over
    eff_current: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        r = 4
        return {"canary": round(self.canary, r), "current": round(self.current, r),
                "n_canary": round(self.n_canary, 2), "n_current": round(self.n_current, 2),
                "difference": round(self.difference, r), "ci_low": round(self.low, r),
                "ci_high": round(self.high, r), "keys": self.keys,
                "requests": dict(self.requests)}


def compare(scored: Sequence[Scored], rules: CanaryRules, *, without: str | None = None
            ) -> Comparison:
    """Canary against current, each arm's keys capped (``cap_shares``), the key ``without``
    left out."""
    means: dict[str, tuple[float, float, float]] = {}
    keys: set[str] = set()
    for arm in ARMS:
        rows = [s for s in scored if s.arm == arm and s.key != without]
        totals: dict[str, float] = defaultdict(float)
        for s in rows:
            totals[s.key] += s.weight
        capped = cap_shares(totals, rules.max_key_share)
        weights = [s.weight * (capped[s.key] / totals[s.key]) if totals[s.key] else 0.0
                   for s in rows]
        mean, n_eff = weighted_mean([s.score for s in rows], weights)
        means[arm] = (mean, n_eff, sum(weights))
        keys |= {k for k, v in capped.items() if v > 0}
    (c_mean, c_eff, c_n), (o_mean, o_eff, o_n) = means["canary"], means["current"]
    d = independent_difference(o_mean, o_eff, c_mean, c_eff, rules.confidence)
    counts = {arm: sum(1 for s in scored if s.arm == arm and s.key != without) for arm in ARMS}
    return Comparison(c_mean, o_mean, c_n, o_n, d.difference, d.low, d.high, len(keys), counts,
                      c_eff, o_eff)


def without_key(scored: Sequence[Scored], key: str, full: Comparison, rules: CanaryRules
                ) -> Comparison:
    """The comparison with ``key``'s feedback left out: the means of the others, the interval
    over the whole window's counts, so what changes is that key's pull on the means, not the
    data its loss takes away (an honest key left out would otherwise only widen the
    interval)."""
    alt = compare(scored, rules, without=key)
    d = independent_difference(alt.current, full.eff_current, alt.canary, full.eff_canary,
                               rules.confidence)
    return Comparison(alt.canary, alt.current, alt.n_canary, alt.n_current, d.difference,
                      d.low, d.high, alt.keys, alt.requests, full.eff_canary,
                      full.eff_current)


def _says(c: Comparison, rules: CanaryRules, counts: Comparison | None = None) -> str:
    """What one comparison says: rollback, promote or wait; the counts the rules need are
    read from ``counts`` (the comparison with every key) when given."""
    n = counts or c
    if min(n.n_canary, n.n_current) >= rules.min_rollback and c.high < 0:
        return "rollback"
    if n.n_canary >= rules.min_scored and n.n_current >= rules.min_rollback \
            and c.low > -rules.margin:
        return "promote"
    return "wait"


@dataclass(frozen=True)
class Verdict:
    """What to do with the canary now, why, and the figures."""

    action: str  # promote | rollback | expire | wait
    why: str
    comparison: Comparison
    pivotal: str | None = None  # the key whose feedback alone would move the decision

    def figures(self) -> dict[str, Any]:
        return {**self.comparison.to_dict(), "action": self.action, "why": self.why,
                **({"pivotal_key": self.pivotal[:16]} if self.pivotal else {})}


def decide(scored: Sequence[Scored], rules: CanaryRules) -> Verdict:
    """Promote, roll back, expire or wait (see the module docstring)."""
    full = compare(scored, rules)
    said = _says(full, rules)
    figures = (f"canary {full.canary:.3f} vs current {full.current:.3f}, difference "
               f"{full.difference:+.3f} [{full.low:+.3f}, {full.high:+.3f}] on "
               f"{full.n_canary:.0f} / {full.n_current:.0f} weighted scores")
    if said != "wait" and full.keys < rules.min_keys:
        said, figures = "wait", figures + f"; feedback from {full.keys} key(s), " \
                                          f"{rules.min_keys} needed"
    pivotal = None
    if said != "wait" and rules.min_keys > 1:
        for key in sorted({s.key for s in scored}):
            if _says(without_key(scored, key, full, rules), rules, full) != said:
                pivotal = key
                figures += f"; without key {key[:12]} it would not {said}: waiting"
                said = "wait"
                break
    if said == "wait" and full.n_canary >= rules.max_scored:
        return Verdict("expire", f"undecided after {full.n_canary:.0f} weighted scores (at "
                                 f"most {rules.max_scored}): {figures}", full, pivotal)
    why = {"rollback": "worse (the interval is below 0)",
           "promote": f"not worse by more than {rules.margin:g}",
           "wait": "not decided yet"}[said]
    return Verdict(said, f"{why}: {figures}", full, pivotal)


__all__ = ["ARMS", "CANARY_META", "FEEDBACK_KEY", "FEEDBACK_WEIGHT", "UNKEYED", "CanaryRules",
           "Comparison", "Scored", "Verdict", "canary_of", "cap_shares", "compare", "decide",
           "scored_of", "without_key"]
