"""The gate's rules: the evidence a decision reads and the conditions it is judged by.

``gate.py`` runs and records decisions; this module only judges (see its docstring for the
conditions and docs/gate.md for the numbers behind the defaults).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.stats import missed_regression, tasks_to_tell

DEFAULT_RULE = "cost_aware"
MARGIN = 0.10  # not_worse's margin, and the regression a dev set must rule out (docs/gate.md)
MAX_TOKEN_RATIO = 1.02  # a tie may cost this much more; an unchanged library measured <= 1.004
MAX_FAILED = 0.10  # more unmeasured tasks than this could hide a MARGIN-sized loss by themselves
MAX_GATE_TASKS = 100  # the most tasks widening goes to (a tie with 25% changed: +-0.098)
EPS = 1e-12  # float noise in a mean of differences must not turn a tie into a rejection
FEW_TASKS = 10  # an interval on fewer paired tasks comes with a warning (a percentile
# bootstrap on 3 tasks, 2 better, reads [+0.000, +0.667]; McNemar's p is 0.5)

_CONDITION = re.compile(
    r"^\s*(?P<kind>cost_aware|mean_not_worse|not_worse|min_delta|ci_lower|mcnemar|tokens|"
    r"latency)\s*(?:(?P<op><=|=|>|<)\s*(?P<x>[-+0-9.eE]+))?\s*$"
)
_OPS: dict[str, tuple[str | None, ...]] = {
    "cost_aware": (None,), "mean_not_worse": (None,), "not_worse": (None, "="),
    "min_delta": ("=",), "ci_lower": (">",), "mcnemar": ("<",), "tokens": ("<=",),
    "latency": ("<=",)}


@dataclass(frozen=True)
class Evidence:
    """What a rule reads: the paired comparison on the gate's tasks (candidate minus current)
    and what each run cost per paired task (None: not recorded, as in decisions saved before
    the gate weighed cost)."""

    difference: float
    ci_low: float
    ci_high: float
    n: int
    p_value: float | None = None
    left_out: int = 0  # tasks failed in either run, not paired
    confidence: float = 0.95
    candidate_tokens: float | None = None
    current_tokens: float | None = None
    candidate_latency_s: float | None = None
    current_latency_s: float | None = None
    bound: float = MARGIN  # the regression the dev set must rule out for a tie to be decided

    @classmethod
    def from_decision(cls, d: Mapping[str, Any], bound: float = MARGIN) -> Evidence:
        """The evidence a saved ``Decision.to_dict()`` holds (older ones hold no costs)."""
        def num(key: str) -> float | None:
            v = d.get(key)
            return None if v is None else float(v)

        return cls(difference=float(d["difference"]), ci_low=float(d["ci_low"]),
                   ci_high=float(d["ci_high"]), n=int(d["n_tasks"]),
                   p_value=num("mcnemar_p"), left_out=len(d.get("left_out") or ()),
                   confidence=float(d.get("confidence", 0.95)),
                   candidate_tokens=num("candidate_tokens"), current_tokens=num("current_tokens"),
                   candidate_latency_s=num("candidate_latency_s"),
                   current_latency_s=num("current_latency_s"), bound=bound)

    @property
    def verdict(self) -> str:
        """``gain`` (interval above 0), ``loss`` (below 0) or ``tie`` (it holds 0). Each task
        left out could have gone either way: the interval over all tasks counts it as a loss
        at its lower end and a win at its upper end, so failures never make a gain clear.
        With 0/1 scores McNemar's exact test must agree (p below 1 - confidence): on a few
        tasks the percentile bootstrap reports [+1, +1] for two wins out of two, where
        p = 0.5."""
        n, k = self.n, self.left_out
        if n + k == 0 or not self.significant:
            return "tie"
        if (n * self.ci_low - k) / (n + k) > EPS:
            return "gain"
        return "loss" if (n * self.ci_high + k) / (n + k) < -EPS else "tie"

    @property
    def significant(self) -> bool:
        """McNemar's exact p is below 1 - confidence, or there is none (scores not 0/1)."""
        return self.p_value is None or self.p_value < 1.0 - self.confidence - EPS

    @property
    def could_miss(self) -> float:
        """The largest regression the gate's tasks could have missed (``missed_regression``);
        on a tie at least the share of tasks that could change unseen (``unseen_share``)."""
        return missed_regression(self.ci_low, self.n, left_out=self.left_out,
                                 confidence=self.confidence, floor=self.verdict == "tie")

    @property
    def powered(self) -> bool:
        """The tasks rule out a regression of ``bound`` or more."""
        return self.could_miss < self.bound - EPS

    def interval(self) -> str:
        """``difference +0.000 [-0.167, +0.167] on 30 tasks``: for reasons."""
        return (f"difference {self.difference:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}] "
                f"on {self.n} tasks")

    def noise(self) -> str:
        """Why a tie is one: the interval holds 0, or McNemar's test does not agree with an
        interval that excludes it (too few tasks changed)."""
        if (self.ci_low > EPS or self.ci_high < -EPS) and self.p_value is not None \
                and not self.significant:
            return (f"McNemar p = {self.p_value:.3g} (>= {1 - self.confidence:.2g}): too few "
                    f"tasks changed to call it a {'gain' if self.ci_low > EPS else 'loss'}")
        return "the interval holds 0"

    @property
    def to_tell(self) -> int:
        """About how many paired tasks would rule out ``bound`` at the spread seen."""
        return tasks_to_tell(max(self.n, 1), self.could_miss, self.bound, self.confidence)

    def cost(self, what: str, most: float) -> tuple[bool | None, str]:
        """Whether the candidate's ``tokens`` or ``latency`` per task is at most ``most``
        times the current's, and the figures; None when they were not recorded."""
        cand, cur = ((self.candidate_tokens, self.current_tokens) if what == "tokens" else
                     (self.candidate_latency_s, self.current_latency_s))
        label = "tokens per task" if what == "tokens" else "seconds per task"
        if cand is None or cur is None:
            return None, f"{label} not recorded"
        fmt = "{:.0f}" if what == "tokens" else "{:.2f}"
        times = f" ({cand / cur:.2f}x)" if cur > 0 else ""
        ok = cand <= cur * most + EPS
        return ok, f"{label} {fmt.format(cand)} vs {fmt.format(cur)}{times}"


