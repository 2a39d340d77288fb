"""The MCP client's pages run as written: README's tour line on the embedded model answers a
question only the server knows and the trace shows the call; docs/mcp.md's client section
(its commands, against mcp-server-sqlite from PyPI with a scripted model; its mcpServers
file; its Python block on the embedded model); and the MCP stage's data is what
benchmarks/mcp_shop.py makes, labels computed from the rows."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from mcp_support import REPO, SHOP_DB, sqlite_server

from whetstone.cli import cli
from whetstone.tools.mcp_config import load_mcp_config

DOC = REPO / "docs" / "mcp.md"
STAGE = REPO / "benchmarks" / "fixtures" / "mcp_shop"


def client_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split("## The other way round", 1)[1].split("\n## ", 1)[0]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", client_section(), re.DOTALL)


def with_server_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{sqlite_server().parent}{os.pathsep}{os.environ['PATH']}")


def stock(name: str) -> int:
    with sqlite3.connect(SHOP_DB) as db:
        return int(db.execute("SELECT stock FROM products WHERE name = ?", (name,)).fetchone()[0])


@pytest.mark.integration
@pytest.mark.slow
def test_the_readme_line_answers_through_the_server_and_the_trace_shows_the_call(
        tmp_path: Path) -> None:
    sqlite_server()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("whetstone run") and "--mcp" in x)
    env = {**os.environ, "WHETSTONE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "whetstone", *shlex.split(line)[1:],
                           "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    trace = json.loads(done.stdout)
    calls = [s for s in trace["steps"] if s["kind"] == "act"]
    assert calls and calls[0]["input"]["tool"] == "sqlite_read_query"
    assert calls[0]["meta"]["tool"]["mcp"] == {"server": "sqlite", "tool": "read_query"}
    assert str(stock("Coral Puzzle")) in calls[0]["output"]["observation"]
    assert str(stock("Coral Puzzle")) in trace["answer"]


def test_the_pages_commands_run_against_the_server(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with_server_on_path(monkeypatch)
    monkeypatch.chdir(tmp_path)
    shutil.copy(SHOP_DB, tmp_path / "shop.db")
    (tmp_path / "servers.json").write_text(blocks("json")[0])
    lines = [x for x in (STAGE / "tasks.jsonl").read_text().splitlines()
             if json.loads(x)["metadata"]["kind"] == "stock"]
    tasks = [json.loads(x) for x in lines]
    from whetstone.engine.evaluation.tasks import split_of

    train = [t for t in tasks if split_of(t["id"]) == "train"][:1]
    dev = [t for t in tasks if split_of(t["id"]) == "dev"][:1]
    (tmp_path / "shop-questions.jsonl").write_text("".join(
        json.dumps(t) + "\n" for t in train + dev))

    def replies(*ts: dict, tool: str = "shop_read_query") -> str:
        out = []
        for t in ts:
            name = t["metadata"]["args"][0]
            query = f"SELECT stock FROM products WHERE name = '{name}'"
            out += [f"Action: {tool}[{json.dumps({'query': query})}]",
                    f"Final Answer: {t['expected']}"]
        path = tmp_path / f"replies-{len(list(tmp_path.glob('replies-*')))}.json"
        path.write_text(json.dumps({"replies": out}))
        return f"scripted:{path}"

    run_line, eval_line, evolve_line = [x for x in blocks("bash")[0].splitlines() if x]
    coral = {"metadata": {"args": ["Coral Puzzle"]}, "expected": stock("Coral Puzzle")}
    res = CliRunner().invoke(cli, [*shlex.split(run_line)[1:], "--json", "--model",
                                   replies(coral, tool="sqlite_read_query")])
    assert res.exit_code == 0, res.output
    act = next(s for s in json.loads(res.stdout)["steps"] if s["kind"] == "act")
    assert act["output"]["observation"] == f"[{{'stock': {stock('Coral Puzzle')}}}]"
    res = CliRunner().invoke(cli, [*shlex.split(eval_line)[1:], "-j", "1", "--json",
                                   "--model", replies(train[0], dev[0])])
    assert res.exit_code == 0, res.output
    [result] = json.loads(res.stdout)["results"]
    assert [t["score"] for t in result["results"]] == [1.0, 1.0]
    (tmp_path / "lib").mkdir()
    res = CliRunner().invoke(cli, [*shlex.split(evolve_line)[1:], "-j", "1", "--library",
                                   "lib", "--model", replies(train[0], dev[0], dev[0])])
    assert res.exit_code == 0, res.output
    assert "demonstrations added" in res.output


def test_the_pages_mcp_servers_file_reads() -> None:
    [shop] = load_mcp_config_text(blocks("json")[0])
    assert shop.name == "shop" and shop.allow == ("read_query", "list_tables", "describe_table")
    assert shop.timeout_s == 30 and shop.args == ("--db-path", "shop.db")


def load_mcp_config_text(text: str) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "servers.json"
        path.write_text(text)
        return load_mcp_config(path)


@pytest.mark.slow
def test_the_pages_python_block_runs_on_the_embedded_model(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    with_server_on_path(monkeypatch)
    monkeypatch.chdir(tmp_path)
    shutil.copy(SHOP_DB, tmp_path / "shop.db")
    [code] = blocks("python")
    scope: dict = {"__name__": "doc"}
    exec(compile(code, str(DOC), "exec"), scope)  # noqa: S102 - the page's own code
    trace = scope["trace"]
    act = [s for s in trace.steps if s.kind == "act"]
    assert act and act[0].input["tool"] == "shop_read_query", trace.steps
    assert str(stock("Coral Puzzle")) in act[0].output["observation"]


@pytest.mark.integration
def test_the_stage_data_is_what_its_script_makes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "mcp_shop.py"), "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "shop.db").read_bytes() == (STAGE / "shop.db").read_bytes()
    assert (tmp_path / "tasks.jsonl").read_text() == (STAGE / "tasks.jsonl").read_text()
    with sqlite3.connect(STAGE / "shop.db") as db:
        for line in (STAGE / "tasks.jsonl").read_text().splitlines():
            task = json.loads(line)
            meta = task["metadata"]
            value = db.execute(meta["sql"], meta["args"]).fetchone()[0]
            assert task["expected"] == (value if task["scorer"] == "numeric" else str(value))
            assert all(str(a) in task["question"] for a in meta["args"])
    [shop] = load_mcp_config(STAGE / "servers.json")
    assert shop.allow == ("read_query", "list_tables", "describe_table")
    assert Path(shop.command).name == "mcp-server-sqlite" and shop.cwd == str(STAGE)
