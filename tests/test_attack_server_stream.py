"""Issue 29, follow-ups to findings 9 and 12: a streamed chat reply from a hostile upstream, and
the legacy completions ``logprobs``.

9. A streamed chat completion is read through ``SseParser``: an upstream's gzip stream that
   inflates to hundreds of MB with no line end, or a plain event that never ends, is cut at
   the event cap; before any text the client gets a 502, after some text an error event. The
   server's peak memory and the time taken stay small (was: 2.15 GB of RSS and 11.5 s for a
   1 GiB bomb). The blocking ``stream`` of the backend reads through the same parser.
12. ``/v1/completions`` takes ``"logprobs": <integer>`` (lm-eval's local-completions sends 1);
   chat keeps ``logprobs`` a flag.

Each server is ``whetstone serve`` run as its own process on 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from servers import Servers
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from test_attack_server_conn import AUTH, peak_rss_mb, whetstone_serve

INFLATED = 256 << 20  # what each hostile stream would send in all, once decoded
_BLOCK = 1 << 20
FINE = ("data: " + json.dumps({
    "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "fine"},
                 "finish_reason": None}]}) + "\n\n").encode()


def gzipped(prefix: bytes) -> Iterator[bytes]:
    """``prefix``, then ``INFLATED`` zero bytes (no line end), as one gzip stream made as it
    is sent (~256 KB on the wire)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    yield c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = bytes(_BLOCK)
    for _ in range(INFLATED // _BLOCK):
        yield c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    yield c.flush(zlib.Z_FINISH)


def endless(prefix: bytes) -> Iterator[bytes]:
    """``prefix``, then one ``data:`` line of ``INFLATED`` bytes that never ends."""
    yield prefix + b'data: {"choices": [{"delta": {"content": "'
    block = b"a" * _BLOCK
    for _ in range(INFLATED // _BLOCK):
        yield block


async def stalled() -> AsyncIterator[bytes]:
    """Some text, then nothing for longer than the caller waits."""
    yield FINE
    await asyncio.sleep(6)
    yield b"data: [DONE]\n\n"


received: list[dict[str, Any]] = []


async def chat_upstream(request: HttpRequest) -> Response:
    """The attack named by the last user message: ``bomb`` or ``endless``, with ``fine``
    first when it ends in ``-after-text``."""
    body = await request.json()
    kind = body["messages"][-1]["content"]
    if kind == "stall":
        return StreamingResponse(stalled(), media_type="text/event-stream")
    prefix = FINE if kind.endswith("-after-text") else b""
    if kind.startswith("bomb"):
        return StreamingResponse(gzipped(prefix), media_type="text/event-stream",
                                 headers={"content-encoding": "gzip"})
    return StreamingResponse(endless(prefix), media_type="text/event-stream")


async def completions_upstream(request: HttpRequest) -> Response:
    body = await request.json()
    received.append(body)
    return JSONResponse({"id": "c2", "object": "text_completion", "created": 1,
                         "model": "tiny", "choices": [{"index": 0, "text": " four",
                                                       "finish_reason": "length",
                                                       "logprobs": None}]})


UPSTREAM = Starlette(routes=[
    Route("/v1/chat/completions", chat_upstream, methods=["POST"]),
    Route("/v1/completions", completions_upstream, methods=["POST"])])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, str]]:
    """``whetstone serve`` in front of ``UPSTREAM``: its base URL, pid and upstream URL."""
    tmp = tmp_path_factory.mktemp("stream")
    with Servers() as servers:
        upstream = servers.start(UPSTREAM)
        with whetstone_serve(tmp, f"openai:tiny@{upstream}/v1", "--upstream-timeout",
                             "20") as (base, pid):
            yield base, pid, upstream


def _stream(base: str, content: str) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=60, headers=AUTH,
                      json={"model": "tiny", "stream": True,
                            "messages": [{"role": "user", "content": content}]})


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["bomb", "endless", "bomb-after-text", "endless-after-text"])
def test_a_hostile_streamed_reply_is_cut_with_bounded_memory_and_time(
        served: tuple[str, int, str], kind: str) -> None:
    base, pid, _ = served
    before = peak_rss_mb(pid)
    start = time.monotonic()
    r = _stream(base, kind)
    took = time.monotonic() - start
    peak = peak_rss_mb(pid)
    assert httpx.get(base + "/health", timeout=5).status_code == 200
    if kind.endswith("-after-text"):  # the status has gone out: an error event, then [DONE]
        assert r.status_code == 200, r.text[:300]
        events = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        assert "fine" in r.text and events[-1]["error"]["code"] == "upstream_error", r.text
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.status_code == 502, r.text[:300]  # was: 2.15 GB of RSS, then a 502 in 11.5 s
        assert r.json()["error"]["code"] == "upstream_error"
    assert took < 8, took
    assert peak - before < 150, (before, peak)  # the 4 MiB event cap, not 256 MiB


