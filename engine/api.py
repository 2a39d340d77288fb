"""The Python API: ``Engine`` wires a backend, the library and the runtime together.

    from whetstone.engine.api import Engine
    engine = Engine(model="embedded")
    trace = engine.run("Use the calculator: what is 17 * 23?")

The CLI and the server are thin layers over this class; it is the only place (with them) that
reads configuration and builds objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..library_store import embeddings
from ..library_store.corpus import Corpus
from ..library_store.otel_export import OtelSettings, otel_sinks
from ..library_store.store import Library, Snapshot
from ..library_store.traces import TraceQuery, TraceSink, TraceStore, parse_trace_filter
from ..tools.base import Tool
from ..tools.toolset import ToolSet
from .backends import auto_concurrency
from .backends.base import Backend
from .backends.registry import BackendOptions, get_backend
from .backends.registry import default_registry as default_backends
from .chat.adapter import ChatAdapter, ChatSwitches
from .chat.client import WrappedClient, wrap_client
from .chat.exchange import ChatReply, ChatRunner, chat_request, check_feedback
from .errors import ConfigError, NotFound
from .evaluation.agent_solver import agent_solver
from .evaluation.benchmarks import load_tasks
from .evaluation.direct import direct_solver
from .evaluation.gate_rules import DEFAULT_RULE
from .evaluation.runner import Solver, with_concurrency
from .evaluation.scorers import get_scorer
from .library import opening
from .library.opening import Pin
from .methods.base import make_config
from .methods.registry import (
    MethodEndpoints,
    MethodRegistry,
    MethodResult,
    default_registry,
)
from .paths import whetstone_home
from .runtime import Agent, AgentEvent, Checkpoints, Plugin, RunConfig
from .runtime.plugins import MethodEnv, check_host, wrap_calls
from .types import Message, Trace

if TYPE_CHECKING:
    from typing import Self

    from .evaluation.tasks import TaskSet
    from .evolution.pipeline import EvolveResult
    from .methods.base import Evolver

# A runtime method for ``Engine(methods=...)``: a registered name, a name with its options, or
# a ready ``Plugin``.
MethodSpec = str | tuple[str, Mapping[str, Any]] | Plugin
# How ``Engine.solver`` answers a task: through the agent loop, or one direct call.
SOLVERS = ("agent", "direct")


def check_solver(solver: str) -> str:
    """``solver`` when it names a solver; ``ConfigError`` listing them otherwise."""
    if solver not in SOLVERS:
        raise ConfigError(f"unknown solver {solver!r}",
                          hint=f"solvers: {', '.join(SOLVERS)} (agent: the agent loop; direct: "
                               "one call with the model's chat template and the library's "
                               "guidance)")
    return solver


class Engine:
    """A frozen model plus the library and methods that adapt it.

    ``model`` is a spec (``embedded``, ``openai:qwen@http://...``) or a ready ``Backend``;
    ``library`` is the library directory (default ``$WHETSTONE_HOME/library``, created on first
    use; another path must hold a library, or be an empty folder, unless ``create=True``: a
    mistyped path is an error, never a new empty library); ``version`` pins a library version or ``candidate:NAME`` (default: follow the current
    one); ``skills`` retrieves the library's skills into each run; ``methods`` are the runtime
    methods to use besides: registered names (``"memory"``), ``(name, options)`` pairs, or
    ``Plugin`` objects (see ``whetstone.engine.methods.registry``). ``tools``: built-in tools by
    name (``"search"`` searches the library's evidence corpus ``corpus``), typed functions,
    LangChain tools and ``McpServer``s (``whetstone.tools.toolset``; servers start on first
    use and stop at ``close``). ``solver`` is how ``solver()`` (so ``whetstone eval`` and the evolve gate)
    answers a task: ``agent`` (the loop) or ``direct`` (one call, the library's guidance in
    the system message).
    """

    def __init__(
        self,
        model: str | Backend = "embedded",
        *,
        library: str | Path | None = None,
        version: str | None = None,
        skills: bool = True,
        methods: Sequence[MethodSpec] = (),
        tools: Sequence[Any] = ("calculator", "python"),
        config: RunConfig | None = None,
        backend_options: BackendOptions | None = None,
        checkpointing: bool = True,
        registry: MethodRegistry | None = None,
        corpus: str = "default",
        solver: str = "agent",
        create: bool | None = None,
        trace_sinks: Sequence[TraceSink] = (),
        otel: bool | OtelSettings | None = None,
    ) -> None:
        self.solver_kind = check_solver(solver)
        self.library_path = (Path(library).expanduser() if library is not None
                             else whetstone_home() / "library")
        self.registry = registry or default_registry()
        # Every write through engine.library is checked by the product's rules by default,
        # each method's folder by that method's validator.
        self.library = opening.open_library(self.library_path, self.registry.folders(),
                                            create=create)
        # The version every host reads ("candidate:NAME" scores a kept candidate without
        # applying it; None follows the current version).
        self.pin = Pin.of(self.library, version)
        self.version = self.pin.version
        # ``skills`` is the library's skills method, first, unless ``methods`` names it.
        named = {m.name if isinstance(m, Plugin) else m if isinstance(m, str) else m[0]
                 for m in methods}
        self.methods = self._check_methods(
            [*(["skills"] if skills and "skills" not in named else []), *methods])
        self.config = config or RunConfig()
        self._checkpointing = checkpointing
        self.corpus_name = corpus
        self._corpora: dict[str, Corpus] = {}
        # Typos are found before the model loads (seconds, embedded): the spec's family, the
        # functions, the MCP servers (started, listed, allow-lists checked). The face injects
        # the search tool's retriever: no tool opens one.
        if not isinstance(model, Backend):
            default_backends().entry_for(model)
        self.tool_specs = tuple(tools)  # as given: a Ray worker builds its own from them
        self._toolset = ToolSet(tools, corpus=self.corpus,
                                images_dir=self.library.scratch("tool-images"))
        try:
            if self._toolset.sessions is not None:
                self._toolset.sessions.tools()
            self.backend = model if isinstance(model, Backend) else get_backend(
                model, backend_options or BackendOptions())
        except BaseException:
            self._toolset.close()  # the servers it started stop with the error
            raise
        self._agent: Agent | None = None
        self._resources: list[Plugin] = []  # the direct solvers' methods (their indexes)
        self.traces: TraceStore = self.library.traces
        self._own_sinks = otel_sinks(otel)  # an OTLP exporter when asked (issue 39)
        self.library.trace_sinks.extend([*trace_sinks, *self._own_sinks])

    def _check_methods(self, methods: Sequence[MethodSpec]
                       ) -> tuple[Plugin | tuple[str, Mapping[str, Any]], ...]:
        """Each method as a ``Plugin`` or a known ``(name, options)`` pair; an unknown name
        is a ``ConfigError`` now, before any model loads."""
        out: list[Plugin | tuple[str, Mapping[str, Any]]] = []
        for m in methods:
            if isinstance(m, Plugin):
                out.append(m)
                continue
            name, options = (m, {}) if isinstance(m, str) else m
            cls = self.registry.entry("runtime", name).load()
            make_config(cls.config_class, options, method=name)  # bad options fail here
            out.append((name, dict(options)))
        return tuple(out)

    # -- the agent -------------------------------------------------------------------------

    def _method_env(self, snapshot: Snapshot | None = None, host: str = "agent",
                    offers_tools: bool | None = None) -> MethodEnv:
        """What this engine gives the methods it builds for ``host``: the library and
        ``snapshot`` (default: the pinned one), the model, second models by spec, the corpora,
        the tools its runs get."""
        return MethodEnv(library=self.library, snapshot=snapshot or self.pin.snapshot(),
                         backend=self.backend, corpora=self.corpus,
                         corpus_name=self.corpus_name, tools=self._tool_list, host=host,
                         offers_tools=offers_tools)

    def _host_plugins(self, host: str, snapshot: Snapshot | None = None,
                      methods: Sequence[Plugin | tuple[str, Mapping[str, Any]]] | None = None,
                      offers_tools: bool | None = None) -> list[Plugin]:
        """``methods`` (default: the engine's) built for ``host`` (``HOST_FEATURES``: agent,
        direct, chat), each by its own ``build``; ``ConfigError`` for a method with a hook the
        host cannot run (``check_host``), never a silent drop."""
        chosen = self.methods if methods is None else methods
        self._check_host(host, chosen)
        env = self._method_env(snapshot, host, offers_tools)
        return [m if isinstance(m, Plugin) else self.registry.runtime_method(m[0], m[1], env)
                for m in chosen]

    def _check_host(self, host: str,
                    methods: Sequence[Plugin | tuple[str, Mapping[str, Any]]]) -> None:
        for m in methods:
            name = m.name if isinstance(m, Plugin) else m[0]
            cls = type(m) if isinstance(m, Plugin) else self.registry.entry("runtime",
                                                                            name).load()
            check_host(name, cls, host)

    def corpus(self, name: str | None = None) -> Corpus:
        """The library's evidence corpus ``name`` (default: ``corpus``), opened once."""
        name = name or self.corpus_name
        if name not in self._corpora:
            self._corpora[name] = Corpus.of_library(self.library_path, name,
                                                    embeddings.query_embedder(threads=1))
        return self._corpora[name]

    def _tool_list(self) -> list[Tool]:
        return self._toolset.tools()

    def _build_agent(self, *, snapshot: Snapshot | None = None, store_traces: bool = True,
                     checkpoints: Checkpoints | None = None,
                     methods: Sequence[Plugin | tuple[str, Mapping[str, Any]]] | None = None
                     ) -> Agent:
        """A new agent over this engine's backend (e.g. for a library snapshot under test)
        with ``methods`` (default: the engine's)."""
        return Agent(self.backend, tools=self._tool_list(), config=self.config,
                     plugins=self._host_plugins("agent", snapshot, methods),
                     trace_store=self.traces if store_traces else None,
                     checkpoints=checkpoints)

    @property
    def agent(self) -> Agent:
        """Built on first use (opening the checkpoint database is not free)."""
        if self._agent is None:
            # The library's own (outside every version): a run resumes against its library.
            checkpoints = (Checkpoints(self.library.scratch("checkpoints") / "runs.sqlite")
                           if self._checkpointing else None)
            self._agent = self._build_agent(checkpoints=checkpoints)
        return self._agent

    def solver(self, snapshot: Snapshot | None = None, kind: str | None = None) -> Solver:
        """What ``whetstone eval`` runs per task (traces are stored by the eval): the agent
        loop, or with ``kind="direct"`` (default: the engine's ``solver``) one call with the
        library's guidance (the skills the agent would be shown, the methods' guidance) in the
        system message; a method with a hook that needs the loop (a node before each decision
        or before finishing, a wrapped model call) is a ``ConfigError`` there. Tagged with the
        backend's batch for ``-j auto``."""
        return self._solver(snapshot, kind or self.solver_kind, self.methods)

    def _solver(self, snapshot: Snapshot | None, kind: str,
                methods: Sequence[Plugin | tuple[str, Mapping[str, Any]]]) -> Solver:
        n, ordered = auto_concurrency(self.backend), self.backend.capabilities.ordered
        if check_solver(kind) == "agent":
            agent = self._build_agent(snapshot=snapshot, store_traces=False, methods=methods)
            return with_concurrency(wrap_calls("solve", agent_solver(agent), agent.plugins,
                                               self.backend), n, ordered=ordered)
        snap = snapshot or self.pin.snapshot()
        plugins = self._host_plugins("direct", snap, methods)
        self._resources += plugins  # the indexes their build opened close with the engine
        version = snap.id if snap is not None else None
        return with_concurrency(wrap_calls("solve", direct_solver(
            self.backend, model=self.backend.shown_spec, library_version=version, plugins=plugins,
            guidance_budget_tokens=self.config.guidance_budget_tokens,
            max_tokens=self.config.max_tokens_per_call, temperature=self.config.temperature),
            plugins, self.backend), n, ordered=ordered)

    def run(self, task: str, **kwargs: Any) -> Trace:
        """Run the agent on ``task`` and return its (stored) trace."""
        return self.agent.run(task, **kwargs)

    def stream(self, task: str, **kwargs: Any) -> Iterator[AgentEvent]:
        """Steps as they happen, then the finished trace (see
        ``whetstone.engine.runtime.Agent.stream``)."""
        return self.agent.stream(task, **kwargs)

    def resume_stream(self, trace_id: str) -> Iterator[AgentEvent]:
        """An interrupted run's steps from where it stopped, then its finished trace
        (``whetstone run --resume ID``)."""
        return self.agent.resume_stream(trace_id)

    async def arun(self, task: str, **kwargs: Any) -> Trace:
        return await self.agent.arun(task, **kwargs)

    def evolve(self, method: str | Evolver | None = None, *,
               traces: Sequence[Trace] | None = None, tasks: TaskSet | str | None = None,
               trace_filter: str | Mapping[str, Any] | None = None, limit: int | None = None,
               labels: Mapping[str, str] | None = None, gate_tasks: Any = None,
               analyst: Backend | str | None = None, dry_run: bool = False,
               rule: str = DEFAULT_RULE, seed: int = 0, concurrency: int | None = None,
               candidate_name: str | None = None, max_agent_runs: int | None = None,
               on_progress: Callable[[str, int, int], None] | None = None,
               on_phase: Callable[[str], None] | None = None,
               registry: MethodRegistry | None = None, solver: str | None = None,
               allow_errors: bool = False, scorer: str | None = None, cluster: Any = None,
               commit: bool = True,
               **options: Any) -> EvolveResult:
        """Evolve the library with the evolver registered as ``method`` (or an evolver
        object; default: the registry's first evolver) and land the change through the gate.
        Learns from ``traces``, or from the stored traces ``trace_filter`` selects
        (``"outcome=answered,score<1"`` or ``TraceQuery`` fields; default every finished
        trace but the gate's own runs), the newest ``limit``, only those of ``tasks`` when
        given (a task set or its spec, run first when none of its traces are stored). The gate
        scores on ``gate_tasks`` (default: the traces' own dev-split tasks, held out from the
        evolver; a ``ConfigError`` when there are none: docs/gate.md) by ``rule`` (default
        ``cost_aware``: docs/gate.md). ``options`` configure the method (its config's
        fields, as ``whetstone methods`` lists them).
        ``on_progress(phase, done, total)`` reports collection, the traces read, fitting,
        the analyst calls (``total`` 0: a running count) and the gate; ``on_phase(text)`` says
        what begins (the traces read and held out, the fit, the gate).
        ``concurrency`` (agent runs at once) defaults to what the backend decodes together.
        ``solver`` (default: the engine's) is how the gate and the collection runs answer:
        ``agent`` or ``direct``. A gate run with failed tasks decides nothing (the change is
        kept as a candidate) unless ``allow_errors``. ``scorer`` (a built-in name,
        ``file.py:function`` or ``module:function``) scores every task, the gate's included,
        instead of each task's own. ``cluster`` (``scale.RayExecutor``) runs the collection,
        the check runs, the gate and an evolver's map phase on Ray. ``commit=False`` keeps an
        accepted change as a candidate (a learner's canary) instead of making it current.
        """
        # lazy: the evolve path loads yaml and 9 more of our modules
        from .evolution.pipeline import evolve

        if scorer is not None:
            get_scorer(scorer)  # an unknown name or a broken user scorer fails now

        if concurrency is None:
            concurrency = cluster.workers if cluster else auto_concurrency(self.backend)
        if method is None:
            method = (registry or self.registry).names("evolver")[0]
        if isinstance(method, str):
            evolver = (registry or self.registry).evolver(method, options, shared={
                "seed": seed, "concurrency": concurrency, **(cluster.shared if cluster else {})})
        elif options:
            raise ConfigError(f"options {', '.join(sorted(options))} given with a ready "
                              f"evolver", hint="configure the evolver object itself")
        else:
            evolver = method
        query = parse_trace_filter(trace_filter) if isinstance(trace_filter, str) or \
            trace_filter is None else dict(trace_filter)
        kind = check_solver(solver or self.solver_kind)
        task_set = load_tasks(tasks) if isinstance(tasks, str) else tasks
        analyst_backend, own = self._analyst(analyst)
        try:
            return evolve(
                evolver, self.library, analyst=analyst_backend,
                make_solver=self._solver_factory(getattr(evolver, "runtime_methods", ()), kind,
                                                  cluster),
                traces=traces,
                query=TraceQuery(**query), limit=limit, tasks=task_set, labels=labels,
                gate_tasks=gate_tasks, rule=rule, seed=seed, concurrency=concurrency,
                candidate_name=candidate_name, dry_run=dry_run, model=self.backend.shown_spec,
                max_agent_runs=max_agent_runs, on_progress=on_progress, on_phase=on_phase,
                allow_errors=allow_errors, agent_tools=self._tool_list, scorer=scorer,
                commit=commit)
        finally:
            if own:
                analyst_backend.close()

    def _solver_factory(self, names: Sequence[str], kind: str, cluster: Any = None
                        ) -> Callable[[Snapshot | None], Solver]:
        """``snapshot -> solver`` for the evolve path: this engine's solver of ``kind`` over
        that library version (on ``cluster``'s workers when given), with the registered
        runtime methods ``names`` added where the engine does not use them yet (with their
        defaults). Runs and the gate read the library through the runtime methods the
        evolver's changes need: a method's own folder reaches a prompt only through its
        runtime plugin."""
        have = {m.name if isinstance(m, Plugin) else m[0] for m in self.methods}
        methods = self.methods + self._check_methods([n for n in names if n not in have])
        if cluster is not None:
            on_ray: Callable[[Snapshot | None], Solver] = cluster.make_solver(self, kind, methods)
            return on_ray
        return lambda snapshot: self._solver(snapshot, kind, methods)

    def _analyst(self, analyst: Backend | str | None) -> tuple[Backend, bool]:
        """The analyst backend, and whether this call built it (and so closes it): the
        agent's own model unless another is named (``MethodEnv.model``)."""
        return MethodEnv(backend=self.backend).model(analyst)

    def trace(self, trace_id: str) -> Trace:
        return self.traces.get(trace_id)

    # -- the methods' endpoints ------------------------------------------------------------

    def endpoint(self, name: str, *, record: bool = True, **params: Any) -> MethodResult:
        """Call the endpoint ``name`` of the installed method that answers it
        (``MethodSpec.endpoints``; ``whetstone methods`` lists them) with ``params``, and store
        the call as a trace unless ``record=False``. The method gets this engine's model,
        corpora and second models, and its options from ``methods`` (a call's ``options=``
        win), e.g. ``endpoint("verify", question=q, answer=a)``."""
        result = self.endpoints().call(name, **params)
        if record:
            self.traces.append(result.trace(model=self.backend.shown_spec))
        return result

    def endpoints(self) -> MethodEndpoints:
        """The installed methods' endpoints bound to this engine (what its server calls on a
        reply; calls through it are not recorded)."""
        return MethodEndpoints(self.registry, self._method_env(),
                               {m[0]: m[1] for m in self.methods if not isinstance(m, Plugin)})

    # -- chat mode ------------------------------------------------------------------------
    # One adapted completion per call, no agent loop; the logic lives in engine/chat/
    # (adapter, exchange, client), these methods only wire this engine's objects into it.

    def chat_adapter(self, *, offers_tools: bool = False, snapshot: Snapshot | None = None
                     ) -> ChatAdapter:
        """What chat mode injects (built once): the library's skills, then ``methods``'
        guidance, within ``config.guidance_budget_tokens``. Chat mode has no agent loop, so
        only the methods' ``guidance`` acts (``check_chat_methods``). A chat completion runs
        no tools, so the skills' lines about their learned tools are left out
        (``SkillsPlugin.offers_tools``); ``offers_tools=True`` is the adapter for a host that
        offers them itself (the MCP server, a LangChain call with the learned tools bound).
        ``snapshot``: a new adapter reading only that version (a canary; the caller closes it)."""
        key = "_chat_adapter_tools" if offers_tools else "_chat_adapter"
        adapter: ChatAdapter | None = None if snapshot else self.__dict__.get(key)
        if adapter is None:
            adapter = ChatAdapter(
                self._host_plugins("chat", snapshot, offers_tools=offers_tools), self.backend,
                budget_tokens=self.config.guidance_budget_tokens,
                version_of=(lambda: snapshot.id) if snapshot else self.pin.current,
                version_info=self.pin.gate)
            if snapshot is None:
                self.__dict__[key] = adapter
        return adapter

    def check_chat_methods(self) -> None:
        """``ConfigError`` for a method chat mode cannot run: a chat completion applies only
        the methods' guidance, so a node before each decision or before finishing, a wrapped
        model call or solver, or a per-task budget would be dropped without a word."""
        self._check_host("chat", self.methods)

    def _chat_runner(self) -> ChatRunner:
        return ChatRunner(self.backend, self.chat_adapter(), self.traces)

    def chat(self, messages: str | Sequence[Message | Mapping[str, Any]], *,
             library: bool = True, record: bool = True, **params: Any) -> ChatReply:
        """One chat completion with the library's guidance in the system message; the
        exchange is stored as a trace (``reply.trace_id``) unless ``record=False``.

        ``messages`` is a prompt or OpenAI-style messages; ``params`` are ``max_tokens``,
        ``temperature``, ``top_p``, ``stop``, ``seed``, ``tools``, ``logprobs``, ``timeout``.
        """
        request = chat_request(messages, **params)
        return self._chat_runner().complete(request, ChatSwitches(library=library,
                                                                  record=record))

    async def achat(self, messages: str | Sequence[Message | Mapping[str, Any]], *,
                    library: bool = True, record: bool = True, **params: Any) -> ChatReply:
        """``chat`` for an event loop (retrieval and the trace write run in threads)."""
        request = chat_request(messages, **params)
        return await self._chat_runner().acomplete(request, ChatSwitches(library=library,
                                                                         record=record))

    def wrap(self, client: Any) -> WrappedClient:
        """An ``openai.OpenAI`` / ``AsyncOpenAI`` client whose ``chat.completions.create``
        applies this engine's library in-process and records each exchange; the trace id is
        ``response.whetstone_trace_id`` (see ``whetstone.engine.chat.client``)."""
        return wrap_client(client, self.chat_adapter(), self.traces)

    def feedback(self, trace_id: str, score: float, comment: str | None = None) -> Trace:
        """Label a recorded exchange (or run): ``score`` from 0 (bad) to 1 (good)."""
        score, comment = check_feedback(score, comment)
        trace = self.traces.get(trace_id)
        if trace.id != trace_id:
            raise NotFound(f"no trace with id {trace_id!r}",
                           hint=f"did you mean {trace.id}? feedback needs the exact id")
        return self.traces.set_score(trace.id, score, comment)

    def app(self, **server_options: Any) -> Any:
        """The OpenAI-compatible server app for this engine: library applied, traces recorded
        (``whetstone.engine.server.create_app`` options: ``api_keys``, ``max_queue`` ...)."""
        from .server import create_app  # heavy: FastAPI, pydantic, starlette

        server_options.setdefault("adapter", self.chat_adapter())
        server_options.setdefault("traces", self.traces)
        server_options.setdefault("endpoints", self.endpoints())
        return create_app(self.backend, **server_options)

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()
        self._toolset.close()
        for resource in self._resources:
            resource.close()
        self._resources.clear()
        for key in ("_chat_adapter", "_chat_adapter_tools"):
            adapter = self.__dict__.pop(key, None)
            if adapter is not None:
                adapter.close()
        for corpus in self._corpora.values():
            corpus.close()
        self.backend.close()
        for sink in self._own_sinks:  # after the last trace: flushed, then shut down
            sink.close()
            self.library.trace_sinks.remove(sink)
        self._own_sinks = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_library(path: str | Path | None = None, *, create: bool | None = None,
                 registry: MethodRegistry | None = None, **kwargs: Any) -> Library:
    """A library as ``Engine`` and the command line open it: every installed method's folders
    (``policies/``, ``memory/``, a plugin's own) shown and written, and the product's checks on
    every commit. ``path`` defaults to ``$WHETSTONE_HOME/library``; ``create=True`` makes a
    missing one, ``None`` only where ``may_create_library`` says (``False``: never).
    (``Library.open`` alone knows only ``skills/`` and checks only paths.)"""
    return opening.open_library(path, (registry or default_registry()).folders(), create=create,
                                **kwargs)


def solver_factory(*, methods: Sequence[MethodSpec] = (),
                   tools: Sequence[Any] = ("calculator", "python"),
                   config: RunConfig | None = None, corpus: str = "default",
                   solver: str = "agent"
                   ) -> Callable[[str, Path | None, str | None], Solver]:
    """``(model, library_path, version) -> solver`` for ``whetstone eval``: ``Engine.solver``
    over that library version, the agent loop or (``solver="direct"``) one direct call. One
    backend per model spec, so comparing two library versions loads the model once, and one
    ``ToolSet`` of ``tools`` for all, so MCP servers start once (``factory.close`` stops them)."""
    check_solver(solver)
    backends: dict[str, Backend] = {}
    shared = ToolSet([t for t in tools if t != "search"])
    tools = [shared, *(["search"] if "search" in tools else [])]  # each library's own corpus

    def factory(model: str, library_path: Path | None, version: str | None) -> Solver:
        if model not in backends:
            default_backends().entry_for(model)
            shared.tools()  # MCP servers start, and their allow-lists are checked, first
            backends[model] = get_backend(model)
        engine = Engine(backends[model], library=library_path, version=version,
                        methods=methods, tools=tools, config=config, checkpointing=False,
                        corpus=corpus, solver=solver, otel=False)  # eval's store exports
        return engine.solver()

    factory.close = shared.close  # type: ignore[attr-defined]
    return factory
