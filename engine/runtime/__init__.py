"""The LangGraph agent runtime: graph, nodes, parsing, checkpoints, plugins."""

from engine.runtime.agent import Agent, AgentEvent, RunFinished, StepEvent, new_trace_id
from engine.runtime.checkpoints import Checkpoints
from engine.runtime.plugins import Guidance, Plugin
from engine.runtime.state import AgentContext, RunConfig

__all__ = ["Agent", "AgentContext", "AgentEvent", "Checkpoints", "Guidance", "Plugin",
           "RunConfig", "RunFinished", "StepEvent", "new_trace_id"]
