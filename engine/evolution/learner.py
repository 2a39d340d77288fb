"""The learner beside the servers (``whetstone learn``): it closes the loop from live feedback
to a new version, and only a measured gain reaches every user.

A process of its own, never a thread of ``serve``: a learner that crashes or is killed leaves
every replica serving as before, and the library holds only whole writes. One learner per
library acts (it holds the lease, ``library_store/lease.py``); another started beside it
waits, and takes over when the holder's heartbeat stops.

    follow the trace store (read_since: each new line once)
    -> every ``every`` new scored traces (a feedback score or a label): evolve with the
       configured evolver on the train share, gated by the default gate on the held-out share
       (``pipeline.evolve`` with ``commit=False``: an accepted change is kept as a candidate)
    -> the accepted candidate becomes the canary (``LearningState.start_canary``): every
       replica routes ``share`` of conversations to it
    -> each poll: its live feedback against the current version's (``canary.decide``)
    -> promote (the candidate is committed, the canary's figures in the manifest), roll back
       or expire (the canary ends; the current version serves everyone)

Each step is logged in the library (``library log``, ``/metrics``) and told to the trace
sinks that take it (``OtelSink.learning``: a span per step). ``evolve`` is given by the face
(``Engine.evolve`` with the learner's method and options), so this module knows nothing of
models or tools.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...library_store.learning import CanaryRecord, LearningState, Step
from ...library_store.lease import Lease
from ...library_store.snapshot import Snapshot
from ...library_store.store import Library
from ...library_store.traces import TraceQuery
from ..errors import (
    ConfigError,
    LeaseLost,
    LibraryError,
    ValidationError,
    WhetstoneError,
)
from ..library.checks import validate_library
from ..types import Trace
from .canary import CanaryRules, Verdict, canary_of, decide, scored_of
from .pipeline import EvolveResult, training_traces

log = logging.getLogger("whetstone.learn")

EvolveFn = Callable[[Sequence[Trace]], EvolveResult]
# The steps that end a round of learning: scored traces before the last of them are not new.
_ROUND_ENDS = ("canary_started", "promoted", "rolled_back", "expired", "abandoned", "stopped",
               "gate_rejected", "refused", "no_change")


@dataclass(frozen=True)
class LearnerConfig:
    """How often the learner evolves, how much traffic a canary gets, and how it is judged
    (defaults: docs/learning.md)."""

    every: int = 50  # new scored traces between two evolves
    share: float = 0.10  # of conversations the canary serves
    rules: CanaryRules = field(default_factory=CanaryRules)
    poll_s: float = 5.0
    limit: int = 2000  # the newest scored traces an evolve reads

    def __post_init__(self) -> None:
        if self.every < 1 or self.limit < 1:
            raise ConfigError(f"--every and --limit must be 1 or more, got {self.every} and "
                              f"{self.limit}")
        if not 0.0 < self.share <= 0.5:
            raise ConfigError(f"the canary's share must be above 0 and at most 0.5, got "
                              f"{self.share}", hint="e.g. --share 0.1 (10% of conversations)")
        if not self.poll_s > 0:
            raise ConfigError(f"--poll must be positive, got {self.poll_s}")


def is_scored(trace: Trace) -> bool:
    """A trace the learner learns from: it carries a score (feedback) or a label."""
    return trace.score is not None or trace.label is not None


def scored_at(trace: Trace) -> float:
    """When a trace got its score: its feedback's time, else when it ended."""
    at = trace.meta.get("feedback_at")
    return float(at) if isinstance(at, (int, float)) else (trace.ended or trace.started)


def gate_figures(result: EvolveResult) -> dict[str, Any]:
    """The gate's decision in short, for the canary record and the log."""
    d = result.decision.to_dict() if result.decision is not None else {}
    keep = ("accepted", "rule", "verdict", "candidate_score", "current_score", "difference",
            "ci_low", "ci_high", "n_tasks", "task_set", "wins", "losses")
    return {k: d.get(k) for k in keep if k in d}


