"""The python tool tried as an attacker would: every attempt is stopped, reported as an
observation, leaves nothing running, and the next call works.

Each of these failed on the subprocess-only sandbox that came before bubblewrap: there the code
connected to 127.0.0.1, read the home folder and the caller's environment, signalled its caller,
wrote outside its folder, used 3 GB across forks under a 512 MB limit and left daemons running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox_support import marker, survivors
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ToolError
from whetstone.engine.runtime import Agent
from whetstone.tools.base import Toolbox
from whetstone.tools.builtin import make_python
from whetstone.tools.sandbox import default_sandbox, run_python

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def needs_bubblewrap() -> None:
    status = default_sandbox().status
    if status.isolation != "bwrap":
        pytest.skip("the sandbox runs without bubblewrap here: " + "; ".join(status.warnings))


@pytest.fixture
def python_box() -> Toolbox:
    return Toolbox.of([make_python(timeout_s=5)])


def still_works(box: Toolbox) -> None:
    """The run goes on: the same toolbox answers the next call."""
    res = box.call("python", {"code": "6 * 7"})
    assert res.ok and res.output.strip() == "42", res


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records whatever reaches it."""
    got: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                got.append(conn.recv(100) or b"<connected>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], got
    stop.set()
    thread.join()
    srv.close()


def test_no_network_not_even_loopback(listener: tuple[int, list[bytes]],
                                      python_box: Toolbox) -> None:
    port, got = listener
    code = ("import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'stolen')\n"
            "print('CONNECTED')")
    res = python_box.call("python", {"code": code})
    time.sleep(0.3)
    assert got == [] and "CONNECTED" not in res.output
    assert not res.ok and "Error" in res.observation("python")
    assert "ConnectionRefusedError" in res.output or "OSError" in res.output
    still_works(python_box)


def test_cannot_read_files_outside_its_folder(tmp_path: Path, python_box: Toolbox) -> None:
    secret = uuid.uuid4().hex
    home_file = Path.home() / f".whetstone-test-secret-{secret[:8]}"
    home_file.write_text(secret)
    near = tmp_path / "secret.txt"
    near.write_text(secret)
    try:
        code = ("import os\n"
                f"for p in [{str(home_file)!r}, {str(near)!r}, '/etc/shadow']:\n"
                "    try:\n"
                "        print(p, open(p).read())\n"
                "    except OSError as exc:\n"
                "        print(p, 'DENIED', type(exc).__name__)\n"
                f"print('HOME', os.path.exists({str(Path.home())!r}) and "
                f"os.listdir({str(Path.home())!r}))")
        res = python_box.call("python", {"code": code})
    finally:
        home_file.unlink()
    assert secret not in res.output
    assert res.output.count("DENIED") == 3
    shadow = Path("/etc/shadow")
    if os.access(shadow, os.R_OK):  # the caller may read it; the tool must not
        first = shadow.read_text().splitlines()[0]
        assert first not in res.output
    assert home_file.name not in res.output.split("HOME", 1)[1]  # the home is not listed
    still_works(python_box)


@pytest.mark.integration
def test_cannot_read_the_callers_environment(python_box: Toolbox) -> None:
    # /proc/<pid>/environ shows a process's initial environment, so the caller must be a
    # process started with the key in it, as a user's shell starts `whetstone`.
    secret = f"sk-{uuid.uuid4().hex}"
    code = ("import os\n"
            "print('ENV', dict(os.environ))\n"
            "for pid in [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    try:\n"
            "        print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError as exc:\n"
            "        print(pid, 'DENIED', type(exc).__name__)\n")
    caller = ("import sys\nfrom whetstone.tools.sandbox import run_python\n"
              "res = run_python(sys.stdin.read())\nprint(res.stdout, res.stderr)")
    env = {**os.environ, "OPENAI_API_KEY": secret}
    out = subprocess.run([sys.executable, "-c", caller], input=code, capture_output=True,
                         check=False, text=True, env=env, cwd=REPO, timeout=60)
    assert "ENV" in out.stdout, out.stderr
    assert secret not in out.stdout and "OPENAI_API_KEY" not in out.stdout
    still_works(python_box)


def test_cannot_signal_its_caller(python_box: Toolbox) -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        code = ("import os, signal\n"
                f"for pid in (os.getppid(), {os.getpid()}):\n"
                "    try:\n"
                "        os.kill(pid, signal.SIGUSR1)\n"
                "        print('SENT', pid)\n"
                "    except OSError as exc:\n"
                "        print('DENIED', pid, type(exc).__name__)\n")
        res = python_box.call("python", {"code": code})
        time.sleep(0.3)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == []
    assert f"DENIED {os.getpid()}" in res.output  # the caller's pid does not exist in there
    still_works(python_box)


def test_cannot_write_outside_its_temp_dir(tmp_path: Path, python_box: Toolbox) -> None:
    name = f"whetstone-escape-{uuid.uuid4().hex[:8]}"
    targets = [tmp_path / name, Path.home() / name, Path("/tmp") / name]
    code = ("import os\n"
            f"for p in {[str(t) for t in targets]!r} + ['/x', '/usr/x', '/dev/shm/x']:\n"
            "    try:\n"
            "        open(p, 'w').write('escaped')\n"
            "        print('WROTE', p)\n"
            "    except OSError as exc:\n"
            "        print('DENIED', p, type(exc).__name__)\n"
            "open('inside.txt', 'w').write('fine')\n"
            "print(open('inside.txt').read())")
    try:
        res = python_box.call("python", {"code": code})
        escaped = [t for t in targets if t.exists()]
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
    assert escaped == [] and "WROTE" not in res.output
    assert res.ok and res.output.rstrip().endswith("fine")  # its own folder is writable
    still_works(python_box)


def test_files_cannot_be_placed_outside_the_folder(tmp_path: Path) -> None:
    escape = tmp_path / "escaped.txt"
    in_tmp = os.path.relpath(escape, tempfile.gettempdir())
    for bad in ("../" + in_tmp, "../" * 12 + str(escape).lstrip("/"), str(escape),
                "sub/../../" + in_tmp, "", "."):
        with pytest.raises(ToolError, match="outside its folder|empty"):
            run_python("print('ran')", files={bad: "x"})
    assert not escape.exists()
    ok = run_python("print(open('sub/x.txt').read())", files={"sub/x.txt": "inner"})
    assert ok.ok and ok.stdout == "inner\n"


def test_a_fork_bomb_hits_the_process_limit_and_nothing_survives(python_box: Toolbox) -> None:
    word = marker()
    code = ("import os\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    start = time.monotonic()
    res = run_python(code, timeout_s=3, args=(word,))
    assert time.monotonic() - start < 8
    assert survivors(word) == []
    assert res.processes_exceeded and not res.ok
    tool = python_box.call("python", {"code": code})
    assert "process limit" in (tool.error or ""), tool
    still_works(python_box)


def test_ten_gigabytes_in_one_process_is_stopped(python_box: Toolbox) -> None:
    res = python_box.call("python", {"code": "x = b'x' * (10 * 1024 ** 3)\nprint('ALLOCATED')"})
    assert "ALLOCATED" not in res.output
    assert "memory limit" in (res.error or ""), res
    still_works(python_box)


def test_three_gigabytes_across_forks_is_stopped(python_box: Toolbox) -> None:
    word = marker()
    code = ("import os, sys, time\n"
            "kids = []\n"
            "for i in range(10):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        block = b'x' * (300 * 1024 * 1024)  # written, so really resident\n"
            "        print('child holds 300 MB', flush=True)\n"
            "        time.sleep(4)\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "codes = [os.waitpid(k, 0)[1] for k in kids]\n"
            "print('ALL HELD', codes)")
    res = run_python(code, timeout_s=15, memory_mb=512, args=(word,))
    assert "ALL HELD [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]" not in res.stdout
    assert res.memory_exceeded and not res.ok
    assert survivors(word) == []
    tool = python_box.call("python", {"code": code})
    assert "memory limit" in (tool.error or ""), tool
    still_works(python_box)


def test_a_setsid_daemon_does_not_outlive_the_call(python_box: Toolbox) -> None:
    word = marker()
    code = ("import os, sys\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.execv(sys.executable, [sys.executable, '-c', "
            "'import time; time.sleep(60)', sys.argv[1]])\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "print('daemon started')")
    start = time.monotonic()
    res = run_python(code, timeout_s=5, args=(word,))
    assert time.monotonic() - start < 4  # not held until the timeout by the daemon's pipes
    assert survivors(word) == []
    assert "daemon started" in res.stdout
    assert res.leftovers >= 1 and "left 1 process" in res.stderr
    tool = python_box.call("python", {"code": code.replace("sys.argv[1]", repr(word))})
    assert survivors(word) == [] and "left 1 process" in tool.output
    still_works(python_box)


def test_an_endless_loop_is_killed_with_the_children_that_left_its_group(
        python_box: Toolbox) -> None:
    word = marker()
    code = ("import os\n"
            "if os.fork() == 0:\n"
            "    os.setsid()  # out of the process group a timeout kills\n"
            "while True:\n"
            "    pass\n")
    start = time.monotonic()
    res = run_python(code, timeout_s=1, args=(word,))
    assert res.timed_out and time.monotonic() - start < 3.5
    assert survivors(word) == []
    tool = python_box.call("python", {"code": "while True: pass"})
    assert tool.timed_out and "timed out" in (tool.error or "")
    still_works(python_box)


def test_an_attack_is_an_observation_and_the_agent_run_goes_on() -> None:
    backend = ScriptedBackend([
        'Thought: look around\nAction: python[{"code": "print(open(\'/etc/shadow\').read())"}]',
        'Thought: compute\nAction: python[{"code": "6 * 7"}]',
        "Thought: done\nFinal Answer: 42",
    ])
    trace = Agent(backend, tools=[make_python(timeout_s=5)]).run("What is 6 * 7?")
    assert trace.outcome == "answered" and trace.answer == "42"
    acts = [s for s in trace.steps if s.kind == "act"]
    assert acts[0].output["observation"].startswith("Error in python")
    assert "No such file or directory" in acts[0].output["observation"]
    assert acts[1].output["observation"].strip() == "42"
