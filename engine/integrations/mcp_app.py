"""``LibraryServer`` on the official MCP SDK (``mcp``, its low-level ``Server``), over stdio or
streamable HTTP.

Over HTTP the endpoint is ``/mcp`` and the limits are ``whetstone serve``'s: its Host, Origin
and Content-Type checks (``whetstone.engine.server.hosts``, in place of the SDK's own), its API
keys (``Authorization: Bearer``, checked with ``whetstone.engine.server.guard``), its
request-body cap (the SDK answers 413 past it) and its connection limits (a header timeout,
connections at once).
Where a key is set, a run logged with it carries the key's hash, and feedback from another key
cannot label it (as on ``/v1/feedback``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, MutableMapping
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from ..errors import NotFound, WhetstoneError
from ..prompts import load_prompt, render_prompt
from ..server.connections import ConnectionGuard, guarded_protocol
from ..server.guard import key_owner
from ..server.hosts import WebCheck, WebPolicy
from ..server.metrics import Metrics
from ..server.service import error_message
from .mcp_server import (
    OWN_TOOLS,
    SEARCH_TOOL,
    SKILL_FILE,
    WRITE_TOOLS,
    LibraryServer,
    skill_uri,
)

if TYPE_CHECKING:
    import socket

    from ..server.connections import ConnectionLimits

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Ctx = ServerRequestContext[Any, Any]

MCP_PATH = "/mcp"
GUIDANCE_PROMPT = "guidance"


def _refused(exc: WhetstoneError) -> MCPError:
    """A request the client got wrong, with what to do (the SDK hides other exceptions)."""
    return MCPError(INVALID_PARAMS, error_message(exc))


def _text(value: Any) -> list[types.ContentBlock]:
    return [types.TextContent(text=value if isinstance(value, str)
                              else json.dumps(value, ensure_ascii=False))]


def _tool(name: str, title: str, description: str, schema: dict[str, Any], *,
          read_only: bool, idempotent: bool, meta: dict[str, Any] | None = None) -> types.Tool:
    """A tool with its title and behaviour hints: none reaches outside the library and its
    sandbox (not open-world) and none deletes anything (not destructive)."""
    hints = types.ToolAnnotations(title=title, read_only_hint=read_only,
                                  destructive_hint=False, idempotent_hint=idempotent,
                                  open_world_hint=False)
    return types.Tool(name=name, title=title, description=description, input_schema=schema,
                      annotations=hints, _meta=meta)


def _own_tools(allow_writes: bool) -> list[types.Tool]:
    """``search_skills``, and the two writes when the server takes them."""
    string = {"type": "string"}
    tools = [_tool(
        SEARCH_TOOL, load_prompt("mcp.yaml#search_skills_title"),
        load_prompt("mcp.yaml#search_skills"), {"type": "object", "properties": {
            "query": {**string, "description": "The task, in words."},
            "k": {"type": "integer", "minimum": 1, "maximum": 50,
                  "description": "How many skills at most (default: the runtime's k)."}},
            "required": ["query"]}, read_only=True, idempotent=True)]
    if not allow_writes:
        return tools
    score = {"type": "number", "minimum": 0, "maximum": 1}
    # The same label again leaves the trace as it was: idempotent. A logged run is a new
    # trace each time: not.
    tools.append(_tool(
        "record_feedback", load_prompt("mcp.yaml#record_feedback_title"),
        load_prompt("mcp.yaml#record_feedback"), {"type": "object", "properties": {
            "trace_id": string, "score": score, "comment": string},
            "required": ["trace_id", "score"]}, read_only=False, idempotent=True))
    step = {"type": "object", "description": 'A {"thought": "..."} or a {"tool": "name", '
            '"arguments": {...}, "observation": "...", "error": null}.'}
    tools.append(_tool(
        "log_run", load_prompt("mcp.yaml#log_run_title"), load_prompt("mcp.yaml#log_run"),
        {"type": "object", "properties": {
            "task": string, "answer": string, "steps": {"type": "array", "items": step},
            "score": score, "model": {**string, "description": "The model that answered."}},
            "required": ["task", "answer"]}, read_only=False, idempotent=False))
    return tools


class McpHandlers:
    """The MCP request handlers over one ``LibraryServer``; ``keys``: the HTTP API keys (a
    write is tied to the key that made it)."""

    def __init__(self, library: LibraryServer, keys: frozenset[str] = frozenset()) -> None:
        self.library = library
        self.keys = keys

    def _owner(self, ctx: Ctx) -> str | None:
        request = ctx.request
        if not self.keys or request is None:
            return None
        return key_owner(request.headers.get("authorization"), self.keys)

    async def list_resources(self, ctx: Ctx, params: Any) -> types.ListResourcesResult:
        files = await anyio.to_thread.run_sync(self.library.files)
        return types.ListResourcesResult(resources=[
            types.Resource(uri=f.uri, name=f.name, description=f.description,
                           mime_type=f.mime_type, size=f.size) for f in files])

    async def list_templates(self, ctx: Ctx, params: Any
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(
                uri_template="whetstone://skills/{name}/{file}", name="skill-file",
                description="A file of a skill in the version this server follows "
                            f"(the skill's instructions: {SKILL_FILE})."),
            types.ResourceTemplate(
                uri_template="whetstone://v{version}/skills/{name}/{file}",
                name="skill-file-by-version",
                description="A file of a skill in library version N "
                            "(`whetstone library log` lists them).")])

    async def read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        try:
            found = await anyio.to_thread.run_sync(self.library.read, str(params.uri))
        except WhetstoneError as exc:
            raise _refused(exc) from exc
        if found.text is not None:
            content: Any = types.TextResourceContents(uri=found.uri, mime_type=found.mime_type,
                                                      text=found.text)
        else:
            content = types.BlobResourceContents(
                uri=found.uri, mime_type=found.mime_type,
                blob=base64.b64encode(found.data or b"").decode("ascii"))
        return types.ReadResourceResult(contents=[content])

    async def list_prompts(self, ctx: Ctx, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=GUIDANCE_PROMPT, description=load_prompt("mcp.yaml#guidance"),
            arguments=[types.PromptArgument(name="task", description="The task to answer.",
                                            required=True)])])

    async def get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams
                         ) -> types.GetPromptResult:
        if params.name != GUIDANCE_PROMPT:
            raise MCPError(INVALID_PARAMS, f"no prompt named {params.name!r} (prompts: "
                                           f"{GUIDANCE_PROMPT})")
        task = (params.arguments or {}).get("task")
        try:
            found = await anyio.to_thread.run_sync(self.library.guidance, task)
        except WhetstoneError as exc:
            raise _refused(exc) from exc
        return types.GetPromptResult(description=found.description, messages=[
            types.PromptMessage(role=role, content=types.TextContent(text=text))  # type: ignore[arg-type]
            for role, text in found.messages])

    async def list_tools(self, ctx: Ctx, params: Any) -> types.ListToolsResult:
        learned = await anyio.to_thread.run_sync(self.library.tool_list)
        # A learned tool runs in the sandbox: no files, no network, nothing kept between
        # calls, so it changes nothing around it (read-only) and a repeat changes nothing more.
        return types.ListToolsResult(tools=[*_own_tools(self.library.allow_writes), *(
            _tool(t.name, render_prompt("mcp.yaml#learned_title", skill=t.skill,
                                        words=t.name.replace("_", " ").capitalize()),
                  t.description, dict(t.input_schema), read_only=True, idempotent=True,
                  meta={"whetstone": {"skill": t.skill, "skill_uri": skill_uri(
                      t.skill, SKILL_FILE), "returns_answer": t.returns_answer}})
            for t in learned)])

    async def call_tool(self, ctx: Ctx, params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        name, args = params.name, dict(params.arguments or {})
        if name in WRITE_TOOLS:
            try:
                self.library.check_writes(name)
            except WhetstoneError as exc:  # not a tool of this server: a protocol error
                raise _refused(exc) from exc
        try:
            if name == SEARCH_TOOL:
                found = await anyio.to_thread.run_sync(
                    lambda: self.library.search(args.get("query"), args.get("k")))
                return types.CallToolResult(content=_text(found), structured_content=found)
            if name in OWN_TOOLS:
                return await self._write(ctx, name, args)
            run = await anyio.to_thread.run_sync(self.library.run_tool, name, args)
        except WhetstoneError as exc:  # the model sees it and can call again
            if name not in OWN_TOOLS and isinstance(exc, NotFound):  # no such tool
                raise _refused(exc) from exc
            return types.CallToolResult(content=_text(error_message(exc)), is_error=True)
        return types.CallToolResult(content=_text(run.text), structured_content=dict(
            run.structured), is_error=not run.ok)

    async def _write(self, ctx: Ctx, name: str, args: dict[str, Any]) -> types.CallToolResult:
        owner = self._owner(ctx)
        if name == "record_feedback":
            out = await self.library.record_feedback(args.get("trace_id"), args.get("score"),
                                                     args.get("comment"), owner=owner)
        else:
            out = await anyio.to_thread.run_sync(lambda: self.library.log_run(
                args.get("task"), args.get("answer"), args.get("steps"), args.get("score"),
                args.get("model"), owner=owner))
        return types.CallToolResult(content=_text(out), structured_content=out)


def build_server(library: LibraryServer, keys: frozenset[str] = frozenset()) -> Server[Any]:
    """The SDK's low-level ``Server`` with the library's resources, prompt and tools."""
    h = McpHandlers(library, keys)
    instructions = render_prompt(
        "mcp.yaml#instructions", library=library.engine.library_path.name,
        version=library.version(),
        writes=load_prompt("mcp.yaml#writes") if library.allow_writes else "")

    return Server("whetstone", version=version("whetstone-engine"), instructions=instructions,
                  on_list_resources=h.list_resources, on_list_resource_templates=h.list_templates,
                  on_read_resource=h.read_resource, on_list_prompts=h.list_prompts,
                  on_get_prompt=h.get_prompt, on_list_tools=h.list_tools,
                  on_call_tool=h.call_tool)


async def serve_stdio(library: LibraryServer) -> None:
    """Serve one client on this process's stdin and stdout until it closes them."""
    from mcp.server.stdio import stdio_server  # heavy: the mcp SDK (~0.4 s)

    server = build_server(library)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


