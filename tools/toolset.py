"""The tools a run offers, from whatever the user gave: ``Engine(tools=[...])`` and ``whetstone
run --tools``.

An item is a built-in tool's name (``calculator``, ``python``; ``search`` over the corpus the
face injects), a function's import path (``module:function``, ``path/to/file.py:function``), a
typed function, a LangChain ``BaseTool``, an ``McpServer`` (its tools, named
``<server>_<tool>``), a ready ``Tool``, or another ``ToolSet`` or ``McpSessions`` whose
servers someone else started and stops (an eval over two library versions shares one). Two
tools may not share a name. The MCP servers given here start on the first ``tools()`` and stop
at ``close()``.

Where each kind runs (docs/mcp.md, "What runs where"): built-in ``python`` code and learned
tools in the sandbox; functions, LangChain tools and MCP servers are the user's own, in this
process or the server's, with the user's rights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.errors import ConfigError
from .base import Tool
from .builtin import builtin_tools
from .functions import (
    function_tool,
    import_function,
    is_langchain_tool,
    langchain_tool,
)
from .mcp_client import McpSessions
from .mcp_config import McpServer
from .search import make_search_tool

if TYPE_CHECKING:
    from typing import Self

log = logging.getLogger("whetstone.tools")

BUILTIN_NAMES = ("calculator", "python", "search")


class ToolSet:
    """``items`` resolved into ``Tool`` objects once (see the module docstring).
    ``corpus()`` gives the retriever ``search`` reads; ``images_dir`` keeps the images MCP
    tools return."""

    def __init__(self, items: Sequence[Any] = (), *, corpus: Callable[[], Any] | None = None,
                 images_dir: Path | None = None) -> None:
        self.items = list(items)
        self._corpus = corpus
        servers = [i for i in self.items if isinstance(i, McpServer)]
        self.sessions = McpSessions(servers, images_dir=images_dir) if servers else None
        # Functions and names are read now, so a bad one fails before anything starts.
        self._ready = {i: self._resolve(item) for i, item in enumerate(self.items)
                       if not _later(item)}
        self._tools: list[Tool] | None = None

    @property
    def servers(self) -> list[McpServer]:
        return list(self.sessions.servers) if self.sessions is not None else []

    def tools(self) -> list[Tool]:
        """Every item's tools, in the order given (MCP servers start here the first time)."""
        if self._tools is None:
            out: list[Tool] = []
            mcp_done = False
            for i, item in enumerate(self.items):
                if i in self._ready:
                    out += self._ready[i]
                elif isinstance(item, McpServer):
                    if not mcp_done and self.sessions is not None:
                        out += self.sessions.tools()
                        for name, why in self.sessions.refused:
                            # Left out by an allow-list: what was asked for, said quietly.
                            level = logging.INFO if "allow-list" in why else logging.WARNING
                            log.log(level, "MCP tool %s is not offered: %s (allow it with "
                                    "--allow-tool %s, or McpServer(allow=...))", name, why, name)
                        mcp_done = True
                else:
                    out += self._resolve(item)
            _check_unique(out)
            self._tools = out
        return list(self._tools)

    def _resolve(self, item: Any) -> list[Tool]:
        if isinstance(item, Tool):
            return [item]
        if isinstance(item, (ToolSet, McpSessions)):
            return item.tools()
        if isinstance(item, str):
            return self._named(item.strip())
        if is_langchain_tool(item):
            return [langchain_tool(item)]
        if callable(item):
            return [function_tool(item)]
        raise ConfigError(f"cannot use {item!r} as a tool",
                          hint="give a built-in tool's name, a typed function, a LangChain "
                               "tool, an McpServer or a Tool")

    def _named(self, name: str) -> list[Tool]:
        if ":" in name:
            target = import_function(name)
            return [langchain_tool(target) if is_langchain_tool(target)
                    else function_tool(target)]
        if name == "search":
            if self._corpus is None:
                raise ConfigError("the search tool needs a corpus, and none was given",
                                  hint="use it through Engine(tools=['search'], corpus=NAME)")

            return [make_search_tool(self._corpus())]
        if name not in BUILTIN_NAMES:
            raise ConfigError(f"unknown tool {name!r}",
                              hint=f"built-in tools: {', '.join(BUILTIN_NAMES)}; a function "
                                   "as module:function or path/to/file.py:function; MCP "
                                   "servers with --mcp, --mcp-url or --mcp-config")
        return builtin_tools((name,))

    def close(self) -> None:
        """Stop the MCP servers this set started (not those of a shared set it was given)."""
        if self.sessions is not None:
            self.sessions.close()

    def __enter__(self) -> Self:
        self.tools()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _later(item: Any) -> bool:
    """Whether an item is resolved on first use: servers start, the corpus opens."""
    return isinstance(item, (McpServer, ToolSet, McpSessions)) or item == "search"


def _check_unique(tools: Sequence[Tool]) -> None:
    seen: dict[str, Tool] = {}
    for t in tools:
        if t.name in seen:
            first, second = seen[t.name].spec.source or "given", t.spec.source or "given"
            raise ConfigError(f"two tools are named {t.name!r} ({first} and {second})",
                              hint="rename one (a function's tool is named after it; an MCP "
                                   "server's after the server: name the server apart)")
        seen[t.name] = t


__all__ = ["BUILTIN_NAMES", "ToolSet"]
