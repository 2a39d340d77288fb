"""MCP servers' tools in a run, called through the official ``mcp`` SDK's client.

``McpSessions`` holds one session per server (``whetstone.tools.mcp_config.McpServer``) on one
event loop of its own, on a background thread: the SDK is async, the agent's tools are called
from worker threads, so each call is handed to that loop and waited for with the server's
time-out. Servers are started once (``start``) and stopped once (``close``) per run, eval or
evolve; their stderr goes to a file whose last lines explain a server that failed or died.
On Linux a stdio server runs under ``mcp_reaper.py``, a child subreaper that kills whatever
the server started (a plain child, a ``setsid`` daemon) when it ends. Whatever a server's
errors show passes through ``McpServer.redact`` (its URL's credentials, its ``${VAR}`` values).

Each listed tool (with its schema and annotations) becomes a ``Tool`` named
``<server>_<tool>``. A call's result becomes an observation: its text content, else its
structured content as JSON; images are saved as files and named in the text (and shown to a
model that reads images, ``ToolResult.metadata["image_inputs"]``), at most
``MAX_IMAGES_PER_CALL`` of them, each within a tool image's bytes and pixels (one left out is
named in the text with why); a line on a server's stdout that is not an MCP message fails the
calls in flight at once (its reply cannot be read); ``isError`` results,
protocol errors, time-outs and a server that died are errors the model reads, never an
exception and never a hang: after a server dies, its tools answer at once that it is gone.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from whetstone.engine.errors import ConfigError, ToolError
from whetstone.engine.types import ToolSpec
from whetstone.tools.base import Tool, ToolResult
from whetstone.tools.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from whetstone.tools.mcp_config import (
    McpServer,
    allowed,
    check_allow_list,
    is_destructive,
    tool_name,
)

log = logging.getLogger("whetstone.mcp")

STDERR_TAIL = 1200  # characters of a server's stderr shown when it fails
_IMAGE_TYPES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
                "image/webp": ".webp"}
_CONNECTION_CLOSED, _REQUEST_TIMEOUT = -32000, -32001  # mcp_types.jsonrpc's codes
_MAX_PAGES = 50
REAPER = Path(__file__).with_name("mcp_reaper.py")  # the process a stdio server runs under
# What one call may bring back as images (more is left out, and the observation says so):
# each at most the bytes and pixels a tool's image input may have (tools/images.py).
MAX_IMAGES_PER_CALL = 8
MAX_IMAGE_BYTES_PER_CALL = 32 * 1024 * 1024
_GROUP: Any = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+


@dataclass
class _Live:
    """One server's session while it runs."""

    server: McpServer
    client: Any = None
    tools: list[Any] = field(default_factory=list)
    dead: str | None = None  # why its tools no longer answer
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    errlog: Any = None  # the file its stderr goes to (stdio)
    calls: set[asyncio.Task[Any]] = field(default_factory=set)  # calls waiting for replies
    garbled: str | None = None  # why the calls in flight were failed (bad stdout)

    def stderr_tail(self) -> str:
        if self.errlog is None:
            return ""
        try:
            self.errlog.flush()
            text = Path(self.errlog.name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        text = text.strip()
        return text[-STDERR_TAIL:] if text else ""

    def failure(self, what: str) -> str:
        """Why the server failed, with its stderr's last lines, as it may be shown."""
        tail = self.stderr_tail()
        return self.server.redact(what + (f"; its last output on stderr:\n{tail}" if tail
                                          else ""))


def _transport(live: _Live) -> Any:
    """The SDK transport for a server: its process over stdio, or streamable HTTP."""
    server = live.server
    if server.command is not None:
        from mcp import StdioServerParameters  # heavy: the mcp SDK (~0.4 s)
        from mcp.client.stdio import stdio_client  # heavy: the mcp SDK (~0.4 s)

        live.errlog = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by McpSessions.close
            "w+", prefix=f"whetstone-mcp-{server.name}-", suffix=".log", encoding="utf-8")
        command, args = server.command, list(server.args)
        if sys.platform == "linux":  # under the reaper: nothing it starts outlives it
            command, args = sys.executable, ["-I", "-S", str(REAPER), str(os.getpid()),
                                             command, *args]
        # "replace": a byte that is not UTF-8 makes its line unreadable (a fault the session
        # hears of, _stdout_fault), instead of stopping the reader with the call waiting.
        params = StdioServerParameters(command=command, args=args,
                                       env=dict(server.env) or None, cwd=server.cwd,
                                       encoding_error_handler="replace")
        return stdio_client(params, errlog=live.errlog)
    return _http_transport(server)