class KeyCheck:
    """ASGI middleware: every HTTP request needs one of ``keys`` as ``Authorization: Bearer``
    (``whetstone serve``'s check and message); 401 otherwise."""

    def __init__(self, app: ASGIApp, keys: frozenset[str]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        auth = headers.get(b"authorization")
        if key_owner(auth.decode("latin-1") if auth is not None else None, self.keys):
            await self.app(scope, receive, send)
            return
        message = ("incorrect API key provided" if auth is not None else
                   "no API key provided; send it as 'Authorization: Bearer <key>'")
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32001, "message": message + " (ask the server's operator for a key)"}}
        ).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="whetstone"')]})
        await send({"type": "http.response.body", "body": body})


def http_app(library: LibraryServer, *, keys: frozenset[str], max_body_bytes: int,
             host: str = "127.0.0.1", web: WebPolicy | None = None) -> ASGIApp:
    """The streamable-HTTP app at ``/mcp``: the web checks first (``web``, default: the
    policy of a server bound to ``host``; 421, 403, 415), then the keys, bodies past
    ``max_body_bytes`` answered 413 by the SDK (before they are parsed). The SDK's own Host
    and Origin check is off: it protected loopback binds only, with lists of its own."""
    app = build_server(library, keys).streamable_http_app(
        streamable_http_path=MCP_PATH, max_request_body_size=max_body_bytes, host=host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    inner = KeyCheck(app, keys) if keys else app
    return WebCheck(inner, web or WebPolicy.for_bind(host))


def serve_http(library: LibraryServer, *, host: str, port: int, keys: frozenset[str],
               max_body_bytes: int, sock: socket.socket, limits: ConnectionLimits,
               log_level: str = "info", web: WebPolicy | None = None) -> None:
    """Serve ``http_app`` under uvicorn with ``whetstone serve``'s connection limits."""
    import uvicorn  # heavy: uvicorn


    app = http_app(library, keys=keys, max_body_bytes=max_body_bytes, host=host, web=web)
    guard = ConnectionGuard(limits, Metrics())
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           http=guarded_protocol(guard)))
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn's exit 3 when start-up fails
        if server.started:
            raise
        raise WhetstoneError(f"the MCP server on {host}:{port} did not start",
                             hint="the log above says why") from exc
