"""`whetstone mcp`: a library served over MCP, tested with the official SDK's own client.

Over stdio (the SDK spawns `whetstone mcp`): a session lists the skills, reads one (and an older
version of it), searches, gets the guidance prompt, calls a learned tool that runs under
bubblewrap, logs a run and labels it, and `whetstone traces ls` shows the label. Over
streamable HTTP: serve's API keys and body limit, and a read-only server refuses writes. In
process: the URI forms, bad input, and feedback tied to the key a run was logged with.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from servers import free_port

from whetstone.cli import cli
from whetstone.engine.errors import ConfigError, NotFound
from whetstone.engine.integrations.mcp_server import LibraryServer, parse_uri, skill_uri
from whetstone.engine.library.checks import validate_library
from whetstone.engine.server.guard import key_hash
from whetstone.library_store.store import Library
from whetstone.tools.isolation import find_bwrap

WHETSTONE = Path(sys.executable).with_name("whetstone")
SKILL = textwrap.dedent("""\
    ---
    name: sum-amounts
    description: Add up a list of amounts. Use when a word problem sums several prices.
    ---
    # Sum amounts
    Call `sum_amounts` with the amounts{extra}.
    """)
TOOL = textwrap.dedent('''\
    def sum_amounts(amounts: list[float]) -> float:
        """Add up amounts exactly.

        Args:
            amounts: the numbers to add.
        """
        return sum(amounts)
    ''')
PENS = "Pens cost 1.5, 2.25 and 3. What is the total?"


def make_library(root: Path) -> Library:
    """v2: the skill and its learned tool; v3: the skill's instructions changed."""
    lib = Library.open(root, create=True)
    lib.commit({"skills/sum-amounts/SKILL.md": SKILL.format(extra=""),
                "skills/sum-amounts/scripts/sum_amounts.py": TOOL},
               method="test", validate=validate_library)
    lib.commit({"skills/sum-amounts/SKILL.md": SKILL.format(extra=", then check the total")},
               method="test", validate=validate_library)
    return lib


def server_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "HOME", "WHETSTONE_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return {**{k: os.environ[k] for k in keep if k in os.environ},
            "WHETSTONE_HOME": str(home)}


def stdio_params(lib: Library, home: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(WHETSTONE), env=server_env(home),
                                 args=["mcp", "--library", str(lib.root), *args])


# --- over stdio ------------------------------------------------------------------------------

