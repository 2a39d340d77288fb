"""Issue 45 item 5, typos and round trips, each through the command line as a user runs it
(scripted models, the SDK-built MCP test server): an allow-list entry that names no tool, a
preview of a server's tools, tool arguments checked against the tool's schema, imports into
a missing library and of spans exported without content, drafts in ``library validate``,
``--tools module:function`` beside the user, mistakes reported before the model loads, and a
wrapped client in front of a Whetstone server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from mcp_support import sdk_server_command, starts, wait_gone
from middleware_support import USER, echo, make_library
from servers import Servers

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend

REPO = Path(__file__).resolve().parent.parent
NO_MODEL = "hf:/nonexistent/model"  # loading it fails (exit 3): what comes first is a check


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def script(tmp_path: Path, *replies: Any) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(list(replies)))
    return f"scripted:{path}"


@pytest.mark.integration
def test_an_allow_tool_that_names_no_tool_of_the_live_server_lists_its_tools(
        tmp_path: Path) -> None:
    """``--allow-tool test_lokup``: the run went on with no tool of the server offered."""
    log = tmp_path / "starts.log"
    code, out = invoke("run", "What does a kettle cost?", "--model",
                       script(tmp_path, "Final Answer: 24.5"), "--mcp",
                       sdk_server_command("test", log), "--allow-tool", "test_lokup")
    assert code == 2, out
    assert "--allow-tool/allowTools test_lokup: MCP server test has no such tool" in out
    assert "test_lookup, test_echo" in out and "test_*" in out, out
    [pid] = starts(log)
    assert wait_gone(pid)  # stopped with the error


@pytest.mark.integration
def test_tools_ls_previews_a_servers_tools_and_what_a_run_would_be_offered(
        tmp_path: Path) -> None:
    server = sdk_server_command("test")
    code, out = invoke("tools", "ls", "--mcp", server, "--json")
    assert code == 0, out
    rows = {r["name"]: r for r in json.loads(out)["mcp"]}
    assert rows["test_lookup"]["description"] == "Look up an item's price in the shop."
    assert rows["test_lookup"]["read_only"] and rows["test_lookup"]["allowed"]
    assert rows["test_wipe"]["destructive"] and not rows["test_wipe"]["allowed"]
    assert "destructive" in rows["test_wipe"]["why"]
    code, out = invoke("tools", "ls", "--mcp", server, "--allow-tool", "test_wipe")
    assert code == 0, out
    (wipe,) = [x for x in out.splitlines() if "test_wipe" in x]
    (lookup,) = [x for x in out.splitlines() if "test_lookup" in x]
    assert "destructive" in wipe and "yes" in wipe, wipe
    assert "read-only" in lookup and "no: not on the server's allow-list" in lookup, lookup


@pytest.mark.integration
def test_arguments_that_do_not_fit_the_schema_come_back_naming_the_field(
        tmp_path: Path) -> None:
    """A built-in, a function and an MCP tool, each called with an argument of the wrong
    type: the model reads which field, from the one check every tool kind goes through (the
    calculator computed "['17*23']" and the function raised a TypeError; the server had to
    find out for itself)."""
    (tmp_path / "shop.py").write_text(
        'def total(items: list[int]) -> int:\n    """Add up the items.\n\n    Args:\n'
        '        items: the amounts\n    """\n    return sum(items)\n')
    calls = [("calculator", {"expression": ["17*23"]}), ("total", {"items": [2, "x"]}),
             ("test_count", {"words": "a b c"})]
    model = script(tmp_path, {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]},
                   "Final Answer: done")
    code, out = invoke("run", "Use the tools.", "--model", model, "--json", "--tools",
                       f"calculator,{tmp_path / 'shop.py'}:total", "--mcp",
                       sdk_server_command("test"))
    assert code == 0, out
    trace = json.loads(out[out.index("{"):])
    seen = {s["input"]["tool"]: s for s in trace["steps"] if s["kind"] == "act"}
    expected = {"calculator": "expression must be string, not array",
                "total": "items[1] must be integer, not string",
                "test_count": "words must be array, not string"}
    for tool, why in expected.items():
        observation = seen[tool]["output"]["observation"]
        assert observation.startswith(f"Error in {tool}: {why}"), observation
        assert "takes" in observation  # and what the tool takes


def test_traces_import_into_a_missing_library_refuses(tmp_path: Path) -> None:
    log = tmp_path / "chat.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2?"},
                                            {"role": "assistant", "content": "4"}]}) + "\n")
    code, out = invoke("traces", "import", str(log), "--library", str(tmp_path / "typo"))
    assert code == 5 and "no library at" in out, out
    assert not (tmp_path / "typo").exists()


