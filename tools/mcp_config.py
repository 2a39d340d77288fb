"""Which MCP servers a run uses, and which of their tools it may call.

A server is started by a command (stdio) or reached at a URL (streamable HTTP). The command
line names them with ``--mcp 'COMMAND ARGS'``, ``--mcp-url URL`` and ``--mcp-config FILE``, the
file in the ``mcpServers`` shape MCP clients share::

    {"mcpServers": {
       "shop": {"command": "mcp-server-sqlite", "args": ["--db-path", "shop.db"],
                "allowTools": ["read_query", "list_tables"]},
       "docs": {"url": "https://mcp.example.com/mcp",
                "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}}}}

Each tool is offered as ``<server>_<tool>`` (``shop_read_query``), so two servers' tools never
collide and a skill that names one keeps naming it when servers are added. A server's tools
are filtered by its allow-list (``allowTools`` in the file, ``--allow-tool shop_write_query``
on the command line; ``*`` patterns work): with one, only the tools it names are offered;
without one, every tool is, except those whose annotations say they are destructive (the MCP
default for an annotated tool that is not read-only), which are refused until allowed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from whetstone.engine.backends.redact import redact_text, url_secrets
from whetstone.engine.errors import ConfigError

SERVER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 60.0
_NAMED = re.compile(r"([A-Za-z][A-Za-z0-9_-]{0,31})=(?=\S)")  # "shop=COMMAND", "docs=https://"
_RUNNERS = {"npx", "uvx", "node", "python", "python3", "bunx", "deno", "pipx", "uv", "docker"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "allowTools",
         "timeout", "startupTimeout", "disabled", "description"}


@dataclass(frozen=True)
class McpServer:
    """One MCP server: ``command`` + ``args`` (stdio) or ``url`` (streamable HTTP, with
    ``headers``). ``allow``: the allow-list (tool names or ``*`` patterns, bare or
    prefixed); ``timeout_s``: the most one call may take; ``start_timeout_s``: to connect."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    # Values that came from ${VAR} (``expanded_values``): secrets wherever they appear.
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not SERVER_NAME.match(self.name):
            raise ConfigError(f"MCP server name {self.name!r} is not lower-case letters, "
                              "digits and _ (up to 32)", hint="e.g. shop or docs_search")
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"MCP server {self.name!r} needs a command or a url, not both",
                              hint='{"command": "mcp-server-sqlite", "args": [...]} or '
                                   '{"url": "https://host/mcp"}')

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """The server as a person would recognise it, as it may be shown (``redact``; no
        headers)."""
        if self.command is not None:
            return self.redact(shlex.join([self.command, *self.args]))
        return self.redact(str(self.url))

    def redact(self, text: str) -> str:
        """``text`` as an error or a log may show it: every URL's userinfo and query values
        masked, and every secret of this server (``${VAR}`` values, header values, the URL's
        password and query values) masked wherever it appears (a path, an echoed error)."""
        found = [*self.secrets, *url_secrets(self.url or "")]
        for value in self.headers.values():  # "Bearer TOKEN": the token, and the whole value
            found += [value, value.split()[-1] if value.split() else value]
        return redact_text(text, found)

    @classmethod
    def stdio(cls, command: str, *, name: str | None = None, **options: Any) -> McpServer:
        """``--mcp 'COMMAND ARGS'`` (``NAME=COMMAND ARGS`` names it); split like a shell
        line, never run through one."""
        given, text = _split_name(command)
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"cannot read the MCP command {command!r}: {exc}",
                              hint="quote it as one shell word: --mcp 'mcp-server-sqlite "
                                   "--db-path shop.db'") from exc
        if not words:
            raise ConfigError("an empty --mcp command", hint="--mcp 'COMMAND ARGS'")
        return cls(name=name or given or command_name(words), command=words[0],
                   args=tuple(words[1:]), **options)

    @classmethod
    def http(cls, url: str, *, name: str | None = None,
             headers: Mapping[str, str] | None = None, **options: Any) -> McpServer:
        """``--mcp-url URL`` (``NAME=URL`` names it), with ``headers`` (auth)."""
        given, text = _split_name(url)
        parsed = urlparse(text)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"{redact_text(text, options.get('secrets', ()))!r} is not an "
                              "http(s) URL",
                              hint="--mcp-url https://host/mcp (the server's streamable HTTP "
                                   "endpoint)")
        return cls(name=name or given or _host_name(parsed.hostname or ""), url=text,
                   headers=dict(headers or {}), **options)


def _host_name(host: str) -> str:
    """``mcp.example.com`` -> ``mcp_example_com``; an address or localhost -> ``local``."""
    if host in ("localhost", "") or re.fullmatch(r"[0-9.]+|[0-9a-f:]+", host):
        return "local"
    return _clean(host)