@contextlib.asynccontextmanager
async def _http_transport(server: McpServer) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client  # heavy: the mcp SDK (~0.4 s)
    from mcp.shared._httpx_utils import create_mcp_http_client  # heavy: the mcp SDK (~0.4 s)

    async with create_mcp_http_client(headers=dict(server.headers)) as http, \
            streamable_http_client(str(server.url), http_client=http) as streams:
        yield streams


async def _tracked(live: _Live, call: Any) -> Any:
    """``call`` as one of the server's calls in flight (``_stdout_fault`` may fail it)."""
    task = asyncio.current_task()
    assert task is not None
    live.calls.add(task)
    try:
        return await call
    finally:
        live.calls.discard(task)


def _stdout_fault(live: _Live) -> Any:
    """The session's message handler: a line on the server's stdout that is not a JSON-RPC
    message (bytes that are not UTF-8, stray output) fails the calls in flight at once; it
    may have been their reply, which then never comes, and the call would wait out its
    time-out. Stdio servers must write only MCP messages there."""

    async def handler(message: Any) -> None:
        if not isinstance(message, Exception):
            return
        live.garbled = ("wrote a line on its stdout that is not an MCP message (bytes that "
                        "are not UTF-8 JSON, or stray output), so its reply cannot be read")
        if live.calls:
            log.warning("MCP server %s %s; the call(s) in flight fail: %s", live.server.name,
                        live.garbled, live.server.redact(_describe(message)[:300]))
        for task in list(live.calls):
            task.cancel()

    return handler


def _describe(exc: BaseException) -> str:
    """An exception from the SDK or a transport as one line (groups: their first leaf)."""
    while _GROUP is not None and isinstance(exc, _GROUP) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 400 else text[:400] + " …"


