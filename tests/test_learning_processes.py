"""``whetstone learn`` as the processes it runs as (issue 48): two learners on one library, one
holds the lease and the other waits; the holder killed with -9 in the middle of an evolve
leaves a valid library and the server answering as before; the one that waited takes over
once the lease expires, and every step and version the library holds is its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from learning_support import KEYS, Users, engine, responder, scripted
from servers import running_server

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.server.canary import CanaryRouter
from whetstone.library_store.learning import LearningState
from whetstone.library_store.store import Library

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def start_learner(library: Path, upstream: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "whetstone", "learn", "--library", str(library),
             "--method", "memory", "--model", f"openai:up@{upstream}/v1", "--solver", "direct",
             "--tools", "",
             "--scorer", "normalised", "--every", "40", "--share", "0.3", "--min-scored", "30",
             "--min-rollback", "10", "--poll", "0.2", "--lease-ttl", "3", "--nice", "0", "--no-idle",
             "-j", "1"], cwd=REPO, env={**os.environ, "OPENAI_API_KEY": ""}, stdout=out,
            stderr=subprocess.STDOUT)


def wait_for(what: str, logs: list[Path], procs: list[subprocess.Popen[bytes]],
             timeout_s: float = 240) -> int:
    """The index of the first log that says ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        for i, log in enumerate(logs):
            if what in log.read_text(errors="replace"):
                return i
        if time.monotonic() > deadline or all(p.poll() is not None for p in procs):
            raise AssertionError(f"no learner said {what!r}:\n" + "\n---\n".join(
                log.read_text(errors="replace")[-3000:] for log in logs))
        time.sleep(0.1)


def holder_of(log: Path) -> str:
    line = next(ln for ln in log.read_text().splitlines() if "holds the lease" in ln)
    return line.split("learner ", 1)[1].split(" holds", 1)[0]


@pytest.mark.integration
@pytest.mark.memory
def test_a_learner_killed_mid_evolve_leaves_serving_and_the_library_whole(
        tmp_path: Path) -> None:
    eng = engine(tmp_path / "lib", scripted())
    router_app = eng.app(api_keys=KEYS, canary=CanaryRouter(
        eng.library, lambda snap: eng.chat_adapter(snapshot=snap)))
    # The learners' model: the same world, slow enough that an evolve's gate takes seconds.
    upstream = create_app(ScriptedBackend(responder=responder(delay_s=0.3)), model_name="up")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs: list[subprocess.Popen[bytes]] = []
    with running_server(upstream) as up, running_server(router_app) as base:
        try:
            procs = [start_learner(eng.library.root, up, log) for log in logs]
            first = wait_for("holds the lease", logs, procs)
            other = 1 - first
            wait_for("waiting for the lease held by", [logs[other]], procs)
            users = Users(base)
            for n in range(50):
                users.ask(n)
            wait_for("gate: ", [logs[first]], procs)  # in the middle of its evolve
            procs[first].send_signal(signal.SIGKILL)
            procs[first].wait(timeout=30)
            # Serving goes on, on the version it served.
            during = [users.ask(n) for n in range(50, 60)]
            assert {s.version for s in during} == {"v1"}
            lib = Library.open(eng.library.root)
            assert lib.verify() == [] and lib.current_id() == "v1"
            assert LearningState(lib).canary() is None
            done = subprocess.run([sys.executable, "-m", "whetstone", "library", "validate",
                                   "--library", str(lib.root)], cwd=REPO, capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
            # The learner that waited takes over once the lease expires, and carries on.
            wait_for("holds the lease", [logs[other]], procs)
            wait_for("canary v1+canary-", [logs[other]], procs)
            for n in range(60, 400):
                users.ask(n)
                if "promoted canary" in logs[other].read_text():
                    break
            wait_for("promoted canary", [logs[other]], procs, timeout_s=60)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
            for p in procs:
                p.wait(timeout=60)
    survivor = holder_of(logs[other])
    steps = LearningState(eng.library).steps()
    assert [s.step for s in steps] == ["canary_started", "promoted"]
    assert {s.holder for s in steps} == {survivor}
    assert eng.library.current_id() == "v2"
    assert eng.library.manifest("v2").scores["canary"]["canary"] == steps[0].canary
    eng.close()

