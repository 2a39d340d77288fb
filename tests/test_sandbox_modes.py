"""The sandbox in each mode this machine supports: bubblewrap or a plain subprocess, limits by a
cgroup or by the watchdog. The limits and the cleanup hold in every mode; the weaker modes say
that they are weaker. Modes the machine cannot run are skipped with the reason."""

from __future__ import annotations

import functools
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.sandbox_support import marker, survivors
from whetstone.engine.errors import ToolError
from whetstone.tools.base import Toolbox
from whetstone.tools.builtin import make_python
from whetstone.tools.isolation import find_bwrap
from whetstone.tools.sandbox import Sandbox
from whetstone.tools.sandbox_limits import find_cgroup_place

MODES = [("bwrap", "cgroup"), ("bwrap", "watchdog"), ("process", "cgroup"),
         ("process", "watchdog")]


@functools.cache
def _sandbox(isolation: str, limits: str) -> Sandbox | str:
    try:
        box = Sandbox.detect(isolation=isolation, limits=limits)  # type: ignore[arg-type]
    except ToolError as exc:
        return exc.message
    # As root without bubblewrap, code runs only where root can be given up (see
    # test_process_mode_as_root_never_runs_code_as_root).
    return box.refusal or box


@pytest.fixture(params=MODES, ids=["-".join(m) for m in MODES])
def box(request: pytest.FixtureRequest) -> Sandbox:
    made = _sandbox(*request.param)
    if isinstance(made, str):
        pytest.skip(f"{'-'.join(request.param)} cannot run here: {made}")
    return made


def test_modes_report_what_they_are(box: Sandbox) -> None:
    res = box.run_python("print(6 * 7)")
    assert res.ok and res.stdout == "42\n"
    assert res.isolation == box.status.isolation
    assert res.limits == box.status.limits != "" and res.warnings == box.status.warnings
    weak = box.status.isolation == "process" or box.status.limits == "watchdog"
    assert box.status.strong is not weak
    assert bool(res.warnings) is weak
    if box.status.isolation == "process":
        assert any("bubblewrap is unavailable" in w for w in res.warnings)
    if box.status.limits == "watchdog":
        assert any("watchdog" in w for w in res.warnings)
    tool = Toolbox.of([make_python(sandbox=box)]).call("python", {"code": "1 + 1"})
    assert tool.output.strip() == "2"
    assert tool.metadata["sandbox"]["isolation"] == box.status.isolation
    assert bool(tool.metadata["sandbox"].get("warnings")) is weak


def test_too_many_processes_are_stopped_in_every_mode(box: Sandbox) -> None:
    word = marker()
    if box.status.limits == "watchdog":
        # The watchdog bounds how long a fork bomb runs, not how far it gets between two polls
        # (thousands of processes): on a shared machine, test it with a bounded swarm.
        code = ("import os, time\n"
                "for i in range(200):\n"
                "    if os.fork() == 0:\n"
                "        time.sleep(60)\n"
                "        os._exit(0)\n"
                "time.sleep(60)\n")
    else:
        code = ("import os\n"
                "while True:\n"
                "    try:\n"
                "        os.fork()\n"
                "    except OSError:\n"
                "        pass\n")
    start = time.monotonic()
    res = box.run_python(code, timeout_s=5, max_tasks=32, args=(word,))
    assert time.monotonic() - start < 4
    assert res.processes_exceeded and not res.timed_out
    assert "more than 32 processes" in res.stderr
    assert survivors(word) == []


def test_memory_across_forks_is_limited_in_every_mode(box: Sandbox) -> None:
    word = marker()
    code = ("import os, time\n"
            "for i in range(8):\n"
            "    if os.fork() == 0:\n"
            "        block = b'x' * (150 * 1024 * 1024)\n"
            "        time.sleep(5)\n"
            "        os._exit(0)\n"
            "for i in range(8):\n"
            "    os.wait()\n"
            "print('ALL HELD')")
    res = box.run_python(code, timeout_s=15, memory_mb=400, args=(word,))
    assert res.memory_exceeded and "ALL HELD" not in res.stdout
    assert "used more than 400 MB together" in res.stderr
    assert survivors(word) == []


def test_a_daemon_is_killed_and_reported_in_every_mode(box: Sandbox) -> None:
    word = marker()
    code = ("import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.execv(sys.executable, [sys.executable, '-c', "
            "'import time; time.sleep(60)', sys.argv[1]])\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "time.sleep(0.3)\n"
            "print('done')")
    start = time.monotonic()
    res = box.run_python(code, timeout_s=8, args=(word,))
    assert time.monotonic() - start < 4
    assert res.ok and res.stdout == "done\n" and res.leftovers == 1
    assert "left 1 process(es) running; they were killed" in res.stderr
    assert survivors(word) == []


def test_a_timeout_kills_what_left_the_group_in_every_mode(box: Sandbox) -> None:
    word = marker()
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "time.sleep(60)\n")
    start = time.monotonic()
    res = box.run_python(code, timeout_s=1, args=(word,))
    assert res.timed_out and time.monotonic() - start < 3.5
    assert survivors(word) == []


def test_an_output_flood_is_cut_in_every_mode(box: Sandbox) -> None:
    res = box.run_python("while True: print('x' * 1000)", timeout_s=10)
    assert res.output_exceeded and not res.timed_out and res.duration_s < 8


def test_a_missing_bubblewrap_falls_back_loudly(tmp_path: object) -> None:
    box = Sandbox.detect(bwrap="/nonexistent/bwrap")
    assert box.status.isolation == "process" and not box.status.strong
    assert "no bubblewrap executable at /nonexistent/bwrap" in box.status.warnings[0]
    assert "WEAK" in box.status.describe()
    res = box.run_python("import os; print('still runs as', os.geteuid())")
    assert res.warnings == box.status.warnings
    if box.refusal is None:  # a normal user, or root that could give root up
        assert res.ok and res.stdout.startswith("still runs as ")
        assert res.stdout != "still runs as 0\n"
    else:
        assert res.returncode == 126 and "would run as root" in res.stderr
    with pytest.raises(ToolError, match="cannot sandbox tool code"):
        Sandbox.detect(isolation="bwrap", bwrap="/nonexistent/bwrap")


def test_process_mode_as_root_never_runs_code_as_root() -> None:
    """Without bubblewrap, root gives root up (setpriv) when the unprivileged uid can read
    this Python, and refuses every call when it cannot: code never runs as uid 0."""
    if os.geteuid() != 0:
        pytest.skip("runs as root only: a normal user has no root to give up")
    box = Sandbox.detect(isolation="process")
    canary = Path(tempfile.gettempdir()) / f"whetstone-canary-{uuid.uuid4().hex}"
    res = box.run_python(f"import os\nopen({str(canary)!r}, 'w').write(str(os.geteuid()))\n"
                         "print(os.geteuid(), os.getegid(), os.getgroups())")
    if box.refusal is not None:
        assert res.returncode == 126 and not res.ok and not canary.exists()
        assert "install bubblewrap" in res.stderr and box.refusal in box.status.warnings
        assert box.status.runs_as.startswith("nothing runs")
    else:
        assert res.stdout.split()[:2] == ["65534", "65534"], res
        canary.unlink()


def test_this_machine_gets_the_strong_sandbox_when_it_can() -> None:
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed (make install installs it where apt exists)")
    box = Sandbox.detect()
    assert box.status.isolation == "bwrap", box.status.describe()
    if find_cgroup_place() is not None:
        assert box.status.strong and box.status.warnings == ()
