"""The tool options of ``run``, ``eval`` and ``evolve``: built-in tools and functions
(``--tools``), MCP servers (``--mcp``, ``--mcp-url``, ``--mcp-config``) and what of theirs
may run (``--allow-tool``). The engine resolves them (``whetstone.tools.toolset``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])
TOOL_PARAMS = ("tools", "mcp", "mcp_url", "mcp_header", "mcp_config", "allow_tool",
               "mcp_timeout")


def tool_click_options(*, with_tools: bool = True) -> list[Callable[[F], F]]:
    """The options as click decorators, ``--tools`` first unless ``with_tools=False`` (the
    command declares it itself); ``pop_tools`` turns their values into one list."""
    options: list[Callable[[F], F]] = [
        click.option("--mcp-timeout", type=click.FloatRange(min=0.1), default=None,
                     metavar="SECONDS",
                     help="Most seconds one MCP tool call may take (default 60; "
                          "--mcp-config servers: their `timeout`)."),
        click.option("--allow-tool", multiple=True, metavar="SERVER_TOOL",
                     help="Offer only the named tools of that MCP server (an allow-list; "
                          "`*` patterns, e.g. shop_*), destructive ones included. "
                          "Repeatable."),
        click.option("--mcp-config", multiple=True, metavar="FILE",
                     type=click.Path(path_type=Path),
                     help="MCP servers from a JSON file in the mcpServers shape MCP "
                          "clients use (allowTools per server). Repeatable."),
        click.option("--mcp-header", multiple=True, metavar="'NAME: VALUE'",
                     help="A header for every --mcp-url server (auth); ${VAR} is read "
                          "from the environment. Repeatable."),
        click.option("--mcp-url", multiple=True, metavar="[NAME=]URL",
                     help="An MCP server over streamable HTTP. Repeatable."),
        click.option("--mcp", multiple=True, metavar="'[NAME=]COMMAND ARGS'",
                     help="An MCP server to start over stdio; its tools are offered as "
                          "NAME_TOOL (NAME: from the command, e.g. mcp-server-sqlite -> "
                          "sqlite). It runs outside the sandbox, as you. Repeatable."),
    ]
    if with_tools:
        options.append(click.option(
            "--tools", default="calculator,python", show_default=True,
            help="Comma-separated built-in tools ('' for none) and functions "
                 "(module:function or file.py:function)."))
    return options


def pop_tools(params: dict[str, Any], *, keep_tools: bool = False) -> dict[str, Any]:
    """``params`` with the tool options' values replaced by ``agent_tools``: the list
    ``Engine(tools=...)`` takes (``keep_tools``: ``--tools`` stays a parameter too)."""
    given = {k: params.pop(k) for k in TOOL_PARAMS if k in params and
             not (keep_tools and k == "tools")}
    tools = params.get("tools") if keep_tools else given.pop("tools", None)
    params["agent_tools"] = agent_tools(tools or "", **given)
    return params


def tool_options(*, with_tools: bool = True) -> Callable[[F], F]:
    """The options on a command, passed to it as one ``agent_tools`` list. Put it below
    ``handle_errors``, so a bad option is reported like any error."""

    def add(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **pop_tools(kwargs, keep_tools=not with_tools))

        for option in tool_click_options(with_tools=with_tools):
            wrapper = option(wrapper)  # type: ignore[assignment]
        return wrapper  # type: ignore[return-value]

    return add


def _headers(lines: Sequence[str]) -> dict[str, str]:
    # lazy: `whetstone --help` imports every command module
    from ...tools.mcp_config import expand_vars
    from ..errors import ConfigError

    out: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"cannot read --mcp-header {line!r}",
                              hint="write 'NAME: VALUE', e.g. 'Authorization: Bearer ${TOKEN}'")
        out[name.strip()] = expand_vars(value.strip(), "--mcp-header")
    return out


def agent_tools(tools: str, *, mcp: Sequence[str] = (), mcp_url: Sequence[str] = (),
                mcp_header: Sequence[str] = (), mcp_config: Sequence[Path] = (),
                allow_tool: Sequence[str] = (), mcp_timeout: float | None = None
                ) -> list[Any]:
    """The ``Engine(tools=...)`` list of the options: the names of ``tools`` (built-ins and
    ``module:function`` references), then every MCP server with its allow-list."""
    # lazy: `whetstone --help` imports every command module
    from ...tools.mcp_config import McpServer, load_mcp_config, with_allowed

    timing: dict[str, Any] = {"timeout_s": mcp_timeout} if mcp_timeout is not None else {}
    headers = _headers(mcp_header)
    servers = [McpServer.stdio(c, **timing) for c in mcp]
    servers += [McpServer.http(u, headers=headers, **timing) for u in mcp_url]
    for path in mcp_config:
        servers += load_mcp_config(path)
    if mcp_header and not mcp_url:
        # lazy: `whetstone --help` imports every command module
        from ..errors import ConfigError

        raise ConfigError("--mcp-header is for --mcp-url servers, and none is given",
                          hint="add --mcp-url URL, or put headers in --mcp-config's entries")
    names: list[Any] = [t.strip() for t in tools.split(",") if t.strip()]
    return names + with_allowed(servers, allow_tool)