@pytest.mark.integration
def test_the_blocking_stream_is_cut_too(served: tuple[str, int, str]) -> None:
    from whetstone.engine.backends import BackendOptions, get_backend
    from whetstone.engine.errors import BackendError
    from whetstone.engine.types import Message, Request

    _, _, upstream = served
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with get_backend(f"openai:tiny@{upstream}/v1", BackendOptions(
            max_retries=0, timeout_s=20)) as backend:
        for kind in ("bomb", "endless-after-text"):
            start = time.monotonic()
            with pytest.raises(BackendError, match="passed 4,194,304 bytes"):
                list(backend.stream(Request(messages=(Message("user", kind),))))
            assert time.monotonic() - start < 8
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 150


@pytest.mark.integration
def test_a_stream_that_stalls_past_the_deadline_is_cut_on_both_paths(
        served: tuple[str, int, str]) -> None:
    """The text so far, then ``finish_reason="timeout"``; was: httpx's own ReadTimeout from
    the blocking path."""
    from whetstone.engine.backends import BackendOptions, get_backend
    from whetstone.engine.types import Message, Request

    ask = Request(messages=(Message("user", "stall"),))
    with get_backend(f"openai:tiny@{served[2]}/v1", BackendOptions(
            max_retries=0, timeout_s=1)) as backend:

        async def collect() -> list[Any]:
            return [c async for c in backend.astream(ask)]

        for read in (lambda: list(backend.stream(ask)), lambda: asyncio.run(collect())):
            start = time.monotonic()
            chunks = read()
            assert time.monotonic() - start < 3
            assert chunks[0].text == "fine"
            assert chunks[-1].completion.finish_reason == "timeout"


def test_the_event_parser_keeps_events_whole_and_bounded() -> None:
    from whetstone.engine.backends.openai_http import HttpFailure, SseParser

    parser = SseParser(max_event_bytes=64, max_total_bytes=200)
    wire = b': ping\r\n\r\ndata: {"a": 1}\r\n\r\nevent: error\ndata: {"b":\ndata:2}\n\nda'
    got = [e for i in range(len(wire)) for e in parser.feed(wire[i:i + 1])]
    assert got == [("", '{"a": 1}'), ("error", '{"b":\n2}')]
    assert parser.feed(b"ta: [DONE]\n\n") == [("", "[DONE]")]
    with pytest.raises(HttpFailure, match="passed 64 bytes without ending"):
        parser.feed(b"data: " + b"x" * 70)  # one line, never ended
    with pytest.raises(HttpFailure, match="passed 200 bytes once decoded"):
        whole = SseParser(max_event_bytes=64, max_total_bytes=200)
        for _ in range(20):  # short events, many of them
            whole.feed(b"data: {}\n\n" * 2)


@pytest.mark.integration
@pytest.mark.parametrize(("route", "extra", "status"), [
    ("/v1/completions", {"logprobs": 1}, 200),  # lm-eval's local-completions
    ("/v1/completions", {"logprobs": 0}, 200),
    ("/v1/completions", {"logprobs": 5, "echo": True}, 200),
    ("/v1/completions", {"logprobs": False}, 200),
    ("/v1/completions", {"logprobs": None}, 200),
    ("/v1/completions", {"logprobs": 21}, 400),
    ("/v1/completions", {"logprobs": 1.0}, 400),
    ("/v1/completions", {"logprobs": "1"}, 400),
    ("/v1/completions", {"logprobs": True}, 400),
    ("/v1/chat/completions", {"logprobs": 1}, 400),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, 400),
])
def test_logprobs_is_read_as_its_route_means_it(served: tuple[str, int, str], route: str,
                                                extra: dict[str, Any], status: int) -> None:
    base = served[0]
    before = len(received)
    body = {"model": "tiny", "prompt": "one two three", "max_tokens": 1, **extra}
    if route.endswith("chat/completions"):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra}
    r = httpx.post(base + route, timeout=30, headers=AUTH, json=body)
    assert r.status_code == status, r.text[:300]  # was: 400 for every integer logprobs
    if status == 200:
        assert r.json()["choices"][0]["text"] == " four"
        assert received[-1]["logprobs"] == extra["logprobs"]  # sent as the client sent it
    else:
        assert "logprobs" in r.json()["error"]["message"]
        assert len(received) == before


def test_the_sdks_transport_errors_are_upstream_faults() -> None:
    # The SDK in this venv raises httpx2's errors: they are the upstream's (502), not ours (500).
    httpx2 = pytest.importorskip("httpx2")
    from whetstone.engine.server.service import upstream_fault

    assert upstream_fault(httpx2.ReadTimeout("slow"))
    assert upstream_fault(httpx2.ConnectError("refused"))
    assert not upstream_fault(KeyError("ours"))
