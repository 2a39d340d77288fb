"""Runtime methods: how a method acts during a run without the runtime knowing it.

A ``Plugin`` is a runtime method. Its hooks are few and generic (``Plugin`` lists them with the
reason each exists): guidance for the system message, tools, nodes at the graph's named
``STAGES``, wrappers at named ``WRAP_POINTS``, a per-task change of the run's budgets, and facts
for the trace. Every hook has a default, so a method implements only what it needs, and the
runtime names no method: a node at a stage or a wrapper at a point needs no change here.

A method registered by name (``whetstone run --methods NAME``, ``Engine(methods=["NAME"])``;
see ``whetstone.engine.methods.registry``) declares ``config_class``, a frozen dataclass of its knobs, and
is built with ``build(config, env)``. Each run's trace lists the methods and their config in
``meta["methods"]``. See docs/architecture.md, "Adding a runtime method".
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from whetstone.engine.backends.base import Backend
from whetstone.engine.backends.registry import get_backend
from whetstone.engine.errors import ConfigError

if TYPE_CHECKING:
    from whetstone.engine.runtime.state import AgentContext, AgentState, RunConfig
    from whetstone.engine.types import Completion, Request, Trace
    from whetstone.library_store.store import Library, Snapshot
    from whetstone.tools.base import Tool

# A graph node: (state, context) -> state update. The runtime adapts it to LangGraph.
NodeFn = Callable[["AgentState", "AgentContext"], Mapping[str, Any]]
# One model call of a run, as the ``think`` node makes it.
ModelCall = Callable[["Request"], "Completion"]
# Solving one whole task: ``(task record, seed) -> Trace`` (``whetstone.engine.evaluation.runner``).
SolveFn = Callable[[Any, int], "Trace"]


@dataclass(frozen=True)
class Guidance:
    """Text for the system message, with what it showed (recorded in the trace's meta).

    ``text`` that starts with a markdown heading is used as is; otherwise it goes under
    ``# <title>``. ``library_version``: the library version the text came from. ``turns``:
    demonstrations as earlier exchanges of the conversation (``{"role", "content"}`` dicts,
    user then assistant), placed after the system message and before the task, the way
    DSPy's ChatAdapter shows few-shot demos.
    """

    title: str
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    library_version: str | None = None
    turns: tuple[Mapping[str, str], ...] = ()


class Collected(NamedTuple):
    """Every plugin's guidance for one task: system text, what each showed, demo turns."""

    text: str
    meta: dict[str, Any]
    turns: list[dict[str, str]]


# An evidence corpus by name (None: the engine's default) -> an object with ``search(query, k)``.
CorpusFactory = Callable[[str | None], Any]


@dataclass(frozen=True)
class MethodEnv:
    """What a method built by the faces may use (a runtime method's ``build``, the function a
    ``MethodSpec`` names): the library, the version the run reads (``snapshot``; None: follow
    the current one), the agent's model, a second model by spec (``model``) and the library's
    evidence corpora (``corpora``, by name; ``corpus_name`` is the default one) and the tools
    the host gives its runs (``tools()``: the user's functions and MCP servers' tools, with
    their allow-lists; a method may compose calls of them). Each is None where the host has
    none to give."""

    library: Library | None = None
    snapshot: Snapshot | None = None
    backend: Backend | None = None
    corpora: CorpusFactory | None = None
    corpus_name: str | None = None
    tools: Callable[[], Sequence[Tool]] | None = None

    def require_library(self, method: str) -> Library:
        """The library, for a method that cannot run without one; ``ConfigError`` naming
        ``method`` when there is none."""
        if self.library is None:
            raise ConfigError(f"the {method} method needs a library",
                              hint="build it through Engine, which opens the library")
        return self.library

    def require_backend(self, method: str) -> Backend:
        """The agent's model; ``ConfigError`` naming ``method`` when there is none."""
        if self.backend is None:
            raise ConfigError(f"the {method} method needs the agent's model",
                              hint="build it through Engine, which passes the backend")
        return self.backend

    def model(self, spec: Backend | str | None = None) -> tuple[Backend, bool]:
        """A second model (an analyst, a rubric writer) and whether the caller closes it:
        ``spec`` as given when it is a backend, the agent's own model when it is empty or the
        agent's spec, else a new backend built from it (the caller's to close)."""
        if isinstance(spec, Backend):
            return spec, False
        if self.backend is not None and (not spec or spec == self.backend.spec):
            return self.backend, False
        if not spec:
            raise ConfigError("no model was named and there is no agent's model to use",
                              hint="name a model spec, or build the method through Engine")
        return get_backend(spec), True

    def corpus(self, name: str | None = None) -> Any:
        """The library's evidence corpus ``name`` (default: ``corpus_name``)."""
        if self.corpora is None:
            raise ConfigError("no evidence corpus is open here",
                              hint="build the method through Engine, which opens the "
                                   "library's corpora, or give the evidence by hand")
        return self.corpora(name or self.corpus_name)


def config_dict(config: Any) -> dict[str, Any]:
    """A method's config as JSON-safe data for the trace (a dataclass, a mapping or None)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, Mapping) else {"value": repr(config)}


# Where a method's nodes run in the agent graph (``Plugin.nodes``). The graph is built from
# this table: a method adds a node at a stage without the runtime knowing the method.
STAGES: Mapping[str, str] = {
    "decide": "before every model decision (e.g. a step rubric the decision is held to)",
    "answer": "on the answer, before the run finishes (e.g. a claim-by-claim verification)",
}
# The calls a method may wrap (``Plugin.wrap``), and what each wraps.
WRAP_POINTS: Mapping[str, str] = {
    "model_call": "one model call of the think node: (request) -> completion",
    "solve": "solving one whole task in an evaluation: (task record, seed) -> trace",
}


@dataclass(frozen=True)
class Node:
    """A graph node a method adds at one of the ``STAGES``; the graph names it
    ``<method>_<function name>`` (policy notes are keyed by node names, so keep it stable)."""

    stage: str
    fn: NodeFn


@dataclass(frozen=True)
class ToolOffer:
    """The plugin's tools a run offers (``names``), and those the run's first decision must
    call one of (``required``: OpenAI's ``tool_choice`` "required", honoured by backends that
    can prefill a reply; elsewhere the tools are just offered)."""

    names: tuple[str, ...] = ()
    required: tuple[str, ...] = ()


def features(plugin_class: type[Plugin]) -> list[str]:
    """What ``plugin_class`` does to a run beyond guidance (which every host shows):
    ``node:<stage>`` and ``wrap:<point>`` as it declares them, ``adjust_config`` and ``tools``
    where it overrides them. A host runs a method only if it runs all of these."""
    out = [f"node:{s}" for s in plugin_class.stages]
    out += [f"wrap:{p}" for p in plugin_class.wraps]
    for hook in ("adjust_config", "tools"):
        if getattr(plugin_class, hook) is not getattr(Plugin, hook):
            out.append(hook)
    return out


# What each host runs of a method. The agent graph: everything. The direct solver (one call
# per task, ``whetstone.engine.evaluation.direct``): the guidance, the call's sampling and wrappers
# around the whole solve. Chat mode (one completion per request, the caller's own loop): the
# guidance alone.
HOST_FEATURES: Mapping[str, frozenset[str]] = {
    "agent": frozenset({*(f"node:{s}" for s in STAGES), *(f"wrap:{p}" for p in WRAP_POINTS),
                        "adjust_config", "tools"}),
    "direct": frozenset({"adjust_config", "wrap:solve"}),
    "chat": frozenset(),
}
_HOST_WORDS = {"agent": "the agent loop", "direct": "the direct solver (one call per task)",
               "chat": "chat mode (one completion per request)"}
_FEATURE_WORDS = {"adjust_config": "per-task budgets (adjust_config)", "tools": "tools",
                  **{f"node:{s}": f"a node {w.split(' (')[0]}" for s, w in STAGES.items()},
                  **{f"wrap:{p}": f"a wrapper around {w.split(':')[0]}"
                     for p, w in WRAP_POINTS.items()}}


def unhonoured_features(plugin_class: type[Plugin], host: str) -> list[str]:
    """The features of ``plugin_class`` that ``host`` (a key of ``HOST_FEATURES``) does not
    run, leaving out those it declares it does without (``Plugin.optional``)."""
    if host not in HOST_FEATURES:
        raise ValueError(f"unknown host {host!r}; hosts: {', '.join(HOST_FEATURES)}")
    return [f for f in features(plugin_class)
            if f not in HOST_FEATURES[host] and f not in plugin_class.optional]


def check_host(name: str, plugin_class: type[Plugin], host: str) -> None:
    """``ConfigError`` when ``host`` cannot run all that the method ``name`` (its class
    ``plugin_class``) does, naming what and where it does run: a host never drops part of a
    method without a word."""
    missing = unhonoured_features(plugin_class, host)
    if not missing:
        return
    where = " or ".join(_HOST_WORDS[h] for h in HOST_FEATURES
                        if h != host and not unhonoured_features(plugin_class, h))
    what = ", ".join(_FEATURE_WORDS.get(m, m) for m in missing)
    raise ConfigError(
        f"method {name!r} cannot run in {_HOST_WORDS[host]}: {what} "
        f"act{'s' if len(missing) == 1 else ''} only in {where or 'a host that runs them'}",
        hint=f"run {name} in the agent (Engine(methods=[{name!r}]).run(task), "
             "`whetstone eval --solver agent`) or leave it out; chat mode and the direct "
             "solver apply the methods that only add guidance to the system message")


# Hooks of earlier releases, and what replaced them.
_RETIRED = {
    "before_think": "return [Node('decide', fn)] from nodes() and declare stages = ('decide',)",
    "verify": "return [Node('answer', fn)] from nodes() and declare stages = ('answer',)",
    "wrap_model": "implement wrap(point, call, backend) and declare wraps = ('model_call',)",
    "wrap_solver": "implement wrap(point, solve, backend) and declare wraps = ('solve',)",
    "run_tools": "return ToolOffer(names) from offer(shown)",
    "required_tools": "return ToolOffer(names, required) from offer(shown)",
}


class Plugin:
    """Base for runtime methods. ``name`` keys its meta in the trace.

    A method implements only the hooks it needs; each is generic, so a new method adds
    nothing to the runtime:

    - ``guidance``: text (and demonstration turns) for the system message, within a token
      budget: how skills, policy notes and worked examples reach the model;
    - ``tools`` and ``offer``: tools the method brings, and which of them a run offers (or
      requires) for what its guidance showed;
    - ``nodes``: graph nodes at the ``STAGES`` the class declares in ``stages`` (a rubric
      before each decision, a check of the answer);
    - ``wrap``: a wrapper around the call points the class declares in ``wraps`` (a model
      call refined in its hidden states, a task solved several times and voted);
    - ``adjust_config``: the budgets and sampling of one run of a task;
    - ``finish_meta`` and ``describe``: what the trace records of the method.
    """

    name: str = "plugin"
    config_class: ClassVar[type | None] = None  # a frozen dataclass; None: no knobs
    config: Any = None
    stages: ClassVar[tuple[str, ...]] = ()  # the STAGES ``nodes`` adds to
    wraps: ClassVar[tuple[str, ...]] = ()  # the WRAP_POINTS ``wrap`` wraps
    # Features a host may leave out: the method then does what it can with the rest (tools
    # it cannot offer in chat mode become guidance). A host runs every other feature or none.
    optional: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = sorted(set(vars(cls)) & set(_RETIRED))
        if old:  # a method written for the old hooks would otherwise be silently ignored
            raise TypeError(f"{cls.__name__} defines {', '.join(old)}, which are no longer "
                            "Plugin hooks: " + "; ".join(_RETIRED[n] for n in old))

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> Plugin:
        """The method for one agent, from its config (how the registry makes it by name).
        Override when the method needs the library or the model from ``env``."""
        return cls(config) if cls.config_class is not None else cls()  # type: ignore[call-arg]

    def describe(self) -> dict[str, Any]:
        """What the trace records about this method: ``{"name", "config"}``."""
        return {"name": self.name, "config": config_dict(self.config)}

    def tools(self) -> list[Tool]:
        """Tools this plugin may add to a run (``offer`` says which, per run)."""
        return []

    def offer(self, shown: Mapping[str, Any]) -> ToolOffer:
        """This plugin's tools to offer in a run whose guidance showed ``shown`` (this
        plugin's guidance meta; empty when it gave none). Default: all, none required."""
        return ToolOffer(tuple(t.name for t in self.tools()))

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        """Text to put in the system message for ``task`` (and demo turns to put before it),
        within ``budget_tokens``."""
        return None

    def nodes(self) -> Sequence[Node]:
        """Graph nodes, each at one of the ``stages`` the class declares."""
        return ()

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        """Facts for the trace's ``meta[self.name]`` once the run ends."""
        return {}

    def adjust_config(self, task: str, config: RunConfig) -> RunConfig:
        """The budgets and sampling for a run of ``task`` (e.g. a ``max_steps`` learned from
        similar tasks); called once per run, in plugin order."""
        return config

    def wrap(self, point: str, inner: Callable[..., Any], backend: Backend | None
             ) -> Callable[..., Any]:
        """``inner`` wrapped, at each of the ``wraps`` the class declares (``WRAP_POINTS``
        says what each call is; ``backend`` is the agent's model, None where the host has
        none to give). Wrappers nest in plugin order, the first innermost."""
        return inner


def wrap_calls(point: str, inner: Callable[..., Any], plugins: Sequence[Plugin],
               backend: Backend | None = None) -> Callable[..., Any]:
    """``inner`` wrapped by every plugin that wraps ``point`` (the first plugin innermost)."""
    if point not in WRAP_POINTS:
        raise ValueError(f"unknown call point {point!r}; points: {', '.join(WRAP_POINTS)}")
    for p in plugins:
        if point in p.wraps:
            inner = p.wrap(point, inner, backend)
    return inner


def collect_guidance(plugins: Sequence[Plugin], ctx: AgentContext, task: str,
                     budget_tokens: int) -> Collected:
    """The plugins' guidance for ``task``, in plugin order, each within what the ones before it
    left of ``budget_tokens`` (system text and demo turns alike); what each showed (``{plugin
    name: meta}``, plus ``library_version`` when a plugin read the library); and their demo
    turns. Empty text and no turns when none had any."""
    parts: list[str] = []
    meta: dict[str, Any] = {}
    turns: list[dict[str, str]] = []
    for plugin in plugins:
        g = plugin.guidance(task, ctx, max(0, budget_tokens))
        if g is None:
            continue
        meta[plugin.name] = dict(g.meta)
        if g.library_version is not None:
            meta["library_version"] = g.library_version
        for t in g.turns:
            turns.append({"role": t["role"], "content": t["content"]})
            budget_tokens -= ctx.backend.count_tokens(t["content"])
        text = g.text.strip()
        if not text:
            continue
        parts.append(text if text.startswith("#") else f"# {g.title}\n{text}")
        budget_tokens -= ctx.backend.count_tokens(text)
    return Collected("\n\n".join(parts), meta, turns)


class DecisionRecords:
    """What a method wrapping ``model_call`` did per decision, kept until the run's ``finish_meta``
    collects it; bounded (oldest dropped first), so a run that never finishes keeps nothing
    forever. Thread-safe: one plugin serves concurrent runs."""

    def __init__(self, cap: int = 4096) -> None:
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._cap = cap

    def put(self, key: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._items[key] = record
            while len(self._items) > self._cap:
                self._items.popitem(last=False)

    def pop(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.pop(key, None)