def test_spans_exported_without_content_say_how_to_export_them(tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    code, out = invoke("run", "What is 17 * 23?", "--model", script(tmp_path, "Final Answer: 391"),
                       "--otel-file", str(spans))
    assert code == 0 and spans.is_file(), out
    (tmp_path / "other").mkdir()
    code, out = invoke("traces", "import", str(spans), "--library", str(tmp_path / "other"))
    assert code == 2, out
    assert "exported without content; export with --otel-content to import it" in out, out


def test_library_validate_checks_the_drafts_too(tmp_path: Path) -> None:
    """A drafted skill broken by hand: validate said ok (exit 0); commit then refused."""
    lib = str(tmp_path / "lib")
    assert invoke("library", "init", "--library", lib)[0] == 0
    assert invoke("skill", "new", "unit-math", "-d", "Convert units.", "--library", lib)[0] == 0
    code, out = invoke("library", "validate", "--library", lib)
    assert code == 0 and "1 hand-edited or drafted file(s)" in out, out
    draft = tmp_path / "lib" / "skills" / "unit-math" / "SKILL.md"
    draft.write_text(draft.read_text().replace("name: unit-math", "name: Unit Math"))
    code, out = invoke("library", "validate", "--library", lib)
    assert code == 5, out
    assert "skills/unit-math/SKILL.md" in out and "name-format" in out, out
    assert invoke("library", "commit", "-m", "units", "--library", lib)[0] == 5  # agrees


@pytest.mark.integration
def test_tools_module_function_is_found_in_the_current_folder(tmp_path: Path) -> None:
    """As the installed ``whetstone`` script runs: its own folder is on sys.path, the one it
    was started in is not (``-P``), and ``--tools shoptools:price`` beside shoptools.py was
    'No module named shoptools'."""
    (tmp_path / "shoptools.py").write_text(
        'def price(item: str) -> float:\n    """The price of an item.\n\n    Args:\n'
        '        item: its name\n    """\n    return {"kettle": 24.5}.get(item, 0.0)\n')
    replies = [{"tool_calls": [{"name": "price", "arguments": {"item": "kettle"}}]},
               "Final Answer: 24.5"]
    (tmp_path / "r.json").write_text(json.dumps(replies))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-P", "-m", "whetstone", "run", "A kettle's price?",
                          "--tools", "shoptools:price", "--model", "scripted:r.json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert "Observation: 24.5" in run.stdout and "Answer: 24.5" in run.stdout


@pytest.mark.integration
def test_mistakes_in_tools_and_mcp_servers_are_reported_before_the_model_loads(
        tmp_path: Path) -> None:
    """With a model that cannot load, the error is the mistyped tool's (2), not the model's
    (3): the tools were read after the model loaded, seconds later for the embedded one."""
    code, out = invoke("run", "hi", "--model", NO_MODEL, "--tools", "no_such_module:fn")
    assert code == 2 and "no_such_module" in out, out
    server = sdk_server_command("test")
    code, out = invoke("run", "hi", "--model", NO_MODEL, "--mcp", server,
                       "--allow-tool", "test_lokup")
    assert code == 2 and "has no such tool" in out, out
    tasks = REPO / "tests" / "fixtures" / "tasks" / "arith.jsonl"
    code, out = invoke("eval", "--tasks", str(tasks), "--model", NO_MODEL, "--mcp", server,
                       "--allow-tool", "test_lokup")
    assert code == 2 and "has no such tool" in out, out
    code, out = invoke("run", "hi", "--model", "embeded")  # the spec's family, at once
    assert code == 2 and "unknown model spec" in out, out


@pytest.mark.trace2skill
def test_mistyped_options_are_reported_before_the_model_loads(tmp_path: Path) -> None:
    """eval's scorer and version, evolve's task sets, gate rule, analyst and trace filter:
    each was read after the model loaded (exit 3 here, seconds later with a real one)."""
    tasks = str(REPO / "tests" / "fixtures" / "tasks" / "arith.jsonl")
    assert invoke("library", "init")[0] == 0
    cases = [
        (["eval", "--tasks", tasks, "--scorer", "nosuch"], "unknown scorer 'nosuch'"),
        (["eval", "--tasks", tasks, "--version", "v9"], "version v9 does not exist"),
        (["evolve", "trace2skill", "--skill", "x", "--gate-tasks", "nosuch.jsonl"],
         "nosuch.jsonl does not exist"),
        (["evolve", "trace2skill", "--skill", "x", "--tasks", "nosuch.jsonl"],
         "nosuch.jsonl does not exist"),
        (["evolve", "trace2skill", "--skill", "x", "--gate-rule", "bogus"],
         "cannot read gate rule 'bogus'"),
        (["evolve", "trace2skill", "--skill", "x", "--analyst", "embeded"],
         "unknown model spec 'embeded'"),
        (["evolve", "trace2skill", "--skill", "x", "--traces", "colour=red"],
         "unknown trace filter"),
    ]
    for args, said in cases:
        code, out = invoke(*args, "--model", NO_MODEL)
        assert code != 3 and said in out, (args, out)


@pytest.mark.integration
def test_a_wrapped_client_of_a_whetstone_server_applies_the_library_once(
        tmp_path: Path) -> None:
    """The client's engine and the server each apply a library: the guidance went in twice.
    The wrapped client marks what it adapted, and the server passes that through."""
    upstream = ScriptedBackend(responder=echo)
    library = make_library(tmp_path / "lib")
    server = Engine(upstream, library=library.root, checkpointing=False)
    client_engine = Engine(ScriptedBackend(responder=echo), library=library.root,
                           checkpointing=False)
    with Servers() as servers:
        url = servers.start(server.app(model_name="up")) + "/v1"
        client = client_engine.wrap(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
        client.chat.completions.create(model="up", messages=USER)
        plain = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        plain.chat.completions.create(model="up", messages=USER)  # the server alone
    wrapped, alone = (r.messages[0].text for r in upstream.requests)
    assert wrapped.count("unit-conversion") == alone.count("unit-conversion") >= 1, wrapped
    server.close()
    client_engine.close()
