"""Elastic Horizon as a runtime method: each run's step budget from similar tasks' traces.

``adjust_config`` reads the library's traces written since the last run
(``TraceStore.read_since``), finds the task's **family** and asks that family's
``HorizonController`` (``whetstone.engine.methods.horizon.controller``) for the budget: the 90th percentile of successful runs' lengths, bounded by
``[min_steps, max_steps]``, adapting as traces arrive.

Similar tasks: a trace's family is the task set it was evaluated in (``meta["task_set"]``
without its split and slice: ``gsm8k@test:0:50`` -> ``gsm8k``; runs outside an eval form the
family ""). A new task joins the family whose centroid (the mean embedding of up to 20 of its
tasks, with the packaged sentence embedder of ``whetstone.library_store.embeddings``) is nearest, if the
cosine is at least ``min_similarity``; else it keeps the configured budget. The embedding
separates task kinds well (GSM8K word problems, HaluEval questions, BFCL calls: a task is far
closer to its own family's centroid) while two tasks of one kind are often far apart, so
families, not nearest traces, decide what "similar" means. ``horizon.family=NAME`` names the
family and skips the embedding; ``horizon.splits=train,dev`` learns only from those splits'
eval traces, so an evaluation on a test split never adapts to its own labels.

Each trace records the decision in ``meta["horizon"]``: the budget and why, the estimate behind
it, the configured budget it replaced and, for a run cut off at a budget tighter than the
configured one, the steps and (estimated: this run's tokens per call) tokens saved; a run given
more steps than configured records the extra as negative savings. The paired measurement is an
eval with and without ``--methods horizon``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ....library_store import embeddings
from ...errors import ConfigError
from ...runtime.plugins import MethodEnv, Plugin
from ..base import knob
from .controller import (
    HorizonController,
    HorizonDecision,
    RunRecord,
    record_from_trace,
)

if TYPE_CHECKING:
    from ....library_store.embeddings import Embedder
    from ....library_store.traces import TraceStore
    from ...runtime.state import AgentState, RunConfig

CENTROID_SAMPLES = 20


@dataclass(frozen=True)
class HorizonConfig:
    """Elastic Horizon's knobs (``--method-config horizon.KEY=VALUE``)."""

    min_steps: int = knob(2, min=1, help="the fewest model calls a run is given")
    max_steps: int = knob(16, min=1, help="the most model calls a run is given")
    quantile: float = knob(0.9, min=0.0, help="the percentile of successful lengths to follow")
    gain: float = knob(0.5, min=0.0, help="how far one update moves the budget (1: all the way)")
    window: int = knob(200, min=10, help="newest runs of the family the estimate reads")
    min_successes: int = knob(5, min=1, help="successes needed before the budget moves")
    min_runs: int = knob(20, min=1, help="runs that must reach a length for it to count as "
                                         "observed")
    min_score: float = knob(1.0, help="score at which a scored run counts as a success")
    family: str | None = knob(None, help="learn from this task family only (a task set's name, "
                                         "e.g. gsm8k); default: the nearest by embedding")
    min_similarity: float = knob(0.2, help="cosine to the nearest family's centroid below "
                                           "which a task keeps the configured budget")
    splits: str | None = knob(None, help="learn only from eval traces of these splits, comma-"
                                         "separated (e.g. train,dev: a test run then never "
                                         "learns from test labels); default: every trace")


