"""Runtime methods: how a method acts during a run without the runtime knowing it.

A ``Plugin`` is a runtime method. It may add guidance to the system message (skills, policy
notes), tools (``read_skill``, learned tools), a node before each decision (a step rubric), a
node before finishing (a claim-by-claim verification), facts to the finished trace's ``meta``, a
per-task change of the run's budgets (``adjust_config``: a step horizon that follows similar
tasks) and a wrapper around the model call (``wrap_model``: refining a white-box model's decoding
in its hidden states). Every hook has a default, so a method implements only what it needs.

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
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from whetstone.engine.errors import ConfigError

if TYPE_CHECKING:
    from whetstone.engine.backends.base import Backend
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


@dataclass(frozen=True)
class MethodEnv:
    """What a runtime method built by name may use: the library, the version the run reads
    (``snapshot``; None: follow the current one) and the agent's model."""

    library: Library | None = None
    snapshot: Snapshot | None = None
    backend: Backend | None = None

    def require_library(self, method: str) -> Library:
        """The library, for a method that cannot run without one; ``ConfigError`` naming
        ``method`` when there is none."""
        if self.library is None:
            raise ConfigError(f"the {method} method needs a library",
                              hint="build it through Engine, which opens the library")
        return self.library


@dataclass(frozen=True)
class VerifyEnv:
    """What a method that verifies answers (``MethodSpec.verify``) is given by ``Engine.verify``:
    the engine's model, ``analyst(spec_or_backend)`` -> ``(backend, close_it)`` for a second
    model, and ``corpus(name)`` for evidence (``corpus_name`` is the engine's default)."""

    backend: Backend
    analyst: Callable[[Any], tuple[Backend, bool]]
    corpus: Callable[[str | None], Any]
    corpus_name: str


class Verification(Protocol):
    """What a verifier returns: the report the server and CLI show, and its trace."""

    def report(self) -> dict[str, Any]: ...

    def trace(self, *, model: str = "") -> Any: ...


def config_dict(config: Any) -> dict[str, Any]:
    """A method's config as JSON-safe data for the trace (a dataclass, a mapping or None)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, Mapping) else {"value": repr(config)}


# The hooks that act on a run (``guidance`` aside; ``describe`` and ``finish_meta`` only
# report, so every host may leave them out).
LOOP_HOOKS = ("before_think", "verify", "wrap_model", "wrap_solver", "adjust_config", "tools",
              "required_tools")
# What each host runs of a method. The agent graph: every hook. The direct solver (one call
# per task, ``whetstone.engine.evaluation.direct``): the guidance, the call's sampling and wrappers
# around the whole solve. Chat mode (one completion per request, the caller's own loop): the
# guidance alone.
HOST_HOOKS: Mapping[str, frozenset[str]] = {
    "agent": frozenset(LOOP_HOOKS),
    "direct": frozenset({"adjust_config", "wrap_solver"}),
    "chat": frozenset(),
}
_HOST_WORDS = {"agent": "the agent loop", "direct": "the direct solver (one call per task)",
               "chat": "chat mode (one completion per request)"}


def loop_hooks(plugin_class: type[Plugin]) -> list[str]:
    """The hooks of ``LOOP_HOOKS`` that ``plugin_class`` overrides."""
    return [h for h in LOOP_HOOKS if getattr(plugin_class, h, None) is not getattr(Plugin, h)]


def unhonoured_hooks(plugin_class: type[Plugin], host: str) -> list[str]:
    """The hooks ``plugin_class`` overrides that ``host`` (a key of ``HOST_HOOKS``) does not
    run."""
    if host not in HOST_HOOKS:
        raise ValueError(f"unknown host {host!r}; hosts: {', '.join(HOST_HOOKS)}")
    return [h for h in loop_hooks(plugin_class) if h not in HOST_HOOKS[host]]


def check_host(name: str, plugin_class: type[Plugin], host: str) -> None:
    """``ConfigError`` when ``host`` cannot run every hook of the method ``name`` (its class
    ``plugin_class``), naming the hooks and where they do run: a host never drops a
    method's hooks without a word."""
    missing = unhonoured_hooks(plugin_class, host)
    if not missing:
        return
    where = " or ".join(_HOST_WORDS[h] for h in HOST_HOOKS
                        if h != host and not unhonoured_hooks(plugin_class, h))
    raise ConfigError(
        f"method {name!r} cannot run in {_HOST_WORDS[host]}: its {', '.join(missing)} "
        f"act{'s' if len(missing) == 1 else ''} only in {where or 'a host that runs them'}",
        hint=f"run {name} in the agent (Engine(methods=[{name!r}]).run(task), "
             "`whetstone eval --solver agent`) or leave it out; chat mode and the direct "
             "solver apply the methods that only add guidance to the system message")


