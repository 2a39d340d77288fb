"""Build the agent's LangGraph ``StateGraph`` from the enabled plugins.

    prepare -> [before-think nodes] -> think -> act -> [before-think nodes] -> think ...
                                         |  \\-> (unparseable) -> [before-think] -> think
                                         \\-> (answer / limit) -> [verify nodes] -> finish

A limit (horizon, token budget, wall clock) or a failed model call goes straight to finish.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from whetstone.engine.runtime.nodes import (
    act,
    finish,
    prepare,
    route_after_act,
    route_after_think,
    think,
)
from whetstone.engine.runtime.plugins import NodeFn, Plugin
from whetstone.engine.runtime.state import AgentContext, AgentState


def _adapt(fn: NodeFn) -> Callable[..., Mapping[str, Any]]:
    """A LangGraph node that hands the injected context to a plain (state, ctx) function."""
    from langgraph.runtime import Runtime

    def node(state: AgentState, runtime: Runtime[AgentContext]) -> Mapping[str, Any]:
        return fn(state, runtime.context)

    node.__name__ = getattr(fn, "__name__", "node")
    return node


def build_graph(plugins: Sequence[Plugin] = ()) -> Any:
    """The uncompiled ``StateGraph``; ``Agent`` compiles it with a checkpointer."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(AgentState, context_schema=AgentContext)
    g.add_node("prepare", _adapt(prepare))
    g.add_node("think", _adapt(think))
    g.add_node("act", _adapt(act))
    g.add_node("finish", _adapt(finish))

    # Node names are "<plugin>_<function>": policy notes are keyed by them, so they stay put.
    before = [(f"{p.name}_{fn.__name__}", fn) for p in plugins
              if (fn := p.before_think()) is not None]
    verify = [(f"{p.name}_{fn.__name__}", fn) for p in plugins
              if (fn := p.verify()) is not None]
    for name, fn in [*before, *verify]:
        g.add_node(name, _adapt(fn))

    # Chains: each list of nodes runs in order, then hands over to the next stage.
    to_think = before[0][0] if before else "think"
    for (a, _), (b, _) in itertools.pairwise(before):
        g.add_edge(a, b)
    if before:
        g.add_edge(before[-1][0], "think")
    to_finish = verify[0][0] if verify else "finish"
    for (a, _), (b, _) in itertools.pairwise(verify):
        g.add_edge(a, b)
    if verify:
        g.add_edge(verify[-1][0], "finish")

    g.add_edge(START, "prepare")
    g.add_edge("prepare", to_think)
    g.add_conditional_edges(
        "think", route_after_think,
        {"act": "act", "retry": to_think, "answered": to_finish, "finish": "finish"},
    )
    g.add_conditional_edges("act", route_after_act, {"continue": to_think, "answered": to_finish})
    g.add_edge("finish", END)
    return g
