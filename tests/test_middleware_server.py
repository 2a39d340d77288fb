"""The middleware server: the library applied per request, traces, feedback, switches, keys and
limits, through the real ``openai`` client against uvicorn on 127.0.0.1 (scripted upstream)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from middleware_support import (
    USER,
    WEATHER_TOOL,
    Gate,
    echo,
    make_adapter,
    make_library,
    wait_for_trace,
)
from servers import Servers

from whetstone.engine.backends.base import Backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.runtime.plugins import Guidance, Plugin
from whetstone.engine.server import create_app
from whetstone.engine.server.adapter import ChatAdapter
from whetstone.engine.server.guard import TRACE_HEADER, VERSION_HEADER
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Library:
    return make_library(tmp_path_factory.mktemp("mw") / "lib")


class Served:
    def __init__(self, url: str, store: TraceStore, backend: Backend) -> None:
        self.url = url  # ends in /v1
        self.base = url.removesuffix("/v1")
        self.store = store
        self.backend = backend

    def client(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("api_key", "test")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=30, **kw)

    def post(self, body: Any, path: str = "/chat/completions", **kw: Any) -> httpx.Response:
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        headers = {"content-type": "application/json", **kw.pop("headers", {})}
        return httpx.post(self.url + path, content=content, headers=headers, timeout=30, **kw)


@pytest.fixture
def serve(library: Library, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(backend, library=..., adapter=..., **create_app_options)`` -> a live server
    applying the library and recording traces in a fresh store."""
    adapters: list[ChatAdapter] = []
    with Servers() as servers:
        def start(backend: Backend, *, lib: Library | None = library, record: bool = True,
                  adapter: ChatAdapter | None = None, **kw: Any) -> Served:
            if adapter is None and lib is not None:
                # No floor: these tests check what is injected, in what order, for all three
                # skills (the floor has its own tests in test_skills_retrieval.py).
                adapter = make_adapter(lib, backend, skills={"min_score": None})
                adapters.append(adapter)
            store = TraceStore(tmp_path / f"traces-{len(adapters)}-{time.monotonic_ns()}")
            kw.setdefault("model_name", "tiny")
            app = create_app(backend, adapter=adapter, traces=store if record else None, **kw)
            return Served(servers.start(app) + "/v1", store, backend)

        yield start
    for a in adapters:
        a.close()


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    assert "Traceback" not in r.text and 'File "' not in r.text
    return body["error"]


def assert_keeps_serving(s: Served, expect: str = "echo: still there?") -> None:
    r = s.client().chat.completions.create(model="tiny", messages=[
        {"role": "user", "content": "still there?"}])
    assert r.choices[0].message.content == expect


# --- adaptation ------------------------------------------------------------------------------

def test_the_library_is_injected_and_named_in_the_headers(serve: Callable[..., Served]) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend)
    raw = s.client().chat.completions.with_raw_response.create(model="tiny", messages=USER)
    r = raw.parse()
    assert r.choices[0].message.content == "echo: How many minutes are 2.5 hours?"
    assert raw.headers[VERSION_HEADER] == "v2"
    trace_id = raw.headers[TRACE_HEADER]
    system, user = backend.requests[0].messages
    assert system.role == "system" and system.text.startswith("# Skills")
    assert "- unit-conversion: Convert between units" in system.text
    assert system.text.index("unit-conversion") < system.text.index("baking-recipes")
    assert "read_skill" not in system.text  # no such tool in a plain completion
    assert user.text == USER[0]["content"]
    trace = wait_for_trace(s.store, trace_id)
    assert trace.task == USER[0]["content"] and trace.answer == r.choices[0].message.content
    assert trace.outcome == "answered" and trace.library_version == "v2"
    assert trace.model == "scripted:" and trace.meta["source"] == "chat"
    assert trace.meta["skills"]["shown"][0] == "unit-conversion"
    assert trace.meta["request_id"] == raw.headers["x-request-id"]
    (step,) = trace.steps
    assert (step.kind, step.module) == ("think", "chat")
    assert step.input["messages"][0]["content"] == system.text  # what the model really saw
    assert step.output["completion"]["text"] == r.choices[0].message.content
    assert trace.total_tokens == r.usage.total_tokens


