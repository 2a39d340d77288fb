"""Whetstone: adapt frozen LLMs and VLMs at inference time, with no weight updates.

The public API is one import::

    from whetstone import Engine
    engine = Engine(model="embedded", library="~/.whetstone/library", methods=["memory"])
    trace = engine.run("What is 17 * 23?")

Everything of Whetstone's lives under this namespace (``whetstone.engine``,
``whetstone.skills``, ``whetstone.tools``, ``whetstone.library_store``, ``whetstone.cli``), so
an application's own ``engine/``, ``skills/`` or ``tools.py`` never collides with it. Names are
loaded on first use: importing ``whetstone`` imports nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from whetstone.engine.api import Engine, open_library
    from whetstone.engine.errors import WhetstoneError
    from whetstone.engine.evolution.pipeline import EvolveResult
    from whetstone.engine.runtime.state import RunConfig
    from whetstone.engine.types import Completion, Message, Request, Skill, Trace
    from whetstone.tools.mcp_config import McpServer, load_mcp_config
    from whetstone.tools.toolset import ToolSet

# name -> the module that defines it (imported when the name is first read)
_EXPORTS: dict[str, str] = {
    "Engine": "whetstone.engine.api",
    "open_library": "whetstone.engine.api",
    "EvolveResult": "whetstone.engine.evolution.pipeline",
    "RunConfig": "whetstone.engine.runtime.state",
    "WhetstoneError": "whetstone.engine.errors",
    "Message": "whetstone.engine.types",
    "Request": "whetstone.engine.types",
    "Completion": "whetstone.engine.types",
    "Trace": "whetstone.engine.types",
    "Skill": "whetstone.engine.types",
    "McpServer": "whetstone.tools.mcp_config",
    "load_mcp_config": "whetstone.tools.mcp_config",
    "ToolSet": "whetstone.tools.toolset",
}

__all__ = ["Completion", "Engine", "EvolveResult", "McpServer", "Message", "Request",
           "RunConfig", "Skill", "ToolSet", "Trace", "WhetstoneError", "__version__",
           "load_mcp_config", "open_library"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # lazy: `import whetstone` loads nothing until a name is used
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("whetstone-engine")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'whetstone' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
