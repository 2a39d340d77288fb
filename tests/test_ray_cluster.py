"""Eval and evolve on a real local Ray cluster (issue 49, items 3 and 4): a head node and a
second worker node, each a ``ray start --block`` process of this test (token authentication
on, a temp folder of its own), stopped by their ids at the end. The model is an
OpenAI-compatible upstream in this process whose replies depend only on the request, so a run
is a pure function of its tasks and seeds. Checked: a Ray eval's scores and traces equal a
local eval's, the work ran on both nodes, and an evolve whose workers are killed mid-way (a
map actor and a solver actor during the gate) ends exactly as a clean run does."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import free_port, running_server, wait_healthy

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Request, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceQuery

REPO = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).parent / "ray"

pytestmark = pytest.mark.timeout(600)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the node's processes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def run_python(code: str, env: dict[str, str], *args: str,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``code`` in a new interpreter with the cluster's environment: Ray reads its
    authentication settings once per process, when it is imported."""
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, check=False)


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a process joining it needs (the token, this checkout)


WAIT_FOR_CPUS = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 120
while ray.cluster_resources().get("CPU", 0) < 2:
    assert time.monotonic() < deadline, ray.cluster_resources()
    time.sleep(0.3)
"""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """A two-node local cluster (one CPU each) with token authentication."""
    if importlib.util.find_spec("ray") is None or not RAY.exists():
        pytest.skip("ray is not installed (optional extra: pip install "
                    "'whetstone-engine[scale]')")
    # Short: Ray's unix sockets live under it and a socket path holds at most 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0", "WHETSTONE_STORE": "",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                        os.environ.get("PYTHONPATH"))))}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(base / "head.log", "wb") as log:
            procs.append(subprocess.Popen(
                [str(RAY), "start", "--head", "--port", "0", "--num-cpus", "1",
                 "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir",
                 str(base), "--block"], stdout=log, stderr=subprocess.STDOUT, cwd=base,
                env=env))
        deadline = time.monotonic() + 120
        address = None
        while address is None:
            found = re.search(r"--address='([^']+)'", (base / "head.log").read_text())
            address = found.group(1) if found else None
            if procs[0].poll() is not None or time.monotonic() > deadline:
                pytest.fail("the Ray head did not start:\n" +
                            (base / "head.log").read_text()[-3000:])
            time.sleep(0.3)
        with open(base / "worker.log", "wb") as log:
            procs.append(subprocess.Popen(
                [str(RAY), "start", "--address", address, "--num-cpus", "1",
                 "--disable-usage-stats", "--block"], stdout=log, stderr=subprocess.STDOUT,
                cwd=base, env=env))
        ready = run_python(WAIT_FOR_CPUS, env, address, timeout=180)
        assert ready.returncode == 0, ready.stderr[-3000:] + \
            (base / "worker.log").read_text()[-2000:]
        yield Cluster(address, env)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(base, ignore_errors=True)


LESSON = "- Add the ones first, then the tens."


def respond(request: Request) -> str:
    """The upstream's reply, a function of the request alone: an analyst gets one edit; the
    agent gets a sum, wrong for every other task unless the skill's lesson is in its prompt."""
    text = "\n".join(m.text for m in request.messages)
    if "You improve a skill" in text:
        return json.dumps({"reasoning": "r", "changelog": "c", "edits": [
            {"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
             "content": LESSON}]})
    found = re.findall(r"What is (\d+) \+ (\d+)\?", request.messages[-1].text)
    if not found:
        return "I cannot tell."
    a, b = map(int, found[-1])
    wrong = a % 2 == 0 and LESSON not in text
    return f"The answer is {a + b + (1 if wrong else 0)}."


class Upstream(ScriptedBackend):
    """The scripted upstream, counting the requests it answered."""

    def __init__(self) -> None:
        super().__init__(responder=respond, delay_s=0.25, max_concurrency=32)
        self.calls = 0

    async def acomplete(self, request: Request) -> Any:
        self.calls += 1
        result = await super().acomplete(request)
        self.requests.clear()
        return result


