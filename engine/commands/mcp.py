"""``whetstone mcp``: the library to MCP clients (coding agents, IDEs, agent frameworks), over
stdio or streamable HTTP (see docs/mcp.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from .common import (
    check_exposed_bind,
    console,
    handle_errors,
    library_option,
    otel_options,
    skills_config,
    skills_options,
    web_options,
)


@click.command("mcp")
@library_option
@click.option("--version", "library_version", default=None,
              help="Pin a library version (default: follow the current one as it moves).")
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio",
              show_default=True,
              help="stdio: one client that started this process; http: streamable HTTP at "
                   "http://HOST:PORT/mcp.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="HTTP only; an address other than 127.0.0.1/localhost needs --api-key "
                   "(or --insecure).")
@click.option("--port", type=int, default=8765, show_default=True, help="HTTP only.")
@web_options
@click.option("--api-key", "api_keys", multiple=True, envvar="WHETSTONE_API_KEY",
              help="HTTP: require this key from clients (Authorization: Bearer); repeat for "
                   "more.")
@click.option("--api-keys-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="HTTP: a file of accepted keys, one per line ('#' comments).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=16 * 1024 * 1024,
              show_default=True, help="HTTP: larger request bodies get 413.")
@click.option("--allow-writes", is_flag=True,
              help="Offer record_feedback and log_run (they write traces); read-only "
                   "without it.")
@skills_options("Skills the guidance prompt shows at most, and search_skills' default k.",
                "The lowest retrieval score (cosine) a skill needs to be shown or found")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, help="HTTP: uvicorn's log level.")
@handle_errors
@otel_options
def mcp(library_path: Path | None, library_version: str | None, transport: str, host: str,
        port: int, allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...],
        insecure: bool, api_keys: tuple[str, ...], api_keys_file: Path | None,
        max_body_bytes: int, allow_writes: bool, skills_k: int,
        skills_min_score: float | None, log_level: str, otel: Any) -> None:
    """Serve the library over MCP: skills as resources (by version), search_skills, the
    guidance prompt, the learned tools (run in the sandbox) and, with --allow-writes,
    record_feedback and log_run. No model is loaded: the client's model answers."""
    import anyio  # lazy: anyio, only when serving

    # lazy: the mcp SDK and uvicorn, only when serving
    from ..integrations.mcp_app import serve_http, serve_stdio
    from ..integrations.mcp_server import LibraryServer
    from ..server.guard import load_api_keys

    out = console(stderr=True)  # stdout is the stdio transport's
    keys = load_api_keys(api_keys, api_keys_file)
    source = click.get_current_context().get_parameter_source("api_keys")
    given = source is click.core.ParameterSource.COMMANDLINE or api_keys_file is not None
    if transport == "stdio" and given:  # WHETSTONE_API_KEY, set for `serve`, is left alone
        raise ConfigError("API keys protect the HTTP transport; a stdio server has one "
                          "client, the process that started it",
                          hint="add --transport http, or leave out --api-key")
    skills = skills_config(skills_k, skills_min_score)
    sock = None
    if transport == "http":
        # lazy: loads anyio, fastapi, numpy, opentelemetry, pydantic and 19 more of our modules
        from ..server.app import bind

        check_exposed_bind(host, keys, insecure, "mcp --transport http")

        sock = bind(host, port)  # a port in use fails now
    library = LibraryServer.open(library_path, allow_writes=allow_writes, skills=skills,
                                 version=library_version, otel=otel)
    try:
        library.adapter.warm_up()  # the embedder and the index, before the first client
        where = f"http://{host}:{port}/mcp" if transport == "http" else "stdio"
        out.print(f"MCP server on {where} · library {library.engine.library_path} "
                  f"({library.version()}) · {'writes allowed' if allow_writes else 'read-only'}"
                  + (f" · API keys {len(keys) or 'off'}" if transport == "http" else ""))
        if sock is None:
            anyio.run(serve_stdio, library)
            return
        # lazy: `whetstone --help` imports every command module
        from ..server.connections import ConnectionLimits
        from ..server.hosts import WebPolicy

        web = WebPolicy.for_bind(host, allowed_hosts=allowed_hosts,
                                 allowed_origins=allowed_origins)
        serve_http(library, host=host, port=port, keys=keys, max_body_bytes=max_body_bytes,
                   sock=sock, limits=ConnectionLimits(), log_level=log_level, web=web)
    finally:
        if sock is not None:
            sock.close()
        library.close()
