"""Load: 200 concurrent requests through the middleware server (library applied, traces on), a
scripted upstream with a fixed 50 ms delay that replies with text derived from each request.
Nothing is lost or mixed up, every exchange is stored with its own request and reply, and the
server's memory stays flat over rounds."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from middleware_support import make_adapter, make_library
from servers import Servers

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.server.guard import TRACE_HEADER
from whetstone.engine.types import Request
from whetstone.library_store.traces import TraceStore

CONCURRENT = 200
ROUNDS = 4  # the first warms up (model load, index, pools); memory is measured after it
MAX_GROWTH_MB = 40  # generous: the bounded caches (recent traces, query vectors) fill up


def reply_to(request: Request) -> str:
    return "reply to " + request.messages[-1].text


async def one_round(url: str, r: int) -> list[tuple[str, str, str]]:
    limits = httpx.Limits(max_connections=CONCURRENT + 16, max_keepalive_connections=CONCURRENT)
    async with httpx.AsyncClient(limits=limits, timeout=300) as http:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, http_client=http)

        async def ask(i: int) -> tuple[str, str, str]:
            text = f"round {r} request {i}: how many minutes are in {i + 1} hours?"
            raw = await client.chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": text}])
            return text, raw.headers[TRACE_HEADER], raw.parse().choices[0].message.content

        return list(await asyncio.gather(*(ask(i) for i in range(CONCURRENT))))


@pytest.mark.integration
async def test_200_concurrent_requests_are_answered_recorded_and_memory_stays_flat(
        tmp_path: Path) -> None:
    library = make_library(tmp_path / "lib")
    backend = ScriptedBackend(responder=reply_to, delay_s=0.05, max_concurrency=64)
    # Every request must retrieve (the load is the point, not the relevance floor: "round 3
    # request 17: ..." scores under it for some numbers).
    adapter = make_adapter(library, backend, skills={"min_score": None})
    store = TraceStore(tmp_path / "traces")
    app = create_app(backend, model_name="tiny", adapter=adapter, traces=store,
                     max_queue=CONCURRENT * 2)
    process = psutil.Process()
    rss: list[float] = []
    seen: set[str] = set()
    with Servers() as servers:
        url = servers.start(app) + "/v1"
        for r in range(ROUNDS):
            results = await one_round(url, r)
            # Every reply belongs to its own request, and every exchange has its own trace.
            assert len(results) == CONCURRENT
            assert all(answer == "reply to " + text for text, _, answer in results)
            ids = {trace_id for _, trace_id, _ in results}
            assert len(ids) == CONCURRENT and not ids & seen
            seen |= ids
            deadline = time.monotonic() + 30
            while not seen <= set(stored := store.latest()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for text, trace_id, answer in results:
                trace = stored[trace_id]
                assert (trace.task, trace.answer, trace.outcome) == (text, answer, "answered")
                assert trace.library_version == "v2" and trace.meta["skills"]["shown"]
            assert app.state.server.service.admitted == 0  # every queue place was given back
            backend.requests.clear()  # the double keeps every request; the server must not
            gc.collect()
            rss.append(process.memory_info().rss / 2**20)
    adapter.close()
    assert len(store.latest()) == CONCURRENT * ROUNDS
    growth = rss[-1] - rss[0]
    assert growth < MAX_GROWTH_MB, f"RSS per round (MiB): {[round(x) for x in rss]}"