@pytest.fixture
def upstream() -> Iterator[tuple[str, Upstream]]:
    from whetstone.engine.server import create_app

    backend = Upstream()
    with running_server(create_app(backend, model_name="up", max_concurrency=32)) as url:
        yield f"openai:up@{url}/v1", backend


TASKS = [TaskRecord(id=f"sum-{a}", question=f"What is {a} + {a * 7 % 50}?",
                    expected=str(a + a * 7 % 50), scorer="numeric") for a in range(1, 13)]


def write_tasks(path: Path) -> Path:
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in TASKS))
    return path


def untimed(value: Any) -> Any:
    """``value`` without the times it holds (a call's ``latency_s``)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k != "latency_s"}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def shape(trace: Trace) -> dict[str, Any]:
    """What a run did, without its times, ids and the eval run's own marks."""
    meta = {k: v for k, v in trace.meta.items() if k not in ("eval_run",)}
    steps = [{"kind": s.kind, "module": s.module, "input": s.input,
              "output": untimed(s.output), "tokens": s.tokens} for s in trace.steps]
    return {"task": trace.task, "answer": trace.answer, "outcome": trace.outcome,
            "score": trace.score, "label": trace.label, "tokens": trace.total_tokens,
            "library_version": trace.library_version, "meta": meta, "steps": steps}


def actor_pids(name: str, token: str | None = None) -> list[int]:
    """Processes of this machine running Ray actor class ``name`` (Ray titles them
    ``ray::<class>``) of the cluster whose auth token is ``token`` (default: this process's
    ``RAY_AUTH_TOKEN``): the workers of this test's cluster, not those of a cluster another
    pytest-xdist worker started beside it."""
    token = token or os.environ.get("RAY_AUTH_TOKEN")
    mark = f"RAY_AUTH_TOKEN={token}".encode() if token else None
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if not cmd.startswith(f"ray::{name}"):
                    continue
                if mark is not None and mark not in (proc / "environ").read_bytes().split(b"\0"):
                    continue
            except OSError:
                continue
            out.append(int(proc.name))
    return sorted(out)


@pytest.mark.integration
def test_a_ray_eval_equals_a_local_eval(ray_cluster: Cluster, upstream: tuple[str, Upstream],
                                         tmp_path: Path) -> None:
    model, _ = upstream
    tasks = write_tasks(tmp_path / "sums.jsonl")
    lib = Library.init(tmp_path / "lib")
    results = {}
    seen: set[int] = set()
    earlier: set[int] = set()
    watching = threading.Event()

    def watch() -> None:  # the solver actors alive during the Ray eval
        while not watching.is_set():
            seen.update(actor_pids("_SolverActor", ray_cluster.env["RAY_AUTH_TOKEN"]))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    for how in ("local", "ray"):
        args = [sys.executable, "-m", "whetstone", "eval", "--tasks", str(tasks), "--model",
                model, "--library", str(lib.root), "--json", "--executor", how, "-j", "2"]
        if how == "ray":
            args += ["--ray-address", ray_cluster.address]
            # An earlier test's actors may still be exiting on this cluster: not this eval's.
            earlier = set(actor_pids("_SolverActor", ray_cluster.env["RAY_AUTH_TOKEN"]))
            watcher.start()
        res = subprocess.run(args, env=ray_cluster.env, cwd=REPO, capture_output=True,
                             text=True, timeout=300, check=False)
        assert res.returncode == 0, res.stderr[-3000:]
        results[how] = json.loads(res.stdout)["results"][0]
    watching.set()
    watcher.join()
    on_ray = results["ray"]
    assert on_ray["meta"]["executor"] == "ray" and on_ray["meta"]["concurrency"] == 2
    per_task = {how: [(r["task_id"], r["score"], r["answer"], r["seed"], r["outcome"])
                      for r in results[how]["results"]] for how in results}
    assert per_task["ray"] == per_task["local"]
    accuracy = {how: results[how]["summary"]["accuracy"] for how in results}
    assert 0 < accuracy["ray"] == accuracy["local"] < 1  # some right, some wrong
    by_run: dict[str, dict[str, Any]] = {}
    for t in lib.traces.query(TraceQuery()):
        by_run.setdefault(t.meta["eval_run"], {})[t.meta["task_id"]] = shape(t)
    assert len(by_run) == 2
    first, second = by_run.values()
    assert first == second and len(first) == len(TASKS)
    # Solver actors ran, one CPU each, at least one on each node of the cluster (Ray may
    # start a third one while one of the two is still being placed: seen on a loaded run).
    assert len(seen - earlier) >= 2, (seen, earlier)


