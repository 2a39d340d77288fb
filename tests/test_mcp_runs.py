"""MCP servers in `whetstone run`, `eval` and `evolve` (scripted models, the SDK-built test
server): the trace records each call like any tool call, a server that times out or dies
mid-run leaves an observation and the run goes on to an answer, each command starts its
servers once and stops them, the tool options' mistakes are errors that say what to do, and an
image a tool returns reaches a model that reads images."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner
from mcp_support import sdk_server_command, starts, wait_gone

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.library_store.store import Library
from whetstone.tools.mcp_config import McpServer


def script(tmp_path: Path, replies: list[str]) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.output


def test_run_calls_the_servers_tool_and_the_trace_shows_the_call(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    model = script(tmp_path, ['Action: shop_lookup[{"item": "kettle"}]', "Final Answer: 24.5"])
    code, out, text = run("run", "What does the shop charge for a kettle?", "--model", model,
                          "--tools", "", "--mcp", sdk_server_command("shop", log), "--json")
    assert code == 0, text
    trace = json.loads(out)
    assert trace["answer"] == "24.5"
    prepare = trace["steps"][0]
    assert "shop_lookup" in prepare["output"]["tools"] and "shop_wipe" not in \
        prepare["output"]["tools"]
    act = next(s for s in trace["steps"] if s["kind"] == "act")
    assert act["input"] == {"tool": "shop_lookup", "arguments": {"item": "kettle"}}
    assert json.loads(act["output"]["observation"])["price"] == 24.5
    assert act["meta"]["tool"]["mcp"] == {"server": "shop", "tool": "lookup", "structured": {
        "item": "kettle", "price": 24.5, "server": "shop"}}
    assert "MCP tool shop_wipe is not offered: its annotations say it is destructive" in text
    [pid] = starts(log)
    assert wait_gone(pid)  # stopped when the command ended


def test_a_server_that_times_out_or_dies_mid_run_leaves_an_observation_and_the_run_answers(
        tmp_path: Path) -> None:
    model = script(tmp_path, ['Action: shop_slow[{"seconds": 30}]',
                              'Action: shop_crash[{}]', "Final Answer: I could not look it up."])
    start = time.monotonic()
    code, out, text = run("run", "What does a kettle cost?", "--model", model, "--tools", "",
                          "--mcp", sdk_server_command("shop"), "--mcp-timeout", "1", "--json")
    assert code == 0, text
    assert time.monotonic() - start < 40
    trace = json.loads(out)
    slow, crash = [s for s in trace["steps"] if s["kind"] == "act"]
    assert slow["output"]["timed_out"] and "did not answer in 1 s" in slow["error"]
    assert "MCP server shop stopped during the call" in crash["error"]
    assert trace["outcome"] == "answered" and trace["answer"] == "I could not look it up."


def test_eval_comparing_two_versions_starts_the_server_once(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/a/SKILL.md": "---\nname: a\ndescription: A first skill.\n---\nA.\n"},
               method="test")
    lib.commit({"skills/b/SKILL.md": "---\nname: b\ndescription: A second skill.\n---\nB.\n"},
               method="test")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"p{i}", "question": f"Price of a {item}?",
                                         "expected": price, "scorer": "numeric"}) + "\n"
                             for i, (item, price) in enumerate([("kettle", 24.5),
                                                                ("lamp", 12.25)])))
    replies = []
    for _ in range(2):  # each version
        for item, price in [("kettle", 24.5), ("lamp", 12.25)]:
            replies += [f'Action: shop_lookup[{{"item": "{item}"}}]', f"Final Answer: {price}"]
    code, out, text = run("eval", "--tasks", str(tasks), "--model", script(tmp_path, replies),
                          "--library", str(lib.root), "--compare", "v1", "v2", "-j", "1",
                          "--tools", "", "--mcp", sdk_server_command("shop", log), "--json")
    assert code == 0, text
    results = json.loads(out)["results"]
    assert [[t["score"] for t in r["results"]] for r in results] == [[1.0, 1.0]] * 2
    [pid] = starts(log)
    assert wait_gone(pid)


def test_evolve_runs_the_agent_with_the_servers_tools_and_starts_it_once(tmp_path: Path
                                                                           ) -> None:
    log = tmp_path / "starts.log"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "p0", "question": "Price of a kettle?",
                                 "expected": 24.5, "scorer": "numeric"}) + "\n")
    held = tmp_path / "held.jsonl"  # the gate decides on another question than it learns
    held.write_text(json.dumps({"id": "g0", "question": "How much is a kettle?",
                                "expected": 24.5, "scorer": "numeric"}) + "\n")
    one = ['Action: shop_lookup[{"item": "kettle"}]', "Final Answer: 24.5"]
    (tmp_path / "lib").mkdir()  # an empty folder becomes the library
    code, _, text = run("evolve", "memory", "--tasks", str(tasks), "--gate-tasks", str(held),
                        "--model", script(tmp_path, one * 3), "--library",
                        str(tmp_path / "lib"), "--tools", "", "--mcp",
                        sdk_server_command("shop", log), "-j", "1", "--json",
                        # what memory keeps is under test, not the gate: a dev tie that adds
                        # tokens is rejected by the default (cost-aware) rule
                        "--gate-rule", "mean_not_worse")
    assert code == 0, text
    lib = Library.open(tmp_path / "lib")
    assert "shop_lookup" in lib.snapshot().read_text("memory/demonstrations.md")
    [pid] = starts(log)
    assert wait_gone(pid)


def test_the_tool_options_mistakes_say_what_to_do(tmp_path: Path) -> None:
    model = script(tmp_path, ["Final Answer: x"])
    code, _, text = run("run", "x", "--model", model, "--mcp", sdk_server_command("shop"),
                        "--allow-tool", "sales_read")
    assert code == 2 and "no MCP server of that name" in text and "shop_..." in text
    code, _, text = run("run", "x", "--model", model, "--mcp-header", "Authorization: Bearer t")
    assert code == 2 and "--mcp-header is for --mcp-url servers" in text
    code, _, text = run("run", "x", "--model", model, "--mcp-url", "https://h/mcp",
                        "--mcp-header", "no colon here")
    assert code == 2 and "write 'NAME: VALUE'" in text
    code, _, text = run("run", "x", "--model", model, "--mcp", "gone=/no/such/server")
    assert code == 1 and "MCP server gone (/no/such/server) did not start" in text
    code, _, text = run("run", "x", "--model", model, "--mcp-config", str(tmp_path / "no.json"))
    assert code == 2 and "cannot read the MCP config" in text


def test_an_image_the_server_returns_reaches_a_model_that_reads_images(tmp_path: Path) -> None:
    model = ScriptedBackend(["Action: art_picture[{}]", "Final Answer: red"], vision=True)
    with Engine(model, library=tmp_path / "lib", create=True, checkpointing=False,
                tools=[McpServer.stdio(sdk_server_command("art"))]) as engine:
        trace = engine.run("What colour is the picture?")
    assert trace.answer == "red"
    last = model.requests[1].messages[-1]
    [image] = last.images
    assert Path(image).read_bytes().startswith(b"\x89PNG")
    assert str(image) in last.text  # the path is named in the observation too
    text_only = ScriptedBackend(["Action: art_picture[{}]", "Final Answer: red"])
    with Engine(text_only, library=tmp_path / "lib2", create=True, checkpointing=False,
                tools=[McpServer.stdio(sdk_server_command("art"))]) as engine:
        engine.run("What colour is the picture?")
    assert text_only.requests[1].messages[-1].images == []
