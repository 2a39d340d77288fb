"""Several ``whetstone serve`` replicas on one library folder and one trace store (issue 39,
item 3): three real server processes behind no balancer but the test, 600 chat requests spread
over them while ``whetstone library import`` commits a new version. Checked: every request's
trace lands exactly once (no loss, no duplicate, across processes), every replica serves the
new version within a stated bound without a restart, and feedback sent to any replica finds a
trace another replica recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from middleware_support import SKILLS
from servers import free_port, running_server, wait_healthy

from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

REPO = Path(__file__).resolve().parent.parent
REPLICAS = 3
REQUESTS = 600
# A replica reads the library's CURRENT on every request (a stat): a committed version is
# served by the next request after the commit. The bound leaves room for a loaded CI machine.
NEW_VERSION_BOUND_S = 5.0

pytestmark = pytest.mark.timeout(600)


def echo_upstream() -> FastAPI:
    """An OpenAI-compatible upstream answering each chat with the user's last message."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest) -> Any:
        body = await request.json()
        text = body["messages"][-1]["content"]
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"echo {text}"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}

    return app


def start_replica(upstream: str, library: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "WHETSTONE_API_KEY": "", "OPENAI_API_KEY": ""}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "whetstone", "serve", "--upstream",
             f"openai:up@{upstream}/v1", "--library", str(library), "--port", str(port),
             "--log-level", "warning"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def chat(client: httpx.Client, base: str, text: str) -> tuple[str, str]:
    """(trace id, library version) of one answered chat."""
    res = client.post(base + "/v1/chat/completions", timeout=60,
                      json={"model": "up", "messages": [{"role": "user", "content": text}]})
    assert res.status_code == 200, res.text
    assert res.json()["choices"][0]["message"]["content"] == f"echo {text}"
    return res.headers["x-whetstone-trace-id"], res.headers["x-whetstone-library-version"]


def new_skill_folder(root: Path) -> Path:
    skill = root / "incoming" / "metric-prefixes"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: metric-prefixes\ndescription: Convert kilo, mega and milli prefixes in "
        "unit questions.\n---\n\n# Metric prefixes\n\n1. kilo is 1000; milli is 1/1000.\n")
    return skill.parent


@pytest.mark.integration
def test_three_replicas_share_one_library_and_one_trace_store(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit(SKILLS, method="test", message="skills")  # v2
    incoming = new_skill_folder(tmp_path)
    ports = [free_port() for _ in range(REPLICAS)]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    procs: list[subprocess.Popen[bytes]] = []
    with running_server(echo_upstream()) as upstream:
        try:
            logs = [tmp_path / f"replica-{i}.log" for i in range(REPLICAS)]
            procs = [start_replica(upstream, lib.root, p, log) for p, log in zip(ports, logs, strict=False)]
            for base, proc, log in zip(bases, procs, logs, strict=False):
                wait_healthy(base, proc, log)

            served: list[tuple[int, str, str, float]] = []  # (replica, trace id, version, t)
            served_lock = threading.Lock()
            imported: dict[str, Any] = {}

            def one(i: int) -> None:
                replica = i % REPLICAS
                with httpx.Client() as client:
                    trace_id, version = chat(client, bases[replica], f"2.5 hours in minutes? #{i}")
                with served_lock:
                    served.append((replica, trace_id, version, time.monotonic()))

            def import_when_busy() -> None:
                while len(served) < REQUESTS // 3:
                    time.sleep(0.05)
                done = subprocess.run(
                    [sys.executable, "-m", "whetstone", "library", "import", str(incoming),
                     "--library", str(lib.root)], cwd=REPO, capture_output=True, text=True,
                    timeout=300, check=False)
                imported.update(code=done.returncode, out=done.stdout + done.stderr,
                                at=time.monotonic())

            importer = threading.Thread(target=import_when_busy)
            importer.start()
            with ThreadPoolExecutor(max_workers=12) as pool:
                list(pool.map(one, range(REQUESTS)))
            importer.join(timeout=300)
            assert imported.get("code") == 0, imported
            new = Library.open(lib.root).current_id()
            assert new == "v3"

            # Every replica serves the new version within the bound, with no restart.
            with httpx.Client() as client:
                for replica, base in enumerate(bases):
                    waited = time.monotonic()
                    while chat(client, base, f"after the import, replica {replica}")[1] != new:
                        assert time.monotonic() - waited < NEW_VERSION_BOUND_S, base
                        time.sleep(0.05)
            late = [s for s in served if s[3] > imported["at"] + NEW_VERSION_BOUND_S]
            assert all(version == new for _, _, version, _ in late)
            # The measured lag: the last answer with the old version after the import ended
            # (requests already in flight then).
            lag = max((t - imported["at"] for _, _, v, t in served if v != new), default=0.0)

            # Feedback sent to another replica than the one that served the request.
            labelled = [s for s in served[:30]]
            with httpx.Client() as client:
                for replica, trace_id, _, _ in labelled:
                    other = bases[(replica + 1) % REPLICAS]
                    res = client.post(other + "/v1/feedback", timeout=30,
                                      json={"trace_id": trace_id, "score": 1})
                    assert res.status_code == 200, res.text
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)  # the trace queue drains on shutdown
            for proc in procs:
                proc.communicate(timeout=120)
    assert all(p.returncode in (0, 130) for p in procs)

    records, _ = TraceStore(lib.root / "traces").read_since(None)
    per_id = Counter(t.id for t in records)
    ids = [trace_id for _, trace_id, _, _ in served]
    assert len(ids) == REQUESTS and len(set(ids)) == REQUESTS  # one trace id per request
    feedback = {trace_id for _, trace_id, _, _ in labelled}
    # Each request's trace landed once; feedback appended one updated record of its trace.
    assert {i: per_id[i] for i in ids if per_id[i] != (2 if i in feedback else 1)} == {}
    latest = TraceStore(lib.root / "traces").latest()
    assert all(latest[i].score == 1.0 for i in feedback)
    assert {latest[i].answer for i in ids} == {f"echo 2.5 hours in minutes? #{n}"
                                               for n in range(REQUESTS)}
    versions = Counter(version for _, _, version, _ in served)
    assert set(versions) <= {"v2", "v3"}, versions
    print(json.dumps({"served_by_version": versions, "replicas": REPLICAS,
                      "old_version_lag_s": round(max(lag, 0.0), 3)}))
