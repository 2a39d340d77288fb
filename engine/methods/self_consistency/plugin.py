"""Self-consistency: solve a task N times with sampling and answer with the majority.

The test-time baseline that spends tokens instead of a library (Wang et al., 2023). A runtime
method (``--methods self_consistency --method-config self_consistency.n=5``) that acts through
two hooks: its wrapper around solving a task (``Plugin.wrap`` at ``solve``) runs the task's whole solver (the agent loop or one direct call)
``n`` times with different seeds, and ``adjust_config`` samples those runs at ``temperature``
(only inside the wrapper: a single ``whetstone run`` is left greedy). Each sample votes with
its answer, read the way the scorers read it: the tool calls for a task that gives tools
(BFCL), else the final number when there is one, else the normalised answer span. The
majority wins; a tie goes to the answer reached first. A sample without an answer does not
vote.

The chosen run's trace is returned with ``total_tokens`` set to the tokens of *every* sample,
so tokens/task in the eval and the scoreboard is the method's real cost, and with
``meta["self_consistency"]``: each sample's trace id, vote, tokens and outcome, the vote count
and the total. ``max_total_tokens`` stops drawing samples once they have spent that many
(equal-cost comparisons with a method that costs more per run).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...answer_text import answer_span
from ...evaluation.answers import extract_number, normalise
from ...evaluation.scorers import tool_calls_of
from ...runtime.plugins import Plugin, SolveFn
from ..base import knob

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...evaluation.tasks import TaskRecord
    from ...runtime.state import RunConfig
    from ...types import Trace


@dataclass(frozen=True)
class SelfConsistencyConfig:
    """Knobs of self-consistency."""

    n: int = knob(5, help="Samples per task.", min=1)
    temperature: float = knob(0.7, help="Sampling temperature of every sample.", min=0.0)
    max_total_tokens: int | None = knob(
        None, help="Stop drawing samples once they spent this many tokens (none: all n).",
        min=1)


def _canonical_number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(round(value, 9))


def vote_of(trace: Trace, task: TaskRecord | None = None) -> str | None:
    """What ``trace`` votes for: a canonical text of its answer, None when it gave none."""
    if task is not None and task.tools:
        names = {str((t.get("function") or t).get("name")) for t in task.tools}
        calls = [(n, a) for n, a in tool_calls_of(trace) if n in names]
        return json.dumps(calls, sort_keys=True, ensure_ascii=False, default=str) \
            if calls else None
    if trace.outcome != "answered" or not (trace.answer or "").strip():
        return None
    number = extract_number(trace.answer)
    if number is not None:
        return _canonical_number(number)
    text = normalise(answer_span(trace.answer or ""))
    return text or None


def sample_seed(seed: int, i: int) -> int:
    """Sample ``i``'s seed: the task's own seed first, then distinct ones."""
    return (seed + 104_729 * i) & 0x7FFFFFFF


class SelfConsistency(Plugin):
    """Sample N runs of a task and answer with the majority (tokens of all N counted)."""

    name = "self_consistency"
    config_class = SelfConsistencyConfig
    wraps = ("solve",)  # the task solved n times, then voted

    def __init__(self, config: SelfConsistencyConfig | None = None) -> None:
        self.config = config or SelfConsistencyConfig()
        self._local = threading.local()  # set while this thread draws samples

    def adjust_config(self, task: str, config: RunConfig) -> RunConfig:
        if getattr(self._local, "sampling", False):
            return replace(config, temperature=self.config.temperature)
        return config

    def wrap(self, point: str, solve: SolveFn, backend: Backend | None) -> SolveFn:
        cfg = self.config

        def sampled(task: Any, seed: int) -> Trace:
            samples: list[Trace] = []
            spent = 0
            self._local.sampling = True
            try:
                for i in range(cfg.n):
                    trace = solve(task, sample_seed(seed, i))
                    samples.append(trace)
                    spent += _tokens(trace)
                    if cfg.max_total_tokens is not None and spent >= cfg.max_total_tokens:
                        break
            finally:
                self._local.sampling = False
            return combine(samples, task, requested=cfg.n)

        return sampled


def _tokens(trace: Trace) -> int:
    return trace.total_tokens or sum(s.tokens for s in trace.steps)


def combine(samples: list[Trace], task: Any = None, *, requested: int | None = None) -> Trace:
    """The majority sample's trace, carrying every sample's tokens and the vote."""
    votes = [vote_of(t, task) for t in samples]
    counts = Counter(v for v in votes if v is not None)
    if counts:
        top = max(counts.values())
        winner = next(v for v in votes if v is not None and counts[v] == top)
        chosen = votes.index(winner)
    else:
        winner, chosen = None, 0
    total = sum(_tokens(t) for t in samples)
    meta: Mapping[str, Any] = {
        **samples[chosen].meta,
        "self_consistency": {
            "requested": requested or len(samples), "drawn": len(samples), "chosen": chosen,
            "answer": winner, "votes": dict(counts), "tokens": total,
            "samples": [{"trace_id": t.id, "vote": v, "tokens": _tokens(t),
                         "outcome": t.outcome} for t, v in zip(samples, votes, strict=False)],
        }}
    return samples[chosen].with_(total_tokens=total, meta=meta)


__all__ = ["SelfConsistency", "SelfConsistencyConfig", "combine", "sample_seed", "vote_of"]