class Learner:
    """One learner on one library (see the module docstring). ``sinks``: objects told of
    each step (``learning(step_dict)``); ``say``: progress lines for a person."""

    def __init__(self, library: Library, lease: Lease, evolve: EvolveFn,
                 config: LearnerConfig | None = None, *, sinks: Sequence[Any] = (),
                 say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.library = library
        self.lease = lease
        self._evolve = evolve
        self.config = config or LearnerConfig()
        self.sinks = sinks
        self._say = say or (lambda text: log.info("%s", text))
        self.clock = clock
        self.state = LearningState(library)
        self._cursor: dict[str, int] | None = None
        self._new: set[str] = set()
        ends = [s.time for s in self.state.steps() if s.step in _ROUND_ENDS]
        self._since = max(ends, default=0.0)
        self._window: dict[str, Trace] = {}
        self._window_id: str | None = None
        self.lost = threading.Event()
        self.last: str = "started"

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Hold the lease (waiting while another learner holds it) and take a step every
        ``poll_s`` until ``stop`` is set; a lost lease sends it back to waiting."""
        try:
            while not stop.is_set():
                if not self._hold(stop):
                    return
                beat_stop = threading.Event()
                beat = threading.Thread(target=self._heartbeat, args=(beat_stop,),
                                        name="whetstone-lease", daemon=True)
                beat.start()
                try:
                    while not stop.is_set() and not self.lost.is_set():
                        try:
                            self.step()
                        except LeaseLost as exc:
                            self._say(f"{exc.message}: waiting for the lease again")
                            break
                        stop.wait(self.config.poll_s)
                finally:
                    beat_stop.set()
                    beat.join(timeout=5)
        finally:
            self.lease.release()

    def _hold(self, stop: threading.Event) -> bool:
        told = False
        while not stop.is_set():
            if self.lease.acquire():
                self.lost.clear()
                self._say(f"learner {self.lease.holder} holds the lease of {self.library.root}")
                return True
            if not told:
                who = self.lease.current() or {}
                self._say(f"waiting for the lease held by {who.get('holder', 'another learner')}"
                          f" (it expires {self.lease.ttl_s:g} s after its last heartbeat)")
                told = True
            stop.wait(min(self.config.poll_s, self.lease.ttl_s / 3))
        return False

    def _heartbeat(self, beat_stop: threading.Event) -> None:
        while not beat_stop.wait(self.lease.ttl_s / 3):
            try:
                renewed = self.lease.renew()
            except Exception:  # a failed renewal is a lost lease, never a crash
                log.exception("renewing the lease failed")
                renewed = False
            if not renewed:
                self.lost.set()
                return

    # -- one step --------------------------------------------------------------------------

    def step(self) -> str:
        """Follow the store, then: judge the canary when one runs, else evolve when enough
        new scored traces came in. Returns what it did (also ``last``)."""
        record = self.state.canary()
        self._follow(record)
        if record is not None:
            self.last = self._check(record)
        elif len(self._new) >= self.config.every:
            self.last = self._evolve_now()
        else:
            self.last = "waiting"
            self._status("waiting for scored traces")
        return self.last

    def _follow(self, record: CanaryRecord | None) -> None:
        """Read the records written since the last call: count the new scored traces, and keep
        the running canary's traces (latest record of each)."""
        if record is not None and record.id != self._window_id:
            self._window_id, self._window = record.id, {}
            if self._cursor is not None:  # already past some of its traces: read them back
                for t in self.library.traces.query(TraceQuery(since=record.started - 60)):
                    if (canary_of(t) or ("", ""))[0] == record.id:
                        self._window[t.id] = t
        records, self._cursor = self.library.traces.read_since(self._cursor)
        for t in training_traces(records):
            if is_scored(t) and scored_at(t) > self._since:
                self._new.add(t.id)
        if record is not None:
            for t in records:
                if (canary_of(t) or ("", ""))[0] == record.id:
                    self._window[t.id] = t

    def _scored_traces(self) -> list[Trace]:
        """What an evolve learns from: the newest ``limit`` scored traces (each trace's latest
        record), the gate's and previews' runs left out."""
        kept = [t for t in training_traces(self.library.traces.query()) if is_scored(t)]
        return kept[-self.config.limit:]

    def _new_round(self) -> None:
        self._new.clear()
        self._since = self.clock()

    def _evolve_now(self) -> str:
        base = self.library.current_id()
        traces = self._scored_traces()
        self._status(f"evolving on {len(traces)} scored traces", evolving=True)
        self._say(f"evolving on {len(traces)} scored traces ({len(self._new)} new) "
                  f"against {base}")
        self._new_round()
        try:
            result = self._evolve(traces)
        except LeaseLost:
            raise
        except WhetstoneError as exc:
            self._say(f"evolve failed: {exc.message} ({exc.hint})" if exc.hint
                      else f"evolve failed: {exc.message}")
            self._status(f"the last evolve failed: {exc.message}")
            return "evolve_failed"
        if result.decision is None:  # nothing to gate, or kept before the gate decided
            name = "refused" if result.candidate else "no_change"
            self._log(Step(name, self.clock(), base, holder=self.lease.holder,
                           figures={"traces": result.traces, "candidate": result.candidate},
                           note=result.note))
            return name
        if not result.decision.accepted:
            self._log(Step("gate_rejected", self.clock(), base, holder=self.lease.holder,
                           figures={"gate": gate_figures(result), "traces": result.traces,
                                    "candidate": result.candidate},
                           note=result.patch.message))
            return "gate_rejected"
        return self._start(result, base)

    def _start(self, result: EvolveResult, base: str) -> str:
        assert result.candidate is not None
        now = self.clock()
        if self.library.current_id() != base:
            self._log(Step("abandoned", now, base, holder=self.lease.holder,
                           note=f"the library moved to {self.library.current_id()} while "
                                f"candidate {result.candidate} was gated against {base}"))
            return "abandoned"
        snap = self.library.candidates.snapshot(result.candidate)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        record = CanaryRecord(id=f"{base}+canary-{stamp}", base=base, root=snap.root,
                              candidate=result.candidate, share=self.config.share,
                              started=now, method=result.patch.method,
                              message=result.patch.message, holder=self.lease.holder,
                              gate=gate_figures(result))
        step = Step("canary_started", now, base, canary=record.id, holder=self.lease.holder,
                    figures={"share": record.share, "gate": dict(record.gate),
                             "traces": result.traces, "split": dict(result.split),
                             "candidate": result.candidate},
                    note=result.patch.message)
        self.state.start_canary(record, step, fence=self.lease.check)
        self._emit(step)
        diff = record.gate.get("difference")
        self._say(f"canary {record.id} serves {record.share:.0%} of conversations (gate: "
                  f"{record.gate.get('verdict')}"
                  + (f", {diff:+.3f} on {record.gate.get('n_tasks')} held-out tasks)"
                     if isinstance(diff, (int, float)) else ")"))
        return "canary_started"

    # -- the canary ------------------------------------------------------------------------

    def _check(self, record: CanaryRecord) -> str:
        current = self.library.current_id()
        if current != record.base:
            return self._moved(record, current)
        verdict = decide(scored_of(self._window.values(), record.id), self.config.rules)
        self._status(f"canary {record.id}: {verdict.action}", canary=record.id,
                     comparison=verdict.figures())
        if verdict.action == "promote":
            return self._promote(record, verdict)
        if verdict.action in ("rollback", "expire"):
            name = "rolled_back" if verdict.action == "rollback" else "expired"
            self._end(record, Step(name, self.clock(), record.base, canary=record.id,
                                   holder=self.lease.holder, figures=verdict.figures(),
                                   note=verdict.why))
            return name
        return "canary_waiting"

    def _promote(self, record: CanaryRecord, verdict: Verdict) -> str:
        base_check = self.library.validator or validate_library

        def fenced(snap: Snapshot, paths: Sequence[str] | None) -> Sequence[ValidationError]:
            # Under the writers' lock, just before the version becomes current.
            self.lease.check()
            running = self.state.canary()
            if running is None or running.id != record.id:
                raise LibraryError(f"canary {record.id} was ended while it was promoted",
                                   hint="nothing was committed")
            return list(base_check(snap, paths))

        figures = {**verdict.figures(), "canary": record.id, "share": record.share,
                   "started": record.started}
        try:
            version = self.library.candidates.apply(
                record.candidate, validate=fenced, expect_parent=record.base,
                scores={"canary": figures},
                message=f"promoted canary {record.id}: {record.message}")
        except LeaseLost:
            raise
        except WhetstoneError as exc:
            self._end(record, Step("abandoned", self.clock(), record.base, canary=record.id,
                                   holder=self.lease.holder, figures=verdict.figures(),
                                   note=f"could not promote it: {exc.message}"))
            return "abandoned"
        self._end(record, Step("promoted", self.clock(), record.base, canary=record.id,
                               version=version.id, holder=self.lease.holder, figures=figures,
                               note=verdict.why))
        self._say(f"promoted canary {record.id} as {version.id}: {verdict.why}")
        return "promoted"

    def _moved(self, record: CanaryRecord, current: str) -> str:
        """The library is no longer at the canary's base: it was promoted (and the learner
        stopped before logging it), or someone else wrote a version, and the comparison is
        void."""
        for m in self.library.log(limit=50):
            info = m.scores.get("canary")
            if isinstance(info, Mapping) and info.get("canary") == record.id:
                self._end(record, Step("promoted", self.clock(), record.base,
                                       canary=record.id, version=m.id,
                                       holder=self.lease.holder, figures=dict(info),
                                       note="logged after the learner restarted"))
                return "promoted"
        self._end(record, Step("abandoned", self.clock(), record.base, canary=record.id,
                               holder=self.lease.holder,
                               note=f"the library moved from {record.base} to {current}: "
                                    f"the canary was measured against {record.base}"))
        return "abandoned"

    def _end(self, record: CanaryRecord, step: Step) -> None:
        if self.state.end_canary(record.id, step, fence=self.lease.check):
            self._emit(step)
            if step.step != "promoted":
                self._say(f"canary {record.id} {step.step.replace('_', ' ')}: {step.note}")
        self._new_round()

    # -- telling -----------------------------------------------------------------------------

    def _log(self, step: Step) -> None:
        self.state.log_step(step, fence=self.lease.check)
        self._emit(step)
        self._say(f"{step.step.replace('_', ' ')} at {step.base}"
                  + (f": {step.note}" if step.note else ""))

    def _emit(self, step: Step) -> None:
        for sink in self.sinks:
            tell = getattr(sink, "learning", None)
            if tell is None:
                continue
            try:
                tell(step.to_dict())
            except Exception:  # an exporter's bug must never stop the learner
                log.exception("trace sink %s failed on step %s", type(sink).__name__,
                              step.step)

    def _status(self, what: str, **extra: Any) -> None:
        try:
            self.state.write_status({"holder": self.lease.holder, "state": what,
                                     "new_scored": len(self._new),
                                     "every": self.config.every, **extra})
        except OSError as exc:  # a status nobody decides on is not worth stopping for
            log.warning("could not write the learner's status: %s", exc)


__all__ = ["EvolveFn", "Learner", "LearnerConfig", "gate_figures", "is_scored", "scored_at"]