@pytest.mark.integration
async def test_a_stdio_session_lists_reads_searches_and_labels_a_run(
        tmp_path: Path, whetstone_home: Path) -> None:
    lib = make_library(tmp_path / "lib")
    params = stdio_params(lib, whetstone_home, "--allow-writes")
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert "version v3" in (init.instructions or "") and "log_run" in init.instructions
        listed = {r.uri: r for r in (await session.list_resources()).resources}
        assert set(listed) == {"whetstone://skills/sum-amounts/SKILL.md",
                               "whetstone://skills/sum-amounts/scripts/sum_amounts.py"}
        assert listed["whetstone://skills/sum-amounts/SKILL.md"].description.startswith(
            "Add up a list of amounts")
        now = (await session.read_resource("whetstone://skills/sum-amounts/SKILL.md")).contents
        old = (await session.read_resource("whetstone://v2/skills/sum-amounts/SKILL.md")).contents
        assert "then check the total" in now[0].text and "check" not in old[0].text
        assert now[0].mime_type == "text/markdown"
        with pytest.raises(MCPError, match=r"no file 'nope.md'.*SKILL.md, scripts/sum_amounts"):
            await session.read_resource("whetstone://skills/sum-amounts/nope.md")

        found = (await session.call_tool("search_skills", {"query": PENS})).structured_content
        assert [s["name"] for s in found["skills"]] == ["sum-amounts"]
        assert found["skills"][0]["score"] >= found["min_score"] == 0.25
        assert found["skills"][0]["uri"] == "whetstone://v3/skills/sum-amounts/SKILL.md"
        unrelated = await session.call_tool("search_skills",
                                            {"query": "Write a haiku about autumn leaves"})
        assert unrelated.structured_content["skills"] == []  # under the runtime's floor
        bad = await session.call_tool("search_skills", {"query": PENS, "k": 0})
        assert bad.is_error and "'k' must be a whole number" in bad.content[0].text

        prompt = await session.get_prompt("guidance", {"task": PENS})
        assert [m.role for m in prompt.messages] == ["user", "user"]
        assert "## Skill: sum-amounts" in prompt.messages[0].content.text
        assert prompt.messages[-1].content.text == PENS
        assert "skills shown: sum-amounts" in (prompt.description or "")

        logged = await session.call_tool("log_run", {
            "task": PENS, "answer": "6.75", "model": "outside-agent",
            "steps": [{"thought": "sum them"}, {"tool": "sum_amounts",
                                                "arguments": {"amounts": [1.5, 2.25, 3]},
                                                "observation": "6.75"}]})
        trace_id = logged.structured_content["trace_id"]
        labelled = await session.call_tool("record_feedback",
                                           {"trace_id": trace_id, "score": 0.9,
                                            "comment": "right"})
        assert not labelled.is_error and labelled.structured_content["score"] == 0.9
        missing = await session.call_tool("record_feedback",
                                          {"trace_id": "nope-123", "score": 1})
        assert missing.is_error and "no trace with id 'nope-123'" in missing.content[0].text

    res = CliRunner().invoke(cli, ["traces", "ls", "--library", str(lib.root), "--json"])
    rows = {r["id"]: r for r in json.loads(res.output)}
    assert rows[trace_id]["score"] == 0.9 and rows[trace_id]["answer"] == "6.75"
    trace = lib.traces.get(trace_id)
    assert [s.kind for s in trace.steps] == ["think", "act", "finish"]
    assert trace.meta["source"] == "mcp" and trace.library_version == "v3"
    assert trace.meta["feedback"] == "right" and trace.model == "outside-agent"


@pytest.mark.integration
async def test_a_learned_tool_runs_under_bubblewrap_with_its_schema(
        tmp_path: Path, whetstone_home: Path) -> None:
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed (make install installs it where apt exists)")
    lib = make_library(tmp_path / "lib")
    async with stdio_client(stdio_params(lib, whetstone_home)) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"search_skills", "sum_amounts"}  # read-only: no writes listed
        schema = tools["sum_amounts"].input_schema
        assert schema["properties"]["amounts"]["type"] == "array"
        assert schema["required"] == ["amounts"]
        ran = await session.call_tool("sum_amounts", {"amounts": [1.5, 2.25, 3]})
        assert not ran.is_error and ran.content[0].text == "6.75"
        assert ran.structured_content["isolation"] == "bwrap"
        wrong = await session.call_tool("sum_amounts", {"amounts": "x"})
        assert wrong.is_error and "amounts must be array" in wrong.content[0].text
        assert wrong.structured_content["isolation"] is None  # refused before the sandbox
        with pytest.raises(MCPError, match="no tool named 'nope'"):
            await session.call_tool("nope", {})


# --- over streamable HTTP --------------------------------------------------------------------

