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

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whetstone.engine.backends.base import Backend
from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.analyst import ask_parsed, render_trace
from whetstone.engine.methods.base import EvolveContext, LibraryPatch, knob, library_texts
from whetstone.engine.methods.dynamo import PROMPTS
from whetstone.engine.methods.dynamo.maker import ToolMaker, task_tool_files
from whetstone.engine.methods.dynamo.parts import (
    Attempt,
    Cluster,
    DynamoState,
    Proposal,
    Round,
    accuracy,
    dropped,
    expand_toolset,
    merge,
    parse_clusters,
    parse_reasoning,
    parse_tool,
    parse_when,
    words,
)
from whetstone.engine.methods.dynamo.sandbox import (
    allowed_modules,
    build_patch,
    image_params,
    judge_tests,
    run_tests,
    skill_files,
    source_parameters,
)
from whetstone.engine.types import Trace
from whetstone.skills.format import check_skill_files
from whetstone.tools.base import Toolbox
from whetstone.tools.builtin import builtin_tools
from whetstone.tools.images import ImageFiles
from whetstone.tools.learned_run import run_learned
from whetstone.tools.visual import visual_tools

if TYPE_CHECKING:
    from whetstone.engine.evaluation.tasks import TaskRecord
    from whetstone.library_store.store import Snapshot
    from whetstone.tools.base import Tool


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
        from whetstone.engine.evaluation.tasks import tasks_from_traces

        source = list(context.tasks) if context.tasks is not None else list(
            tasks_from_traces(traces, name="traces"))
        if not source:
            raise ConfigError("dynamo learns from labelled tasks, and none were given",
                              hint="pass --tasks SET (e.g. gsm8k@train:0:40)")
        return source[:self.config.train]