class ElasticHorizon(Plugin):
    """Elastic Horizon: the step budget follows the p90 of similar tasks' successful runs."""

    name = "horizon"
    config_class = HorizonConfig

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> ElasticHorizon:
        return cls(env.require_library("horizon").traces, config or HorizonConfig())

    def __init__(self, store: TraceStore, config: HorizonConfig | None = None, *,
                 embedder: Embedder | None = None) -> None:
        cfg = config or HorizonConfig()
        if cfg.min_steps > cfg.max_steps:
            raise ConfigError(f"horizon.min_steps ({cfg.min_steps}) is above horizon.max_steps "
                              f"({cfg.max_steps})", hint="make min_steps <= max_steps")
        self.config = cfg
        self.store = store
        self._cursor: dict[str, int] | None = None  # how far the store has been read
        self._embedder = embedder
        self._records: dict[str, RunRecord] = {}
        self._controllers: dict[str, HorizonController] = {}
        self._centroids: dict[str, np.ndarray] = {}
        self._decisions: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._splits = (frozenset(p.strip() for p in cfg.splits.split(",") if p.strip())
                        if cfg.splits else None)

    # -- the budget ------------------------------------------------------------------------

    def adjust_config(self, task: str, config: RunConfig) -> RunConfig:
        with self._lock:
            self._refresh()
            family, similarity = self._family(task)
            if family is None:
                decision = HorizonDecision(config.max_steps, "no similar tasks")
            else:
                decision = self._controller(family, config.max_steps).update(
                    r for r in self._records.values() if r.family == family)
            self._decisions[task] = {"family": family, "similarity": similarity,
                                     "baseline_max_steps": config.max_steps,
                                     **decision.to_dict()}
        return dataclasses.replace(config, max_steps=decision.max_steps)

    def _controller(self, family: str, start: int) -> HorizonController:
        if family not in self._controllers:
            c = self.config
            self._controllers[family] = HorizonController(
                budget=start, min_steps=c.min_steps, max_steps=c.max_steps,
                quantile=c.quantile, gain=c.gain, window=c.window,
                min_successes=c.min_successes, min_runs=c.min_runs)
        return self._controllers[family]

    def _refresh(self) -> None:
        """Take in the traces written since the last run (the latest record of an id wins)."""
        traces, self._cursor = self.store.read_since(self._cursor)
        for trace in traces:
            record = record_from_trace(trace, min_score=self.config.min_score)
            if record is not None and self._splits is not None \
                    and record.split not in self._splits:
                record = None
            if record is not None:
                self._records[record.id] = record
            elif trace.id in self._records and trace.outcome == "running":
                del self._records[trace.id]

    # -- similar tasks ---------------------------------------------------------------------

    def _family(self, task: str) -> tuple[str | None, float | None]:
        """The task's family, and its cosine to that family's centroid (None when named)."""
        if self.config.family is not None:
            return self.config.family, None
        families = {r.family for r in self._records.values()}
        if not families:
            return None, None
        self._add_centroids(families)
        query = self._embed([task])[0]
        best, score = max(((f, float(query @ c)) for f, c in self._centroids.items()),
                          key=lambda fc: fc[1])
        return (best if score >= self.config.min_similarity else None), round(score, 4)

    def _add_centroids(self, families: set[str]) -> None:
        for family in sorted(families - set(self._centroids)):
            tasks = [r.task for r in sorted(self._records.values(), key=lambda r: r.started)
                     if r.family == family][:CENTROID_SAMPLES]
            mean = self._embed(tasks).mean(axis=0)
            self._centroids[family] = mean / (np.linalg.norm(mean) or 1.0)

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self._embedder is None:
            self._embedder = embeddings.query_embedder(threads=1)
        return np.asarray(self._embedder.embed(texts), dtype=np.float32)

    # -- the trace -------------------------------------------------------------------------

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        with self._lock:
            decision = self._decisions.pop(state.get("task", ""), None)
        budgets = (state.get("meta") or {}).get("budgets") or {}
        given = budgets.get("max_steps")
        meta: dict[str, Any] = dict(decision or {"max_steps": given, "reason": "unknown"})
        baseline = meta.get("baseline_max_steps")
        used = state.get("n_calls", 0)
        per_call = state.get("tokens", 0) / used if used else 0.0
        saved = 0
        if baseline is not None and given is not None:
            if state.get("outcome") == "horizon" and given < baseline:
                saved = baseline - used  # the configured horizon would have run on
            elif used > baseline:
                saved = baseline - used  # steps it used beyond the configured horizon
        meta.update(steps_used=used, steps_saved=saved,
                    tokens_saved_est=round(saved * per_call))
        return meta