def ratio(candidate: float | None, current: float | None) -> float | None:
    """``candidate / current``; None when either is unknown or the current is 0."""
    return None if candidate is None or current is None or current <= 0 else candidate / current


@dataclass(frozen=True)
class Condition:
    """One parsed condition of a rule; ``threshold`` None: the kind's default."""

    kind: str
    threshold: float | None = None

    def __str__(self) -> str:
        op = _OPS[self.kind][-1]
        if op is None or (self.threshold is None and None in _OPS[self.kind]):
            return self.kind
        return f"{self.kind}{op}{self.threshold:g}"

    @property
    def x(self) -> float:
        """The threshold in force: the one given, else the kind's default."""
        return (MARGIN if self.kind == "not_worse" else 0.0) if self.threshold is None \
            else self.threshold

    def check(self, ev: Evidence) -> tuple[bool | None, tuple[str, ...]]:
        """Whether the evidence (candidate minus current) passes, and sentences saying why;
        None when it lacks a figure the condition needs (a saved decision without costs)."""
        if self.kind == "cost_aware":
            return _cost_aware(ev)
        if self.kind in ("tokens", "latency"):
            ok, figures = ev.cost(self.kind, self.x)
            if ev.verdict == "gain":
                return True, (f"{figures}: a clear gain, its cost is not weighed",)
            if ok is None:
                return None, (figures,)
            return ok, (f"{figures}: {'at most' if ok else 'more than'} {self.x:g}x on a tie",)
        return _check_difference(self, ev)


