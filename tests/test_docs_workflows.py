"""docs/workflows.md's blocks run as written: the example file is a valid workflow that answers
through a shop's own read tool, and the evolve command runs (on a slice, with a scripted model
and no exploration: the page's own command with its full slices takes the real models)."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.methods.workflows.records import parse_workflows
from whetstone.engine.methods.workflows.runner import run_workflow
from whetstone.tools.base import Toolbox
from whetstone.tools.functions import function_tool

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "workflows.md"
SQLITE_SERVER = REPO / ".cache" / "mcp-servers" / "sqlite-venv" / "bin" / "mcp-server-sqlite"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.workflows
def test_the_example_file_is_a_workflow_that_answers(tmp_path: Path) -> None:
    (text,) = blocks("yaml")
    (workflow,), problems = parse_workflows(text, path="workflows/shop.yaml")
    assert problems == []
    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE products (name TEXT, price_cents INTEGER, deleted INTEGER)")
        con.executemany("INSERT INTO products VALUES (?, ?, ?)",
                        [("Ruby Mat", 999, 1), ("Ruby Mat", 1250, 0), ("O'Hara Lamp", 4000, 0)])

    def shop_read_query(query: str) -> str:
        """Run a read-only SQL query."""
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            con.row_factory = sqlite3.Row
            return str([dict(r) for r in con.execute(query)])

    tools = Toolbox.of([function_tool(shop_read_query)])
    done = run_workflow(workflow, {"name": "Ruby Mat"}, tools.call)
    assert done.value == "12.5"  # the live row, its cents read back as dollars
    assert run_workflow(workflow, {"name": "O'Hara Lamp"}, tools.call).value == "40"


@pytest.mark.workflows
@pytest.mark.skipif(not SQLITE_SERVER.exists(), reason="mcp-server-sqlite is not installed "
                    "(make mcp-servers)")
def test_the_evolve_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = blocks("bash")
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:3] == ["whetstone", "evolve", "workflows"]
    args = [re.sub(r":0:\d+$", ":0:3", w) for w in words[3:]]
    args[args.index("--analyst") + 1] = "scripted:"  # the page names the 1.5B
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["I do not know."] * 40))
    monkeypatch.chdir(REPO)
    lib = tmp_path / "lib"
    runner = CliRunner()
    assert runner.invoke(cli, ["library", "init", "--library", str(lib)]).exit_code == 0
    result = runner.invoke(cli, ["evolve", "workflows", *args, "--library", str(lib),
                                 "--model", f"scripted:{replies}", "--max-analyst-calls", "0",
                                 "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "the evolver proposed no change" in result.output