def test_guidance_is_appended_to_an_existing_system_message(serve: Callable[..., Served]
                                                            ) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend)
    s.client().chat.completions.create(model="tiny", messages=[
        {"role": "developer", "content": "You are terse."}, *USER])
    system = backend.requests[0].messages[0]
    assert len(backend.requests[0].messages) == 2
    assert system.text.startswith("You are terse.\n\n# Skills")


def test_the_query_is_the_last_user_message_through_a_tool_exchange(
        serve: Callable[..., Served]) -> None:
    backend = ScriptedBackend([
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "c1"}]},
        "It is 3 C in Oslo."], tool_calls=True)
    s = serve(backend)
    c = s.client()
    ask = [{"role": "user", "content": "What is the weather like in Oslo today?"}]
    raw = c.chat.completions.with_raw_response.create(model="tiny", messages=ask,
                                                      tools=[WEATHER_TOOL])
    first = raw.parse()
    (call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.id, call.function.name) == ("c1", "get_weather")
    assert backend.requests[0].tools[0]["function"]["name"] == "get_weather"
    second = c.chat.completions.create(model="tiny", tools=[WEATHER_TOOL], messages=[
        *ask, first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "c1", "content": "3 C"}])
    assert second.choices[0].message.content == "It is 3 C in Oslo."
    shown = [r.messages[0].text.splitlines()[4] for r in backend.requests]
    assert shown[0] == shown[1] and "weather-reports" in shown[0]  # same query, same guidance
    assert [m.role for m in backend.requests[1].messages] == ["system", "user", "assistant",
                                                              "tool"]
    trace = wait_for_trace(s.store, raw.headers[TRACE_HEADER])
    assert trace.answer == 'get_weather({"city": "Oslo"})'
    assert trace.steps[0].input["tools"] == ["get_weather"]