class McpSessions:
    """Sessions with ``servers``, started by ``start`` and stopped by ``close`` (also a
    context manager). ``images_dir``: where images the tools return are kept (default: a
    temporary folder)."""

    def __init__(self, servers: Sequence[McpServer], *, images_dir: Path | None = None) -> None:
        names = [s.name for s in servers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"two MCP servers are named {', '.join(dup)}",
                              hint="name them apart: --mcp 'NAME=COMMAND ARGS', "
                                   "--mcp-url NAME=URL, or their keys in --mcp-config")
        self.servers = list(servers)
        self._lives = [_Live(s) for s in servers]
        self._images_dir = images_dir
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tools: list[Tool] | None = None
        self.refused: list[tuple[str, str]] = []  # (tool name, why it is not offered)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        """Connect to every server at once and list its tools; a server that cannot start is
        a ``ToolError`` naming it, with its stderr (the others are stopped)."""
        if self._loop is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="whetstone-mcp")
        self._thread.start()
        pending = [(live, asyncio.run_coroutine_threadsafe(self._open(live), self._loop))
                   for live in self._lives]
        problems = []
        for live, fut in pending:
            try:
                fut.result(timeout=live.server.start_timeout_s + 5)
            except (TimeoutError, ToolError, concurrent.futures.TimeoutError) as exc:
                why = exc.message if isinstance(exc, ToolError) else \
                    f"no answer in {live.server.start_timeout_s:g} s"
                problems.append(live.failure(f"MCP server {live.server.name} "
                                             f"({live.server.describe()}) did not start: {why}"))
        if problems:
            self.close()
            raise ToolError("\n".join(problems),
                            hint="check the command runs on its own (it must speak MCP on "
                                 "stdio), or that the URL is the server's /mcp endpoint and "
                                 "the headers authorise it")
        return self

    async def _open(self, live: _Live) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        live.stop = asyncio.Event()
        live.task = loop.create_task(self._serve(live, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), live.server.start_timeout_s)
        except TimeoutError:
            ready.cancel()  # nobody waits for it any more
            live.task.cancel()
            raise

    async def _serve(self, live: _Live, ready: asyncio.Future[None]) -> None:
        """The session's whole life in one task (the SDK's contexts must end where they
        began): connect, list, wait for ``close``."""
        from mcp import Client  # heavy: the mcp SDK (~0.4 s)
        from mcp_types import Implementation  # heavy: the mcp SDK

        assert live.stop is not None
        try:
            async with Client(_transport(live), read_timeout_seconds=live.server.timeout_s,
                              client_info=Implementation(name="whetstone", version="0.1"),
                              message_handler=_stdout_fault(live)) as client:
                live.tools = await self._list(client)
                live.client = client
                ready.set_result(None)
                await live.stop.wait()
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - reported, not raised
            why = "stopped" if isinstance(exc, asyncio.CancelledError) else _describe(exc)
            if not ready.done():
                ready.set_exception(ToolError(why))
            elif live.dead is None and not live.stop.is_set():
                live.dead = live.server.redact(f"its session ended ({why})")
        finally:
            live.client = None

    @staticmethod
    async def _list(client: Any) -> list[Any]:
        tools, cursor = [], None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools += list(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def close(self) -> None:
        """Stop every session (each server's process ends) and the loop."""
        loop = self._loop
        if loop is None:
            return
        self._loop = None

        async def stop_all() -> None:
            for live in self._lives:
                if live.stop is not None:
                    live.stop.set()
            tasks = [live.task for live in self._lives if live.task is not None]
            if tasks:
                _, slow = await asyncio.wait(tasks, timeout=10)
                for task in slow:
                    task.cancel()
        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout=20)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            why = _describe(exc)
            for live in self._lives:
                why = live.server.redact(why)
            log.warning("MCP servers did not stop cleanly: %s", why)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
        for live in self._lives:
            if live.errlog is not None:
                live.errlog.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the tools --------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """Every server's tools its allow-list and annotations let through (``refused`` says
        which were not, and why); starts the servers if needed."""
        if self._tools is None:
            self.start()
            try:
                for live in self._lives:
                    check_allow_list(live.server, [t.name for t in live.tools])
            except ConfigError:
                self.close()  # a run that cannot start stops the servers it started
                raise
            out: list[Tool] = []
            for live in self._lives:
                for t in live.tools:
                    ok, why = allowed(live.server, t.name, t.annotations)
                    name = tool_name(live.server.name, t.name)
                    if not ok:
                        self.refused.append((name, why))
                        continue
                    out.append(Tool(self._spec(live, t, name), self._caller(live, t.name)))
            self._tools = out
        return list(self._tools)

    def listing(self) -> list[dict[str, Any]]:
        """Every tool of every server, offered or not (``whetstone tools ls --mcp``): its
        name as offered, description, MCP hints, and whether the allow-list and annotations
        let it through (``why`` not); starts the servers if needed."""
        self.tools()
        rows = []
        for live in self._lives:
            for t in live.tools:
                ok, why = allowed(live.server, t.name, t.annotations)
                rows.append({"server": live.server.name, "tool": t.name,
                             "name": tool_name(live.server.name, t.name),
                             "description": " ".join((t.description or "").split()),
                             "read_only": bool(getattr(t.annotations, "read_only_hint", None)),
                             "destructive": is_destructive(t.annotations),
                             "allowed": ok, "why": why})
        return rows

    @staticmethod
    def _spec(live: _Live, tool: Any, name: str) -> ToolSpec:
        params = dict(tool.input_schema or {})
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        description = (tool.description or getattr(tool.annotations, "title", None)
                       or tool.name).strip()
        return ToolSpec(name=name, description=description, parameters=params,
                        source=f"mcp:{live.server.name}/{tool.name}",
                        timeout_s=live.server.timeout_s)

    def _caller(self, live: _Live, tool: str) -> Any:
        def run(args: Mapping[str, Any]) -> ToolResult:
            return self.call(live, tool, args)
        return run

    def call(self, live: _Live, tool: str, args: Mapping[str, Any]) -> ToolResult:
        """One call, waited for at most the server's time-out; every failure a ``ToolResult``
        error."""
        start = time.perf_counter()
        meta = {"mcp": {"server": live.server.name, "tool": tool}}
        loop, timeout = self._loop, live.server.timeout_s
        if live.dead is not None or loop is None or live.client is None:
            why = live.dead or "the MCP sessions are closed"
            return ToolResult(error=f"MCP server {live.server.name} is not running: {why}",
                              metadata=meta)
        fut = asyncio.run_coroutine_threadsafe(_tracked(live, live.client.call_tool(
            tool, dict(args), read_timeout_seconds=timeout)), loop)
        try:
            result = fut.result(timeout=timeout + 5)
        except (TimeoutError, concurrent.futures.TimeoutError):
            fut.cancel()
            return self._timed_out(live, timeout, start, meta)
        except concurrent.futures.CancelledError:  # _stdout_fault failed it at once
            return ToolResult(error=f"MCP server {live.server.name} "
                              f"{live.garbled or 'dropped the call'}",
                              duration_s=time.perf_counter() - start, metadata=meta)
        except Exception as exc:  # noqa: BLE001 - every failure is the model's observation
            return self._failed(live, exc, timeout, start, meta)
        return self.observation(result, time.perf_counter() - start, meta)

    @staticmethod
    def _timed_out(live: _Live, timeout: float, start: float, meta: dict[str, Any]
                   ) -> ToolResult:
        return ToolResult(error=f"{live.server.name} did not answer in {timeout:g} s",
                          duration_s=time.perf_counter() - start, timed_out=True,
                          metadata=meta)

    def _failed(self, live: _Live, exc: Exception, timeout: float, start: float,
                meta: dict[str, Any]) -> ToolResult:
        code = getattr(exc, "code", None)
        if code == _REQUEST_TIMEOUT:
            return self._timed_out(live, timeout, start, meta)
        text = live.server.redact(_describe(exc))
        if code == _CONNECTION_CLOSED:
            live.dead = "it closed the connection (the process exited or the server hung up)"
            text = f"MCP server {live.server.name} stopped during the call: {live.dead}"
            time.sleep(0.2)  # let the dying process's last words reach its log
            tail = live.stderr_tail()
            if tail:  # for the trace and the person reading it, not for the model
                meta["mcp"]["stderr"] = live.server.redact(tail)
        return ToolResult(error=text, duration_s=time.perf_counter() - start, metadata=meta)

    def observation(self, result: Any, seconds: float, meta: dict[str, Any]) -> ToolResult:
        """A ``CallToolResult`` as the model reads it (see the module docstring)."""
        texts: list[str] = []
        images: list[str] = []
        budget = MAX_IMAGE_BYTES_PER_CALL
        for block in result.content or []:
            kind = getattr(block, "type", "")
            if kind == "text":
                texts.append(block.text)
            elif kind == "image":
                raw, why = _image_bytes(block.data, budget, len(images))
                if raw is None:
                    texts.append(f"[image left out: {why}]")
                    continue
                budget -= len(raw)
                path = self._save_image(raw, block.mime_type)
                images.append(path)
                texts.append(f"[image: {path}]")
            elif kind == "resource":
                res = block.resource
                texts.append(getattr(res, "text", None) or f"[resource: {res.uri}]")
            elif kind == "resource_link":
                texts.append(f"[resource: {block.uri}]")
            else:
                texts.append(f"[{kind or 'content'} omitted]")
        structured = result.structured_content
        if structured is not None:
            meta["mcp"]["structured"] = structured
        text = "\n".join(t for t in texts if t) if texts else (
            json.dumps(structured, ensure_ascii=False) if structured is not None else "")
        if images:
            meta["images"] = meta["image_inputs"] = images
        if result.is_error:
            return ToolResult(error=text or "the tool reported an error", duration_s=seconds,
                              metadata=meta)
        return ToolResult(text, duration_s=seconds, metadata=meta)

    def _save_image(self, raw: bytes, mime: str) -> str:
        """Keep an image a tool returned (named by its content hash); its path."""
        if self._images_dir is None:
            self._images_dir = Path(tempfile.mkdtemp(prefix="whetstone-mcp-images-"))
        self._images_dir.mkdir(parents=True, exist_ok=True)
        suffix = _IMAGE_TYPES.get(mime.lower(), ".bin")
        path = self._images_dir / f"{hashlib.sha256(raw).hexdigest()[:32]}{suffix}"
        if not path.exists():
            path.write_bytes(raw)
        return str(path)


