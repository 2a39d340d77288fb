"""Issue 29, findings 10-12: what a client can learn and do through the server's API.

10. feedback has an owner: only the key an exchange was recorded for may label it;
11. ``/health``, ``verify`` and the schema routes tell a client without a key nothing about
    this host, and one with a key no path on it;
12. every integer field is a JSON integer within its range, or a 400 before anything goes
    upstream.

One ``whetstone serve`` process for the module, on 127.0.0.1, in front of a real HTTP
upstream (the ``openai:`` backend) that records every body it receives, so "never forwarded"
is checked where it matters: at the upstream.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import free_port, running_server, wait_healthy
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

pytestmark = [pytest.mark.integration]  # every test here uses it

REPO = Path(__file__).resolve().parent.parent
KEY_A, KEY_B = "sk-attack-owner-a", "sk-attack-owner-b"
START_TIMEOUT_S = 180.0  # two busy cores; the process usually answers within seconds


@dataclass
class Upstream:
    """A fake OpenAI server that answers every call with "ok" and keeps what it was sent."""

    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def chat(self, request: HttpRequest) -> Response:
        self.received.append(("chat", await request.json()))
        return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1,
                             "model": "tiny", "choices": [{
                                 "index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})

    async def completions(self, request: HttpRequest) -> Response:
        self.received.append(("completions", await request.json()))
        return JSONResponse({"id": "c2", "object": "text_completion", "created": 1,
                             "model": "tiny", "choices": [{"index": 0, "text": "ok",
                                                           "finish_reason": "stop"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"])])


@dataclass
class Served:
    base: str
    root: Path  # every path of this server's library, corpus and home lies under it
    library: Path
    upstream: Upstream

    def post(self, path: str, body: Any, key: str | None = KEY_A) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.base + path, json=body, headers=headers, timeout=30)

    def get(self, path: str, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.base + path, headers=headers, timeout=30)

    def chat(self, key: str = KEY_A, **body: Any) -> httpx.Response:
        return self.post("/v1/chat/completions",
                         {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                          **body}, key)


def _wait_until_up(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    wait_healthy(base, proc, log, START_TIMEOUT_S)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("attack-server")
    upstream = Upstream()
    port = free_port()
    env = {**os.environ, "WHETSTONE_HOME": str(root / "home"), "WHETSTONE_API_KEY": "",
           "OPENAI_API_KEY": ""}
    env.setdefault("WHETSTONE_CACHE", str(REPO / ".cache" / "whetstone"))
    log = root / "serve.log"
    (root / "library").mkdir()  # an empty folder: serve makes the library there
    with running_server(upstream.app()) as upstream_url, log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "whetstone", "serve", "--upstream",
             f"openai:tiny@{upstream_url}/v1", "--library", str(root / "library"),
             "--port", str(port), "--served-name", "tiny", "--api-key", KEY_A,
             "--api-key", KEY_B, "--log-level", "warning"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(proc, base, log)
            yield Served(base, root, root / "library", upstream)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _feedback(served: Served, trace_id: str, score: float, key: str) -> httpx.Response:
    return served.post("/v1/feedback", {"trace_id": trace_id, "score": score}, key)


def _stored_lines(served: Served, trace_id: str) -> list[dict[str, Any]]:
    """Every stored line of one trace, oldest first (the latest line for an id wins)."""
    lines = []
    for path in sorted((served.library / "traces").rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if trace_id in line:
                lines.append(json.loads(line))
    return lines


# --- 10. feedback has an owner ------------------------------------------------------------------

def test_only_the_key_an_exchange_was_recorded_for_may_label_it(served: Served) -> None:
    reply = served.chat(KEY_A)
    assert reply.status_code == 200, reply.text
    trace_id = reply.headers["x-whetstone-trace-id"]
    mine = _feedback(served, trace_id, 1, KEY_A)
    assert mine.status_code == 200, mine.text
    theirs = _feedback(served, trace_id, 0, KEY_B)  # was: 200, and A's score became 0
    unknown = _feedback(served, "20990101-000000-deadbeef", 0, KEY_B)
    # Another key's trace reads exactly as a trace that does not exist: ids do not leak.
    assert theirs.status_code == unknown.status_code == 404, theirs.text
    assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"] == (
        "trace_not_found")
    lines = _stored_lines(served, trace_id)
    assert lines[-1]["score"] == 1.0  # B's 0 never landed
    owner = hashlib.sha256(KEY_A.encode()).hexdigest()
    assert lines[-1]["meta"]["api_key_sha256"] == owner  # the key's hash, kept with the trace
    stored = "\n".join(json.dumps(line) for line in lines)
    assert KEY_A not in stored and KEY_B not in stored  # never the key itself


def test_a_key_cannot_label_a_trace_recorded_without_one(served: Served) -> None:
    """A trace no key recorded (an eval run in the same store, an exchange from before the
    server had keys) belongs to no client."""
    from whetstone.engine.types import Trace
    from whetstone.library_store.traces import TraceStore

    TraceStore(served.library / "traces").append(
        Trace(id="20260101-000000-0a0b0c0d", task="offline", answer="4"))
    r = _feedback(served, "20260101-000000-0a0b0c0d", 0, KEY_A)
    assert r.status_code == 404 and r.json()["error"]["code"] == "trace_not_found", r.text


# --- 11. what a client learns about this host -----------------------------------------------

def _assert_no_host_paths(text: str, served: Served) -> None:
    for secret in (str(served.root), str(REPO), str(Path.home())):
        assert secret not in text, (secret, text)


def test_health_without_a_key_is_minimal(served: Served) -> None:
    for key in (None, "sk-wrong"):
        r = served.get("/health", key)
        assert r.status_code == 200
        # was: recording and library_version too (and "no library at /tmp/..." when missing)
        assert r.json() == {"status": "ok", "model": "tiny", "backend": "openai:tiny",
                            "upstream": "openai:tiny"}, r.text
        _assert_no_host_paths(r.text, served)


def test_health_with_a_key_names_states_not_paths(served: Served) -> None:
    keyed = served.get("/health", KEY_A).json()
    assert keyed["library_version"] == "v1" and keyed["recording"] is True
    current = served.library / "CURRENT"
    current.rename(served.library / "CURRENT.away")
    try:
        gone = served.get("/health", KEY_A)
        assert gone.json()["library_version"] is None
        assert gone.json()["library_error"] == "missing"  # was: "no library at /tmp/.../library"
        _assert_no_host_paths(gone.text, served)
        assert served.get("/health").json().keys() == {"status", "model", "backend",
                                                        "upstream"}
    finally:
        (served.library / "CURRENT.away").rename(current)
    assert served.get("/health", KEY_A).json()["library_version"] == "v1"


def test_verify_with_an_empty_corpus_does_not_name_its_folder(served: Served) -> None:
    r = served.chat(KEY_A, whetstone={"endpoints": ["verify"]})
    assert r.status_code == 200, r.text
    error = r.json()["whetstone"]["endpoints"]["verify"]["error"]
    assert "corpus 'default' is empty" in error and "whetstone corpus add" in error
    _assert_no_host_paths(r.text, served)  # was: "... is empty (/tmp/.../corpus/default)"


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_schema_or_docs_are_served(served: Served, path: str) -> None:
    for key in (None, KEY_A):
        r = served.get(path, key)
        assert r.status_code == 404, (path, key, r.text[:200])  # was: the schema, to anyone
        assert "/v1/feedback" not in r.text


# --- 12. integer fields ------------------------------------------------------------------------

BAD_INTEGERS = [
    ("max_tokens", 1e300), ("max_tokens", 5.0), ("max_tokens", "5"), ("max_tokens", True),
    ("max_tokens", 10 ** 100), ("max_tokens", 0), ("max_completion_tokens", 1e300),
    ("max_completion_tokens", 2.0), ("n", 1.0), ("n", 0), ("top_logprobs", 2.0),
    ("top_logprobs", 21), ("seed", 1e300), ("seed", 3.0), ("best_of", 1e300),
    ("dimensions", 1.5),
]


@pytest.mark.parametrize(("key", "value"), BAD_INTEGERS,
                         ids=[f"{k}={v!r}"[:40] for k, v in BAD_INTEGERS])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_an_integer_field_must_be_an_integer_in_range(served: Served, route: str, key: str,
                                                      value: Any) -> None:
    before = len(served.upstream.received)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi",
            key: value}
    for stream in (False, True):
        r = served.post(route, {**body, "stream": stream})
        assert r.status_code == 400, (route, key, value, r.status_code, r.text[:300])
        message = r.json()["error"]["message"]
        assert f"'{key}' must be an integer between" in message, message
        assert len(message) < 400  # a 301-digit number is not echoed back
    assert len(served.upstream.received) == before  # nothing went upstream


@pytest.mark.parametrize(("key", "value", "words"), [
    ("temperature", 1e300, "must be between 0.0 and 2.0"),
    ("top_p", -1, "must be between 0.0 and 1.0"),
    ("frequency_penalty", float("inf"), "must be a finite number"),
    ("presence_penalty", "0.5", "must be a number"),
])
def test_a_number_field_sent_through_is_checked_too(served: Served, key: str, value: Any,
                                                    words: str) -> None:
    before = len(served.upstream.received)
    r = httpx.post(served.base + "/v1/completions", timeout=30,
                   headers={"Authorization": f"Bearer {KEY_A}",
                            "Content-Type": "application/json"},
                   # json.dumps writes inf as Infinity, which Python's parser (the server's)
                   # reads back: the client can send it.
                   content=json.dumps({"model": "tiny", "prompt": "hi", key: value}))
    assert r.status_code == 400 and f"'{key}' {words}" in r.text, r.text
    assert len(served.upstream.received) == before


def test_good_integers_still_reach_the_upstream(served: Served) -> None:
    r = served.chat(KEY_A, max_tokens=7, seed=-3, n=1, top_logprobs=0, logprobs=True)
    assert r.status_code == 200, r.text
    kind, sent = served.upstream.received[-1]
    assert kind == "chat" and sent["max_tokens"] == 7 and sent["seed"] == -3
    passed = served.post("/v1/completions", {"model": "tiny", "prompt": "hi",
                                             "max_tokens": 1_000_000, "n": 2})
    assert passed.status_code == 200, passed.text
    assert served.upstream.received[-1] == ("completions", {"model": "tiny", "prompt": "hi",
                                                            "max_tokens": 1_000_000, "n": 2})