def test_streaming_is_the_upstreams_stream_and_is_recorded(serve: Callable[..., Served]
                                                            ) -> None:
    backend = ScriptedBackend(responder=lambda r: "one two three four")
    s = serve(backend)
    with httpx.stream("POST", s.url + "/chat/completions", timeout=30, json={
            "model": "tiny", "messages": USER, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers[VERSION_HEADER] == "v2"
        trace_id = r.headers[TRACE_HEADER]
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    pieces = [b["choices"][0]["delta"].get("content") for b in bodies if b["choices"]]
    assert [p for p in pieces if p] == ["one", " two", " three", " four"]
    trace = wait_for_trace(s.store, trace_id)
    assert trace.answer == "one two three four" and trace.outcome == "answered"
    assert trace.meta["stream"] is True and trace.total_tokens == bodies[-1]["usage"][
        "total_tokens"]
    chunks = list(s.client().chat.completions.create(model="tiny", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "one two three four")


def test_a_stream_the_client_abandons_is_recorded_as_interrupted(
        serve: Callable[..., Served]) -> None:
    words = " ".join(f"w{i}" for i in range(300))
    backend = ScriptedBackend(responder=lambda r: words, max_concurrency=1)
    s = serve(backend, max_queue=0)
    with httpx.stream("POST", s.url + "/chat/completions", timeout=30,
                      json={"model": "tiny", "messages": USER, "stream": True}) as r:
        trace_id = r.headers[TRACE_HEADER]
        next(r.iter_lines())
    trace = wait_for_trace(s.store, trace_id)
    assert trace.outcome == "interrupted" and trace.answer is None
    # The place in the queue came back: with no queue, a leak would make this a 429.
    assert_keeps_serving(s, expect=words)


def test_the_server_follows_new_library_versions(serve: Callable[..., Served],
                                                 tmp_path: Path) -> None:
    lib = make_library(tmp_path / "moving")
    backend = ScriptedBackend(responder=echo)
    s = serve(backend, lib=lib)
    c = s.client()
    first = c.chat.completions.with_raw_response.create(model="tiny", messages=USER)
    lib.commit({"skills/baking-recipes/SKILL.md": None}, method="test", message="drop baking")
    second = c.chat.completions.with_raw_response.create(model="tiny", messages=USER)
    assert (first.headers[VERSION_HEADER], second.headers[VERSION_HEADER]) == ("v2", "v3")
    assert "baking-recipes" in backend.requests[0].messages[0].text
    assert "baking-recipes" not in backend.requests[1].messages[0].text
    health = httpx.get(s.base + "/health", timeout=10).json()
    assert health["library_version"] == "v3" and health["upstream"] == "scripted:"


class _Broken(Plugin):
    name = "broken"

    def guidance(self, task: str, ctx: Any, budget_tokens: int) -> Guidance | None:
        raise RuntimeError("index exploded")


def test_a_failing_retrieval_answers_without_the_library(serve: Callable[..., Served]) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend, adapter=ChatAdapter([_Broken()], backend))
    raw = s.client().chat.completions.with_raw_response.create(model="tiny", messages=USER)
    assert raw.parse().choices[0].message.content.startswith("echo:")
    assert VERSION_HEADER not in raw.headers
    assert [m.role for m in backend.requests[0].messages] == ["user"]
    trace = wait_for_trace(s.store, raw.headers[TRACE_HEADER])
    assert "index exploded" in trace.meta["library_error"]
    metrics = httpx.get(s.base + "/metrics", timeout=10).text
    assert 'whetstone_errors_total{code="library_unavailable"} 1' in metrics


def test_a_backend_crash_is_a_500_and_still_recorded(serve: Callable[..., Served]) -> None:
    def oom(request: Any) -> str:
        raise RuntimeError("CUDA out of memory")

    s = serve(ScriptedBackend(responder=oom))
    for stream in (False, True):
        r = s.post({"model": "tiny", "messages": USER, "stream": stream},
                   headers={"X-Request-Id": f"req-{stream}"})
        err = assert_openai_error(r, 500)
        assert err["type"] == "server_error" and "CUDA" not in err["message"]
        assert r.headers["x-request-id"] == f"req-{stream}" and r.headers[VERSION_HEADER]
        trace = wait_for_trace(s.store, r.headers[TRACE_HEADER])
        assert trace.outcome == "error" and trace.meta["request_id"] == f"req-{stream}"
        assert "RuntimeError: CUDA out of memory" in trace.meta["reason"]
    metrics = httpx.get(s.base + "/metrics", timeout=10).text
    assert 'whetstone_errors_total{code="internal_error"} 2' in metrics


# --- per-request switches --------------------------------------------------------------------

def test_extra_body_switches_the_library_and_recording_off(serve: Callable[..., Served]
                                                           ) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend)
    c = s.client()
    off = c.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, extra_body={"whetstone": {"library": False}})
    assert VERSION_HEADER not in off.headers
    assert [m.role for m in backend.requests[0].messages] == ["user"]
    assert wait_for_trace(s.store, off.headers[TRACE_HEADER]).meta["library"] is False
    unrecorded = c.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, extra_body={"whetstone": {"record": False}})
    assert TRACE_HEADER not in unrecorded.headers and unrecorded.headers[VERSION_HEADER] == "v2"
    small = c.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, extra_body={"whetstone": {"budget_tokens": 40}})
    assert small.headers[VERSION_HEADER] == "v2"
    assert "## Skill:" not in backend.requests[2].messages[0].text  # no room for bodies
    time.sleep(0.3)
    assert len(s.store.latest()) == 2  # the unrecorded one was not written


@pytest.mark.parametrize("switches, words", [
    ({"libary": False}, "unknown 'whetstone' option(s): 'libary'"),
    ({"library": "no"}, "'whetstone.library' must be true or false"),
    ({"budget_tokens": -1}, "'whetstone.budget_tokens' must be an integer"),
    ("off", "'whetstone' must be an object"),
])
def test_bad_switches_are_a_400(serve: Callable[..., Served], switches: Any, words: str
                                ) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend)
    err = assert_openai_error(s.post({"model": "tiny", "messages": USER,
                                      "whetstone": switches}), 400)
    assert words in err["message"] and backend.requests == []


# --- feedback --------------------------------------------------------------------------------

