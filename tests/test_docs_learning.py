"""docs/learning.md runs as written: its commands with the docs' fake model
(``tests/docs_support.py``), the long-running ones (``serve``, ``learn``) started in the
background until they say they are up, then stopped; its feedback body is what the server
takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from docs_support import REPO
from servers import free_port
from test_docs_blocks import argv, blocks, commands, home, invoke  # noqa: F401

SUPPORT = REPO / "tests" / "docs_support.py"
PAGE = "docs/learning.md"


def start(args: list[str], tmp: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, str(SUPPORT), str(tmp / "scratch"), *args],
                                cwd=os.getcwd(), env=os.environ.copy(), stdout=out,
                                stderr=subprocess.STDOUT)


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, \
            log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.integration
def test_the_learning_page_runs_as_written(home: Path, tmp_path: Path) -> None:  # noqa: F811
    Path("keys.txt").write_text("alice-key\nbob-key\ncarol-key\n")
    invoke(["library", "init", "--library", "./lib"])
    ran: list[str] = []
    running: list[subprocess.Popen[bytes]] = []
    try:
        for block in blocks(PAGE, "bash"):
            for command in commands(block):
                args = argv(command, {})
                if args[0] in ("serve", "learn"):
                    log = tmp_path / f"{args[0]}-{len(running)}.log"
                    if args[0] == "serve":
                        port = str(free_port())
                        args[args.index("--port") + 1] = port
                    proc = start(args, tmp_path, log)
                    running.append(proc)
                    if args[0] == "serve":
                        wait_until(lambda port=port: healthy(f"http://127.0.0.1:{port}/health"),
                                   proc, log)
                    else:
                        wait_until(lambda log=log: "holds the lease" in log.read_text(
                            errors="replace"), proc, log)
                elif args[:2] == ["library", "rollback"]:
                    from whetstone import open_library

                    open_library(Path("lib")).commit({"memory/notes.md": "# Notes\n"},
                                                     method="hand", message="one to undo",
                                                     validate=False)
                    invoke(args)
                    assert open_library(Path("lib")).manifest().root == \
                        open_library(Path("lib")).manifest("v1").root
                else:
                    invoke(args)
                ran.append(" ".join(args[:2]))
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = [proc.wait(timeout=60) for proc in running]
    assert all(c in (0, 130) for c in codes), codes
    body = json.loads(blocks(PAGE, "json")[0])
    assert set(body) == {"trace_id", "score", "label"}
    assert ran.count("serve --library") == 2 and "learn --library" in ran
    assert {"library canary", "library log", "library rollback"} <= set(ran), ran
