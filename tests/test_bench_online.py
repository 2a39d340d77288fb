"""The online-learning replay runs end to end on the scripted model of a stage (tiny sizes:
its numbers are a test double's, only the run's shape is checked): both servers answer every
request through the stage's real MCP server, the adversarial replay runs, and the figure and
the page section are written, and written again from the saved run with --render."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_support import sqlite_server

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "bench_online.py"
pytestmark = pytest.mark.timeout(900)


@pytest.mark.integration
def test_the_replay_runs_with_a_frozen_a_learning_and_an_adversarial_server(
        tmp_path: Path) -> None:
    sqlite_server()  # the stage's MCP server (skipped, with the reason, when not installed)
    out, png = tmp_path / "online.json", tmp_path / "online.png"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--model", "scripted", "--requests", "90", "--window",
         "30", "--every", "30", "--share", "0.3", "--min-scored", "10", "--min-rollback", "5",
         "--max-scored", "60", "--solver", "direct", "-j", "2", "--out", str(out), "--png",
         str(png)], check=False, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    by = {(r["replay"], r["server"]) for r in data["requests"]}
    assert by == {("honest", "frozen"), ("honest", "learning"), ("adversarial", "learning")}
    assert len(data["requests"]) == 3 * 90
    assert all(r["turns"] >= 1 for r in data["requests"])  # the client ran the tool calls
    assert [w["requests"] for w in data["analysis"]["windows"]] == [[1, 30], [31, 60], [61, 90]]
    assert "![served accuracy per window](" in data["markdown"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for line in ("first promotion:", "last 90 requests: frozen", "harmful promotions"):
        assert line in run.stdout, run.stdout
    png.unlink()
    again = subprocess.run([sys.executable, str(BENCH), "--render", "--out", str(out), "--png",
                            str(png)], check=False, capture_output=True, text=True, timeout=300,
                           cwd=REPO)
    assert again.returncode == 0, again.stderr[-2000:]
    assert png.is_file() and "last 90 requests" in again.stdout
