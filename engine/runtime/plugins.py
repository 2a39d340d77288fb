"""How methods plug into the runtime without the runtime knowing them.

A ``Plugin`` may add guidance to the system message (skills, policy notes), tools (``read_skill``,
Dynamo tools), a node before each decision (Co-ReAct's rubric) and a node before finishing
(MARCH's verification), and may add facts to the finished trace's ``meta``. All hooks have
defaults, so a plugin implements only what it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.runtime.state import AgentContext, AgentState
    from tools.base import Tool

# A graph node: (state, context) -> state update. The runtime adapts it to LangGraph.
NodeFn = Callable[["AgentState", "AgentContext"], Mapping[str, Any]]


@dataclass(frozen=True)
class Guidance:
    """Text for the system message, with what it showed (recorded in the trace's meta).

    ``text`` that starts with a markdown heading is used as is; otherwise it goes under
    ``# <title>``. ``library_version``: the library version the text came from.
    """

    title: str
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    library_version: str | None = None


class Plugin:
    """Base for run-time methods. ``name`` keys its meta in the trace."""

    name: str = "plugin"

    def tools(self) -> list[Tool]:
        """Tools this plugin adds to every run."""
        return []

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        """Text to put in the system message for ``task``, within ``budget_tokens``."""
        return None

    def before_think(self) -> NodeFn | None:
        """A node run before every model decision (Co-ReAct)."""
        return None

    def verify(self) -> NodeFn | None:
        """A node run on the answer before the run finishes (MARCH)."""
        return None

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        """Facts for the trace's ``meta[self.name]`` once the run ends."""
        return {}