@pytest.fixture
def http_server(tmp_path: Path, whetstone_home: Path) -> Iterator[tuple[str, Library]]:
    """`whetstone mcp --transport http` (read-only) with the key k1 and a 4 KiB body cap."""
    lib = make_library(tmp_path / "lib")
    port = free_port()
    proc = subprocess.Popen(
        [str(WHETSTONE), "mcp", "--transport", "http", "--port", str(port), "--library",
         str(lib.root), "--api-key", "k1", "--max-body-bytes", "4096", "--log-level",
         "warning"], env=server_env(whetstone_home), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP server did not start: {proc.stderr.read()}"
                                       ) from exc
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp", lib
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.integration
async def test_http_needs_the_key_caps_bodies_and_a_read_only_server_refuses_writes(
        http_server: tuple[str, Library]) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    url, lib = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with httpx2.AsyncClient() as raw:
        refused = await raw.post(url, json=hello)
        assert refused.status_code == 401 and "no API key provided" in refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = await raw.post(url, json=hello, headers={"Authorization": "Bearer k2"})
        assert wrong.status_code == 401 and "incorrect API key" in wrong.text
        big = await raw.post(url, content=b"x" * 5000, headers={
            "Authorization": "Bearer k1", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"})
        assert big.status_code == 413

    before = len(lib.traces.query())
    client = create_mcp_http_client(headers={"Authorization": "Bearer k1"})
    async with client, streamable_http_client(url, http_client=client) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        names = [t.name for t in (await session.list_tools()).tools]
        assert names == ["search_skills", "sum_amounts"]
        with pytest.raises(MCPError, match=r"read-only.*whetstone mcp --allow-writes"):
            await session.call_tool("log_run", {"task": "2+2?", "answer": "4"})
        with pytest.raises(MCPError, match="read-only"):
            await session.call_tool("record_feedback", {"trace_id": "x", "score": 1})
    assert len(lib.traces.query()) == before


# --- in process ------------------------------------------------------------------------------

def test_skill_uris_round_trip_and_anything_else_is_refused_with_the_forms() -> None:
    uri = skill_uri("sum-amounts", "references/a b.md", "v2")
    assert uri == "whetstone://v2/skills/sum-amounts/references/a%20b.md"
    assert parse_uri(uri) == ("v2", "sum-amounts", "references/a b.md")
    assert parse_uri("whetstone://skills/sum-amounts") == (None, "sum-amounts", "SKILL.md")
    for bad in ("whetstone://skills/../x/SKILL.md", "file:///etc/passwd",
                "whetstone://skills/a/%2E%2E/b", "whetstone://v0/skills/a/SKILL.md",
                "whetstone://skills/a/SKILL.md?x=1", "whetstone://other/a"):
        with pytest.raises(NotFound) as err:
            parse_uri(bad)
        assert "whetstone://skills/<name>/<file>" in (err.value.hint or "")


async def test_feedback_over_http_labels_only_the_runs_of_its_own_key(tmp_path: Path) -> None:
    server = LibraryServer.open(make_library(tmp_path / "lib").root, allow_writes=True)
    try:
        logged = server.log_run("2+2?", "4", owner=key_hash("k1"))
        with pytest.raises(NotFound):  # another key learns nothing about the id
            await server.record_feedback(logged["trace_id"], 1, owner=key_hash("k2"))
        out = await server.record_feedback(logged["trace_id"], 1, owner=key_hash("k1"))
        assert out["score"] == 1.0
        with pytest.raises(ConfigError, match=r"steps\[1\] is neither"):
            server.log_run("t", "a", steps=[{"thought": "x"}, {"answer": "y"}])
        with pytest.raises(ConfigError, match="'score' must be a number from 0 to 1"):
            server.log_run("t", "a", score=2)
        with pytest.raises(ConfigError, match="not a trace id"):
            await server.record_feedback("a b", 1)
        assert "no skill fits" in server.guidance("Write a haiku about autumn").description
    finally:
        server.close()


def test_api_keys_on_stdio_are_refused_before_anything_loads(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["mcp", "--library", str(tmp_path / "lib"), "--api-key", "k"])
    assert res.exit_code == 2 and "--transport http" in res.output
    assert not (tmp_path / "lib").exists()


# --- what a client reads (issue 37, item 9) ---------------------------------------------------

HALVE = textwrap.dedent('''\
    def halve(x: float) -> float:
        """Half of x.

        Args:
            x: a number.
        """
        return _divide(x, 0)


    def _divide(a, b):
        return a / b
    ''')


def failing_library(root: Path) -> Library:
    lib = Library.open(root, create=True)
    lib.commit({"skills/halving/SKILL.md": "---\nname: halving\ndescription: Halve a number."
                "\n---\n# Halving\nCall `halve`.\n", "skills/halving/scripts/halve.py": HALVE},
               method="test", validate=validate_library)
    return lib


async def test_a_failing_learned_tool_returns_its_exception_and_its_own_lines_only(
        tmp_path: Path) -> None:
    """The client got the sandbox's traceback, /tmp/whetstone-sandbox-... paths and all."""
    from whetstone.engine.integrations.langchain_tools import library_tools_for_langchain
    from whetstone.engine.integrations.mcp_app import McpHandlers

    lib = failing_library(tmp_path / "lib")
    server = LibraryServer.open(lib.root)
    try:
        import mcp_types as types

        ran = await McpHandlers(server).call_tool(
            None, types.CallToolRequestParams(name="halve", arguments={"x": 3}))  # type: ignore[arg-type]
    finally:
        server.close()
    (tool,) = library_tools_for_langchain(lib.root)  # the same tool, as LangChain runs it
    message = tool.invoke({"type": "tool_call", "id": "c1", "name": "halve", "args": {"x": 3}})
    for text in (ran.content[0].text, message.content, json.dumps(ran.structured_content)):
        assert "whetstone-sandbox" not in text and "/tmp/" not in text, text
        assert "Traceback" not in text and "^^^" not in text and "~~^" not in text, text
        assert "ZeroDivisionError: division by zero" in text
        assert "skills/halving/scripts/halve.py:11 in _divide: return a / b" in text
    assert ran.is_error and not ran.structured_content["output"]
    assert message.content.startswith("Error in halve: ZeroDivisionError")
    assert message.artifact["ok"] is False


async def test_feedback_and_log_run_errors_speak_to_an_mcp_client(tmp_path: Path) -> None:
    """record_feedback on an unknown id said "use the X-Whetstone-Trace-Id header" (HTTP);
    log_run said "needs a 'answer'"."""
    server = LibraryServer.open(make_library(tmp_path / "lib").root, allow_writes=True)
    try:
        with pytest.raises(NotFound) as info:
            await server.record_feedback("20261130-101500-3f9a1c2b", 1)
        assert (info.value.hint or "").startswith("use the trace_id log_run returned")
        with pytest.raises(ConfigError, match=r"^log_run needs an 'answer' \(a non-empty"):
            server.log_run("2+2?", "")
        with pytest.raises(ConfigError, match=r"^log_run needs a 'task'"):
            server.log_run(None, "4")
    finally:
        server.close()


async def test_every_tool_has_a_title_and_says_what_it_changes(tmp_path: Path) -> None:
    """Tools had no ``title``; learned tools no ``readOnlyHint``/``idempotentHint``."""
    from whetstone.engine.integrations.mcp_app import McpHandlers

    server = LibraryServer.open(make_library(tmp_path / "lib").root, allow_writes=True)
    try:
        listed = await McpHandlers(server).list_tools(None, None)  # type: ignore[arg-type]
    finally:
        server.close()
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == {"search_skills", "record_feedback", "log_run", "sum_amounts"}
    for t in tools.values():
        assert t.title and t.annotations is not None and t.annotations.title == t.title
        assert t.annotations.open_world_hint is False and t.annotations.destructive_hint is False
    hints = {n: (t.annotations.read_only_hint, t.annotations.idempotent_hint)  # type: ignore[union-attr]
             for n, t in tools.items()}
    assert hints == {"search_skills": (True, True), "sum_amounts": (True, True),
                     "record_feedback": (False, True), "log_run": (False, False)}
    assert tools["sum_amounts"].title == "Sum amounts (skill sum-amounts)"
    wire = tools["sum_amounts"].model_dump(by_alias=True, exclude_none=True)
    assert wire["annotations"]["readOnlyHint"] is True and wire["title"]
