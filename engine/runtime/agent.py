"""``Agent``: run a task through the graph, stream its steps, record its trace, resume it.

    agent = Agent(get_backend("embedded"), trace_store=store, checkpoints=Checkpoints(path))
    trace = agent.run("Use the calculator: what is 17 * 23?")
    for event in agent.stream(task): ...   # StepEvent as they happen, then RunFinished
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from whetstone.engine.backends.base import Backend
from whetstone.engine.errors import WhetstoneError, error_text
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.runtime.graph import build_graph
from whetstone.engine.runtime.nodes import build_trace
from whetstone.engine.runtime.plugins import ModelCall, Plugin, wrap_calls
from whetstone.engine.runtime.state import AgentContext, AgentState, RunConfig
from whetstone.engine.types import Step, Trace
from whetstone.library_store.trace_build import new_trace_id
from whetstone.library_store.traces import TraceStore
from whetstone.tools.base import Tool, Toolbox
from whetstone.tools.builtin import builtin_tools

log = logging.getLogger("whetstone.runtime")


def clash_text(dropped: Tool, kept: Tool) -> str:
    """The warning for a plugin's tool left out because a given tool has its name."""
    return (f"tool {dropped.name!r} of the library ({dropped.spec.source or 'learned'}) is "
            f"not offered: the run's own tool {kept.name!r} ({kept.spec.source or 'given'}) "
            "has that name and is the one called (rename one of them)")


@dataclass(frozen=True)
class StepEvent:
    """A step, emitted as soon as its node finished."""

    step: Step


@dataclass(frozen=True)
class RunFinished:
    """The run ended (answered, or stopped by a limit or an error); ``trace`` is stored."""

    trace: Trace


AgentEvent = StepEvent | RunFinished


@dataclass(frozen=True)
class TraceRecorder:
    """The one writer of a run's trace: its ``running`` record when it starts, then its final
    record (built once from the graph's final state) or the record of a stop (interrupted, an
    error). The graph's nodes write nothing; each record goes to ``store`` in one ``append``."""

    store: TraceStore | None

    def started(self, state: Mapping[str, Any], ctx: AgentContext) -> None:
        """The ``running`` record: a killed run leaves it behind."""
        if self.store is not None:
            self.store.append(build_trace(state, ctx, outcome="running"))

    def finished(self, values: Mapping[str, Any], ctx: AgentContext) -> Trace:
        """The final trace of a run the finish node settled; stored, and returned as is."""
        trace = build_trace(values, ctx)
        if self.store is not None:
            self.store.append(trace)
        return trace

    def stopped(self, values: Mapping[str, Any], ctx: AgentContext, outcome: str,
                reason: str, *, error: str | None = None) -> None:
        """The record of a run stopped before it finished (its last state, ended now)."""
        if self.store is None or "trace_id" not in values:
            return
        meta = {**dict(values.get("meta") or {}), "reason": reason,
                **({"error": error} if error else {})}
        self.store.append(build_trace(values, ctx, outcome=outcome, meta=meta,
                                      ended=time.time()))


