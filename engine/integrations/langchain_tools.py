"""A library's learned tools as LangChain tools, for a ``ToolNode`` or any LangChain agent.

    tools = library_tools_for_langchain("lib")
    builder.add_node("model", whetstone_node(WhetstoneChatModel(inner=..., library="lib"),
                                             tools=tools))
    builder.add_node("tools", ToolNode(tools))

Each tool is the one the agent loop offers (``whetstone.engine.runtime.library_tools``): it runs only in
the sandbox, and a failure is its observation, never an exception. The tool message's content
is what the model reads; its ``artifact`` says how the call ran (``sandbox.isolation``, the
limits, a weak mode's warnings), as the agent's ``act`` step records it.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool, StructuredTool

from ...library_store.store import Library, Snapshot
from ...tools.base import Tool, Toolbox
from ...tools.images import ImageFiles
from ..api import Engine
from ..errors import ConfigError
from ..library.opening import open_library
from ..methods.registry import default_registry

if TYPE_CHECKING:
    from ...tools.sandbox import Sandbox

# What a parameter filled with the task (``Annotated[str, "task"]``) says when the caller, not
# the runtime, must fill it: a LangChain tool call has no task of its own.
TASK_PARAMETER = "The whole task, word for word as the user asked it."


def _snapshot(library: str | Path | Library | Engine, version: str | None) -> Snapshot:
    if isinstance(library, Engine):
        return library.pin.snapshot() or library.library.snapshot()
    if isinstance(library, (str, Path)):
        library = open_library(Path(library), default_registry().folders(), create=False)
    if not isinstance(library, Library):
        raise ConfigError(f"library must be a folder, a Library or an Engine, got "
                          f"{type(library).__name__}", hint='library_tools_for_langchain("lib")')
    return library.snapshot(library.resolve(version)) if version else library.snapshot()


def as_langchain_tool(tool: Tool) -> BaseTool:
    """A Whetstone ``Tool`` as a LangChain ``StructuredTool`` (sync and async): its JSON
    schema as the arguments (a task-filled parameter becomes one the model fills), its
    ``returns_answer`` as ``return_direct``, the ``ToolResult`` metadata as the artifact."""
    schema: dict[str, Any] = copy.deepcopy(dict(tool.spec.parameters))
    schema.setdefault("type", "object")
    task_params = [p for p, source in tool.spec.inject.items() if source == "task"]
    for param in task_params:
        schema.setdefault("properties", {})[param] = {"type": "string",
                                                      "description": TASK_PARAMETER}
        schema["required"] = [*schema.get("required", []), param]
    box = Toolbox.of([tool])

    def run(**arguments: Any) -> tuple[str, dict[str, Any]]:
        task = next((str(arguments[p]) for p in task_params if p in arguments), None)
        result = box.call(tool.name, arguments, task=task)
        artifact = {"ok": result.ok, "error": result.error,
                    "duration_s": round(result.duration_s, 6), "timed_out": result.timed_out,
                    **dict(result.metadata)}
        return result.observation(tool.name), artifact

    async def arun(**arguments: Any) -> tuple[str, dict[str, Any]]:
        return await asyncio.to_thread(run, **arguments)

    return StructuredTool.from_function(
        func=run, coroutine=arun, name=tool.name, description=tool.spec.description,
        args_schema=schema, response_format="content_and_artifact",
        return_direct=tool.spec.returns_answer)


def library_tools_for_langchain(library: str | Path | Library | Engine, *,
                                version: str | None = None, sandbox: Sandbox | None = None
                                ) -> list[BaseTool]:
    """The learned tools of a library version (default: the current one, or the version an
    ``Engine`` pins) as LangChain tools that run in the sandbox. A tool that fails its checks
    is left out, as the agent leaves it out (``whetstone tools ls`` says why)."""
    # lazy: loads yaml and 4 more of our modules
    from ..runtime.library_tools import library_tools

    snap = _snapshot(library, version)
    images = ImageFiles(snap.library.scratch("tool-images"))
    tools, _ = library_tools(snap, images=images, sandbox=sandbox)
    return [as_langchain_tool(t) for t in tools]


__all__ = ["as_langchain_tool", "library_tools_for_langchain"]