def test_feedback_labels_the_trace(serve: Callable[..., Served]) -> None:
    s = serve(ScriptedBackend(responder=echo))
    raw = s.client().chat.completions.with_raw_response.create(model="tiny", messages=USER)
    trace_id = raw.headers[TRACE_HEADER]
    r = s.post({"trace_id": trace_id, "score": 1, "comment": "right"}, path="/feedback")
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "feedback", "trace_id": trace_id, "score": 1.0,
                        "comment": "right"}
    stored = s.store.get(trace_id)
    assert stored.score == 1.0 and stored.meta["feedback"] == "right"
    assert stored.answer == raw.parse().choices[0].message.content
    r = s.post({"trace_id": trace_id, "score": 0.25}, path="/feedback")
    assert r.status_code == 200 and s.store.get(trace_id).score == 0.25


def test_feedback_on_a_trace_written_before_this_server_started(
        serve: Callable[..., Served], library: Library) -> None:
    s = serve(ScriptedBackend(responder=echo))
    trace_id = s.client().chat.completions.with_raw_response.create(
        model="tiny", messages=USER).headers[TRACE_HEADER]
    wait_for_trace(s.store, trace_id)
    again = create_app(ScriptedBackend(), traces=s.store, model_name="tiny")
    with Servers() as servers:
        url = servers.start(again) + "/v1"
        r = httpx.post(url + "/feedback", json={"trace_id": trace_id, "score": 0}, timeout=10)
    assert r.status_code == 200 and s.store.get(trace_id).score == 0.0


def test_feedback_on_a_trace_stuck_in_the_queue_is_a_503(serve: Callable[..., Served],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from whetstone.engine.server import recording

    monkeypatch.setattr(recording, "LABEL_WAIT_S", 0.2)
    monkeypatch.setattr(recording, "SETTLE_WAIT_S", 0.1)  # replies go though the store lags
    s = serve(ScriptedBackend(responder=echo))
    stuck = threading.Event()
    real = s.store.append_records

    def slow_append_records(records: Any) -> None:
        stuck.wait(10)  # the store is backed up
        real(records)

    monkeypatch.setattr(s.store, "append_records", slow_append_records)
    first = s.post({"model": "tiny", "messages": USER}).headers[TRACE_HEADER]
    second = s.post({"model": "tiny", "messages": USER}).headers[TRACE_HEADER]
    time.sleep(0.2)  # both queued; the first batch is being written
    r = s.post({"trace_id": second, "score": 1}, path="/feedback")
    err = assert_openai_error(r, 503)
    assert "still waiting to be written" in err["message"] and r.headers["retry-after"]
    stuck.set()
    r = s.post({"trace_id": second, "score": 1}, path="/feedback")
    assert r.status_code == 200, r.text
    assert s.store.get(second).score == 1.0 and s.store.get(first).score is None


@pytest.mark.parametrize("body, status, words", [
    ({"trace_id": "20990101-000000-deadbeef", "score": 1}, 404, "no trace with id"),
    ({"score": 1}, 400, "'trace_id' is required"),
    ({"trace_id": "", "score": 1}, 400, "'trace_id' is required"),
    ({"trace_id": "X", "score": "good"}, 400, "'score' must be a number from 0 to 1"),
    ({"trace_id": "X", "score": 1.5}, 400, "'score' must be a number from 0 to 1"),
    ({"trace_id": "X", "score": True}, 400, "'score' must be a number"),
    ({"trace_id": "X"}, 400, "'score' must be a number"),
    ({"trace_id": "X", "score": 1, "comment": 5}, 400, "'comment' must be a string"),
    ([1], 400, "must be a JSON object"),
])
def test_bad_feedback(serve: Callable[..., Served], body: Any, status: int, words: str) -> None:
    s = serve(ScriptedBackend(responder=echo))
    trace_id = s.client().chat.completions.with_raw_response.create(
        model="tiny", messages=USER).headers[TRACE_HEADER]
    if isinstance(body, dict) and body.get("trace_id") == "X":
        body = {**body, "trace_id": trace_id}
    err = assert_openai_error(s.post(body, path="/feedback"), status)
    assert words in err["message"]
    assert wait_for_trace(s.store, trace_id).score is None  # written 50 ms later


def test_feedback_needs_the_exact_id_and_nan_is_not_a_score(serve: Callable[..., Served]
                                                           ) -> None:
    s = serve(ScriptedBackend(responder=echo))
    trace_id = s.client().chat.completions.with_raw_response.create(
        model="tiny", messages=USER).headers[TRACE_HEADER]
    assert_openai_error(s.post({"trace_id": trace_id[:-3], "score": 1}, path="/feedback"), 404)
    nan = json.dumps({"trace_id": trace_id, "score": math.nan})  # Python writes NaN, JSON-ish
    assert "'score'" in assert_openai_error(s.post(nan, path="/feedback"), 400)["message"]


def test_feedback_without_recording_is_a_404(serve: Callable[..., Served]) -> None:
    s = serve(ScriptedBackend(responder=echo), record=False)
    err = assert_openai_error(s.post({"trace_id": "x", "score": 1}, path="/feedback"), 404)
    assert "does not record traces" in err["message"]


# --- bad input: each answered properly, and the server keeps serving --------------------------

@pytest.mark.parametrize("body, status, code", [
    ('{"model": "tiny", "messages": [', 400, "invalid_json"),
    ({"model": "tiny"}, 400, None),
    ({"model": "gpt-4o", "messages": USER}, 404, "model_not_found"),
])
def test_bad_requests_then_a_good_one(serve: Callable[..., Served], body: Any, status: int,
                                      code: str | None) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend)
    err = assert_openai_error(s.post(body), status)
    assert err["code"] == code and backend.requests == []
    assert_keeps_serving(s)
    assert len(backend.requests) == 1