def _image_bytes(data: str, budget: int, kept: int) -> tuple[bytes | None, str]:
    """An image block's bytes, or None and why it is left out: past the call's count or
    bytes, larger than a tool's image input may be, or more pixels than that (read from its
    header, never decoded: a 30000x30000 PNG is a few hundred bytes)."""
    if kept >= MAX_IMAGES_PER_CALL:
        return None, f"a call keeps at most {MAX_IMAGES_PER_CALL} images"
    if len(data) * 3 // 4 > min(budget, MAX_IMAGE_BYTES):
        return None, (f"more than {min(budget, MAX_IMAGE_BYTES) // 2**20} MB"
                      + (" left of the call's images" if budget < MAX_IMAGE_BYTES else ""))
    try:
        raw = base64.b64decode(data, validate=False)
    except (ValueError, TypeError):
        return None, "not base64 data"
    if len(raw) > min(budget, MAX_IMAGE_BYTES):
        return None, f"more than {min(budget, MAX_IMAGE_BYTES) // 2**20} MB"
    why = _pixels_problem(raw)
    return (None, why) if why else (raw, "")


def _pixels_problem(raw: bytes) -> str | None:
    """Why an image's size (read from its header, never decoded) is refused, or None."""
    from PIL import Image  # heavy: Pillow, only when a tool returns an image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as img:
                width, height = img.size
    except Image.DecompressionBombError:  # past twice PIL's own bound, larger than ours
        return f"more than {MAX_IMAGE_PIXELS:,} pixels"
    except Exception:  # noqa: BLE001 - any unreadable header is the same answer
        return "not an image that can be read"
    if width * height > MAX_IMAGE_PIXELS:
        return f"{width}x{height} is more than {MAX_IMAGE_PIXELS:,} pixels"
    return None


__all__ = ["McpSessions"]