class Plugin:
    """Base for runtime methods. ``name`` keys its meta in the trace."""

    name: str = "plugin"
    config_class: ClassVar[type | None] = None  # a frozen dataclass; None: no knobs
    config: Any = None

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> Plugin:
        """The method for one agent, from its config (how the registry makes it by name).
        Override when the method needs the library or the model from ``env``."""
        return cls(config) if cls.config_class is not None else cls()  # type: ignore[call-arg]

    def describe(self) -> dict[str, Any]:
        """What the trace records about this method: ``{"name", "config"}``."""
        return {"name": self.name, "config": config_dict(self.config)}

    def tools(self) -> list[Tool]:
        """Tools this plugin may add to a run (``run_tools`` says which, per run)."""
        return []

    def run_tools(self, shown: Mapping[str, Any]) -> list[str]:
        """Names of this plugin's tools to offer in a run whose guidance showed ``shown`` (this
        plugin's guidance meta; empty when it gave none). Default: all of them."""
        return [t.name for t in self.tools()]

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        """Text to put in the system message for ``task`` (and demo turns to put before it),
        within ``budget_tokens``."""
        return None

    def before_think(self) -> NodeFn | None:
        """A node run before every model decision (a step rubric)."""
        return None

    def verify(self) -> NodeFn | None:
        """A node run on the answer before the run finishes (a verification)."""
        return None

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        """Facts for the trace's ``meta[self.name]`` once the run ends."""
        return {}

    def adjust_config(self, task: str, config: RunConfig) -> RunConfig:
        """The budgets and sampling for a run of ``task`` (e.g. a ``max_steps`` learned from
        similar tasks); called once per run, in plugin order."""
        return config

    def required_tools(self, shown: Mapping[str, Any]) -> list[str]:
        """Tools the run's first decision must call one of (OpenAI's ``tool_choice``
        "required", over these), for what this plugin's guidance showed (``shown``: its
        ``Guidance.meta``). Honoured by backends that can prefill a reply (the
        ``prefill`` capability); elsewhere the tools are offered as usual."""
        return []

    def wrap_model(self, call: ModelCall, backend: Backend) -> ModelCall:
        """The model call the ``think`` node makes, wrapped (e.g. refining a white-box
        ``backend``'s decoding in its hidden states); wrappers nest in plugin order."""
        return call

    def wrap_solver(self, solve: SolveFn) -> SolveFn:
        """A wrapper around solving one whole task, for a method that runs a task more than
        once (e.g. to sample several runs and vote). Evaluation solvers
        (``Engine.solver``: eval, the gate, the scoreboard) apply it, in plugin order; a
        single ``run`` does not."""
        return solve


def wrap_solvers(solve: SolveFn, plugins: Sequence[Plugin]) -> SolveFn:
    """``solve`` wrapped by every plugin's ``wrap_solver`` (the first plugin innermost)."""
    for p in plugins:
        solve = p.wrap_solver(solve)
    return solve


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
    """What a ``wrap_model`` method did per decision, kept until the run's ``finish_meta``
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
