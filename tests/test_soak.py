"""Issue 12, acceptance: a bounded soak on loopback. ``whetstone serve`` (a real process, so its
memory is its own) in front of a fake upstream takes 200 requests with 1 MB bodies and 100
feedback calls with unknown ids. Its peak memory stays under ``MEMORY_CAP``, feedback answers
with a p95 under 50 ms, and the trace store stays under the cap it was given.

The issue's numbers before the fix: memory 103 -> 921 MB over 50 requests of 15 MB (the
writer kept the last 512 traces), each request stored twice in full, and feedback on an
unknown id parsed the whole store (0.9 s on 240 MB).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from servers import free_port, running_server
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

REPO = Path(__file__).resolve().parent.parent
REQUESTS = 200
BODY_CHARS = 1024 * 1024
FEEDBACKS = 100
TRACES_CAP = 4_000_000  # bytes of trace files the server may keep (--traces-max-bytes)
MEMORY_CAP = 256 * 1024 * 1024  # peak RSS of the server process (measured: ~115 MiB)
FEEDBACK_P95_S = 0.050


async def upstream_chat(request: HttpRequest) -> JSONResponse:
    body = await request.json()
    n = len(body["messages"][-1]["content"])
    return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1, "model": "tiny",
                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                             "role": "assistant", "content": f"read {n} characters"}}],
                         "usage": {"prompt_tokens": n // 4, "completion_tokens": 3,
                                   "total_tokens": n // 4 + 3}})


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    upstream_app = Starlette(routes=[Route("/v1/chat/completions", upstream_chat,
                                           methods=["POST"])])
    library = tmp_path / "lib"
    library.mkdir()  # an empty folder: serve makes the library there
    port = free_port()
    with running_server(upstream_app) as upstream:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "whetstone", "serve", "--upstream", f"openai:tiny@{upstream}/v1",
             "--library", str(library), "--no-library", "--port", str(port),
             "--traces-max-bytes", str(TRACES_CAP), "--max-concurrency", "4",
             "--log-level", "warning"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
            yield url, proc, library / "traces"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()  # type: ignore[union-attr]


@pytest.mark.integration
def test_soak_1mb_bodies_and_unknown_feedback_stay_bounded(
        server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, proc, traces = server
    filler = "x" * BODY_CHARS

    with httpx.Client(base_url=url, timeout=60) as client:
        def one(i: int) -> str:
            r = client.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": f"{i} {filler}"}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == (
                f"read {len(filler) + len(str(i)) + 1} characters")
            return r.headers["x-whetstone-trace-id"]

        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(one, range(REQUESTS)))

        latencies = []
        for _ in range(FEEDBACKS):
            start = time.perf_counter()
            r = client.post("/v1/feedback", json={"trace_id": uuid.uuid4().hex, "score": 1})
            latencies.append(time.perf_counter() - start)
            assert r.status_code == 404 and r.json()["error"]["code"] == "trace_not_found"
        labelled = client.post("/v1/feedback", json={"trace_id": ids[-1], "score": 0.5})
        assert labelled.status_code == 200, labelled.text
        metrics = client.get("/metrics").text

    peak = _peak_rss(proc.pid)
    p95 = statistics.quantiles(latencies, n=20)[-1]
    data = sum(p.stat().st_size for p in traces.glob("*.jsonl"))
    index = sum(p.stat().st_size for p in traces.glob("index.sqlite*"))
    print(f"\nsoak: peak RSS {peak / 2**20:.0f} MiB (cap {MEMORY_CAP / 2**20:.0f}), "
          f"feedback p50 {statistics.median(latencies) * 1000:.1f} ms p95 {p95 * 1000:.1f} ms, "
          f"traces {data / 1e6:.2f} MB (cap {TRACES_CAP / 1e6:.1f}) + index {index / 1e3:.0f} kB")
    assert peak < MEMORY_CAP
    assert p95 < FEEDBACK_P95_S
    assert data <= TRACES_CAP and index < 1_500_000
    assert f"whetstone_traces_written_total {REQUESTS}" in metrics
    # The newest traces are kept (the oldest files went), each cut to the record cap.
    newest = [json.loads(line) for p in sorted(traces.glob("*.jsonl"))
              for line in p.read_text().splitlines()]
    assert newest and all(len(json.dumps(t)) < 300_000 for t in newest)
    assert any(t["id"] == ids[-1] and t["score"] == 0.5 for t in newest)