def test_a_body_over_the_limit_is_a_413(serve: Callable[..., Served]) -> None:
    backend = ScriptedBackend(responder=echo)
    s = serve(backend, max_body_bytes=2_000)
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 5_000}]}
    err = assert_openai_error(s.post(big), 413)
    assert err["code"] == "request_too_large" and "2000 bytes" in err["message"]
    with pytest.raises(openai.APIStatusError) as info:
        s.client().chat.completions.create(model="tiny", messages=big["messages"])
    assert info.value.status_code == 413

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        data = json.dumps(big).encode()
        for i in range(0, len(data), 500):
            yield data[i:i + 500]

    r = httpx.post(s.url + "/chat/completions", content=chunked(), timeout=30,
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 413)
    assert backend.requests == []
    assert_keeps_serving(s)


def test_api_keys(serve: Callable[..., Served]) -> None:
    s = serve(ScriptedBackend(responder=echo), api_keys=["sk-right", "sk-other"])
    with pytest.raises(openai.AuthenticationError) as info:
        s.client(api_key="sk-wrong").chat.completions.create(model="tiny", messages=USER)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    assert "sk-wrong" not in info.value.message
    missing = httpx.post(s.url + "/chat/completions", json={"model": "tiny", "messages": USER},
                         timeout=10)
    err = assert_openai_error(missing, 401)
    assert "no API key provided" in err["message"]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert_openai_error(httpx.get(s.url + "/models", timeout=10), 401)
    assert_openai_error(s.post({"trace_id": "x", "score": 1}, path="/feedback"), 401)
    assert httpx.get(s.base + "/health", timeout=10).status_code == 200  # probes need no key
    for key in ("sk-right", "sk-other"):
        r = s.client(api_key=key).chat.completions.create(model="tiny", messages=USER)
        assert r.choices[0].message.content.startswith("echo:")


def test_a_full_queue_is_a_429_and_the_server_recovers(serve: Callable[..., Served]) -> None:
    gate = Gate()
    s = serve(gate, max_concurrency=1, max_queue=1)
    c = s.client()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(c.chat.completions.create, model="tiny", messages=USER)
        assert gate.entered.wait(10)
        second = pool.submit(c.chat.completions.create, model="tiny", messages=USER)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the second one waits in the queue
            if "whetstone_queue_depth 1" in httpx.get(s.base + "/metrics", timeout=5).text:
                break
            time.sleep(0.02)
        r = s.post({"model": "tiny", "messages": USER})
        err = assert_openai_error(r, 429)
        assert err["code"] == "rate_limit_exceeded" and r.headers["retry-after"] == "1"
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="tiny", messages=USER)
        gate.release.set()
        assert first.result(10).choices[0].message.content.startswith("echo:")
        assert second.result(10).choices[0].message.content.startswith("echo:")
    assert_keeps_serving(s)