EVOLVE = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[7])
from test_ray_cluster import actor_pids
from whetstone.engine.api import Engine
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.scale import RayExecutor
from whetstone.library_store.store import Library

library, model, address, tasks, gate, kill = sys.argv[1:7]
killed = []
seen = {"_Worker": set(), "_SolverActor": set()}  # actor processes, as progress was reported
restarted = {}

def on_progress(phase, done, total):
    name = {"trace2skill map": "_Worker", "gate: candidate": "_SolverActor"}.get(phase)
    if name is None:
        return
    pids = actor_pids(name)
    if any(p == phase for p, _ in killed):  # a process that was not there at the kill
        restarted[phase] = restarted.get(phase, False) or bool(set(pids) - seen[name])
    seen[name].update(pids)
    if kill != "1" or done < 1 or any(p == phase for p, _ in killed) or not pids:
        return
    os.kill(pids[0], signal.SIGKILL)  # mid-run: the other worker is still running
    killed.append((phase, pids[0]))

with RayExecutor(address, workers=2) as cluster, \
        Engine(model, library=library, checkpointing=False, create=True) as engine:
    result = engine.evolve("trace2skill", tasks=load_tasks(tasks), skill="sums", create=True,
                           description="Add two numbers.", workers=2,
                           gate_tasks=load_tasks(gate), cluster=cluster,
                           candidate_name="sums-try", on_progress=on_progress)
print(json.dumps({"result": result.to_dict(), "killed": killed, "restarted": restarted,
                  "files": Library.open(library).snapshot().files()}, default=str))
