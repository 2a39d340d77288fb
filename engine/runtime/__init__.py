"""The LangGraph agent runtime: graph, nodes, parsing, checkpoints, plugins."""

from whetstone.engine.runtime.agent import Agent, AgentEvent, RunFinished, StepEvent, new_trace_id
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.runtime.plugins import Guidance, Plugin
from whetstone.engine.runtime.state import AgentContext, RunConfig

__all__ = ["Agent", "AgentContext", "AgentEvent", "Checkpoints", "Guidance", "Plugin",
           "RunConfig", "RunFinished", "StepEvent", "new_trace_id"]
