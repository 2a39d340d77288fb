"""Dynamo: co-evolve reasoning skills and executable tools from a frozen model's own correct and
incorrect attempts.

Each round, on a small labelled training subset (``train`` tasks of ``--tasks``):

    ATTEMPT    run the agent (round 1 reuses the stored runs of the current library), split
               correct from incorrect attempts;
    MAKE       when the agent fails most tasks (``maker_share``), the tool maker (``maker.py``)
               writes tools that read the task and answer it, admitted only if they answer
               held-in training tasks (labels) well enough: the round's proposal if admitted;
    DIAGNOSE   the analyst reads failures beside similar correct attempts and groups them by
               cause: cognitive (-> a reasoning skill) or computational / perceptual (-> a tool
               plus the skill that says when to call it);
    WRITE      one analyst call per cluster writes the skill, or the tool's code (which must
               pass the AST admission check: the refusal is shown and it may try once more)
               with test arguments for each failing input;
    TEST       each tool runs in the sandbox on the failing inputs; one that crashes or
               returns nothing useful is dropped with the reason; a verified result becomes a
               worked example in its skill;
    CHECK      the agent runs again over a preview of the library with the round's files; the
               round is kept only if training accuracy rose (``min_gain``).

Rounds repeat until ``rounds``, no failures left, no gain, or the budget. The patch holds every
kept skill (+ tool, + ``assets/provenance.json``: the failures and the sandbox test results);
the evolve pipeline gates it. Given-toolset mode (``toolset``): with tools supplied in advance,
the analyst only writes when to call each. Progress is saved after every phase under
``<library>/state/dynamo/``: an interrupted evolve resumes where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...backends.base import Backend
from ...errors import ConfigError
from ...types import Trace
from ..base import EvolveContext, LibraryPatch, knob
from .attempts import AttemptPhase
from .diagnosis import DiagnosePhase
from .parts import (
    Round,
    accuracy,
)
from .sandbox import (
    build_patch,
)
from .writing import WritePhase

if TYPE_CHECKING:
    from ....library_store.store import Snapshot
    from ...evaluation.tasks import TaskRecord


@dataclass(frozen=True)
class DynamoConfig:
    """Dynamo's knobs (``whetstone evolve dynamo --help``)."""

    train: int = knob(20, help="Labelled training tasks (from --tasks) the agent attempts.",
                      min=1)
    rounds: int = knob(2, help="Most rounds of attempt, diagnose, write, test, check.", min=1)
    toolset: str = knob("", help="Given-toolset mode: tools supplied in advance "
                                 "(comma-separated, e.g. python; a pattern such as '*' names the "
                                 "agent's own tools it matches); learn only when to call each.")
    max_failures: int = knob(12, help="Failures diagnosed per round.", min=1)
    batch_size: int = knob(4, help="Failures per diagnosis call.", min=1)
    contrast: int = knob(2, help="Correct attempts shown beside each batch of failures.", min=0)
    max_proposals: int = knob(3, help="Most skills (or skill + tool pairs) per round.", min=1)
    min_gain: float = knob(0.0, help="A round is kept only if training accuracy rises by more.",
                           min=0)
    require_match: bool = knob(False, help="Keep a tool only if a test result holds the "
                                           "expected answer.")
    test_timeout_s: float = knob(10.0, help="Seconds per sandboxed tool test.", min=0.1)
    maker_share: float = knob(0.5, help="The tool maker runs when the agent fails at least this "
                                        "share of the training tasks (above 1: never).", min=0)
    maker_samples: int = knob(3, help="Sampled tool candidates per maker call (plus one "
                                      "greedy).", min=0)
    maker_temperature: float = knob(0.7, help="The tool maker's sampling temperature.", min=0)
    maker_shown: int = knob(3, help="Training tasks (with answers) shown to the tool maker.",
                            min=1)
    maker_check: int = knob(16, help="Held-in training tasks a made tool is checked on.", min=1)
    maker_accuracy: float = knob(0.8, help="A made tool enters the library only if it answers "
                                           "at least this share of them.", min=0)
    maker_probe: int = knob(6, help="Training tasks that guide the maker's search: every "
                                    "candidate runs on all of them, and repairs see the ones it "
                                    "fails (never the tasks that admit a tool).", min=0)
    maker_rounds: int = knob(4, help="Repair rounds of the maker's search while no tool is "
                                     "admitted (0: none).", min=0)
    maker_beam: int = knob(2, help="Best candidates so far repaired in each round.", min=1)
    maker_seconds: float = knob(600.0, help="No new repair round starts after this many "
                                            "seconds of tool making.", min=0)
    workers: int = knob(4, help="Analyst calls in flight at once.", min=1)
    temperature: float = knob(0.3, help="The analyst's sampling temperature.", min=0)
    max_tokens: int = knob(1024, help="Most tokens per analyst reply.", min=1)
    max_analyst_calls: int = knob(60, help="Budget of analyst calls (retries count).", min=1)
    fresh: bool = knob(False, help="Start over instead of resuming a saved run.")
    seed: int = knob(0, cli=False)  # set from the shared --seed


