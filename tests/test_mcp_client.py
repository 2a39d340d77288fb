"""The MCP client in the runtime (`whetstone.tools.mcp_client`), against real servers.

From the package registries: mcp-server-sqlite (PyPI, stdio) and
@modelcontextprotocol/server-filesystem (npm, stdio), installed by `make mcp-servers` and
skipped with the reason when missing. Built with the `mcp` SDK here: the test server of
tests/fixtures/mcp_test_server.py, over stdio and over streamable HTTP with a bearer token.
What is checked: listing (schemas, annotations), calls, structured results, tool errors,
time-outs, a server killed mid-call, two servers with a same-named tool, servers that cannot
start, allow-lists and the refusal of destructive tools, and that every server process is gone
after `close`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from mcp_support import (
    SHOP_DB,
    TEST_SERVER,
    filesystem_server,
    http_test_server,
    red_png,
    sdk_server_command,
    sqlite_server,
    starts,
    wait_gone,
)

from whetstone.engine.errors import ConfigError, ToolError
from whetstone.tools.base import Toolbox
from whetstone.tools.mcp_client import McpSessions
from whetstone.tools.mcp_config import (
    McpServer,
    command_name,
    load_mcp_config,
    tool_name,
    with_allowed,
)

# --- from PyPI: mcp-server-sqlite -------------------------------------------------------------


@pytest.mark.integration
def test_sqlite_server_from_pypi_lists_its_tools_and_answers_a_query(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    shutil.copy(SHOP_DB, db)
    server = McpServer.stdio(f"{sqlite_server()} --db-path {db}")
    assert server.name == "sqlite"  # mcp-server-sqlite -> sqlite
    with McpSessions([server]) as sessions:
        tools = {t.name: t for t in sessions.tools()}
        assert {"sqlite_read_query", "sqlite_list_tables", "sqlite_describe_table",
                "sqlite_write_query"} <= set(tools)
        spec = tools["sqlite_read_query"].spec
        assert spec.source == "mcp:sqlite/read_query"
        assert spec.parameters["required"] == ["query"]
        assert spec.parameters["properties"]["query"]["type"] == "string"
        assert sessions.refused == []  # this server annotates nothing: nothing is refused
        box = Toolbox.of(tools.values())
        rows = box.call("sqlite_read_query",
                        {"query": "SELECT stock FROM products WHERE name = 'Coral Puzzle'"})
        assert rows.ok and rows.output == "[{'stock': 300}]", rows
        assert rows.metadata["mcp"] == {"server": "sqlite", "tool": "read_query"}
        refused = box.call("sqlite_read_query", {"query": "DELETE FROM products"})
        assert "Only SELECT queries are allowed" in refused.output  # the server's own words


@pytest.mark.integration
def test_an_allow_list_offers_only_the_tools_it_names(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    shutil.copy(SHOP_DB, db)
    servers = with_allowed([McpServer.stdio(f"shop={sqlite_server()} --db-path {db}")],
                           ["shop_read_query", "shop_list_*"])
    with McpSessions(servers) as sessions:
        assert [t.name for t in sessions.tools()] == ["shop_read_query", "shop_list_tables"]
        refused = dict(sessions.refused)
        assert refused["shop_write_query"] == "not on the server's allow-list"
        assert "shop_describe_table" in refused


# --- from npm: @modelcontextprotocol/server-filesystem --------------------------------------


@pytest.mark.integration
def test_filesystem_server_from_npm_refuses_its_destructive_tools_and_returns_structure(
        tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "notes.txt").write_text("the code word is heron\n")
    (folder / "red.png").write_bytes(red_png())
    server = McpServer.stdio(f"files={filesystem_server()} {folder}")
    with McpSessions([server], images_dir=tmp_path / "images") as sessions:
        tools = {t.name: t for t in sessions.tools()}
        refused = dict(sessions.refused)
        # Its annotations: write_file, edit_file and move_file are destructive.
        assert {"files_write_file", "files_edit_file", "files_move_file"} <= set(refused)
        assert refused["files_write_file"] == "its annotations say it is destructive"
        assert "files_create_directory" in tools  # annotated destructiveHint false
        assert "files_read_text_file" in tools
        box = Toolbox.of(tools.values())
        read = box.call("files_read_text_file", {"path": str(folder / "notes.txt")})
        assert read.ok and read.output.strip() == "the code word is heron"
        assert read.metadata["mcp"]["structured"] == {"content": "the code word is heron\n"}
        outside = box.call("files_read_text_file", {"path": "/etc/hostname"})
        assert not outside.ok and "outside allowed directories" in (outside.error or "")
        image = box.call("files_read_media_file", {"path": str(folder / "red.png")})
        assert image.ok, image
        [saved] = image.metadata["image_inputs"]
        assert Path(saved).read_bytes() == red_png() and saved in image.output


@pytest.mark.integration
def test_an_allowed_destructive_tool_is_offered_and_runs(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    servers = with_allowed([McpServer.stdio(f"files={filesystem_server()} {folder}")],
                           ["files_write_file"])
    with McpSessions(servers) as sessions:
        [tool] = sessions.tools()
        assert tool.name == "files_write_file"
        done = Toolbox.of([tool]).call("files_write_file",
                                       {"path": str(folder / "a.txt"), "content": "hi"})
        assert done.ok, done
    assert (folder / "a.txt").read_text() == "hi"


# --- built with the SDK: over HTTP, with a token ---------------------------------------------


@pytest.mark.integration
def test_http_server_needs_its_token(tmp_path: Path) -> None:
    with http_test_server(token="s3cret") as url:
        with pytest.raises(ToolError, match=r"MCP server local .* did not start") as err:
            McpSessions([McpServer.http(url, start_timeout_s=20)]).start()
        assert "the URL is the server's /mcp endpoint" in (err.value.hint or "")
        server = McpServer.http(f"web={url}", headers={"Authorization": "Bearer s3cret"})
        with McpSessions([server]) as sessions:
            box = Toolbox.of(sessions.tools())
            assert "web_lookup" in box.names() and "web_wipe" not in box.names()
            found = box.call("web_lookup", {"item": "kettle"})
            assert found.ok and json.loads(found.output)["price"] == 24.5
            assert found.metadata["mcp"]["structured"] == {
                "item": "kettle", "price": 24.5, "server": "web"}


@pytest.mark.integration
def test_over_http_errors_time_outs_and_a_killed_server_are_observations(tmp_path: Path
                                                                          ) -> None:
    log = tmp_path / "starts.log"
    with http_test_server(name="web", log=log) as url:
        server = McpServer.http(f"web={url}", timeout_s=1.5)
        with McpSessions([server]) as sessions:
            box = Toolbox.of(sessions.tools())
            failed = box.call("web_fail", {"reason": "disk full"})
            assert not failed.ok and "failed on purpose: disk full" in (failed.error or "")
            missing = box.call("web_lookup", {"item": "sofa"})
            assert not missing.ok and "no item 'sofa'" in (missing.error or "")
            start = time.monotonic()
            slow = box.call("web_slow", {"seconds": 30})
            assert slow.timed_out and "did not answer in 1.5 s" in (slow.error or "")
            assert time.monotonic() - start < 10
            assert box.call("web_echo", {"text": "still here"}).output == "web: still here"
            start = time.monotonic()
            crashed = box.call("web_crash", {})
            assert not crashed.ok and time.monotonic() - start < 10
            [pid] = starts(log)
            assert wait_gone(pid)
            after = box.call("web_echo", {"text": "anyone?"})
            assert not after.ok and time.monotonic() - start < 15


# --- built with the SDK: over stdio ----------------------------------------------------------


@pytest.mark.integration
def test_a_stdio_server_killed_mid_call_is_reported_at_once_and_then_gone(tmp_path: Path
                                                                           ) -> None:
    log = tmp_path / "starts.log"
    with McpSessions([McpServer.stdio(sdk_server_command("box", log))]) as sessions:
        box = Toolbox.of(sessions.tools())
        start = time.monotonic()
        crashed = box.call("box_crash", {})
        assert time.monotonic() - start < 5
        assert crashed.error and "MCP server box stopped during the call" in crashed.error
        assert "crashing on purpose" in crashed.metadata["mcp"]["stderr"]
        [pid] = starts(log)
        assert wait_gone(pid)
        start = time.monotonic()
        again = box.call("box_echo", {"text": "x"})
        assert again.error and again.error.startswith("MCP server box is not running")
        assert time.monotonic() - start < 1


@pytest.mark.integration
def test_two_servers_with_a_same_named_tool_are_told_apart(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    servers = [McpServer.stdio(sdk_server_command(n, log)) for n in ("north", "south")]
    with McpSessions(servers) as sessions:
        box = Toolbox.of(sessions.tools())
        assert {"north_echo", "south_echo"} <= set(box.names())
        assert box.call("north_echo", {"text": "hi"}).output == "north: hi"
        assert box.call("south_echo", {"text": "hi"}).output == "south: hi"
        pids = starts(log)
        assert len(pids) == 2
    assert all(wait_gone(pid) for pid in pids)  # close stops every server
    with pytest.raises(ConfigError, match="two MCP servers are named north"):
        McpSessions([McpServer.stdio(sdk_server_command("north"))] * 2)


@pytest.mark.integration
def test_images_come_back_as_files_and_destructive_tools_stay_out(tmp_path: Path) -> None:
    with McpSessions([McpServer.stdio(sdk_server_command("art"))],
                     images_dir=tmp_path / "images") as sessions:
        box = Toolbox.of(sessions.tools())
        assert ("art_wipe", "its annotations say it is destructive") in sessions.refused
        assert "art_count" in box.names()  # annotated read-only
        picture = box.call("art_picture", {})
        [path] = picture.metadata["image_inputs"]
        assert Path(path).parent == tmp_path / "images"
        assert Path(path).read_bytes().startswith(b"\x89PNG")
        assert picture.output == f"[image: {path}]"
        assert box.call("art_count", {"words": ["a", "b", "c"]}).output == "3"


@pytest.mark.integration
def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    broken = McpServer.stdio(f"broken={sys.executable} -c "
                             "\"import sys; sys.stderr.write('no database given'); sys.exit(2)\"")
    with pytest.raises(ToolError, match=r"(?s)MCP server broken .* did not start.*"
                                        "no database given"):
        McpSessions([broken]).start()
    with pytest.raises(ToolError, match="MCP server nothing .* did not start"):
        McpSessions([McpServer.stdio("nothing=/no/such/mcp-server")]).start()
    log = tmp_path / "starts.log"
    good = McpServer.stdio(sdk_server_command("good", log))
    with pytest.raises(ToolError, match="MCP server broken"):
        McpSessions([good, broken]).start()
    assert all(wait_gone(pid) for pid in starts(log))  # the one that started is stopped
    silent = McpServer.stdio(f"silent={sys.executable} -c \"import time; time.sleep(60)\"",
                             start_timeout_s=1)
    start = time.monotonic()
    with pytest.raises(ToolError, match="no answer in 1 s"):
        McpSessions([silent]).start()
    assert time.monotonic() - start < 10


# --- naming and configuration ---------------------------------------------------------------


@pytest.mark.integration
def test_server_names_come_from_commands_and_urls() -> None:
    assert command_name(["mcp-server-sqlite", "--db-path", "x.db"]) == "sqlite"
    assert command_name(["npx", "-y", "@modelcontextprotocol/server-filesystem", "."]) \
        == "filesystem"
    assert command_name(["uvx", "mcp-server-git", "--repository", "."]) == "git"
    assert command_name(["python", "-m", "weather_mcp"]) == "weather"
    assert command_name(["/opt/bin/github-mcp-server", "stdio"]) == "github"
    assert McpServer.stdio("db=mcp-server-sqlite --db-path=a.db").name == "db"
    assert McpServer.stdio("mcp-server-sqlite --db-path=a.db").args == ("--db-path=a.db",)
    assert McpServer.http("https://mcp.example.com/mcp").name == "mcp_example_com"
    assert McpServer.http("docs=https://mcp.example.com/mcp").name == "docs"
    assert McpServer.http("http://127.0.0.1:8765/mcp").name == "local"
    assert tool_name("docs", "search.v2") == "docs_search_v2"
    with pytest.raises(ConfigError, match="not an http"):
        McpServer.http("ftp://x")
    with pytest.raises(ConfigError, match="cannot read the MCP command"):
        McpServer.stdio("mcp-server-sqlite 'unclosed")


@pytest.mark.integration
def test_allow_tool_goes_to_the_server_it_names() -> None:
    servers = [McpServer.stdio("docs=a"), McpServer.stdio("docs_search=b")]
    out = with_allowed(servers, ["docs_search_query", "docs_read"])
    assert out[0].allow == ("docs_read",) and out[1].allow == ("docs_search_query",)
    assert [s.allow for s in with_allowed(servers, ["*"])] == [("*",), ("*",)]
    with pytest.raises(ConfigError, match="no MCP server of that name") as err:
        with_allowed(servers, ["shop_read_query"])
    assert "docs_..." in (err.value.hint or "")


def test_the_mcp_servers_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCS_TOKEN", "t0k")
    (tmp_path / "bin").mkdir()
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {
        "shop": {"command": "./bin/serve", "args": ["--db-path", "shop.db"], "cwd": ".",
                 "env": {"LOG": "${DOCS_TOKEN}"}, "allowTools": ["read_query"],
                 "timeout": 5},
        "docs": {"type": "http", "url": "https://mcp.example.com/mcp",
                 "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}},
        "off": {"command": "x", "disabled": True}}}))
    shop, docs = load_mcp_config(config)
    assert shop.command == str(tmp_path / "bin" / "serve") and shop.cwd == str(tmp_path)
    assert shop.allow == ("read_query",) and shop.timeout_s == 5 and shop.env == {"LOG": "t0k"}
    assert docs.url == "https://mcp.example.com/mcp"
    assert docs.headers == {"Authorization": "Bearer t0k"}
    assert "t0k" not in docs.describe()
    for bad, message in [({"mcpServers": {"a": {"command": "x", "colour": 1}}}, "unknown key"),
                         ({"mcpServers": {"a": {"url": "https://h/mcp", "type": "sse"}}},
                          "SSE transport is not supported"),
                         ({"mcpServers": {"a": {"args": []}}}, "needs a command"),
                         ({"servers": {}}, "no mcpServers object"),
                         ({"mcpServers": {"a": {"command": "${NOT_SET_ANYWHERE}"}}},
                          r"\$\{NOT_SET_ANYWHERE\}, which is not set")]:
        config.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=message):
            load_mcp_config(config)
    config.write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_mcp_config(config)


@pytest.mark.integration
def test_the_sessions_can_be_used_from_many_threads(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with McpSessions([McpServer.stdio(sdk_server_command("par"))]) as sessions:
        box = Toolbox.of(sessions.tools())
        start = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: box.call("par_slow", {"seconds": 1}).output,
                                 range(8)))
        assert outs == ["slept 1.0"] * 8
        assert time.monotonic() - start < 6  # in parallel, not one after another


def test_the_test_servers_picture_is_a_png_pillow_reads() -> None:
    import io

    from PIL import Image

    sys.path.insert(0, str(TEST_SERVER.parent))
    try:
        from mcp_test_server import png
    finally:
        sys.path.remove(str(TEST_SERVER.parent))
    assert Image.open(io.BytesIO(png())).size == (2, 2)