# --- metrics and health ----------------------------------------------------------------------

def _sample(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_start!r} in:\n{text}")


def test_metrics_count_requests_tokens_errors_and_traces(serve: Callable[..., Served]) -> None:
    s = serve(ScriptedBackend(responder=echo))
    c = s.client()
    replies = [c.chat.completions.create(model="tiny", messages=USER) for _ in range(3)]
    list(c.chat.completions.create(model="tiny", messages=USER, stream=True))
    s.post("{bad json")
    s.post({"model": "nope", "messages": USER})
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:
        r = httpx.get(s.base + "/metrics", timeout=10)
        text = r.text
        if _sample(text, "whetstone_traces_written_total") == 4:
            break
        time.sleep(0.05)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    chat = 'route="/v1/chat/completions"'
    assert _sample(text, f'whetstone_requests_total{{{chat},status="200"}}') == 4
    assert _sample(text, f'whetstone_requests_total{{{chat},status="400"}}') == 1
    assert _sample(text, f'whetstone_requests_total{{{chat},status="404"}}') == 1
    assert _sample(text, f'whetstone_request_duration_seconds_count{{{chat}}}') == 6
    assert _sample(text, f'whetstone_request_duration_seconds_bucket{{{chat},le="+Inf"}}') == 6
    assert _sample(text, 'whetstone_upstream_duration_seconds_count{stream="false"}') == 3
    assert _sample(text, 'whetstone_upstream_duration_seconds_count{stream="true"}') == 1
    assert _sample(text, "whetstone_retrieval_duration_seconds_count") == 4
    completion_tokens = sum(r.usage.completion_tokens for r in replies)
    assert _sample(text, 'whetstone_tokens_total{kind="completion"}') > completion_tokens
    assert _sample(text, 'whetstone_errors_total{code="invalid_json"}') == 1
    assert _sample(text, 'whetstone_errors_total{code="model_not_found"}') == 1
    assert _sample(text, 'whetstone_library_requests_total{applied="true"}') == 4
    assert _sample(text, "whetstone_traces_written_total") == 4
    assert _sample(text, "whetstone_queue_depth") == 0
    assert _sample(text, "whetstone_requests_in_flight") == 0
    assert "# TYPE whetstone_request_duration_seconds histogram" in text


def test_health_names_the_library_version_and_upstream(serve: Callable[..., Served]) -> None:
    s = serve(ScriptedBackend(responder=echo))
    assert httpx.get(s.base + "/health", timeout=10).json() == {
        "status": "ok", "model": "tiny", "backend": "scripted:", "upstream": "scripted:",
        "recording": True, "library_version": "v2"}


# --- shutdown --------------------------------------------------------------------------------

def test_shutdown_writes_every_queued_trace(library: Library, tmp_path: Path) -> None:
    backend = ScriptedBackend(responder=echo)
    adapter = make_adapter(library, backend)
    store = TraceStore(tmp_path / "traces")
    app = create_app(backend, model_name="tiny", adapter=adapter, traces=store)
    writer = app.state.server.pipeline.traces
    ids = []
    written_before_exit = 0
    with Servers() as servers:
        url = servers.start(app) + "/v1"
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        with ThreadPoolExecutor(8) as pool:
            raws = list(pool.map(lambda i: c.chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": f"q{i}"}]), range(40)))
        ids = [r.headers[TRACE_HEADER] for r in raws]
        written_before_exit = len(store.latest())
    adapter.close()
    assert written_before_exit <= 40 and writer.pending == 0
    stored = store.latest()
    assert sorted(stored) == sorted(ids)
    assert {stored[i].answer for i in ids} == {f"echo: q{i}" for i in range(40)}