def _split_name(text: str) -> tuple[str | None, str]:
    m = _NAMED.match(text.strip())
    if m is None:
        return None, text.strip()
    return _clean(m.group(1)), text.strip()[m.end():]


def _clean(text: str) -> str:
    name = re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")[:32]
    if not name or not name[0].isalpha():
        name = ("mcp_" + name)[:32].rstrip("_")
    return name


def command_name(words: Sequence[str]) -> str:
    """A server's name from its command: the package or program, without the runner
    (``npx -y``, ``uvx``, ``python -m``) and the ``mcp-server-``/``server-`` affixes:
    ``mcp-server-sqlite`` -> ``sqlite``, ``npx -y @modelcontextprotocol/server-filesystem``
    -> ``filesystem``."""
    rest = list(words)
    while rest and (Path(rest[0]).name in _RUNNERS or rest[0].startswith("-")):
        rest = rest[1:]
    head = Path(rest[0]).name if rest else Path(words[0]).name
    head = head.rsplit("/", 1)[-1].split("@", 1)[0] or head
    head = re.sub(r"\.(py|js|mjs|ts)$", "", head)
    for affix in ("mcp-server-", "mcp_server_", "server-", "mcp-"):
        head = head.removeprefix(affix)
    for affix in ("-mcp-server", "-mcp", "_mcp", "-server"):
        head = head.removesuffix(affix)
    return _clean(head or "mcp")


def expanded_values(value: Any) -> tuple[str, ...]:
    """The environment's values of every ``${VAR}`` in the strings of ``value`` (a string,
    or a config entry's lists and objects): what ``expand_vars`` puts in, secrets to mask."""
    if isinstance(value, str):
        return tuple(os.environ[v] for v in _VAR.findall(value) if os.environ.get(v))
    items = value.values() if isinstance(value, Mapping) else value \
        if isinstance(value, (list, tuple)) else ()
    return tuple(s for item in items for s in expanded_values(item))


def expand_vars(value: str, where: str) -> str:
    """``${VAR}`` from the environment (secrets stay out of files and the process list)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ConfigError(f"{where} uses ${{{m.group(1)}}}, which is not set",
                              hint=f"export {m.group(1)}=... before running")
        return os.environ[m.group(1)]
    return _VAR.sub(sub, value)


def _strings(value: Any, where: str, *, mapping: bool = False) -> Any:
    if mapping:
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{where} must be an object of strings")
        return {str(k): expand_vars(v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(expand_vars(v, where) for v in value)


def _seconds(value: Any, where: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where} must be a positive number of seconds")
    return float(value)


def server_from_entry(name: str, entry: Mapping[str, Any], *, base: Path) -> McpServer:
    """One ``mcpServers`` entry; a relative ``cwd``, and a ``command`` given as a relative
    path (``./bin/server``), are read from the file's folder (``base``)."""
    where = f"mcpServers.{name}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where} must be an object")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}",
                          hint="keys: " + ", ".join(sorted(_KEYS)))
    secrets = expanded_values(dict(entry))
    kind = entry.get("type") or entry.get("transport")
    if kind in ("sse",):
        raise ConfigError(f"{where}: the SSE transport is not supported",
                          hint="use the server's streamable HTTP endpoint (type http)")
    common: dict[str, Any] = {
        "allow": _strings(entry.get("allowTools", []), f"{where}.allowTools"),
        "timeout_s": _seconds(entry.get("timeout"), f"{where}.timeout",
                              DEFAULT_CALL_TIMEOUT_S),
        "start_timeout_s": _seconds(entry.get("startupTimeout"), f"{where}.startupTimeout",
                                    DEFAULT_START_TIMEOUT_S),
        "secrets": secrets}
    if entry.get("url") is not None:
        if not isinstance(entry["url"], str):
            raise ConfigError(f"{where}.url must be a string")
        return McpServer.http(expand_vars(entry["url"], f"{where}.url"), name=_clean(name),
                              headers=_strings(entry.get("headers", {}), f"{where}.headers",
                                               mapping=True), **common)
    if not isinstance(entry.get("command"), str) or not entry["command"].strip():
        raise ConfigError(f"{where} needs a command (stdio) or a url (HTTP)")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}.cwd must be a string")
    command = expand_vars(entry["command"], f"{where}.command")
    if "/" in command and not Path(command).expanduser().is_absolute():
        command = str((base / command).resolve())  # ./bin/server: beside the file
    return McpServer(name=_clean(name), command=command,
                     args=_strings(entry.get("args", []), f"{where}.args"),
                     env=_strings(entry.get("env", {}), f"{where}.env", mapping=True),
                     cwd=str((base / expand_vars(cwd, f"{where}.cwd")).resolve()) if cwd else None,
                     **common)