def _check_difference(cond: Condition, ev: Evidence) -> tuple[bool, tuple[str, ...]]:
    x = cond.x
    if cond.kind == "not_worse":
        ok = ev.ci_low > -x + EPS
        return ok, ((f"CI lower end {ev.ci_low:+.3f} {'>' if ok else '<='} -{x:g}: a "
                     f"regression of {x:g} or more is {'' if ok else 'not '}ruled out"),)
    if cond.kind == "mean_not_worse":
        ok = ev.difference >= -EPS
        return ok, (f"difference {ev.difference:+.4f} {'>=' if ok else '<'} 0",)
    if cond.kind == "min_delta":
        ok = ev.difference >= x - EPS
        return ok, (f"difference {ev.difference:+.4f} {'>=' if ok else '<'} {x:g}",)
    if cond.kind == "ci_lower":
        ok = ev.ci_low > x
        return ok, (f"CI lower bound {ev.ci_low:+.4f} {'>' if ok else '<='} {x:g}",)
    if ev.p_value is None:
        raise EvalError(f"rule {cond} needs McNemar's test, which needs 0/1 scores",
                        hint="use ci_lower>0 for continuous scores")
    ok = ev.difference > EPS and ev.p_value < x
    return ok, ((f"difference {ev.difference:+.4f} with McNemar p={ev.p_value:.4g} "
                 f"({'passes' if ok else 'fails'} p<{x:g} and better)"),)


def _cost_aware(ev: Evidence) -> tuple[bool | None, tuple[str, ...]]:
    """The default: a clear gain passes, a clear loss fails, a tie passes only when powered and
    not more expensive (see the module docstring)."""
    tokens_ok, tokens = ev.cost("tokens", MAX_TOKEN_RATIO)
    _, latency = ev.cost("latency", math.inf)
    latency += " (recorded, not decided on)"
    if ev.verdict == "gain":
        return True, (f"a clear gain: {ev.interval()}, the interval above 0",
                      f"{tokens}: not weighed against a clear gain", latency)
    if ev.verdict == "loss":
        return False, (f"a clear loss: {ev.interval()}, the interval below 0", tokens, latency)
    m = ev.could_miss
    either = f", counting the {ev.left_out} left out either way" if ev.left_out else ""
    reasons = [f"a tie: {ev.interval()}, inside the noise ({ev.noise()}{either})"]
    if ev.powered:
        reasons.append(f"the dev set could have missed a regression of {m:.3f} at most "
                       f"(< {ev.bound:g})")
    else:
        reasons.append(f"could not tell: the dev set could have missed a regression of "
                       f"{m:.3f} (>= {ev.bound:g}); about {ev.to_tell} dev tasks would tell "
                       "at the spread seen")
    if tokens_ok is None:
        reasons.append(f"{tokens}: cannot weigh the cost")
    else:
        reasons.append(f"{tokens}: " + ("not more expensive" if tokens_ok else
                                        f"more expensive on a tie (> {MAX_TOKEN_RATIO:g}x)"))
    reasons.append(latency)
    lower = ev.difference < -EPS
    if lower:
        # Fewer tokens can mean the model gave up sooner: cost never buys a lower score.
        reasons.append(f"the candidate scores lower ({ev.difference:+.3f}): on a tie, cost "
                       "decides only when the difference is not negative")
    if not ev.powered or tokens_ok is False or lower:
        return False, tuple(reasons)
    return (None if tokens_ok is None else True), tuple(reasons)