class _Run:
    """One fit in progress: the state, the phases, and saving after each of them."""

    def __init__(self, method: Dynamo, context: EvolveContext, analyst: Backend,
                 tasks: list[TaskRecord], library: Snapshot | Mapping[str, str],
                 base_id: str) -> None:
        self.cfg = method.config
        self.method = method
        self.context = context
        self.analyst = analyst
        self.tasks = {t.id: t for t in tasks}
        self.library = library
        self.texts = library_texts(library, "skills/")
        key = hashlib.sha256(json.dumps({
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "fresh"},
            "tasks": list(self.tasks), "base": base_id, "model": context.model,
            "analyst": analyst.spec}, sort_keys=True).encode()).hexdigest()[:20]
        # Libraries from before the state/ layout kept this under work/dynamo/.
        self.saved = (context.library.state("dynamo", legacy=("work/dynamo",))
                      if context.library is not None else None)
        self.path = self.saved.path(key) if self.saved is not None else None
        self.state = self._load(key)
        self.images = self._images()
        self._given: dict[str, Tool] | None = None

    # -- saving -----------------------------------------------------------------------------

    def _load(self, key: str) -> DynamoState:
        data = self.saved.load(key) if self.saved is not None and not self.cfg.fresh else None
        if data is not None:
            try:
                state = DynamoState.from_dict(data)
                if state.key == key:
                    return state
            except (KeyError, TypeError, ValueError):
                pass  # a damaged save: start over rather than fail
        return DynamoState(key)

    def save(self) -> None:
        if self.saved is not None:
            self.saved.save(self.state.key, self.state.to_dict())

    # -- the loop ---------------------------------------------------------------------------

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

    def _ask(self, coro: Any) -> Any:
        return asyncio.run(coro)

    # -- attempts ---------------------------------------------------------------------------

    def _attempt_of(self, task: TaskRecord, trace: Trace | None, score: float) -> Attempt:
        expected = task.expected if isinstance(task.expected, str) else json.dumps(
            task.expected, ensure_ascii=False)
        text = render_trace(trace, max_chars=2500) if trace is not None else \
            f"Task: {task.prompt}\n(the run was not stored)"
        return Attempt(task.id, trace.id if trace else "", score, task.prompt, expected,
                       trace.answer if trace else None, text, task.image)

    def _first_attempts(self, traces: Sequence[Trace]) -> dict[str, Attempt]:
        """Round 1's attempts: the given runs of these tasks (scored by the task's scorer when
        they carry no score), the missing ones run now over the current library."""
        # lazy: loads filelock and 41 more of our modules
        from whetstone.engine.evaluation.scorers import get_scorer

        out: dict[str, Attempt] = {}
        for t in traces:
            task = self.tasks.get(str(t.meta.get("task_id")))
            # A failed run (outcome error) is no attempt: the task is run again below.
            if task is None or t.outcome in ("running", "error") or "evolve_preview" in t.meta:
                continue
            score = t.score if t.score is not None else get_scorer(task.scorer)(t, task)
            out[task.id] = self._attempt_of(task, t, score)
        missing = [i for i in self.tasks if i not in out]
        if missing:
            out.update(self._attempt(missing, None, "attempts"))
        return {i: out[i] for i in self.tasks if i in out}

    def _attempt(self, ids: list[str], changes: Mapping[str, str] | None, phase: str
                 ) -> dict[str, Attempt]:
        """Run the agent on ``ids`` over the current library plus ``changes`` (None: the
        current library); an interrupted run keeps what finished and resumes from it."""
        # lazy: loads filelock and 6 more of our modules
        from whetstone.library_store.traces import TraceQuery

        st, ctx = self.state, self.context
        done = {i: a for i, a in st.pending.items() if i in ids}
        todo = [self.tasks[i] for i in ids if i not in done]
        snapshot = None
        if changes is not None:
            assert ctx.library is not None
            snapshot = ctx.library.preview(changes, label=f"dynamo-{phase.replace(' ', '-')}",
                                           method="dynamo")
        result = ctx.run_agent(todo, snapshot=snapshot, phase=phase) if todo else None
        if result is not None:
            st.agent_runs += result.n
            assert ctx.store is not None
            traces = {t.id: t for t in ctx.store.query(TraceQuery(ids=frozenset(
                r.trace_id for r in result.results if r.trace_id)))}
            for r in result.results:
                # A failed task is unmeasured: no attempt, never a wrong answer to the
                # analyst or the training accuracy (rounds compare the tasks both measured).
                if r.scored:
                    done[r.task_id] = self._attempt_of(self.tasks[r.task_id],
                                                       traces.get(r.trace_id or ""), r.score)
            if result.partial:
                st.pending = done
                self.save()
                raise KeyboardInterrupt(f"dynamo {phase}: interrupted; run the same evolve "
                                        "again to resume")
        st.pending = {}
        return {i: done[i] for i in ids if i in done}

    # -- the analyst ------------------------------------------------------------------------

    async def _call(self, messages: list[dict[str, str]], parse: Any, seed: int) -> Any:
        reply = await ask_parsed(self.analyst, messages, parse,
                                 temperature=self.cfg.temperature,
                                 max_tokens=self.cfg.max_tokens, seed=seed)
        self.state.analyst.add(reply.stats)
        return reply

    def _messages(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": PROMPTS.load("system")},
                {"role": "user", "content": user}]

    def _block(self, label: str, a: Attempt, *, failure: bool) -> str:
        image = PROMPTS.render("parts.yaml#image", path=a.image) if a.image else ""
        if failure:
            return PROMPTS.render("parts.yaml#failure", label=label, task_id=a.task_id,
                                  image=image, trace=a.text, expected=a.expected)
        return PROMPTS.render("parts.yaml#success", label=label, task_id=a.task_id,
                              image=image, trace=a.text)

    def _failures(self, ids: Sequence[str]) -> tuple[str, dict[str, str]]:
        labels = {f"F{i}": t for i, t in enumerate(ids, 1)}
        text = "\n\n".join(self._block(label, self.state.attempts[t], failure=True)
                           for label, t in labels.items())
        return text, labels

    def _contrast(self, failures: Sequence[str]) -> str:
        seen = set().union(*(words(self.state.attempts[f].question) for f in failures))
        correct = [a for a in self.state.attempts.values() if a.correct]
        correct.sort(key=lambda a: -len(words(a.question) & seen))
        blocks = [self._block(f"S{i}", a, failure=False)
                  for i, a in enumerate(correct[:self.cfg.contrast], 1)]
        return "\n\n".join(blocks) or PROMPTS.load("parts.yaml#no_successes")

    def _tool_names(self) -> str:
        names: dict[str, None] = {}
        for a in self.state.attempts.values():
            for line in a.text.splitlines():
                if line.startswith("Model calls "):
                    names.setdefault(line[len("Model calls "):].split("(")[0], None)
        given = list(self._given_tools()) if self.cfg.toolset else []
        return ", ".join(dict.fromkeys([*given, *names])) or "(none used)"

    async def _diagnose(self) -> list[Cluster]:
        failing = [i for i, a in self.state.attempts.items() if not a.correct]
        failing = failing[:self.cfg.max_failures]
        batches = [failing[i:i + self.cfg.batch_size]
                   for i in range(0, len(failing), self.cfg.batch_size)]
        sem = asyncio.Semaphore(self.cfg.workers)

        async def one(n: int, batch: list[str]) -> list[Cluster]:
            text, labels = self._failures(batch)
            user = PROMPTS.render("diagnose", failures=text,
                                  successes=self._contrast(batch), tools=self._tool_names())
            async with sem:
                reply = await self._call(self._messages(user), lambda raw: parse_clusters(
                    raw, labels, self.state.repairs), self.cfg.seed + n)
            self.context.on_progress("diagnose", n + 1, len(batches))
            return reply.value or []

        found = await asyncio.gather(*(one(n, b) for n, b in enumerate(batches)))
        return merge([c for cs in found for c in cs])[:self.cfg.max_proposals]

    async def _write(self, rnd: Round) -> list[Proposal]:
        sem = asyncio.Semaphore(self.cfg.workers)
        clusters = rnd.clusters or []

        async def one(n: int, cluster: Cluster) -> Proposal:
            async with sem:
                p = await self._propose(cluster, self.cfg.seed + 100 * rnd.number + n)
            self.context.on_progress("write", n + 1, len(clusters))
            return p

        proposals = list(await asyncio.gather(*(one(n, c) for n, c in enumerate(clusters))))
        return self._finish(proposals, rnd.number)

    async def _propose(self, cluster: Cluster, seed: int) -> Proposal:
        text, labels = self._failures(cluster.failures)
        if self.cfg.toolset:
            return await self._propose_when(cluster, text, labels, seed)
        if cluster.kind == "cognitive":
            user = PROMPTS.render("skill", failures=text, diagnosis=cluster.diagnosis,
                                  fix=cluster.fix, existing=", ".join(self._skill_names())
                                 or "(none)")
            reply = await self._call(self._messages(user), lambda raw: parse_reasoning(
                raw, cluster, self.state.repairs), seed)
            return reply.value or dropped("reasoning", cluster, reply)
        user = PROMPTS.render("tool", failures=text, diagnosis=cluster.diagnosis,
                              fix=cluster.fix, modules=allowed_modules())
        taken = self._tool_taken()
        reply = await self._call(self._messages(user), lambda raw: parse_tool(
            raw, cluster, labels, taken, self.state.repairs), seed)
        if reply.value is None:
            return dropped("tool", cluster, reply)
        proposal, definition = reply.value
        self._test(proposal, lambda args: self._run_learned(definition, args),
                   definition.image_params)
        return proposal

    async def _propose_when(self, cluster: Cluster, text: str, labels: dict[str, str],
                            seed: int) -> Proposal:
        given = self._given_tools()
        lines = "\n".join(PROMPTS.render(
            "parts.yaml#tool_line", name=t.name, description=t.spec.description,
            parameters=json.dumps(t.spec.parameters.get("properties", {}))) for t in
            given.values())
        user = PROMPTS.render("when", failures=text, diagnosis=cluster.diagnosis,
                              fix=cluster.fix, tools=lines)
        reply = await self._call(self._messages(user), lambda raw: parse_when(
            raw, cluster, labels, list(given), self.state.repairs), seed)
        if reply.value is None:
            p = dropped("when", cluster, reply)
            p.reason = p.reason if reply.stats.dropped else "no given tool fits"
            return p
        proposal = reply.value
        tool = given[proposal.tool]

        box = Toolbox.of([tool])
        self._test(proposal, lambda args: box.call(tool.name, args), image_params(tool))
        return proposal

    def _wants_maker(self) -> bool:
        st = self.state
        failing = sum(not a.correct for a in st.attempts.values())
        return (not self.cfg.toolset and not any(r.maker for r in st.rounds)
                and failing >= self.cfg.maker_share * max(1, len(st.attempts)) and failing > 0)

    async def _make(self) -> Proposal:
        """The tool maker (``whetstone.engine.methods.dynamo.maker``) on the failed training tasks."""
        st = self.state
        maker = ToolMaker(self.cfg, self.analyst, st.analyst, st.repairs,
                          call_tool=self._run_learned, taken=self._tool_taken())
        return await maker.make_for(self.tasks, st.attempts)

    # -- tools ------------------------------------------------------------------------------

    def _images(self) -> ImageFiles:
        roots = {str(Path(t.image).resolve().parent) for t in self.tasks.values() if t.image}
        out = (self.saved.folder / "tool-images" if self.saved is not None
               else Path(ImageFiles.temporary().out_dir))
        return ImageFiles(out, tuple(Path(r) for r in sorted(roots)))

    def _run_learned(self, definition: Any, args: dict[str, Any]) -> Any:
        return run_learned(definition, args, images=self.images, sandbox=self.method.sandbox,
                           timeout_s=self.cfg.test_timeout_s)

    def _test(self, proposal: Proposal, call: Any, image_params: Sequence[str]) -> None:
        # lazy: loads filelock and 41 more of our modules
        from whetstone.engine.evaluation.scorers import get_scorer

        def score(output: str, task_id: str) -> float:
            task = self.tasks[task_id]
            try:
                return get_scorer(task.scorer)(output, task)
            except Exception:  # noqa: BLE001 -- a scorer that cannot read a tool's output
                return 0.0

        run_tests(proposal.tests, call, self.state.attempts, image_params, score)
        proposal.reason = judge_tests(proposal.tests, require_match=self.cfg.require_match)
        proposal.kept = not proposal.reason

    def _given_tools(self) -> dict[str, Tool]:
        """The ``toolset`` tools by name: built-in, visual, learned, or the agent's own."""
        if self._given is None:
            # lazy: loads filelock and 38 more of our modules
            from whetstone.engine.runtime.library_tools import library_tools

            known: dict[str, Tool] = {t.name: t for t in builtin_tools()}
            known.update({t.name: t for t in visual_tools(self.images)})
            if not isinstance(self.library, Mapping):
                known.update({t.name: t for t in library_tools(
                    self.library, images=self.images, sandbox=self.method.sandbox)[0]})
            self._given = expand_toolset(self.cfg.toolset, known, self.context.agent_tools)
        return self._given

    # -- names and files --------------------------------------------------------------------

    def _skill_names(self) -> list[str]:
        names = {p.split("/")[1] for p in self.texts if p.count("/") >= 2}
        return sorted(names | {p.split("/")[1] for p in self.state.changes})

    def _tool_taken(self) -> set[str]:
        # lazy: loads filelock and 38 more of our modules
        from whetstone.engine.runtime.library_tools import reserved_tool_names, script_tool_name

        paths = [*self.texts, *self.state.changes]
        return set(reserved_tool_names()) | {f[1] for p in paths
                                             if (f := script_tool_name(p)) is not None}

    def _finish(self, proposals: list[Proposal], round_no: int) -> list[Proposal]:
        """Unique names, files for the kept ones, each checked against the skill rules."""
        taken = set(self._skill_names())
        for i, p in enumerate(proposals):
            if p.kind == "reasoning" and not p.reason:
                p.kept = True
            if not p.kept:
                continue
            base = p.skill or f"dynamo-lesson-{round_no}-{i + 1}"
            p.skill = next(n for n in [base, *(f"{base}-{k}" for k in range(2, 99))]
                           if n not in taken)
            taken.add(p.skill)
            params, source = None, None  # a given tool's schema, and where it comes from
            if p.kind == "task_tool":
                p.files = task_tool_files(p, round_no=round_no, questions={
                    i: t.prompt for i, t in self.tasks.items()})
            elif p.tool:
                given = self._given_tools().get(p.tool) if p.kind == "when" else None
                params = given.spec.parameters if given else source_parameters(p)
                source = given.spec.source if given else None
            if p.kind != "task_tool":
                p.files = skill_files(p, round_no=round_no, attempts=self.state.attempts,
                                      parameters=params, tool_source=source)
            prefix = f"skills/{p.skill}/"
            problems = check_skill_files(p.skill, {k[len(prefix):]: v.encode() for k, v in
                                                   p.files.items()}, base=prefix.rstrip("/"))[1]
            if problems:
                p.kept, p.reason, p.files = False, f"breaks the skill rules: {problems[0]}", {}
        return proposals

    # -- the patch --------------------------------------------------------------------------

    def patch(self) -> LibraryPatch:
        return build_patch(self.state, toolset=self.cfg.toolset, tasks=list(self.tasks),
                           checkpoint=str(self.path or ""))