class Dynamo:
    """Co-evolve reasoning skills and sandbox-tested tools from the agent's own attempts.

    The evolver (``whetstone.engine.methods.base.Evolver``): ``fit`` runs the agent on labelled
    training tasks through ``context.run_agent`` and returns a ``LibraryPatch`` of skills and
    skill + tool pairs with their provenance; the caller gates it on held-out tasks.
    """

    name = "dynamo"
    config_class = DynamoConfig

    def __init__(self, config: DynamoConfig, *, sandbox: Any = None) -> None:
        self.config = config
        self.sandbox = sandbox  # whetstone.tools.sandbox.Sandbox; None: this machine's default

    # -- the rounds -------------------------------------------------------------------------

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch:
        """Attempt, diagnose, write, test and check, round by round (see the module
        docstring); resumes a saved run of the same evolve unless ``fresh``."""
        if context is None or context.make_solver is None or context.store is None:
            raise ConfigError("dynamo runs the agent on labelled tasks and needs an evolve "
                              "context with a solver and a trace store",
                              hint="run it with `whetstone evolve dynamo --tasks SET` or "
                                   "Engine.evolve('dynamo', tasks=...)")
        tasks = self._train_tasks(context, traces)
        base_id = library.id if not isinstance(library, Mapping) else "files"
        run = _Run(self, context, analyst, tasks, library, base_id)
        start = time.perf_counter()
        try:
            run.loop(traces)
        finally:
            run.state.seconds += time.perf_counter() - start
            run.save()
        return run.patch()

    def _train_tasks(self, context: EvolveContext, traces: Sequence[Trace]
                     ) -> list[TaskRecord]:
        # lazy: loads filelock and 41 more of our modules
        from ...evaluation.tasks import tasks_from_traces

        source = list(context.tasks) if context.tasks is not None else list(
            tasks_from_traces(traces, name="traces"))
        if not source:
            raise ConfigError("dynamo learns from labelled tasks, and none were given",
                              hint="pass --tasks SET (e.g. gsm8k@train:0:40)")
        return source[:self.config.train]


class _Run(AttemptPhase, DiagnosePhase, WritePhase):
    """One fit in progress: the phases round by round, saving after each of them."""

    def loop(self, traces: Sequence[Trace]) -> None:
        st = self.state
        if not st.attempts:
            st.attempts = self._first_attempts(traces)
            st.scores = [accuracy(st.attempts)]
            self.save()
        while not st.stop:
            rnd = st.rounds[-1] if st.rounds and st.rounds[-1].kept is None else None
            if rnd is None:
                why = self._why_stop()
                if why:
                    st.stop = why
                    break
                rnd = Round(len(st.rounds) + 1)
                st.rounds.append(rnd)
            self._round(rnd)
            self.save()

    def _why_stop(self) -> str:
        st = self.state
        if len(st.rounds) >= self.cfg.rounds:
            return f"ran {len(st.rounds)} round(s)"
        if all(a.correct for a in st.attempts.values()):
            return "no failures left on the training tasks"
        if st.analyst.calls >= self.cfg.max_analyst_calls:
            return "the analyst budget is spent"
        return ""

    def _round(self, rnd: Round) -> None:
        st = self.state
        if rnd.maker is None and rnd.clusters is None and self._wants_maker():
            self.context.on_phase(f"dynamo round {rnd.number}: make a tool")
            rnd.maker = self._ask(self._make())
            self.save()
        if rnd.maker is not None and rnd.maker.kept and rnd.proposals is None:
            # A verified tool answers the training tasks: no diagnosis is needed this round.
            rnd.clusters = [rnd.maker.cluster]
            rnd.proposals = self._finish([rnd.maker], rnd.number)
            self.save()
        if rnd.clusters is None:
            self.context.on_phase(f"dynamo round {rnd.number}: diagnose")
            rnd.clusters = self._ask(self._diagnose())
            self.save()
        if rnd.proposals is None:
            self.context.on_phase(f"dynamo round {rnd.number}: write and test")
            rnd.proposals = self._ask(self._write(rnd))
            self.save()
        kept = [p for p in rnd.proposals if p.kept]
        if not kept:
            rnd.kept, rnd.note = False, "no skill or tool survived"
            st.stop = f"round {rnd.number}: {rnd.note}"
            return
        trial = {**st.changes, **{k: v for p in kept for k, v in p.files.items()}}
        if rnd.trial is None:
            self.context.on_phase(f"dynamo round {rnd.number}: check")
            rnd.trial = self._attempt(list(self.tasks), trial, f"round {rnd.number}")
            self.save()
        self._decide(rnd, trial)

    def _decide(self, rnd: Round, trial: dict[str, str]) -> None:
        st = self.state
        common = [i for i in rnd.trial or {} if i in st.attempts]
        if not common:  # the agent-run budget left nothing to measure: the gate judges it
            rnd.kept, rnd.note = True, "not checked: the agent-run budget is spent"
            st.changes, st.stop = trial, "the agent-run budget is spent"
            return
        before, after = accuracy(st.attempts, common), accuracy(rnd.trial or {}, common)
        rnd.note = f"training accuracy {before:.3f} -> {after:.3f} on {len(common)} tasks"
        if after - before > self.cfg.min_gain:
            rnd.kept = True
            st.changes = trial
            st.attempts = {**st.attempts, **(rnd.trial or {})}
            st.scores.append(accuracy(st.attempts))
        else:
            rnd.kept = False
            st.stop = f"round {rnd.number}: no gain ({rnd.note})"

    def patch(self) -> LibraryPatch:
        return build_patch(self.state, toolset=self.cfg.toolset, tasks=list(self.tasks),
                           checkpoint=str(self.path or ""))