"""


def comparable(d: dict[str, Any]) -> dict[str, Any]:
    decision = {k: v for k, v in (d["decision"] or {}).items()
                if "latency" not in k and k not in ("reasons", "decided_at")}
    # The tasks that flipped, without their runs' trace ids (new in every run).
    decision["flipped"] = [{k: v for k, v in f.items() if not k.endswith("_trace")}
                           for f in decision.get("flipped") or ()]
    return {"changed": d["changed"], "diff": d["diff"], "version": d["version"],
            "candidate": d["candidate"], "decision": decision, "traces": d["traces"]}


@pytest.mark.integration
@pytest.mark.trace2skill
def test_workers_killed_mid_evolve_end_as_a_clean_run(ray_cluster: Cluster,
                                                      upstream: tuple[str, Upstream],
                                                      tmp_path: Path) -> None:
    model, backend = upstream
    tasks = tmp_path / "sums.jsonl"
    tasks.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in TASKS[:8]))
    # The gate decides on tasks the evolver did not learn from (docs/gate.md): 12 others, half
    # of them wrong without the lesson as the learned ones are, enough for McNemar's test.
    gate = tmp_path / "gate.jsonl"
    gate.write_text("".join(json.dumps(TaskRecord(
        id=f"sum-{a}", question=f"What is {a} + {a * 7 % 50}?", expected=str(a + a * 7 % 50),
        scorer="numeric").to_dict()) + "\n" for a in range(13, 25)))
    runs = {}
    calls = {}
    for how in ("clean", "killed"):
        backend.calls = 0
        done = run_python(EVOLVE, ray_cluster.env, str(tmp_path / how), model,
                          ray_cluster.address, str(tasks), str(gate),
                          "1" if how == "killed" else "0",
                          str(Path(__file__).parent))
        assert done.returncode == 0, done.stderr[-4000:]
        runs[how] = json.loads(done.stdout.strip().splitlines()[-1])
        calls[how] = backend.calls
    clean, killed = runs["clean"], runs["killed"]
    # The run without kills must itself have reached a decision; when it did not (one CI run
    # on a loaded machine kept it as a candidate), say why rather than diffing two results.
    assert clean["result"]["decision"] is not None, (clean["result"]["note"],
                                                     clean["result"]["message"])
    assert [p for p, _ in killed["killed"]] == ["trace2skill map", "gate: candidate"]
    assert killed["restarted"] == {"trace2skill map": True, "gate: candidate": True}
    assert comparable(killed["result"]) == comparable(clean["result"])
    assert clean["result"]["version"] and LESSON in clean["result"]["diff"]  # gate took it
    assert killed["files"] == clean["files"]
    # A call a worker had in flight when it was killed is made again (none: it was between).
    assert calls["killed"] >= calls["clean"]
    print(json.dumps({"killed": killed["killed"], "upstream_calls": calls,
                      "verdict": clean["result"]["decision"]["verdict"]}))


def deployment_commands() -> list[str]:
    """The bash block of docs/middleware.md's "Deployment past one machine", one command a
    line (comments dropped, continued lines joined)."""
    text = (REPO / "docs" / "middleware.md").read_text(encoding="utf-8")
    section = text.split("## Deployment past one machine", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```bash\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    return [c.strip() for c in block.replace("\\\n", " ").splitlines()
            if c.strip() and not c.strip().startswith("#")]


@pytest.mark.integration
def test_the_deployment_block_of_the_docs_runs(ray_cluster: Cluster, pg_url: str,
                                               tmp_path: Path) -> None:
    """Every command of the block, in order, against a throwaway PostgreSQL, a scripted
    upstream serving ``qwen`` and the two-node cluster (the hosts replaced by theirs)."""
    from whetstone.engine.server import create_app

    Library.init(tmp_path / "folder").commit(
        {"skills/sums/SKILL.md": "---\nname: sums\ndescription: Add two numbers.\n---\n\n"
                                 "# Sums\n\n## Pitfalls\n"}, method="t")
    Library.open(tmp_path / "folder").export(tmp_path / "skills-export.tar.gz")
    write_tasks(tmp_path / "tasks.jsonl")
    (tmp_path / "keys.txt").write_text("doc-key\n")
    backend = ScriptedBackend(responder=respond, max_concurrency=32)
    with running_server(create_app(backend, model_name="qwen", max_concurrency=32)) as url:
        fills = {"http://vllm.internal:8000/v1": url + "/v1",
                 "ray-head.internal:6379": ray_cluster.address}
        env = {**ray_cluster.env, "WHETSTONE_HOME": str(tmp_path / "admin")}
        ran = []
        for line in deployment_commands():
            for old, new in fills.items():
                line = line.replace(old, new)
            if line.startswith("export "):
                name, _, value = line[len("export "):].partition("=")
                assert name == "WHETSTONE_STORE" and "db.internal" in value
                env[name] = pg_url
                continue
            words = shlex.split(line)
            assert words[0] == "whetstone", line
            argv = [sys.executable, "-m", "whetstone", *words[1:]]
            if words[1] == "serve":
                port = free_port()
                home = tmp_path / "replica"
                with open(tmp_path / "serve.log", "wb") as log:
                    proc = subprocess.Popen([*argv, "--port", str(port)], cwd=tmp_path,
                                            env={**env, "WHETSTONE_HOME": str(home)},
                                            stdout=log, stderr=subprocess.STDOUT)
                try:
                    base = f"http://127.0.0.1:{port}"
                    wait_healthy(base, proc, tmp_path / "serve.log")
                    res = httpx.post(base + "/v1/chat/completions", timeout=60, headers={
                        "Authorization": "Bearer doc-key"}, json={"model": "qwen", "messages": [
                            {"role": "user", "content": "What is 1 + 7?"}]})
                    assert res.status_code == 200 and \
                        res.headers["x-whetstone-library-version"] == "v2", res.text
                finally:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(timeout=60)
            else:
                done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=300, check=False)
                assert done.returncode == 0, (line, done.stderr[-3000:])
            ran.append(words[1])
    assert ran == ["library", "library", "serve", "eval", "evolve"]
    lib = Library.open(tmp_path / "check", store=pg_url)
    assert lib.current_id() in ("v2", "v3") and len(lib.traces.latest()) > len(TASKS)