def parse_rule(rule: str) -> tuple[Condition, ...]:
    """Parse ``cond[&cond...]``; see the module docstring for the conditions."""
    conds: list[Condition] = []
    for part in rule.split("&"):
        m = _CONDITION.match(part)
        kind = m.group("kind") if m else None
        if not m or kind is None or (m.group("op") or None) not in _OPS[kind]:
            raise EvalError(f"cannot read gate rule {rule!r} (at {part.strip()!r})",
                            hint="rules: cost_aware, not_worse[=MARGIN], mean_not_worse, "
                                 "min_delta=X, ci_lower>X, mcnemar<X, tokens<=R, latency<=R; "
                                 "combine with &")
        try:
            x = float(m.group("x")) if m.group("x") else None
        except ValueError:
            raise EvalError(f"gate rule {rule!r}: {m.group('x')!r} is not a number",
                            hint="e.g. min_delta=0.02") from None
        if x is not None and kind == "not_worse" and not 0.0 <= x <= 1.0:
            raise EvalError(f"gate rule {rule!r}: not_worse's margin must be in [0, 1], got {x:g}",
                            hint="e.g. not_worse=0.05 (the interval's lower end above -0.05)")
        if x is not None and kind in ("tokens", "latency") and not x > 0:
            raise EvalError(f"gate rule {rule!r}: {kind}<=R needs a ratio above 0",
                            hint=f"e.g. {kind}<=1.1")
        conds.append(Condition(kind, x))
    return tuple(conds)


def apply_rule(rule: str | Sequence[Condition], ev: Evidence
               ) -> tuple[bool | None, tuple[str, ...]]:
    """Every condition's check: accepted when all pass, rejected when one fails, None when
    none fails but one lacks a figure; with every reason."""
    conds = parse_rule(rule) if isinstance(rule, str) else tuple(rule)
    checks = [cond.check(ev) for cond in conds]
    reasons = tuple(why for _, whys in checks for why in whys)
    oks = [ok for ok, _ in checks]
    if any(ok is False for ok in oks):
        return False, reasons
    return (None if any(ok is None for ok in oks) else True), reasons


def decide_again(saved: Mapping[str, Any], rule: str = DEFAULT_RULE, *,
                 power_bound: float = MARGIN) -> tuple[bool | None, tuple[str, ...]]:
    """``rule`` applied to a saved decision's figures: (accepted, reasons); accepted is None
    when the saved decision lacks a figure the rule needs (tokens, in decisions saved before
    the gate weighed cost): rerun its gate. A tie the saved tasks could not tell is rejected
    here; ``run_gate`` would first widen its tasks where a larger slice exists."""
    return apply_rule(rule, Evidence.from_decision(saved, power_bound))


def verdict_text(d: Mapping[str, Any]) -> str:
    """The verdict of a saved decision in words: ``a clear gain``, ``a clear loss``, ``a tie``,
    ``a tie it could not tell``, with ``, more expensive`` or ``, scoring lower`` on a tie
    where that decided it."""
    ev = Evidence.from_decision(d, float(d.get("power_bound") or MARGIN))
    kind = {"gain": "a clear gain", "loss": "a clear loss", "tie": "a tie"}[ev.verdict]
    costlier, _ = ev.cost("tokens", MAX_TOKEN_RATIO)
    if ev.verdict == "tie":
        kind += ("" if ev.powered else " it could not tell") + (
            ", more expensive" if costlier is False else "") + (
            ", scoring lower" if ev.powered and ev.difference < -EPS else "")
    return kind


def summary(d: Mapping[str, Any]) -> str:
    """One line for a table, from a saved decision (``Decision.to_dict()``): the verdict and
    the figures behind it (the token ratio only where the decision recorded tokens; what the
    dev set could have missed only on a tie, where it decides)."""
    ev = Evidence.from_decision(d, float(d.get("power_bound") or MARGIN))
    kind = verdict_text(d)
    parts = [f"{ev.difference:+.2f} [{ev.ci_low:+.2f}, {ev.ci_high:+.2f}] on {ev.n} tasks"]
    r = ratio(ev.candidate_tokens, ev.current_tokens)
    if r is not None:
        parts.append(f"tokens {r:.2f}x")
    if ev.verdict == "tie":
        parts.append(f"could have missed {ev.could_miss:.2f}")
    widened = d.get("widened_from")
    if widened:
        parts.append(f"widened from {widened.get('n_tasks')} tasks")
    if ev.left_out:
        parts.append(f"{ev.left_out} failed, left out")
    return f"{kind}: " + ", ".join(parts)