def load_mcp_config(path: str | Path) -> list[McpServer]:
    """The servers of an ``mcpServers`` file (entries with ``"disabled": true`` left out)."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the MCP config {path}: {exc.strerror or exc}",
                          hint="give the path of a JSON file with an mcpServers object") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the MCP config {path} is not JSON: {exc}",
                          hint='{"mcpServers": {"name": {"command": "...", "args": [...]}}}'
                          ) from exc
    servers = data.get("mcpServers") if isinstance(data, Mapping) else None
    if not isinstance(servers, Mapping):
        raise ConfigError(f"the MCP config {path} has no mcpServers object",
                          hint='{"mcpServers": {"name": {"command": "...", "args": [...]}}}')
    return [server_from_entry(str(n), e, base=path.parent) for n, e in servers.items()
            if not (isinstance(e, Mapping) and e.get("disabled") is True)]


def tool_name(server: str, tool: str) -> str:
    """The name a server's tool is offered under: ``<server>_<tool>``, cut to the 64
    characters function names may have."""
    return f"{server}_{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"[:64]


def is_destructive(annotations: Any) -> bool:
    """Whether a tool's MCP annotations say it may destroy: marked destructive (even when it
    also claims to be read-only: hints that contradict each other are read the careful
    way), or not read-only and not marked non-destructive (the spec's default for such a
    tool is destructive). A tool with no annotations says nothing; an allow-list is how to
    keep it out."""
    if annotations is None:
        return False
    if getattr(annotations, "destructive_hint", None) is True:
        return True
    return not getattr(annotations, "read_only_hint", None) and \
        getattr(annotations, "destructive_hint", None) is not False


def _matches(patterns: Iterable[str], server: str, tool: str) -> bool:
    full = tool_name(server, tool)
    return any(fnmatch.fnmatchcase(full, p) or fnmatch.fnmatchcase(tool, p) for p in patterns)


def allowed(server: McpServer, tool: str, annotations: Any) -> tuple[bool, str]:
    """(offered, why not) for one of ``server``'s tools under its allow-list."""
    if server.allow:
        if _matches(server.allow, server.name, tool):
            return True, ""
        return False, "not on the server's allow-list"
    if is_destructive(annotations):
        return False, "its annotations say it is destructive"
    return True, ""


def check_allow_list(server: McpServer, tools: Sequence[str]) -> None:
    """A ``ConfigError`` when an entry of ``server``'s allow-list (``--allow-tool``,
    ``allowTools``) matches none of the ``tools`` it lists: a typo would otherwise leave the
    tool out without a word. It names the server's tools. (``*`` alone is every server's.)"""
    bad = [p for p in server.allow
           if p.strip() != "*" and not any(_matches([p], server.name, t) for t in tools)]
    if bad:
        names = ", ".join(tool_name(server.name, t) for t in tools) or "(none)"
        raise ConfigError(f"--allow-tool/allowTools {', '.join(bad)}: MCP server {server.name} "
                          f"has no such tool; its tools: {names}",
                          hint="allow one of them by its name, or several with a * pattern "
                               f"(e.g. {server.name}_*)")


def with_allowed(servers: Sequence[McpServer], names: Sequence[str]) -> list[McpServer]:
    """``servers`` with ``--allow-tool`` names added to the allow-list of the server each
    names (``<server>_<tool>`` or ``<server>_*``; the longest server name that fits, so
    ``docs_search_x`` is ``docs_search``'s before ``docs``'s; ``*`` alone: every server's); a
    name that fits no server is a ``ConfigError`` listing them."""
    out = list(servers)
    for raw in names:
        pattern = raw.strip()
        fits = [i for i, s in enumerate(out) if pattern.startswith(s.name + "_")]
        longest = max((len(out[i].name) for i in fits), default=0)
        hits = list(range(len(out))) if pattern == "*" else \
            [i for i in fits if len(out[i].name) == longest]
        if not hits:
            known = ", ".join(f"{s.name}_..." for s in out) or "(no MCP server given)"
            raise ConfigError(f"--allow-tool {pattern}: no MCP server of that name",
                              hint=f"name a tool as <server>_<tool>: {known}")
        for i in hits:
            out[i] = replace(out[i], allow=(*out[i].allow, pattern))
    return out


__all__ = ["DEFAULT_CALL_TIMEOUT_S", "McpServer", "allowed", "check_allow_list", "command_name",
           "expand_vars", "expanded_values", "is_destructive", "load_mcp_config",
           "server_from_entry", "tool_name", "with_allowed"]
