"""Build the agent's LangGraph ``StateGraph`` from the enabled plugins.

    prepare -> [decide nodes] -> think -> act -> [decide nodes] -> think ...
                                    |  \\-> (unparseable) -> [decide nodes] -> think
                                    \\-> (answer / limit) -> [answer nodes] -> finish

The bracketed stages are ``plugins.STAGES``: the nodes methods add there (``Plugin.nodes``).

A limit (horizon, token budget, wall clock) or a failed model call goes straight to finish.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .nodes import (
    act,
    finish,
    prepare,
    route_after_act,
    route_after_think,
    think,
)
from .plugins import STAGES, NodeFn, Plugin
from .state import AgentContext, AgentState


def _adapt(fn: NodeFn) -> Callable[..., Mapping[str, Any]]:
    """A LangGraph node that hands the injected context to a plain (state, ctx) function."""
    from langgraph.runtime import Runtime  # heavy: langgraph

    def node(state: AgentState, runtime: Runtime[AgentContext]) -> Mapping[str, Any]:
        return fn(state, runtime.context)

    node.__name__ = getattr(fn, "__name__", "node")
    return node


# The node each stage of ``STAGES`` hands over to.
_STAGE_PRECEDES = {"decide": "think", "answer": "finish"}


def stage_nodes(plugins: Sequence[Plugin]) -> dict[str, list[tuple[str, NodeFn]]]:
    """``{stage: [(node name, fn), ...]}`` for every stage of ``STAGES``, in plugin order; a
    node at a stage its class does not declare (or the graph does not have) is a
    ``ConfigError``."""
    out: dict[str, list[tuple[str, NodeFn]]] = {stage: [] for stage in STAGES}
    for p in plugins:
        for node in p.nodes():
            if node.stage not in STAGES or node.stage not in p.stages:
                raise ConfigError(
                    f"method {p.name!r} adds a node at stage {node.stage!r}, which "
                    + ("its class does not declare in `stages`" if node.stage in STAGES
                       else "the agent graph does not have"),
                    hint=f"stages: {', '.join(STAGES)}; declare them in the class's `stages`")
            out[node.stage].append((f"{p.name}_{getattr(node.fn, '__name__', 'node')}",
                                    node.fn))
    return out


def build_graph(plugins: Sequence[Plugin] = ()) -> Any:
    """The uncompiled ``StateGraph``; ``Agent`` compiles it with a checkpointer."""
    from langgraph.graph import END, START, StateGraph  # heavy: langgraph

    g = StateGraph(AgentState, context_schema=AgentContext)
    g.add_node("prepare", _adapt(prepare))
    g.add_node("think", _adapt(think))
    g.add_node("act", _adapt(act))
    g.add_node("finish", _adapt(finish))

    # Node names are "<plugin>_<function>": policy notes are keyed by them, so they stay put.
    chains = stage_nodes(plugins)
    for name, fn in [n for chain in chains.values() for n in chain]:
        g.add_node(name, _adapt(fn))
    # Each stage's nodes run in order, then hand over to what the stage precedes.
    heads: dict[str, str] = {}
    for stage, then in _STAGE_PRECEDES.items():
        chain = chains[stage]
        heads[stage] = chain[0][0] if chain else then
        for (a, _), (b, _) in itertools.pairwise(chain):
            g.add_edge(a, b)
        if chain:
            g.add_edge(chain[-1][0], then)
    to_think, to_finish = heads["decide"], heads["answer"]

    g.add_edge(START, "prepare")
    g.add_edge("prepare", to_think)
    g.add_conditional_edges(
        "think", route_after_think,
        {"act": "act", "retry": to_think, "answered": to_finish, "finish": "finish"},
    )
    g.add_conditional_edges("act", route_after_act, {"continue": to_think, "answered": to_finish})
    g.add_edge("finish", END)
    return g