class Agent:
    """A ReAct agent over a frozen backend, with plugins contributing guidance and nodes."""

    def __init__(
        self,
        backend: Backend,
        *,
        tools: Sequence[Tool] | None = None,
        config: RunConfig | None = None,
        plugins: Sequence[Plugin] = (),
        trace_store: TraceStore | None = None,
        checkpoints: Checkpoints | None = None,
        library_version: str | None = None,
    ) -> None:
        self._base_tools = list(builtin_tools() if tools is None else tools)
        self.backend = backend
        self.config = config or RunConfig()
        self.plugins = tuple(plugins)
        self.trace_store = trace_store
        self.recorder = TraceRecorder(trace_store)
        self.checkpoints = checkpoints
        self._warned: set[str] = set()
        toolbox, plugin_tools, clashes = self._toolbox()
        self.context = AgentContext(
            backend=backend, toolbox=toolbox, config=self.config, plugin_tools=plugin_tools,
            plugins=self.plugins, library_version=library_version, tool_clashes=clashes,
        )
        call: ModelCall = wrap_calls("model_call", backend.complete, self.plugins, backend)
        if call is not backend.complete:
            self.context.model_call = call
        saver = checkpoints.saver if checkpoints is not None else None
        self.graph = build_graph(self.plugins).compile(checkpointer=saver)

    def _toolbox(self) -> tuple[Toolbox, frozenset[str], dict[str, str]]:
        """The given tools plus the plugins' (asked again per run: the library's learned
        tools follow its current version), the plugins' tool names, and the clashes.

        The given tools are the user's (functions, LangChain tools, MCP tools, built-ins): a
        plugin's tool of the same name (a learned tool, written by a model) is dropped, so a
        library can never stand in for the user's own ``order_status``; each clash is logged
        once per agent and recorded in the trace (``tool_clashes``)."""
        given = {t.name: t for t in self._base_tools}
        plugin_tools: list[Tool] = []
        clashes: dict[str, str] = {}  # name -> the warning
        for t in (t for p in self.plugins for t in p.tools()):
            if t.name in given:
                clashes[t.name] = clash_text(t, given[t.name])
            else:
                plugin_tools.append(t)
        for text in clashes.values():
            if text not in self._warned:
                self._warned.add(text)
                log.warning("%s", text)
        return (Toolbox.of([*self._base_tools, *plugin_tools]),
                frozenset(t.name for t in plugin_tools), clashes)

    def _run_context(self, task: str, start: float, seed: int | None = None) -> AgentContext:
        """The context of one run: a fresh wall clock, the tools of now, and the config the
        plugins chose for ``task`` (after ``seed`` overrides the configured one)."""
        config = self.config if seed is None else dataclasses.replace(self.config, seed=seed)
        for p in self.plugins:
            config = p.adjust_config(task, config)
        toolbox, plugin_tools, clashes = self._toolbox()
        return dataclasses.replace(self.context, clock_start=start, config=config,
                                   toolbox=toolbox, plugin_tools=plugin_tools,
                                   tool_clashes=clashes)

    # -- running ---------------------------------------------------------------------------

    def stream(
        self,
        task: str,
        *,
        label: str | None = None,
        answer_tools: Sequence[Mapping[str, Any]] = (),
        meta: Mapping[str, Any] | None = None,
        trace_id: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        seed: int | None = None,
    ) -> Iterator[AgentEvent]:
        """Run ``task``; yields each ``StepEvent`` as it happens, then ``RunFinished``.

        ``messages`` replaces the default single user message (e.g. a conversation or an image
        part); ``answer_tools`` are task-given function schemas whose call is the answer;
        ``seed`` overrides the configured seed for this run.
        """
        now = time.time()
        tid = trace_id or new_trace_id(now)  # the id says when the run started
        ctx = self._run_context(task, now, seed)
        state: AgentState = {
            "trace_id": tid, "task": task, "label": label, "system": "",
            "messages": [dict(m) for m in messages] if messages else
            [{"role": "user", "content": task}],
            "steps": [], "pending": [], "answer_tools": [dict(t) for t in answer_tools],
            "answer": None, "outcome": None, "reason": None, "error": None, "n_calls": 0,
            "tokens": 0, "started": now,
            "meta": {**dict(meta or {}), "methods": [p.describe() for p in self.plugins],
                     # The limits this run had after the plugins' adjust_config (what a
                     # horizon controller reads back: a run stopped at its horizon is cut
                     # short, not finished).
                     "budgets": {"max_steps": ctx.config.max_steps,
                                 "max_total_tokens": ctx.config.max_total_tokens}},
        }
        self.recorder.started(state, ctx)
        if self.checkpoints is not None:
            self.checkpoints.prune(now)
            self.checkpoints.started(tid, now)
        yield from self._drive(state, tid, ctx, seen=0)

    def resume_stream(self, trace_id: str) -> Iterator[AgentEvent]:
        """Continue an interrupted or killed run from its last checkpoint (fresh wall clock)."""
        if self.checkpoints is None:
            raise WhetstoneError("this agent has no checkpointer, so runs cannot be resumed",
                                 hint="build the Agent with checkpoints=Checkpoints(path)")
        self.checkpoints.require_resumable(trace_id)
        values = self.graph.get_state(self._config(trace_id, self.config)).values
        ctx = self._run_context(values.get("task", ""), time.time())
        budgets = (values.get("meta") or {}).get("budgets") or {}
        if budgets:  # the limits it started with, not what adjust_config would pick now
            ctx = dataclasses.replace(ctx, config=dataclasses.replace(
                ctx.config, max_steps=budgets.get("max_steps", ctx.config.max_steps),
                max_total_tokens=budgets.get("max_total_tokens", ctx.config.max_total_tokens)))
        yield from self._drive(None, trace_id, ctx, seen=len(values.get("steps") or []),
                               last=values)

    def run(self, task: str, **kwargs: Any) -> Trace:
        """Run to the end and return the stored trace."""
        return _final(self.stream(task, **kwargs))

    def resume(self, trace_id: str) -> Trace:
        return _final(self.resume_stream(trace_id))

    async def arun(self, task: str, **kwargs: Any) -> Trace:
        """``run`` off the event loop (model calls block)."""
        return await asyncio.to_thread(self.run, task, **kwargs)

    # -- internals -------------------------------------------------------------------------

    def _config(self, trace_id: str, config: RunConfig) -> Any:
        # Each think/act round is ~2-3 graph steps; leave room for plugin nodes.
        limit = 6 * (config.max_steps + 2) + 10 * len(self.plugins)
        return {"configurable": {"thread_id": trace_id}, "recursion_limit": limit}

    def _drive(self, state: AgentState | None, tid: str, ctx: AgentContext, *, seen: int,
               last: Mapping[str, Any] | None = None) -> Iterator[AgentEvent]:
        last_values: Mapping[str, Any] = last if last is not None else (state or {})
        try:
            # "sync": each step's checkpoint is on disk before the next starts (kill-safe).
            extra = {"durability": "sync"} if self.checkpoints is not None else {}
            for values in self.graph.stream(state, self._config(tid, ctx.config), context=ctx,
                                            stream_mode="values", **extra):
                last_values = values
                steps = values.get("steps") or []
                for s in steps[seen:]:
                    yield StepEvent(Step.from_dict(s))
                seen = len(steps)
        except KeyboardInterrupt:
            self.recorder.stopped(last_values, ctx, "interrupted", "interrupted by the user")
            raise
        except GeneratorExit:
            # The consumer stopped reading (Ctrl-C landed in its code, or it broke out of the
            # loop) before the run finished: the run is interrupted, and resumable.
            self.recorder.stopped(last_values, ctx, "interrupted", "interrupted by the caller")
            raise
        except WhetstoneError as exc:
            self.recorder.stopped(last_values, ctx, "error", exc.message, error=error_text(exc))
            raise
        if last_values.get("ended") is None:
            raise WhetstoneError(f"run {tid} ended without its finish node",
                                 hint="the graph must end in its finish node; report this "
                                      "with the methods the run had")
        # Written before the checkpoint is marked finished: a kill in between leaves a
        # resumable run that writes this record when resumed.
        trace = self.recorder.finished(last_values, ctx)
        if self.checkpoints is not None:
            self.checkpoints.finished(tid)
        yield RunFinished(trace)

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()


def _final(events: Iterator[AgentEvent]) -> Trace:
    trace: Trace | None = None
    for event in events:
        if isinstance(event, RunFinished):
            trace = event.trace
    assert trace is not None, "the graph ended without a finish step"
    return trace
