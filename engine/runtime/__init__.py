"""The LangGraph agent runtime: graph, nodes, parsing, checkpoints, plugins."""

from .agent import Agent, AgentEvent, RunFinished, StepEvent, new_trace_id
from .checkpoints import Checkpoints
from .plugins import Guidance, Plugin
from .state import AgentContext, RunConfig

__all__ = ["Agent", "AgentContext", "AgentEvent", "Checkpoints", "Guidance", "Plugin",
           "RunConfig", "RunFinished", "StepEvent", "new_trace_id"]
